import { describe, expect, it } from 'vitest';
import { LocalEngine, type SamplingModel } from '../../lib/engine/local.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../../lib/model/types.js';
import { AbortError, ConfigError } from '../../lib/core/errors.js';
import { tinyTokenizer } from '../helpers/fixtures.js';

/** Echoes the last prompt token plus the weight value; records each batch. */
class EchoModel implements SamplingModel {
  batches: number[] = [];
  weight = 0;
  active = 0;
  overlapped = false;
  async generate(requests: readonly GenerateRequest[], options: { signal?: AbortSignal; version?: number }): Promise<GenerateResponse[]> {
    this.batches.push(requests.length);
    this.active++;
    if (this.active > 1) this.overlapped = true;
    await new Promise((resolve) => setTimeout(resolve, 5));
    this.active--;
    return requests.map((r) => ({
      tokens: [r.promptTokens[r.promptTokens.length - 1] + this.weight],
      logprobs: [-1],
      finishReason: options.signal?.aborted ? 'abort' : 'stop',
      policyVersion: options.version ?? 0,
    }));
  }
  setWeights(weights: NamedWeights): void {
    this.weight = weights.get('w')!.data[0];
  }
}

const req = (last: number): GenerateRequest => ({ promptTokens: [1, last], maxTokens: 1 });
const weights = (value: number): NamedWeights => new Map([['w', { shape: [1], data: new Float32Array([value]) }]]);

describe('LocalEngine', () => {
  it('gathers concurrent calls into one batch, in request order, one batch at a time', async () => {
    const model = new EchoModel();
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxBatchSize: 8, maxWaitMs: 5 });
    const results = await Promise.all([1, 2, 3, 4].map((i) => engine.generate([req(i), req(i + 10)])));
    expect(results.map((r) => r.map((x) => x.tokens[0]))).toEqual([
      [1, 11],
      [2, 12],
      [3, 13],
      [4, 14],
    ]);
    expect(model.batches).toEqual([8]);
    const more = await Promise.all(Array.from({ length: 20 }, (_, i) => engine.generate([req(i)])));
    expect(more.map((r) => r[0].tokens[0])).toEqual(Array.from({ length: 20 }, (_, i) => i));
    expect(model.batches.slice(1).every((n) => n <= 8)).toBe(true);
    expect(model.batches.slice(1).reduce((a, b) => a + b, 0)).toBe(20);
    expect(model.overlapped).toBe(false);
  });

  it('loads weights between batches and tags responses with the version that made them', async () => {
    const model = new EchoModel();
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxWaitMs: 0 });
    const first = engine.generate([req(1)]);
    await new Promise((resolve) => setTimeout(resolve, 1));
    const load = engine.loadWeights(3, weights(100));
    const second = engine.generate([req(1)]);
    const [a] = await first;
    await load;
    const [b] = await second;
    expect([a.tokens[0], a.policyVersion]).toEqual([1, 0]);
    expect([b.tokens[0], b.policyVersion]).toEqual([101, 3]);
    expect(engine.version).toBe(3);
  });

  it('sharing the trainer’s model, a load moves the version between batches and leaves the weights alone', async () => {
    const model = new EchoModel();
    model.weight = 7; // what the trainer left in its model
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxWaitMs: 0, sharesTrainerWeights: true });
    expect(engine.sharesTrainerWeights).toBe(true);
    const first = engine.generate([req(1)]);
    await new Promise((resolve) => setTimeout(resolve, 1));
    const load = engine.loadWeights(2, new Map());
    const second = engine.generate([req(1)]);
    const [a] = await first;
    await load;
    const [b] = await second;
    expect([a.tokens[0], a.policyVersion]).toEqual([8, 0]);
    expect([b.tokens[0], b.policyVersion]).toEqual([8, 2]);
    expect(model.weight).toBe(7);
  });

  it('a load waiting for a running batch ends at once with an AbortError when its signal fires, and changes nothing', async () => {
    // The first batch runs until the spec releases it: only the signal can end the load's wait.
    const model = new EchoModel();
    let release: () => void = () => undefined;
    let started: () => void = () => undefined;
    const running = new Promise<void>((resolve) => (started = resolve));
    const generate = model.generate.bind(model);
    let held = true;
    model.generate = async (requests, options) => {
      if (held) {
        started();
        await new Promise<void>((resolve) => (release = resolve));
        held = false;
      }
      return generate(requests, options);
    };
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxWaitMs: 0 });
    const first = engine.generate([req(1)]);
    await running;
    const stop = new AbortController();
    const load = engine.loadWeights(3, weights(100), stop.signal);
    stop.abort();
    const error = await load.catch((e: unknown) => e);
    expect(error).toBeInstanceOf(AbortError);
    expect((error as AbortError).context).toEqual({ version: 3 });
    release();
    expect((await first)[0].tokens).toEqual([1]);
    // Dropped: neither the weights nor the version moved, and the engine serves on; a later load goes through.
    const [after] = await engine.generate([req(1)]);
    expect([after.tokens[0], after.policyVersion, engine.version]).toEqual([1, 0, 0]);
    await engine.loadWeights(4, weights(10), new AbortController().signal);
    expect(engine.version).toBe(4);
    const gone = new AbortController();
    gone.abort();
    await expect(engine.loadWeights(5, weights(1), gone.signal)).rejects.toBeInstanceOf(AbortError);
    expect(engine.version).toBe(4);
  });

  it('rejects aborted requests and keeps serving the rest', async () => {
    const model = new EchoModel();
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxWaitMs: 5 });
    const controller = new AbortController();
    controller.abort();
    await expect(engine.generate([req(1)], controller.signal)).rejects.toBeInstanceOf(AbortError);
    const later = new AbortController();
    const cancelled = engine.generate([req(2)], later.signal);
    const kept = engine.generate([req(3)]);
    later.abort();
    await expect(cancelled).rejects.toBeInstanceOf(AbortError);
    expect((await kept)[0].tokens).toEqual([3]);
  });

  it('gives the event loop a turn before each batch, however many are queued', async () => {
    // Counts turns of the event loop: each one polls sockets (a server's /health) before the next runs.
    let turn = 0;
    let ticking = true;
    const tick = (): void => {
      turn++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const started: number[] = [];
    const model = new EchoModel();
    model.generate = async (requests) => {
      started.push(turn);
      return requests.map((r) => ({ tokens: [r.promptTokens[1]], logprobs: [-1], finishReason: 'stop' as const, policyVersion: 0 }));
    };
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer, maxBatchSize: 4, maxWaitMs: 0 });
    const responses = await engine.generate(Array.from({ length: 16 }, (_, i) => req(i)));
    ticking = false;
    expect(responses.map((r) => r.tokens[0])).toEqual(Array.from({ length: 16 }, (_, i) => i));
    expect(engine.batchSizes).toEqual([4, 4, 4, 4]);
    started
      .slice(1)
      .forEach((t, i) => expect(t, `batch ${i + 1} started on turn ${t}, batch ${i} on ${started[i]}`).toBeGreaterThan(started[i]));
  });

  it('passes model failures to every request of the batch', async () => {
    const model = new EchoModel();
    model.generate = () => Promise.reject(new Error('kernel failed'));
    const engine = new LocalEngine(model, { tokenizer: tinyTokenizer });
    await expect(engine.generate([req(1), req(2)])).rejects.toThrow('kernel failed');
    expect(() => new LocalEngine(model, { tokenizer: tinyTokenizer, maxBatchSize: 0 })).toThrow(ConfigError);
  });
});
