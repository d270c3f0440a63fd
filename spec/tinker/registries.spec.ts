/**
 * The bounded registries of rxrl's Tinker service, without HTTP: futures (in flight, results kept), training
 * clients and sessions (room, freeing after queued work, silent sessions), named sampler weights (count, bytes,
 * least recently used first).
 */
import { beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { RequestError } from '../../lib/serve/protocol.js';
import { TrainingClients } from '../../lib/tinker/clients.js';
import { FutureStore, type Outcome } from '../../lib/tinker/futures.js';
import { SamplerWeights, type AdapterSnapshot } from '../../lib/tinker/sampling.js';
import { TinkerTrainer } from '../../lib/tinker/training.js';

let base: PolicyModel;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  base = PolicyModel.create({ vocabSize: 11, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 }, 3);
});

/** A snapshot of `floats` float32 values. */
const snapshot = (floats: number): AdapterSnapshot => ({
  weights: new Map([['w', { shape: [floats], data: new Float32Array(floats) }]]),
  rank: 1,
});

const status = (fn: () => unknown): number | undefined => {
  try {
    fn();
    return undefined;
  } catch (error) {
    return error instanceof RequestError ? error.status : -1;
  }
};

describe('FutureStore', () => {
  it('refuses past maxInFlight with 429, runs a queue in order, and keeps only maxFinished results', async () => {
    const store = new FutureStore({ maxInFlight: 2, maxFinished: 1 });
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const queue = { tail: Promise.resolve() as Promise<unknown> };
    const order: number[] = [];
    const a = store.submit(async () => {
      await gate;
      order.push(1);
      return { json: 1 };
    }, queue);
    const b = store.submit(() => {
      order.push(2);
      return { json: 2 };
    }, queue);
    expect(status(() => store.submit(() => ({ json: 3 })))).toBe(429);
    release();
    await store.settled();
    expect(order).toEqual([1, 2]);
    expect(store.get(a)).toBeUndefined(); // dropped: only the newest settled result is kept
    expect(await store.get(b)?.outcome).toEqual({ json: 2 });
  });

  it("reports rxrl errors as the client's, anything else as a bare internal error", async () => {
    const store = new FutureStore({ maxInFlight: 4, maxFinished: 4 });
    const user = store.submit(() => {
      throw new RequestError(400, 'bad datum');
    });
    const bug = store.submit(() => {
      throw new TypeError("Cannot read properties of undefined (reading 'backend')");
    });
    expect(await store.get(user)?.outcome).toEqual({ error: 'bad datum', category: 'user' } satisfies Outcome);
    expect(await store.get(bug)?.outcome).toEqual({ error: 'internal error', category: 'server' } satisfies Outcome);
  });
});

describe('TrainingClients', () => {
  it('counts a freed client until its queued work is done, then disposes it; finishing a session frees its clients', async () => {
    const clients = new TrainingClients({ maxModels: 1, maxSessions: 4, sessionTimeoutMs: 60_000 });
    try {
      const s = clients.openSession();
      const client = clients.add(clients.reserve(s, undefined), s, new TinkerTrainer(base, 1, 0));
      let release!: () => void;
      client.queue.tail = new Promise<void>((resolve) => (release = resolve));
      const freed = clients.free(client);
      expect(status(() => clients.get(client.id))).toBe(404);
      expect(status(() => clients.reserve(s, undefined))).toBe(429); // still being freed
      release();
      await freed;
      const second = clients.add(clients.reserve(s, undefined), s, new TinkerTrainer(base, 1, 0));
      expect(second.id).toBe(`${s}:train:1`);
      clients.finish(s);
      expect(status(() => clients.get(second.id))).toBe(404);
      expect(clients.touch(s)).toBe(false);
      expect(status(() => clients.reserve(s, 0))).toBe(404);
    } finally {
      await clients.close();
    }
  });

  it('ends sessions silent past sessionTimeoutMs and bounds the sessions open', async () => {
    let now = 0;
    const clients = new TrainingClients({ maxModels: 2, maxSessions: 2, sessionTimeoutMs: 100 }, () => now);
    try {
      const silent = clients.openSession();
      const live = clients.openSession();
      expect(status(() => clients.openSession())).toBe(429);
      const client = clients.add(clients.reserve(silent, undefined), silent, new TinkerTrainer(base, 1, 0));
      now = 60;
      clients.touch(live);
      now = 120;
      clients.expire();
      expect(clients.touch(silent)).toBe(false);
      expect(clients.touch(live)).toBe(true);
      expect(status(() => clients.get(client.id))).toBe(404);
      expect(clients.openSession()).toMatch(/^sess-/);
    } finally {
      await clients.close();
    }
  });
});

describe('SamplerWeights', () => {
  it('keeps at most maxCount names and maxBytes bytes, dropping the least recently used', () => {
    const store = new SamplerWeights({ maxCount: 3, maxBytes: 4 * 100 });
    store.set('a', snapshot(10));
    store.set('b', snapshot(10));
    store.set('c', snapshot(10));
    store.get('a'); // now the most recently used
    store.set('d', snapshot(10));
    expect(status(() => store.get('b'))).toBe(404);
    expect(store.size).toBe(3);
    store.set('e', snapshot(80)); // 320 bytes: with it, two of the 40-byte ones fit in 400 (c, the oldest, goes)
    expect(store.size).toBe(3);
    expect(status(() => store.get('c'))).toBe(404);
    expect(status(() => store.get('e'))).toBeUndefined();
    expect(status(() => store.set('f', snapshot(101)))).toBe(400); // larger than the bound alone: refused, nothing dropped
    expect(store.size).toBe(3);
  });
});
