/**
 * Typed errors. Callers test with the predicates at the bottom (or `instanceof`), never by matching text.
 *
 * Every error carries a stable `name`, a `retriable` flag that the retry helper honours, an optional `cause`
 * and context fields that say what was being done.
 *
 * @packageDocumentation
 */

/** Options shared by every rxrl error. */
export interface RxrlErrorOptions {
  /** The underlying error, if any. */
  readonly cause?: unknown;
  /** Whether repeating the same operation may succeed. Defaults to `false`. */
  readonly retriable?: boolean;
  /** Structured context (ids, keys, sizes) for logs. */
  readonly context?: Readonly<Record<string, unknown>> | undefined;
}

/** Base class of every error rxrl throws on purpose. */
export class RxrlError extends Error {
  override readonly name: string = 'RxrlError';
  /** Whether repeating the same operation may succeed. */
  readonly retriable: boolean;
  /** Structured context for logs. */
  readonly context: Readonly<Record<string, unknown>>;

  constructor(message: string, options: RxrlErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.retriable = options.retriable ?? false;
    this.context = options.context ?? {};
  }
}

/** A configuration value or option is invalid. Never retriable. */
export class ConfigError extends RxrlError {
  override readonly name = 'ConfigError';
}

/** Input data (a task, a message, a file line) could not be decoded or failed its schema. Never retriable. */
export class DecodeError extends RxrlError {
  override readonly name = 'DecodeError';
}

/**
 * A prompt is certainly longer than a model's context allows, known from its text before it was encoded (see
 * `Tokenizer.minTokens`): `context` holds `limit` and `atLeast` (tokens). Also a trajectory longer than the trained
 * model's context, refused when its batch is made (`collate`): `context` holds `taskId`, `trajectoryId`, `tokens` and
 * `limit`. Never retriable.
 */
export class ContextLengthError extends RxrlError {
  override readonly name = 'ContextLengthError';
}

/**
 * Every sample of a training step failed under the `stop_on_error` policy: the run fails instead of stopping
 * gracefully. `cause` is the failure that stopped it; `context.batch` the step's admission batch. Also, under
 * `stop_on_error`, a step given no rows (`context.step`, `context.rows` 0) and a run whose every update was skipped
 * (`context.steps`). Never retriable.
 */
export class StepFailedError extends RxrlError {
  override readonly name = 'StepFailedError';
}

/** A requested TF.js backend is not installed or failed to initialize. */
export class BackendUnavailableError extends RxrlError {
  override readonly name = 'BackendUnavailableError';
}

/** A rollout engine failed to produce a response. Retriable unless said otherwise. */
export class EngineError extends RxrlError {
  override readonly name = 'EngineError';
}

/** A rollout agent (`rollout.agent`) crashed, was cancelled, made no model call or gave an invalid reward. Never retriable. */
export class AgentError extends RxrlError {
  override readonly name = 'AgentError';
}

/** An evaluator failed or returned a non-finite reward. Never retriable. */
export class EvaluationError extends RxrlError {
  override readonly name = 'EvaluationError';
}

/** Work was cancelled through an `AbortSignal`. */
export class AbortError extends RxrlError {
  override readonly name = 'AbortError';
}

/**
 * An operation kept failing with retriable errors until the retry helper gave up. Never retriable itself; the
 * last failure is the `cause`, and `context.attempts` says how many attempts were made.
 */
export class RetriesExhaustedError extends RxrlError {
  override readonly name = 'RetriesExhaustedError';
}

/** A tensor shape or size did not match what a function documents. A programmer error: never retriable. */
export class ShapeError extends RxrlError {
  override readonly name = 'ShapeError';
}

/**
 * A path lies outside the directory it is confined to (a weights root), once every link is followed, or cannot
 * be resolved there. Deliberately says no more than that, whatever the reason. Never retriable.
 */
export class ForbiddenPathError extends RxrlError {
  override readonly name = 'ForbiddenPathError';
}

/**
 * A write failed because the device is full (`ENOSPC`), the disk quota is spent (`EDQUOT`) or the file reached the
 * process's size limit (`EFBIG`, `ulimit -f`). Never retriable:
 * space must be freed first. `context` holds the `path` being written and the system error `code`.
 */
export class StorageError extends RxrlError {
  override readonly name = 'StorageError';
}

/**
 * A run directory is in use: another run holds its lock file. Never retriable. `context` holds the lock file's
 * `path` and the holder's `pid`, `host` and `startedAt`.
 */
export class RunLockedError extends RxrlError {
  override readonly name = 'RunLockedError';
}

/** A command line was malformed (unknown flag, missing value, wrong arguments). Never retriable; the CLI exits 2. */
export class UsageError extends RxrlError {
  override readonly name = 'UsageError';
}

/** System error codes of a full device or a spent quota, and what they mean. */
const STORAGE_FULL: Readonly<Record<string, string>> = {
  ENOSPC: 'no space left on device',
  EDQUOT: 'disk quota exceeded',
  EFBIG: 'file size limit reached',
};

/**
 * What to throw for a failed write to `path`: a {@link StorageError} naming `path` when the device is full or the
 * quota spent, else `error` itself.
 *
 * @param error - what the write threw.
 * @param path - the file or directory being written, as the user knows it.
 */
export function asStorageError(error: unknown, path: string): unknown {
  const code = (error as { code?: unknown } | null)?.code;
  if (error instanceof StorageError || typeof code !== 'string' || !(code in STORAGE_FULL)) return error;
  return new StorageError(`${STORAGE_FULL[code]} (${code}) writing ${path}`, { cause: error, context: { path, code } });
}

/** True for any error rxrl raised on purpose. */
export function isRxrlError(error: unknown): error is RxrlError {
  return error instanceof RxrlError;
}

/** True when the error says the operation may succeed if repeated. */
export function isRetriable(error: unknown): boolean {
  return error instanceof RxrlError && error.retriable;
}

/** True for a {@link UsageError}. */
export function isUsageError(error: unknown): error is UsageError {
  return isRxrlError(error) && error.name === 'UsageError';
}

/** True when the error (or a DOMException from `AbortSignal`) reports a cancellation. */
export function isAbortError(error: unknown): boolean {
  return (
    error instanceof AbortError || (typeof error === 'object' && error !== null && (error as { name?: unknown }).name === 'AbortError')
  );
}

/** Throws an {@link AbortError} if the signal has fired. */
export function throwIfAborted(signal: AbortSignal | undefined, context?: Record<string, unknown>): void {
  if (signal?.aborted) {
    throw new AbortError('operation aborted', { cause: signal.reason, context });
  }
}

/** Exhaustiveness helper for `switch` statements over string-literal unions. */
export function assertNever(value: never, what = 'value'): never {
  throw new ConfigError(`unexpected ${what}: ${String(value)}`);
}
