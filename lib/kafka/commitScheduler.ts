/**
 * Commit scheduling for at-least-once consumption: acknowledgements are gathered for a short interval into one
 * offset commit, at most one commit is in flight, failures are counted (a rebalance does not count) and, past a
 * limit, reported once as fatal. Plain state over an injected commit function and timer, so it runs without a
 * broker and without real time; `fromKafka` wires it to a kafkajs consumer.
 *
 * @packageDocumentation
 */

import { KafkaBridgeError } from './errors.js';
import { OffsetTracker, type CommitOffset } from './offsets.js';
import type { KafkaEventType } from './types.js';

/** Receives a {@link KafkaEvent}'s type and payload; the caller wraps them in the envelope. */
export type KafkaEventSink = (type: KafkaEventType, payload: Readonly<Record<string, unknown>>) => void;

/** Runs `callback` once after `delayMs`; returns what cancels it. */
export type ScheduleTimeout = (callback: () => void, delayMs: number) => () => void;

/** {@link ScheduleTimeout} over the global `setTimeout`. */
export const scheduleTimeout: ScheduleTimeout = (callback, delayMs) => {
  const handle = setTimeout(callback, delayMs);
  return () => clearTimeout(handle);
};

/** Consecutive failed commits (each retried by kafkajs) after which the stream errors. */
export const MAX_COMMIT_FAILURES = 5;

/** kafkajs's messages (its non-retriable wrapper keeps only the message) for a member the group has moved past. */
const REBALANCE_MESSAGE = /coordinator is not aware of this member|group is rebalancing|generation id is not valid/i;
const REBALANCE_TYPES = new Set(['UNKNOWN_MEMBER_ID', 'REBALANCE_IN_PROGRESS', 'ILLEGAL_GENERATION']);

/**
 * Whether a failed commit failed because the group rebalanced past this member (a stall longer than its session,
 * say): kafkajs rejoins by itself, and the offsets not committed are delivered again to the partitions' owners —
 * at-least-once, as designed — so such failures do not count towards giving up.
 *
 * @internal
 */
export function isRebalanceCommitError(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e !== undefined && e !== null && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const { type, message } = e as { type?: unknown; message?: unknown };
    if (typeof type === 'string' && REBALANCE_TYPES.has(type)) return true;
    if (typeof message === 'string' && REBALANCE_MESSAGE.test(message)) return true;
  }
  return false;
}

/** Options of {@link CommitScheduler}. */
export interface CommitSchedulerOptions {
  /** Commits offsets (kafkajs's `consumer.commitOffsets`); a rejection counts as a failed commit. */
  readonly commit: (offsets: readonly CommitOffset[]) => Promise<void>;
  /** Delay that gathers acknowledgements into one commit, in ms. */
  readonly intervalMs: number;
  /** Receives `kafka.commit` (`offsets`) and `kafka.commit_failed` (`error`, `failures`, `rebalance`). */
  readonly emit: KafkaEventSink;
  /** Called with a {@link KafkaBridgeError} each time a commit fails and `maxFailures` failed in a row. */
  readonly onGiveUp: (error: KafkaBridgeError) => void;
  /** Consecutive non-rebalance failures before {@link onGiveUp}. Default {@link MAX_COMMIT_FAILURES}. */
  readonly maxFailures?: number | undefined;
  /** The timer. Default {@link scheduleTimeout}. */
  readonly schedule?: ScheduleTimeout;
  /** The offsets' bookkeeping. Default a new {@link OffsetTracker}. */
  readonly tracker?: OffsetTracker;
}

/**
 * Turns acknowledgements into offset commits, `intervalMs` after the first acknowledgement not yet committed.
 *
 * @example
 * ```ts
 * const commits = new CommitScheduler({ commit: (o) => consumer.commitOffsets([...o]), intervalMs: 20, emit, onGiveUp });
 * const ack = commits.deliver('t', 0, '5');
 * ack();                   // a commit of offset 6 of t/0 runs in 20 ms
 * commits.stop();          // no more timed commits …
 * await commits.flush();   // … but the final one
 * ```
 */
export class CommitScheduler {
  private readonly tracker: OffsetTracker;
  private readonly schedule: ScheduleTimeout;
  private readonly maxFailures: number;
  private cancelTimer: (() => void) | undefined;
  private committing: Promise<void> | undefined;
  private commitAgain = false;
  private failures = 0;
  private stopped = false;

  constructor(private readonly options: CommitSchedulerOptions) {
    this.tracker = options.tracker ?? new OffsetTracker();
    this.schedule = options.schedule ?? scheduleTimeout;
    this.maxFailures = options.maxFailures ?? MAX_COMMIT_FAILURES;
  }

  /** Consecutive failed commits that counted (rebalances do not). */
  get consecutiveFailures(): number {
    return this.failures;
  }

  /**
   * Records the delivery of an offset; returns its acknowledgement, which marks the offset done (see
   * {@link OffsetTracker.deliver}) and schedules a commit.
   */
  deliver(topic: string, partition: number, offset: string): () => void {
    const done = this.tracker.deliver(topic, partition, offset);
    return () => {
      done();
      this.request();
    };
  }

  /** Forgets the partitions not in `assignment` (a rebalance took them away); see {@link OffsetTracker.retain}. */
  retain(assignment: Readonly<Record<string, readonly number[]>>): void {
    this.tracker.retain(assignment);
  }

  /** Schedules a commit in `intervalMs`, unless one is scheduled already or the scheduler is stopped. */
  request(): void {
    if (this.stopped || this.cancelTimer !== undefined) return;
    this.cancelTimer = this.schedule(() => {
      this.cancelTimer = undefined;
      void this.flush();
    }, this.options.intervalMs);
  }

  /** Cancels the scheduled commit and schedules no more; {@link flush} still commits (the final commit). */
  stop(): void {
    this.stopped = true;
    this.cancelTimer?.();
    this.cancelTimer = undefined;
  }

  /**
   * Commits what may be committed now. While a commit is in flight, asks it to commit again when it is done and
   * returns its promise. Never rejects: a failure is reported through `emit` and `onGiveUp`.
   */
  flush(): Promise<void> {
    if (this.committing) {
      this.commitAgain = true;
      return this.committing;
    }
    // A flush that arrives after the loop's last check and before this promise lets go still sets `commitAgain`
    // and gets this promise: it commits once more before settling (a failed commit waits for the next flush).
    this.committing = this.commitLoop().then((ok) => {
      this.committing = undefined;
      return ok && this.commitAgain ? this.flush() : undefined;
    });
    return this.committing;
  }

  /** Commits until no flush asked again meanwhile; false after a failed commit. */
  private async commitLoop(): Promise<boolean> {
    do {
      this.commitAgain = false;
      const offsets = this.tracker.committable();
      if (offsets.length === 0) continue;
      try {
        await this.options.commit(offsets);
        this.tracker.markCommitted(offsets);
        this.failures = 0;
        this.options.emit('kafka.commit', { offsets });
      } catch (error) {
        this.failed(error);
        return false;
      }
    } while (this.commitAgain);
    return true;
  }

  private failed(error: unknown): void {
    const rebalance = isRebalanceCommitError(error);
    if (!rebalance) this.failures++;
    this.options.emit('kafka.commit_failed', { error: String(error), failures: this.failures, rebalance });
    if (this.failures >= this.maxFailures) {
      this.options.onGiveUp(
        new KafkaBridgeError(`offset commit failed ${this.failures} times in a row: ${String(error)}`, { cause: error }),
      );
    }
  }
}
