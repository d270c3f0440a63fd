/**
 * Pause/resume decisions of a consumer with bounded demand: records count as in flight from their emission until
 * their acknowledgement; at `capacity` the source pauses, below `resumeBelow` it resumes. Plain state over injected
 * pause and resume actions; `fromKafka` wires it to a kafkajs consumer.
 *
 * @packageDocumentation
 */

import { ConfigError } from '../core/errors.js';
import type { KafkaEventSink } from './commitScheduler.js';

/** Options of {@link FlowController}. */
export interface FlowControllerOptions {
  /** Most records in flight; at this many the source pauses. An integer >= 1. */
  readonly capacity: number;
  /** The source resumes once fewer than this many are in flight. An integer in `[1, capacity]`. */
  readonly resumeBelow: number;
  /** Stops fetching (kafkajs's `consumer.pause`). */
  readonly pause: () => void;
  /** Starts fetching again (kafkajs's `consumer.resume`); may throw once the source stopped, which is ignored. */
  readonly resume: () => void;
  /** Receives `kafka.pause` (`inFlight`, `capacity`) and `kafka.resume` (`inFlight`). */
  readonly emit: KafkaEventSink;
}

/**
 * Checks `capacity` (an integer >= 1) and `resumeBelow` (an integer in `[1, capacity]`).
 *
 * @param owner - names the caller in the error message.
 * @throws {@link ConfigError} when either is out of range.
 */
export function checkFlowLimits(capacity: number, resumeBelow: number, owner = 'FlowController'): void {
  if (!Number.isInteger(capacity) || capacity < 1) {
    throw new ConfigError(`${owner} capacity must be an integer >= 1, got ${capacity}`);
  }
  if (!(Number.isInteger(resumeBelow) && resumeBelow >= 1 && resumeBelow <= capacity)) {
    throw new ConfigError(`${owner} resumeBelow must be an integer in [1, capacity], got ${resumeBelow}`);
  }
}

/**
 * Counts records in flight and decides when the source pauses and resumes.
 *
 * @example
 * ```ts
 * const flow = new FlowController({ capacity: 2, resumeBelow: 1, pause, resume, emit });
 * flow.admit(); flow.admit();
 * flow.full;      // true: the caller stops emitting and calls flow.pause()
 * flow.pause();   // pause() runs once
 * flow.release(); // 1 in flight: still paused
 * flow.release(); // 0 in flight: resume() runs
 * ```
 * @throws {@link ConfigError} when `capacity` or `resumeBelow` is out of range.
 */
export class FlowController {
  private count = 0;
  private paused = false;
  private closed = false;

  constructor(private readonly options: FlowControllerOptions) {
    checkFlowLimits(options.capacity, options.resumeBelow);
  }

  /** Records emitted and not yet acknowledged. */
  get inFlight(): number {
    return this.count;
  }

  /** Whether the source is paused. */
  get isPaused(): boolean {
    return this.paused;
  }

  /** Whether `capacity` records are in flight: the caller must not emit another one. */
  get full(): boolean {
    return this.count >= this.options.capacity;
  }

  /** One more record in flight. */
  admit(): void {
    this.count++;
  }

  /** One record fewer in flight (acknowledged); resumes the source once fewer than `resumeBelow` are. */
  release(): void {
    this.count--;
    this.maybeResume();
  }

  /** Pauses the source, unless it is paused already. */
  pause(): void {
    if (this.paused) return;
    this.paused = true;
    this.options.pause();
    this.options.emit('kafka.pause', { inFlight: this.count, capacity: this.options.capacity });
  }

  /** The source stopped: no more resumes. */
  close(): void {
    this.closed = true;
  }

  private maybeResume(): void {
    if (!this.paused || this.closed || this.count >= this.options.resumeBelow) return;
    this.paused = false;
    try {
      this.options.resume();
      this.options.emit('kafka.resume', { inFlight: this.count });
    } catch {
      // The source stopped meanwhile; nothing to resume.
    }
  }
}
