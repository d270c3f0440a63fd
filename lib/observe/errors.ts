/**
 * Typed errors of the observability module. Callers test with `instanceof` or the `name`, never the message.
 *
 * @packageDocumentation
 */
import { RxrlError } from '../core/errors.js';

/**
 * More work is in flight than an {@link ActivityTracker} may hold: almost always an activity whose `done()` is
 * never called. A programmer error: never retriable. `context` holds `module`, `inFlight` and `capacity`.
 */
export class ActivityOverflowError extends RxrlError {
  override readonly name = 'ActivityOverflowError';
}

/**
 * A run directory or its metrics file cannot be used: the directory is missing, the writer was closed, or a
 * record is malformed. Never retriable. `context` holds the `path` and, for a bad record, the offending `field`.
 */
export class RunDirError extends RxrlError {
  override readonly name = 'RunDirError';
}

/**
 * A module of a run had work in flight and finished none of it for `activity.stallFailSeconds`: a hung engine, a
 * weight sync that never returns. Never retriable. `context` holds the `module`, its `inFlight` count,
 * `idleSeconds` and `failSeconds`.
 */
export class StalledError extends RxrlError {
  override readonly name = 'StalledError';
}
