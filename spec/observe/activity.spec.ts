import { describe, expect, it } from 'vitest';
import { AbortError, ConfigError, isAbortError } from '../../lib/core/errors.js';
import { ActivityOverflowError, ActivityTracker } from '../../lib/observe/index.js';

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
      inFlight: 3,
      modules: {
        rollout: { inFlight: 2, started: 2, completed: 0, oldestStartedAt: 1 },
        trainer: { inFlight: 1, started: 1, completed: 0, oldestStartedAt: 3 },
      },
    });
    a.done();
    a.done(); // idempotent
    c.done();
    expect(tracker.snapshot()).toEqual({
      inFlight: 1,
      modules: {
        rollout: { inFlight: 1, started: 2, completed: 1, oldestStartedAt: 2 },
        trainer: { inFlight: 0, started: 1, completed: 1 },
      },
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
    expect(tracker.snapshot().modules.trainer).toEqual({ inFlight: 0, started: 2, completed: 2 });
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
