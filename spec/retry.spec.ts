import { describe, expect, it } from 'vitest';

import { AbortError, ConfigError, EngineError, RetriesExhaustedError, ShapeError } from '../lib/core/errors.js';
import { RETRY_DEFAULTS, RETRY_TEST_DEFAULTS, isProgrammerError, retry, retryDefaults, retryDelay, sleep } from '../lib/core/retry.js';

const transient = (): EngineError => new EngineError('try again', { retriable: true });

describe('retry', () => {
  it('uses the fast defaults under test', () => {
    expect(process.env.NODE_ENV).toBe('test');
    expect(retryDefaults()).toBe(RETRY_TEST_DEFAULTS);
    expect(RETRY_DEFAULTS.initialDelayMs).toBeGreaterThan(RETRY_TEST_DEFAULTS.initialDelayMs);
  });

  it('grows delays exponentially up to the cap, with jitter inside its band', () => {
    const options = { initialDelayMs: 10, maxDelayMs: 100, multiplier: 2, jitter: 0.2 };
    expect([1, 2, 3, 4, 5].map((a) => retryDelay(a, options, 0.5))).toEqual([10, 20, 40, 80, 100]);
    expect(retryDelay(2, options, 0)).toBeCloseTo(16);
    expect(retryDelay(2, options, 0.999999)).toBeCloseTo(24, 3);
    expect(retryDelay(9, options, 0.999999)).toBe(100);
    expect(retryDelay(3, { ...options, jitter: 0 }, 0.9)).toBe(40);
  });

  it('with a deadline: retries without a count until the next wait would end past it, then gives up naming it', async () => {
    let clock = 0;
    let calls = 0;
    const waits: number[] = [];
    const error = await retry(
      async () => {
        calls++;
        clock += 100; // each attempt takes 100 ms of the injected clock
        throw transient();
      },
      {
        retries: Infinity,
        deadlineMs: 1_000,
        initialDelayMs: 1,
        maxDelayMs: 1,
        jitter: 0,
        now: () => clock,
        onRetry: (e) => waits.push(e.delayMs),
      },
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RetriesExhaustedError);
    expect((error as RetriesExhaustedError).context).toEqual({ attempts: 10, deadlineMs: 1_000 });
    expect((error as Error).cause).toBeInstanceOf(EngineError);
    expect(calls).toBe(10); // at 1000 ms the next 1 ms wait would end past the deadline
    expect(waits).toEqual(Array(9).fill(1));
    await expect(retry(async () => 1, { retries: Infinity })).rejects.toBeInstanceOf(ConfigError); // no count, no deadline: refused
    await expect(retry(async () => 1, { deadlineMs: -1 })).rejects.toBeInstanceOf(ConfigError);
  });

  it('retries retriable errors, reporting each wait, until the operation succeeds', async () => {
    const seen: number[] = [];
    let calls = 0;
    const value = await retry(
      async (attempt) => {
        calls++;
        expect(attempt).toBe(calls);
        if (attempt < 3) throw transient();
        return 'done';
      },
      { retries: 5, initialDelayMs: 1, onRetry: (e) => seen.push(e.attempt) },
    );
    expect(value).toBe('done');
    expect(seen).toEqual([1, 2]);
  });

  it('gives up after the last retry with RetriesExhaustedError holding the last error', async () => {
    let calls = 0;
    const last = transient();
    const error = await retry(
      async () => {
        calls++;
        throw calls === 3 ? last : transient();
      },
      { retries: 2, initialDelayMs: 1 },
    ).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RetriesExhaustedError);
    expect((error as RetriesExhaustedError).cause).toBe(last);
    expect((error as RetriesExhaustedError).context.attempts).toBe(3);
    expect((error as RetriesExhaustedError).retriable).toBe(false);
    expect(calls).toBe(3);
  });

  it('never retries non-retriable errors, nor programmer errors whatever the predicate says', async () => {
    const attempts = async (thrown: Error, isRetriable?: () => boolean): Promise<number> => {
      let calls = 0;
      const error = await retry(
        async () => {
          calls++;
          throw thrown;
        },
        { retries: 3, initialDelayMs: 1, isRetriable },
      ).catch((e: unknown) => e);
      expect(error).toBe(thrown);
      return calls;
    };
    expect(await attempts(new EngineError('400', { retriable: false }))).toBe(1);
    expect(await attempts(new Error('plain'))).toBe(1);
    for (const bug of [
      new TypeError('x is undefined'),
      new RangeError('r'),
      new SyntaxError('s'),
      new ConfigError('c'),
      new ShapeError('s'),
    ]) {
      expect(isProgrammerError(bug)).toBe(true);
      expect(await attempts(bug, () => true)).toBe(1);
    }
  });

  it('stops waiting and attempting when the signal fires', async () => {
    const controller = new AbortController();
    let calls = 0;
    const done = retry(
      async () => {
        calls++;
        throw transient();
      },
      { retries: 10, initialDelayMs: 60_000, signal: controller.signal },
    );
    await Promise.resolve();
    controller.abort();
    await expect(done).rejects.toBeInstanceOf(AbortError);
    expect(calls).toBe(1);
    await expect(retry(async () => 1, { signal: controller.signal })).rejects.toBeInstanceOf(AbortError);
    await expect(sleep(1, controller.signal)).rejects.toBeInstanceOf(AbortError);
  });

  it('rejects invalid settings', async () => {
    await expect(retry(async () => 1, { retries: -1 })).rejects.toBeInstanceOf(ConfigError);
    await expect(retry(async () => 1, { jitter: 2 })).rejects.toBeInstanceOf(ConfigError);
    await expect(retry(async () => 1, { multiplier: 0.5 })).rejects.toBeInstanceOf(ConfigError);
  });
});
