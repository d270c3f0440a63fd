/**
 * Waiting in specs: poll a condition until it holds, and fail loudly when it will not. A wait on a process that makes
 * progress (steps trained, lines written) measures the time since its last progress, not the total, so a slow or
 * loaded machine only makes a spec slower, never makes it fail; only a run that stopped moving fails it.
 */

/** Options of {@link waitFor}. */
export interface WaitForOptions {
  /**
   * How long the wait may go on: in all (default 20 000 ms), or, with {@link progress}, since progress was last seen
   * (default 120 000 ms).
   */
  readonly timeoutMs?: number;
  /** Default 25 ms. */
  readonly intervalMs?: number;
  /** What is awaited, for the failure's message (a function is read when the wait fails). */
  readonly what?: string | (() => string);
  /**
   * A measure of progress (a count, a size, a key of several): while its value changes, the wait goes on, and
   * `timeoutMs` bounds only the time without a change.
   */
  readonly progress?: () => unknown;
}

/**
 * Polls `condition` until it holds; throws (failing the test) once `timeoutMs` passed in all, or, with a `progress`
 * measure, without progress.
 *
 * @param condition - what must hold; may be async.
 * @param options - the timeout, the polling interval, what is awaited and a progress measure.
 */
export async function waitFor(condition: () => boolean | Promise<boolean>, options: WaitForOptions = {}): Promise<void> {
  const timeoutMs = options.timeoutMs ?? (options.progress ? 120_000 : 20_000);
  let last = options.progress?.();
  let since = Date.now();
  for (;;) {
    if (await condition()) return;
    const now = options.progress?.();
    if (options.progress && !Object.is(now, last)) {
      last = now;
      since = Date.now();
    }
    if (Date.now() - since > timeoutMs) {
      const what = typeof options.what === 'function' ? options.what() : (options.what ?? 'condition');
      throw new Error(`waitFor timed out after ${timeoutMs} ms${options.progress ? ' without progress' : ''}: ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, options.intervalMs ?? 25));
  }
}
