/** The commit scheduler behind fromKafka, over a hand-driven timer and commit function (no broker, no clock). */
import { KafkaJSProtocolError } from 'kafkajs';
import { describe, expect, it } from 'vitest';

import { CommitScheduler, type KafkaEventSink, type ScheduleTimeout } from '../../lib/kafka/commitScheduler.js';
import { isKafkaBridgeError, type KafkaBridgeError } from '../../lib/kafka/errors.js';
import type { CommitOffset } from '../../lib/kafka/offsets.js';
import type { KafkaEventType } from '../../lib/kafka/types.js';

/** A timer that fires only when told to. */
class ManualTimer {
  private pending: { callback: () => void; delayMs: number; cancelled: boolean }[] = [];
  cancels = 0;

  readonly schedule: ScheduleTimeout = (callback, delayMs) => {
    const entry = { callback, delayMs, cancelled: false };
    this.pending.push(entry);
    return () => {
      entry.cancelled = true;
      this.cancels++;
    };
  };

  /** Delays of the timers scheduled and neither fired nor cancelled. */
  get delays(): number[] {
    return this.pending.filter((e) => !e.cancelled).map((e) => e.delayMs);
  }

  /** Fires every live timer. */
  fire(): void {
    const due = this.pending.filter((e) => !e.cancelled);
    this.pending = [];
    for (const e of due) e.callback();
  }
}

/** A commit function whose calls settle when the spec says. */
class ManualCommits {
  readonly calls: { offsets: CommitOffset[]; resolve: () => void; reject: (error: unknown) => void }[] = [];

  readonly commit = (offsets: readonly CommitOffset[]): Promise<void> =>
    new Promise<void>((resolve, reject) => {
      this.calls.push({ offsets: [...offsets], resolve, reject });
    });

  get last(): (typeof this.calls)[number] {
    return this.calls[this.calls.length - 1];
  }
}

/** Lets the promise callbacks queued so far run. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await Promise.resolve();
};

function setup(maxFailures?: number) {
  const timer = new ManualTimer();
  const commits = new ManualCommits();
  const events: { type: KafkaEventType; payload: Readonly<Record<string, unknown>> }[] = [];
  const gaveUp: KafkaBridgeError[] = [];
  const emit: KafkaEventSink = (type, payload) => events.push({ type, payload });
  const scheduler = new CommitScheduler({
    commit: commits.commit,
    intervalMs: 20,
    emit,
    onGiveUp: (error) => gaveUp.push(error),
    schedule: timer.schedule,
    maxFailures,
  });
  return { timer, commits, events, gaveUp, scheduler };
}

const rebalanceError = (): Error =>
  new KafkaJSProtocolError({ message: 'The coordinator is not aware of this member', type: 'UNKNOWN_MEMBER_ID', code: 25 } as never);

describe('CommitScheduler', () => {
  it('gathers the acknowledgements of one interval into one commit, after the timer fires', async () => {
    const { timer, commits, events, scheduler } = setup();
    const acks = ['0', '1', '2'].map((o) => scheduler.deliver('t', 0, o));
    const other = scheduler.deliver('t', 1, '7');
    expect(timer.delays).toEqual([]);
    acks[0]();
    acks[1]();
    other();
    expect(timer.delays).toEqual([20]); // one timer for every acknowledgement of the interval
    expect(commits.calls).toEqual([]);
    timer.fire();
    expect(commits.calls.map((c) => c.offsets)).toEqual([
      [
        { topic: 't', partition: 0, offset: '2' },
        { topic: 't', partition: 1, offset: '8' },
      ],
    ]);
    commits.last.resolve();
    await settle();
    expect(events).toEqual([{ type: 'kafka.commit', payload: { offsets: commits.last.offsets } }]);
    acks[2]();
    expect(timer.delays).toEqual([20]);
    timer.fire();
    expect(commits.last.offsets).toEqual([{ topic: 't', partition: 0, offset: '3' }]);
  });

  it('commits a partition only up to its first unacknowledged offset', async () => {
    const { timer, commits, scheduler } = setup();
    const acks = ['10', '11', '12'].map((o) => scheduler.deliver('t', 0, o));
    acks[1]();
    acks[2]();
    timer.fire();
    expect(commits.calls).toEqual([]); // 10 is outstanding: nothing may be committed
    await settle();
    acks[0]();
    timer.fire();
    expect(commits.last.offsets).toEqual([{ topic: 't', partition: 0, offset: '13' }]);
  });

  it('keeps one commit in flight; a flush meanwhile commits again, with the newer offsets, once it is done', async () => {
    const { commits, events, scheduler } = setup();
    const a = scheduler.deliver('t', 0, '0');
    const b = scheduler.deliver('t', 0, '1');
    a();
    const first = scheduler.flush();
    b();
    const second = scheduler.flush();
    expect(second).toBe(first);
    expect(commits.calls.length).toBe(1);
    commits.last.resolve();
    await settle();
    expect(commits.calls.map((c) => c.offsets)).toEqual([
      [{ topic: 't', partition: 0, offset: '1' }],
      [{ topic: 't', partition: 0, offset: '2' }],
    ]);
    commits.last.resolve();
    await first;
    expect(events.map((e) => e.type)).toEqual(['kafka.commit', 'kafka.commit']);
  });

  it('a flush in the moment after a commit loop ended (before it let go of its promise) still commits, and its promise waits for that commit', async () => {
    const timer = new ManualTimer();
    const commits = new ManualCommits();
    let late: (() => void) | undefined;
    let lateFlush: Promise<void> | undefined;
    const scheduler: CommitScheduler = new CommitScheduler({
      commit: commits.commit,
      intervalMs: 20,
      // The commit's event queues a microtask that runs after the loop returns and before its promise settles.
      emit: (type) => {
        if (type === 'kafka.commit' && late) {
          const ack = late;
          late = undefined;
          queueMicrotask(() => {
            ack();
            lateFlush = scheduler.flush();
          });
        }
      },
      onGiveUp: () => undefined,
      schedule: timer.schedule,
    });
    scheduler.deliver('t', 0, '0')();
    late = scheduler.deliver('t', 0, '1');
    scheduler.stop(); // the final commit of a closing consumer: flush alone commits
    const first = scheduler.flush();
    commits.last.resolve();
    await settle();
    expect(lateFlush).toBeDefined();
    expect(commits.calls.map((c) => c.offsets)).toEqual([
      [{ topic: 't', partition: 0, offset: '1' }],
      [{ topic: 't', partition: 0, offset: '2' }],
    ]);
    let settled = false;
    void lateFlush!.then(() => (settled = true));
    await settle();
    expect(settled).toBe(false); // it waits for the second commit
    commits.last.resolve();
    await lateFlush;
    await first;
  });

  it('does not call commit when nothing moved', async () => {
    const { commits, events, scheduler } = setup();
    await scheduler.flush();
    scheduler.deliver('t', 0, '0')();
    const done = scheduler.flush();
    commits.last.resolve();
    await done;
    await scheduler.flush();
    expect(commits.calls.length).toBe(1);
    expect(events.length).toBe(1);
  });

  it('reports failed commits, offers their offsets again, and gives up after maxFailures in a row', async () => {
    const { commits, events, gaveUp, scheduler } = setup(3);
    scheduler.deliver('t', 0, '0')();
    const boom = new Error('broker unreachable');
    for (let i = 1; i <= 3; i++) {
      const done = scheduler.flush();
      expect(commits.last.offsets).toEqual([{ topic: 't', partition: 0, offset: '1' }]);
      commits.last.reject(boom);
      await expect(done).resolves.toBeUndefined();
      expect(scheduler.consecutiveFailures).toBe(i);
    }
    expect(events.map((e) => e.payload)).toEqual([1, 2, 3].map((failures) => ({ error: String(boom), failures, rebalance: false })));
    expect(events.every((e) => e.type === 'kafka.commit_failed')).toBe(true);
    expect(gaveUp.length).toBe(1);
    expect(isKafkaBridgeError(gaveUp[0])).toBe(true);
    expect(gaveUp[0].cause).toBe(boom);
  });

  it('does not count a rebalance against giving up; a success resets the count', async () => {
    const { commits, events, gaveUp, scheduler } = setup(2);
    scheduler.deliver('t', 0, '0')();
    let done = scheduler.flush();
    commits.last.reject(new Error('transient'));
    await done;
    for (let i = 0; i < 3; i++) {
      done = scheduler.flush();
      commits.last.reject(rebalanceError());
      await done;
    }
    expect(scheduler.consecutiveFailures).toBe(1);
    expect(events.slice(1).map((e) => e.payload.rebalance)).toEqual([true, true, true]);
    done = scheduler.flush();
    commits.last.resolve();
    await done;
    expect(scheduler.consecutiveFailures).toBe(0);
    scheduler.deliver('t', 0, '1')();
    done = scheduler.flush();
    commits.last.reject(new Error('transient'));
    await done;
    expect(gaveUp).toEqual([]);
    expect(scheduler.consecutiveFailures).toBe(1);
  });

  it('stop() cancels the scheduled commit and schedules no more, but flush() still makes the final commit', async () => {
    const { timer, commits, scheduler } = setup();
    const a = scheduler.deliver('t', 0, '0');
    const b = scheduler.deliver('t', 0, '1');
    a();
    expect(timer.delays).toEqual([20]);
    scheduler.stop();
    expect(timer.delays).toEqual([]);
    expect(timer.cancels).toBe(1);
    b();
    expect(timer.delays).toEqual([]);
    const final = scheduler.flush();
    expect(commits.last.offsets).toEqual([{ topic: 't', partition: 0, offset: '2' }]);
    commits.last.resolve();
    await final;
  });

  it('after a rebalance, the revoked partitions commit nothing, not even their late acknowledgements', async () => {
    const { timer, commits, scheduler } = setup();
    const lost = scheduler.deliver('t', 0, '4');
    const kept = scheduler.deliver('t', 1, '9');
    scheduler.retain({ t: [1] });
    lost();
    kept();
    timer.fire();
    expect(commits.last.offsets).toEqual([{ topic: 't', partition: 1, offset: '10' }]);
  });
});
