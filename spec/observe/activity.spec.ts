import { describe, expect, it } from 'vitest';
import { AbortError, ConfigError, isAbortError } from '../../lib/core/errors.js';
import { ActivityOverflowError, ActivityTracker, StalledError, watchStalls } from '../../lib/observe/index.js';

function clock(): () => number {
  let t = 0;
  return () => ++t;
}

describe('ActivityTracker', () => {
  it('counts in-flight work per module in its snapshot', () => {
    const tracker = new ActivityTracker({ now: clock() });
    const a = tracker.begin('rollout');
    const b = tracker.begin('rollout');
    const c = tracker.begin('trainer');
    expect(tracker.snapshot()).toEqual({
      at: 4,
      inFlight: 3,
      modules: {
        rollout: { inFlight: 2, started: 2, completed: 0, failed: 0, oldestStartedAt: 1, idleSeconds: 0.003, stalled: false },
        trainer: { inFlight: 1, started: 1, completed: 0, failed: 0, oldestStartedAt: 3, idleSeconds: 0.001, stalled: false },
      },
      workers: {},
      stalled: [],
    });
    a.done(); // t = 5
    a.done(); // idempotent
    c.done(); // t = 6
    expect(tracker.snapshot()).toEqual({
      at: 7,
      inFlight: 1,
      modules: {
        // Idle since its last end (t = 5), which is later than its oldest open start (t = 2).
        rollout: {
          inFlight: 1,
          started: 2,
          completed: 1,
          failed: 0,
          oldestStartedAt: 2,
          lastEndedAt: 5,
          idleSeconds: 0.002,
          stalled: false,
        },
        trainer: { inFlight: 0, started: 1, completed: 1, failed: 0, lastEndedAt: 6, idleSeconds: 0, stalled: false },
      },
      workers: {},
      stalled: [],
    });
    b.done();
    expect(tracker.inFlight).toBe(0);
  });

  it('quiescent() resolves at once when idle, else when the last activity is done', async () => {
    const tracker = new ActivityTracker();
    await tracker.quiescent();
    const a = tracker.begin('rollout');
    const b = tracker.begin('checkpoint');
    let settled = false;
    const waiting = tracker.quiescent().then(() => (settled = true));
    const second = tracker.quiescent();
    a.done();
    await Promise.resolve();
    expect(settled).toBe(false);
    b.done();
    await Promise.all([waiting, second]);
    expect(settled).toBe(true);
  });

  it('track() closes the activity whether the work resolves or rejects', async () => {
    const tracker = new ActivityTracker();
    let during = -1;
    await expect(
      tracker.track('trainer', async () => {
        during = tracker.inFlight;
        return 7;
      }),
    ).resolves.toBe(7);
    expect(during).toBe(1);
    await expect(tracker.track('trainer', Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    const trainer = tracker.snapshot().modules.trainer;
    expect(trainer).toMatchObject({ inFlight: 0, started: 2, completed: 1, failed: 1 });
    expect(trainer.lastError).toMatchObject({ name: 'Error', message: 'boom' });
  });

  it('is bounded: one activity past capacity is an ActivityOverflowError with context', () => {
    const tracker = new ActivityTracker({ capacity: 2 });
    tracker.begin('rollout');
    const b = tracker.begin('rollout');
    let error: unknown;
    try {
      tracker.begin('trainer');
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ActivityOverflowError);
    expect((error as ActivityOverflowError).context).toEqual({ module: 'trainer', inFlight: 2, capacity: 2 });
    expect((error as ActivityOverflowError).retriable).toBe(false);
    b.done();
    expect(() => tracker.begin('trainer')).not.toThrow();
    expect(() => new ActivityTracker({ capacity: 0 })).toThrow(ConfigError);
  });

  it('quiescent(signal) rejects with an AbortError when aborted, and leaves other waiters alone', async () => {
    const tracker = new ActivityTracker();
    const a = tracker.begin('rollout');
    const controller = new AbortController();
    const aborted = tracker.quiescent(controller.signal);
    const other = tracker.quiescent();
    controller.abort();
    await expect(aborted).rejects.toBeInstanceOf(AbortError);
    a.done();
    await other;
    const pre = new AbortController();
    pre.abort();
    await expect(tracker.quiescent(pre.signal)).rejects.toSatisfy(isAbortError);
  });
});

describe('ActivityTracker stalls, holds and workers', () => {
  /** A clock the test moves. */
  function manual(): { now: () => number; advance: (ms: number) => void } {
    let t = 0;
    return { now: () => t, advance: (ms) => (t += ms) };
  }

  it('a module with work in flight and nothing ended for stallSeconds is stalled; an end clears it', () => {
    const clock = manual();
    const tracker = new ActivityTracker({ now: clock.now, stallSeconds: 10 });
    const first = tracker.begin('rollout');
    const second = tracker.begin('rollout');
    clock.advance(4_000);
    first.done(); // progress at t = 4 s
    clock.advance(9_000);
    expect(tracker.snapshot().modules.rollout).toMatchObject({ idleSeconds: 9, stalled: false });
    clock.advance(1_000);
    const stalledNow = tracker.snapshot();
    expect(stalledNow.modules.rollout).toMatchObject({ inFlight: 1, idleSeconds: 10, stalled: true });
    expect(stalledNow.stalled).toEqual(['rollout']);
    second.fail(new TypeError('no answer'));
    const after = tracker.snapshot();
    expect(after.stalled).toEqual([]);
    expect(after.modules.rollout).toMatchObject({
      failed: 1,
      stalled: false,
      lastError: { name: 'TypeError', message: 'no answer', at: 14_000 },
    });
  });

  it('held items are shown and never stall; stalled modules are listed longest idle first', () => {
    const clock = manual();
    const tracker = new ActivityTracker({ now: clock.now, stallSeconds: 1 });
    tracker.hold('store', 3);
    tracker.begin('trainer');
    clock.advance(1_000);
    tracker.begin('checkpoint');
    clock.advance(2_000);
    const snapshot = tracker.snapshot();
    expect(snapshot.modules.store).toMatchObject({ held: 3, inFlight: 0, stalled: false });
    expect(snapshot.stalled).toEqual(['trainer', 'checkpoint']);
  });

  it('a worker is up while it beats, left after its last beat, gone after workerGoneMs of silence', () => {
    const clock = manual();
    const tracker = new ActivityTracker({ now: clock.now, workerGoneMs: 3_000 });
    const beat = { run: 'r1', inFlight: 2, done: 5, failed: 1, version: 4 };
    tracker.heartbeat({ worker: 'w-a', ...beat });
    tracker.heartbeat({ worker: 'w-b', ...beat, version: undefined });
    clock.advance(2_000);
    tracker.heartbeat({ worker: 'w-b', ...beat, inFlight: 0, leaving: true });
    expect(tracker.snapshot().workers).toEqual({
      'w-a': { run: 'r1', inFlight: 2, done: 5, failed: 1, version: 4, lastBeatAt: 0, beatAgeSeconds: 2, state: 'up' },
      'w-b': { run: 'r1', inFlight: 0, done: 5, failed: 1, version: 4, lastBeatAt: 2_000, beatAgeSeconds: 0, state: 'left' },
    });
    clock.advance(1_000);
    expect(tracker.snapshot().workers['w-a'].state).toBe('gone');
    expect(() => new ActivityTracker({ stallSeconds: 0 })).toThrow(ConfigError);
  });

  it('watchStalls warns once per stall, says when it ends, and fails once naming the module stalled last', async () => {
    const clock = manual();
    const tracker = new ActivityTracker({ now: clock.now, stallSeconds: 2 });
    const seen: string[] = [];
    const failures: StalledError[] = [];
    const stop = watchStalls(tracker, {
      failSeconds: 5,
      intervalMs: 5,
      onStall: (module) => seen.push(`stall ${module}`),
      onRecover: (module) => seen.push(`moves ${module}`),
      onFail: (error) => failures.push(error),
    });
    const tick = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 20));
    const sample = tracker.begin('rollout');
    clock.advance(2_000);
    await tick();
    await tick();
    sample.done();
    await tick();
    tracker.begin('trainer');
    clock.advance(1_000);
    tracker.begin('checkpoint'); // nested in the step: stalled last
    clock.advance(5_000);
    await tick();
    await tick();
    stop();
    expect(seen).toEqual(['stall rollout', 'moves rollout', 'stall trainer', 'stall checkpoint']);
    expect(failures).toHaveLength(1);
    expect(failures[0]).toBeInstanceOf(StalledError);
    expect(failures[0].context).toMatchObject({ module: 'checkpoint', inFlight: 1 });
    expect(failures[0].message).toContain("module 'checkpoint' stalled");
  });
});
