/**
 * Releasing resources after a failure without losing it: the first error is the one that propagates; a release that
 * fails after it (a model whose backend died with the step cannot be disposed either) is reported and attached to
 * it, never thrown in its place.
 *
 * @packageDocumentation
 */

/** An error with the failures of the releases that ran after it (as Java's `getSuppressed()`). */
export interface WithSuppressed {
  /** Failures of releases that ran after this error, in order. */
  readonly suppressed?: readonly unknown[];
}

/**
 * Attaches `later` to `first.suppressed` (when `first` is an object that can take it) and hands it to `onSuppressed`.
 *
 * @param first - the error that propagates.
 * @param later - a failure of a release that ran after it.
 * @param onSuppressed - reports `later` (a warning in the run's log).
 */
export function suppress(first: unknown, later: unknown, onSuppressed?: (error: unknown, first: unknown) => void): void {
  if (typeof first === 'object' && first !== null && Object.isExtensible(first)) {
    const held = (first as WithSuppressed).suppressed ?? [];
    Object.defineProperty(first, 'suppressed', { value: [...held, later], configurable: true, enumerable: false, writable: true });
  }
  onSuppressed?.(later, first);
}

/**
 * Runs `release` after `error` happened and throws `error`: a failure of `release` is suppressed (see {@link suppress}).
 *
 * @example
 * ```ts
 * try { build(); } catch (error) { await releaseAfter(error, () => model.dispose(), (e) => log.warn({ err: e }, 'release failed')); }
 * ```
 * @param error - the failure that propagates.
 * @param release - frees what was built before it.
 * @param onSuppressed - reports a failure of `release`.
 * @returns never: throws `error`.
 */
export async function releaseAfter(
  error: unknown,
  release: () => unknown,
  onSuppressed?: (error: unknown, first: unknown) => void,
): Promise<never> {
  try {
    await release();
  } catch (later) {
    suppress(error, later, onSuppressed);
  }
  throw error;
}

/**
 * Runs `work`, then `release(failed)` whatever happened. When `work` failed, its error propagates and a failure of
 * `release` is suppressed (see {@link suppress}); when it succeeded, a failure of `release` is thrown.
 *
 * @param work - the work.
 * @param release - frees what the work used; `failed` says whether the work threw.
 * @param onSuppressed - reports a failure of `release` after one of `work`.
 * @returns what `work` returned.
 */
export async function releasing<T>(
  work: () => Promise<T>,
  release: (failed: boolean) => unknown,
  onSuppressed?: (error: unknown, first: unknown) => void,
): Promise<T> {
  let result: T;
  try {
    result = await work();
  } catch (error) {
    return releaseAfter(error, () => release(true), onSuppressed);
  }
  await release(false);
  return result;
}

/**
 * Calls each `dispose` in order, all of them even when some throw; then throws the first failure (the later ones
 * suppressed onto it, see {@link suppress}).
 *
 * @param disposals - the disposals.
 */
export function disposeEach(disposals: Iterable<() => void>): void {
  let first: { error: unknown } | undefined;
  for (const dispose of disposals) {
    try {
      dispose();
    } catch (error) {
      if (first === undefined) first = { error };
      else suppress(first.error, error);
    }
  }
  if (first !== undefined) throw first.error;
}
