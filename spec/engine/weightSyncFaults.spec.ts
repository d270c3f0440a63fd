/**
 * A server whose weight update never answers (issue 53, row 7): the update fails at its deadline
 * (`weightSync.timeoutMs`, from `openai.weightSyncTimeoutMs`), retries included, and ends at once when the run's
 * signal fires. The server is a real node `http` server on loopback that reads each request and never answers.
 */
import { createServer, type Server } from 'node:http';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { AbortError, EngineError, RetriesExhaustedError } from '../../lib/core/errors.js';
import { OpenAIEngine } from '../../lib/engine/openai.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';

const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 16 };

let server: Server;
let baseURL: string;
let dir: string;
const received: string[] = [];
let onRequest: () => void = () => undefined;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-weight-sync-'));
  server = createServer((req) => {
    received.push(`${req.method} ${req.url}`);
    req.resume();
    onRequest();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  baseURL = `http://127.0.0.1:${(server.address() as { port: number }).port}/v1`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((resolve) => server.close(resolve));
});

function engine(timeoutMs: number): OpenAIEngine {
  return new OpenAIEngine({ baseURL, model: 'm', tokenizer, weightSync: { directory: join(dir, String(timeoutMs)), config, timeoutMs } });
}

describe('a weight update that never answers', () => {
  it('fails at weightSync.timeoutMs, its retries included (before: 1 + 5 attempts of the deadline each)', async () => {
    received.length = 0;
    const model = PolicyModel.create(config, 1);
    try {
      const error = await engine(300)
        .loadWeights(1, model.getWeights())
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RetriesExhaustedError);
      expect((error as RetriesExhaustedError).cause).toBeInstanceOf(EngineError);
      expect(received).toEqual(['POST /update_weights_from_disk']);
    } finally {
      model.dispose();
    }
  });

  it("ends with an AbortError as soon as the run's signal fires", async () => {
    received.length = 0;
    const model = PolicyModel.create(config, 1);
    const stop = new AbortController();
    onRequest = () => stop.abort();
    try {
      // A deadline of 300 s: only the signal can end the wait.
      const error = await engine(300_000)
        .loadWeights(1, model.getWeights(), stop.signal)
        .catch((e: unknown) => e);
      expect(error).toBeInstanceOf(AbortError);
      expect(received).toEqual(['POST /update_weights_from_disk']);
    } finally {
      onRequest = () => undefined;
      model.dispose();
    }
  });
});
