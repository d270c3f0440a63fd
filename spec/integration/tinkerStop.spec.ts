/**
 * SIGTERM while a run trained on a Tinker service waits for a future that never finishes: a real `rxrl run` (the
 * built CLI) against rxrl's Tinker service behind a hostile proxy on loopback. The proxy passes everything through
 * until the second `forward_backward`, then holds every poll of that request's future (as a service whose worker
 * hung holds its polls). Step 1 and its checkpoint are written first; SIGTERM must end the run within the helper's
 * bound, long before any deadline of the wait (tinker.futureTimeoutMs and pollTimeoutMs are 300 s here), and keep
 * that checkpoint intact.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { tinkerService, type TinkerService } from '../../lib/tinker/service.js';
import { loadRollout } from '../../pipelines/parts/data.js';
import { tinyRun } from '../checkpoint/tinyRun.js';
import { checkpointWritten, expectHandledStop, intactCheckpoint, stopWhenBlocked } from '../helpers/stopRun.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
let tokenizer: Tokenizer;
let base: PolicyModel;
let service: TinkerService;
let dir: string;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  tokenizer = (await loadRollout(tinyRun('/unused', 1), root)).tokenizer;
  base = PolicyModel.create({ vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 }, 7);
  service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny' });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-stop-'));
});

afterAll(async () => {
  await service?.close();
  base?.dispose();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** A proxy to `target` that holds every poll of the `holdAt`-th `forward_backward`'s future; `held` resolves at the first. */
async function holdingProxy(target: string, holdAt: number): Promise<{ url: string; held: Promise<void>; close: () => Promise<void> }> {
  let forwardBackwards = 0;
  let heldId: string | undefined;
  let onHeld: () => void = () => undefined;
  const held = new Promise<void>((resolve) => (onHeld = resolve));
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url === '/api/v1/retrieve_future' && heldId !== undefined && body.toString().includes(heldId)) {
        onHeld();
        return; // never answered
      }
      void (async () => {
        const headers: Record<string, string> = {};
        for (const name of ['content-type', 'accept', 'x-api-key'])
          if (typeof req.headers[name] === 'string') headers[name] = req.headers[name];
        const answer = await fetch(`${target}${req.url}`, { method: req.method ?? 'POST', headers, ...(body.length > 0 ? { body } : {}) });
        const bytes = Buffer.from(await answer.arrayBuffer());
        if (req.url === '/api/v1/forward_backward' && ++forwardBackwards === holdAt)
          heldId = (JSON.parse(bytes.toString()) as { request_id: string }).request_id;
        res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' });
        res.end(bytes);
      })().catch(() => res.destroy());
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    held,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
}

describe('SIGTERM while a Tinker future never finishes', () => {
  it('ends the run at once and keeps the checkpoint of step 1', async () => {
    const proxy = await holdingProxy(service.url, 2);
    try {
      const runDir = join(dir, 'run');
      const recipe = join(dir, 'recipe.json');
      await writeFile(
        recipe,
        JSON.stringify({
          run: { dir: runDir, seed: 3, steps: 5, backend: 'cpu' },
          data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
          model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
          rollout: { groupSize: 2 },
          sync: { batchSize: 2 },
          checkpoint: { every: 1, keepLast: 0 },
          validation: { beforeTrain: false },
          trainer: { backend: 'tinker' },
          tinker: { baseUrl: proxy.url, baseModel: 'tiny', rank: 2, futureTimeoutMs: 300_000, pollTimeoutMs: 300_000 },
        }),
      );
      const stopped = await stopWhenBlocked({
        args: ['run', recipe],
        what: 'tinker future held',
        env: { RXRL_LOG_LEVEL: 'warn' },
        // Blocked on step 2's future, with step 1's checkpoint written.
        blocked: () => Promise.all([proxy.held, checkpointWritten(runDir)]),
      });
      expectHandledStop(stopped);
      expect(await intactCheckpoint(runDir)).toMatch(/global_step_1$/);
    } finally {
      await proxy.close();
    }
  }, 300_000);
});
