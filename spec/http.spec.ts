/**
 * Every outbound HTTP client of rxrl reads its answers through lib/core/http.ts, so an answer is bounded in size and
 * a request has a deadline, whoever answers (issue 53, "every response a size bound; every network call a
 * deadline"). Each client meets a hostile node `http` server on loopback that answers with an endless body, or
 * declares a body of 1 TiB: the client ends with a {@link DecodeError} naming the bound (`context.limit`), having
 * read at most that much.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { DecodeError } from '../lib/core/errors.js';
import { collate } from '../lib/data/collate.js';
import { OpenAIEngine } from '../lib/engine/openai.js';
import { DEFAULT_MAX_RESPONSE_BYTES } from '../lib/engine/openaiClient.js';
import { openaiScorer, TEACHER_MAX_RESPONSE_BYTES } from '../lib/engine/teacher.js';
import { downloadSnapshot, fetchListing, MAX_LISTING_BYTES } from '../lib/model/hubDownload.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { TinkerClient, TinkerError, TINKER_MAX_RESPONSE_BYTES } from '../lib/tinker/client.js';
import { runServed } from '../pipelines/served.js';
import { traj } from './helpers/fixtures.js';

/** What a hostile server does with a request it does not answer honestly. */
type Hostility = 'endless' | 'huge-length' | 'silent';

const MiB = 1024 * 1024;
const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/**
 * A server on 127.0.0.1 that answers every request with `hostility` (JSON by its content type): `endless` streams
 * `[1,1,1,…` for as long as the client reads, `huge-length` declares 1 TiB and sends a few bytes, `silent` never
 * answers. `honest` answers the requests it recognizes first.
 */
async function hostileServer(
  hostility: Hostility,
  honest: (req: IncomingMessage, res: ServerResponse) => boolean = () => false,
): Promise<{ readonly url: string; readonly sent: () => number }> {
  let sent = 0;
  const server = createServer((req, res) => {
    req.resume();
    if (honest(req, res) || hostility === 'silent') return;
    if (hostility === 'huge-length') {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': String(2 ** 40) });
      res.write('[1,');
      return;
    }
    res.writeHead(200, { 'content-type': 'application/json' });
    const chunk = Buffer.from('1,'.repeat(32 * 1024));
    const pump = (): void => {
      while (!res.destroyed) {
        sent += chunk.length;
        if (!res.write(chunk)) return void res.once('drain', pump);
      }
    };
    res.write('[');
    pump();
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, sent: () => sent };
}

/** The error `promise` rejects with (it must reject). */
async function failure(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    () => expect.unreachable('the call succeeded'),
    (error: unknown) => error,
  );
}

/** `error` is a DecodeError naming `limit` as its bound. */
function expectBound(error: unknown, limit: number): void {
  expect(error, String(error)).toBeInstanceOf(DecodeError);
  expect((error as DecodeError).context.limit).toBe(limit);
}

const tokenizer = new CharTokenizer('abcde=');

describe('OpenAIEngine (the rollout engine)', () => {
  const generate = (baseURL: string, maxResponseBytes = DEFAULT_MAX_RESPONSE_BYTES): Promise<unknown> =>
    new OpenAIEngine({ baseURL: `${baseURL}/v1`, model: 'm', tokenizer, retry: { retries: 1 }, maxResponseBytes }).generate([
      { promptTokens: [1, 2], maxTokens: 4 },
    ]);

  it('an answer declared 1 TiB long is a DecodeError at once, not a failed connection retried', async () => {
    const server = await hostileServer('huge-length');
    expectBound(await failure(generate(server.url)), DEFAULT_MAX_RESPONSE_BYTES);
  });

  it('an endless answer is a DecodeError at maxResponseBytes', async () => {
    const server = await hostileServer('endless');
    expectBound(await failure(generate(server.url, MiB)), MiB);
    expect(server.sent()).toBeLessThan(64 * MiB);
  });
});

describe('openaiScorer (the distillation teacher)', () => {
  const batch = collate([traj('a@0', 0, { promptTokens: [1, 2], responseTokens: [3, 4], logprobs: [-1, -1], lossMask: [1, 1] })], {
    padId: tokenizer.padId,
    modelTag: 'policy',
  });
  const score = (baseUrl: string, maxResponseBytes = TEACHER_MAX_RESPONSE_BYTES): Promise<unknown> =>
    openaiScorer({
      baseUrl: `${baseUrl}/v1`,
      model: 'teacher',
      tokenizer,
      timeoutMs: 60_000,
      retries: 1,
      maxResponseBytes,
    }).responseLogprobs(batch);

  it(`an answer declared 1 TiB long is a DecodeError at TEACHER_MAX_RESPONSE_BYTES (${TEACHER_MAX_RESPONSE_BYTES})`, async () => {
    const server = await hostileServer('huge-length');
    expectBound(await failure(score(server.url)), TEACHER_MAX_RESPONSE_BYTES);
  });

  it('an endless answer is a DecodeError at maxResponseBytes, not retried', async () => {
    const server = await hostileServer('endless');
    expectBound(await failure(score(server.url, MiB)), MiB);
  });
});

describe('TinkerClient', () => {
  it(`an answer declared 1 TiB long is a DecodeError at TINKER_MAX_RESPONSE_BYTES (${TINKER_MAX_RESPONSE_BYTES})`, async () => {
    const server = await hostileServer('huge-length');
    expectBound(await failure(TinkerClient.connect({ baseURL: server.url, apiKey: 'k' })), TINKER_MAX_RESPONSE_BYTES);
  });

  it('an endless answer is a DecodeError at maxResponseBytes', async () => {
    const server = await hostileServer('endless');
    expectBound(await failure(TinkerClient.connect({ baseURL: server.url, apiKey: 'k', maxResponseBytes: MiB })), MiB);
  });

  it('a request never answered fails at futureTimeoutMs as a lost service (it waited forever before)', async () => {
    const server = await hostileServer('silent');
    const error = await failure(TinkerClient.connect({ baseURL: server.url, apiKey: 'k', futureTimeoutMs: 300 }));
    expect(error, String(error)).toBeInstanceOf(TinkerError);
    expect((error as TinkerError).context).toMatchObject({ lost: true, timeoutMs: 300 });
  }, 30_000);
});

describe('the hub download (HF_ENDPOINT)', () => {
  const id = { repo: 'org/tiny', revision: 'main' };

  it.each(['huge-length', 'endless'] as const)('a %s listing is a DecodeError at MAX_LISTING_BYTES', async (hostility) => {
    const server = await hostileServer(hostility);
    expectBound(await failure(fetchListing(id, { endpoint: server.url })), MAX_LISTING_BYTES);
  });

  it('a file whose answer declares more than its listed size is a DecodeError at that size, before a byte is kept', async () => {
    const listing = { sha: 'c'.repeat(40), siblings: [{ rfilename: 'config.json', size: 2, blobId: 'a'.repeat(40) }] };
    const server = await hostileServer('huge-length', (req, res) => {
      if (!req.url?.startsWith('/api/models/')) return false;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(listing));
      return true;
    });
    const cacheDir = mkdtempSync(join(tmpdir(), 'rxrl-http-hub-'));
    const repoDir = join(cacheDir, 'models--org--tiny');
    const error = await failure(downloadSnapshot(id, { endpoint: server.url, cacheDir, repoDir, wanted: () => true }));
    expectBound(error, 2);
    expect(readdirSync(join(repoDir, 'blobs'))).toEqual([]);
  });
});

describe('runServed (a served run asking the server its model)', () => {
  it('a model list declared 1 TiB long is a DecodeError at DEFAULT_MAX_RESPONSE_BYTES', async () => {
    const server = await hostileServer('huge-length');
    expectBound(await failure(runServed({ baseURL: `${server.url}/v1`, steps: 1 })), DEFAULT_MAX_RESPONSE_BYTES);
  });
});
