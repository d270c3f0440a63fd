/**
 * The one retry helper: exponential backoff with jitter, a bail-out for errors that repeating cannot fix, and
 * faster defaults under test (`NODE_ENV=test`, which vitest sets).
 *
 * What is worth repeating is decided by the error, not by this module: by default an error is retried only when
 * it is an `RxrlError` whose `retriable` flag is set (see {@link isRetriable}). Programmer errors (`TypeError`,
 * `RangeError`, `ReferenceError`, `SyntaxError`, `ConfigError`, `ShapeError`) are never retried, whatever the
 * predicate says, and neither is a cancellation.
 *
 * @packageDocumentation
 */
import { AbortError, ConfigError, RetriesExhaustedError, ShapeError, isAbortError, isRetriable } from './errors.js';

/** One retry about to happen, as reported to {@link RetryOptions.onRetry}. */
export interface RetryEvent {
  /** The attempt that just failed, 1-based. */
  readonly attempt: number;
  /** How long the helper waits before the next attempt, in ms. */
  readonly delayMs: number;
  /** Why the attempt failed. */
  readonly error: unknown;
}

/** Options of {@link retry}. */
export interface RetryOptions {
  /** Attempts after the first one (an integer ≥ 0, or `Infinity` with a `deadlineMs`). Default 5. */
  readonly retries?: number;
  /**
   * Gives up (a {@link RetriesExhaustedError}) rather than wait past this many ms after the first attempt started.
   * Default: no deadline.
   */
  readonly deadlineMs?: number | undefined;
  /** The clock of `deadlineMs`, in ms. Default `performance.now`. */
  readonly now?: (() => number) | undefined;
  /** Delay before the first retry, in ms. Default 300 (5 under test). */
  readonly initialDelayMs?: number;
  /** Longest delay between attempts, in ms. Default 30 000 (50 under test). */
  readonly maxDelayMs?: number;
  /** Growth factor of the delay per attempt (≥ 1). Default 2. */
  readonly multiplier?: number;
  /**
   * Randomization in `[0, 1]`: each delay is drawn uniformly from `delay · [1 − jitter, 1 + jitter]`, so that
   * clients that failed together do not retry together. Default 0.2.
   */
  readonly jitter?: number;
  /** Whether an error is worth another attempt. Default {@link isRetriable}. */
  readonly isRetriable?: ((error: unknown) => boolean) | undefined;
  /** Called before each wait (counting, logging). */
  readonly onRetry?: (event: RetryEvent) => void;
  /** Uniform numbers in `[0, 1)` for the jitter. Default `Math.random`. */
  readonly random?: () => number;
  /** Cancels the waits and further attempts; the helper then rejects with an {@link AbortError}. */
  readonly signal?: AbortSignal | undefined;
}

/** Default retry settings of a running process. */
export const RETRY_DEFAULTS = {
  retries: 5,
  initialDelayMs: 300,
  maxDelayMs: 30_000,
  multiplier: 2,
  jitter: 0.2,
} as const;

/** Default retry settings under test (`NODE_ENV=test`): the same shape, short delays. */
export const RETRY_TEST_DEFAULTS = {
  retries: 5,
  initialDelayMs: 5,
  maxDelayMs: 50,
  multiplier: 2,
  jitter: 0.2,
} as const;

/** The defaults that apply in this process. */
export function retryDefaults(): typeof RETRY_DEFAULTS | typeof RETRY_TEST_DEFAULTS {
  return process.env.NODE_ENV === 'test' ? RETRY_TEST_DEFAULTS : RETRY_DEFAULTS;
}

/** True for errors that are bugs in the caller: repeating the same call cannot fix them. */
export function isProgrammerError(error: unknown): boolean {
  return (
    error instanceof TypeError ||
    error instanceof RangeError ||
    error instanceof ReferenceError ||
    error instanceof SyntaxError ||
    error instanceof ConfigError ||
    error instanceof ShapeError
  );
}

/**
 * The wait before retry number `attempt` (1-based): `min(maxDelayMs, initialDelayMs · multiplier^(attempt−1))`,
 * scaled by a uniform factor in `[1 − jitter, 1 + jitter]` and clamped to `maxDelayMs`.
 *
 * @param attempt - Which retry (1 for the first).
 * @param options - Backoff settings; unset fields take {@link retryDefaults}.
 * @param random - A uniform draw in `[0, 1)`.
 * @returns The delay in ms (≥ 0).
 */
export function retryDelay(attempt: number, options: RetryOptions = {}, random: number = Math.random()): number {
  const d = retryDefaults();
  const initial = options.initialDelayMs ?? d.initialDelayMs;
  const max = options.maxDelayMs ?? d.maxDelayMs;
  const multiplier = options.multiplier ?? d.multiplier;
  const jitter = options.jitter ?? d.jitter;
  const base = Math.min(max, initial * multiplier ** Math.max(0, attempt - 1));
  const factor = 1 - jitter + 2 * jitter * random;
  return Math.max(0, Math.min(max, base * factor));
}

/**
 * Runs `operation` until it succeeds, an error is not worth repeating, the attempts run out or the signal
 * fires. Between attempts it waits {@link retryDelay}.
 *
 * @example
 * ```ts
 * import { retry } from 'rxrl';
 * const body = await retry((attempt, signal) => fetchJson(url, signal), { retries: 3, signal });
 * ```
 * @param operation - The work; receives the 1-based attempt number and the signal.
 * @param options - Backoff, the retry predicate, a hook and cancellation.
 * @returns What `operation` resolved with.
 * @throws the operation's own error when it is not retriable (a programmer error, a cancellation, or the
 *   predicate says no), {@link RetriesExhaustedError} (with the last error as `cause`) when every attempt
 *   failed, and {@link AbortError} when `signal` fires.
 */
export async function retry<T>(operation: (attempt: number, signal?: AbortSignal) => Promise<T>, options: RetryOptions = {}): Promise<T> {
  const retries = options.retries ?? retryDefaults().retries;
  const { signal, deadlineMs } = options;
  if (!((Number.isInteger(retries) && retries >= 0) || (retries === Infinity && deadlineMs !== undefined))) {
    throw new ConfigError(`retries must be an integer >= 0 (or Infinity with a deadlineMs), got ${retries}`);
  }
  if (deadlineMs !== undefined && !(deadlineMs >= 0)) throw new ConfigError(`deadlineMs must be >= 0, got ${deadlineMs}`);
  const jitter = options.jitter ?? retryDefaults().jitter;
  if (!(jitter >= 0 && jitter <= 1)) throw new ConfigError(`jitter must be in [0, 1], got ${jitter}`);
  const multiplier = options.multiplier ?? retryDefaults().multiplier;
  if (!(multiplier >= 1)) throw new ConfigError(`multiplier must be >= 1, got ${multiplier}`);
  const worthRetrying = options.isRetriable ?? isRetriable;
  const random = options.random ?? Math.random;
  const now = options.now ?? (() => performance.now());
  const deadline = deadlineMs === undefined ? Infinity : now() + deadlineMs;
  for (let attempt = 1; ; attempt++) {
    if (signal?.aborted) throw new AbortError('retry aborted', { cause: signal.reason, context: { attempt } });
    try {
      return await operation(attempt, signal);
    } catch (error) {
      if (signal?.aborted || isAbortError(error) || isProgrammerError(error) || !worthRetrying(error)) throw error;
      if (attempt > retries) {
        throw new RetriesExhaustedError(`gave up after ${attempt} attempts: ${describe(error)}`, {
          cause: error,
          context: { attempts: attempt },
        });
      }
      const delayMs = retryDelay(attempt, options, random());
      if (now() + delayMs > deadline) {
        throw new RetriesExhaustedError(`gave up after ${attempt} attempts in ${deadlineMs} ms: ${describe(error)}`, {
          cause: error,
          context: { attempts: attempt, deadlineMs },
        });
      }
      options.onRetry?.({ attempt, delayMs, error });
      await sleep(delayMs, signal);
    }
  }
}

/** Resolves after `ms`, or rejects with an {@link AbortError} when `signal` fires first. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    if (signal?.aborted) {
      reject(new AbortError('sleep aborted', { cause: signal.reason }));
      return;
    }
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(new AbortError('sleep aborted', { cause: signal?.reason }));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}
