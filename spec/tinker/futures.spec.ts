/**
 * How the client waits for a future, against a hostile service: a real HTTP server on loopback that speaks enough of
 * the Tinker API to open a session and make a model, and holds every `retrieve_future` poll (as a service holds a
 * poll until the result is ready, answering 408 "not yet" after a while). As the official SDK: a held poll is given
 * up after `pollTimeoutMs` and polled again, a 408 is polled again (no failed attempt), one `futureTimeoutMs`
 * deadline covers all polls, and the run's stop signal ends the poll in flight at once.
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { afterEach, describe, expect, it } from 'vitest';

import { AbortError, isAbortError } from '../../lib/core/errors.js';
import { TinkerClient, TinkerError, tinkerServiceLost, type TinkerClientOptions } from '../../lib/tinker/client.js';

/** What the hostile service does with poll number `n` (0-based) of the model's future. */
type PollAnswer = (n: number, res: ServerResponse) => void;

interface Hostile {
  readonly url: string;
  /** Polls received so far. */
  readonly polls: () => number;
  /** Polls whose connection the client closed before an answer. */
  readonly abandoned: () => number;
  /** Resolves once `n` polls were received. */
  readonly polled: (n: number) => Promise<void>;
  readonly close: () => Promise<void>;
}

const servers: Hostile[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) await server.close();
});

async function hostile(answer: PollAnswer): Promise<Hostile> {
  let polls = 0;
  let abandoned = 0;
  const waiting: { n: number; resolve: () => void }[] = [];
  const json = (res: ServerResponse, status: number, body: unknown): void => {
    res.writeHead(status, { 'content-type': 'application/json' });
    res.end(JSON.stringify(body));
  };
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      if (req.url === '/api/v1/create_session') return json(res, 200, { session_id: 'held' });
      if (req.url === '/api/v1/create_model') return json(res, 200, { request_id: 'req-model' });
      if (req.url !== '/api/v1/retrieve_future') return json(res, 200, {});
      const n = polls++;
      res.on('close', () => {
        if (!res.writableEnded) abandoned++;
      });
      for (const w of waiting.filter((w) => polls >= w.n)) w.resolve();
      answer(n, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const h: Hostile = {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    polls: () => polls,
    abandoned: () => abandoned,
    polled: (n) => (polls >= n ? Promise.resolve() : new Promise((resolve) => waiting.push({ n, resolve }))),
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve()));
    },
  };
  servers.push(h);
  return h;
}

const hold: PollAnswer = () => undefined; // never answers
const answer408 = (res: ServerResponse): void => {
  res.writeHead(408, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ type: 'try_again', queue_state: 'active' }));
};
const done = (res: ServerResponse): void => {
  res.writeHead(200, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ model_id: 'held:train:0' }));
};

function connect(url: string, options: Partial<TinkerClientOptions> = {}): Promise<TinkerClient> {
  // No retries at all: a 408 or a held poll must not need one.
  return TinkerClient.connect({ baseURL: url, apiKey: 'unused', retry: { retries: 0 }, heartbeatMs: 60_000, ...options });
}

describe("the Tinker client's wait for a future (a service that holds its polls)", () => {
  it('polls again after a 408 ("not yet"), which is no failed attempt, and returns the result', async () => {
    const server = await hostile((n, res) => setTimeout(() => (n < 3 ? answer408(res) : done(res)), 20));
    const client = await connect(server.url, { futureTimeoutMs: 60_000 });
    try {
      expect(await client.createLoraModel('tiny', 2)).toBe('held:train:0');
      expect(server.polls()).toBe(4);
    } finally {
      await client.close();
    }
  });

  it('gives a held poll up after pollTimeoutMs and polls again', async () => {
    const server = await hostile((n, res) => (n < 2 ? hold(n, res) : done(res)));
    const client = await connect(server.url, { futureTimeoutMs: 60_000, pollTimeoutMs: 100 });
    try {
      expect(await client.createLoraModel('tiny', 2)).toBe('held:train:0');
      expect(server.polls()).toBe(3);
      expect(server.abandoned()).toBe(2);
    } finally {
      await client.close();
    }
  });

  it('ends at futureTimeoutMs, one deadline over all polls, with a TinkerError saying the service is lost', async () => {
    const server = await hostile(hold);
    const client = await connect(server.url, { futureTimeoutMs: 300, pollTimeoutMs: 60_000 });
    try {
      const error = await client.createLoraModel('tiny', 2).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(TinkerError);
      expect((error as TinkerError).context).toMatchObject({ lost: true, requestId: 'req-model', timeoutMs: 300 });
      expect(tinkerServiceLost(error)).toBe(true);
      expect(server.polls()).toBe(1);
    } finally {
      await client.close();
    }
  });

  it("ends the poll in flight at once when the run's stop signal fires (an AbortError)", async () => {
    const server = await hostile(hold);
    const stop = new AbortController();
    const client = await connect(server.url, { futureTimeoutMs: 600_000, pollTimeoutMs: 600_000, signal: stop.signal });
    try {
      const pending = client.createLoraModel('tiny', 2).catch((e: unknown) => e);
      await server.polled(1);
      stop.abort();
      const error = await pending;
      expect(error).toBeInstanceOf(AbortError);
      expect(isAbortError(error)).toBe(true);
      await expect.poll(() => server.abandoned()).toBe(1); // the held request itself was closed
    } finally {
      await client.close();
    }
  });
});
