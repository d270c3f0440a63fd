/**
 * One cancellable unit of rollout work (a sample, or a multi-agent episode) as a cold Observable: shared by the
 * `rollout` and `rolloutEpisodes` operators, so both fail a sample alone, time it out and cancel it the same way.
 *
 * @internal
 * @packageDocumentation
 */
import { Observable } from 'rxjs';
import { EngineError, isAbortError } from '../../lib/core/errors.js';

/** Options of {@link runSample}. */
export interface RunSampleOptions {
  /** Cancels every unit; a unit rejected by this abort errors the stream instead of failing alone. */
  readonly signal?: AbortSignal | undefined;
  /** A unit still running this long (ms) is cancelled and failed with an `EngineError`. */
  readonly timeoutMs?: number | undefined;
  /** What the unit is, for the timeout's message: `sample` or `episode`. */
  readonly kind: string;
  /** The unit's id (a trajectory id, or an episode's). */
  readonly id: string;
}

/**
 * Runs `work` once per subscription and emits its outputs. A rejection (not caused by `options.signal`) is
 * turned into outputs by `fail`, so the stream goes on; unsubscribing before it settles aborts the work.
 *
 * @param work - the unit; it must honour its signal.
 * @param fail - the outputs that report a failed unit (the error is an `EngineError` when it timed out).
 * @param options - the shared abort signal, the time limit, and the unit's kind and id.
 * @returns a cold Observable of the unit's outputs.
 */
export function runSample<T>(
  work: (signal: AbortSignal) => Promise<readonly T[]>,
  fail: (error: Error) => readonly T[],
  options: RunSampleOptions,
): Observable<T> {
  return new Observable<T>((subscriber) => {
    const controller = new AbortController();
    const timeout = options.timeoutMs === undefined ? undefined : AbortSignal.timeout(options.timeoutMs);
    const signal = AbortSignal.any([controller.signal, ...(options.signal ? [options.signal] : []), ...(timeout ? [timeout] : [])]);
    let settled = false;
    const emit = (outputs: readonly T[]): void => {
      for (const output of outputs) subscriber.next(output);
      subscriber.complete();
    };
    work(signal).then(
      (outputs) => {
        settled = true;
        emit(outputs);
      },
      (error: unknown) => {
        settled = true;
        if (options.signal?.aborted && isAbortError(error)) {
          subscriber.error(error);
          return;
        }
        const timedOut = timeout?.aborted === true && !controller.signal.aborted;
        emit(
          fail(
            timedOut
              ? new EngineError(`${options.kind} ${options.id} did not finish within ${options.timeoutMs} ms`, {
                  cause: error,
                  context: { id: options.id },
                })
              : error instanceof Error
                ? error
                : new Error(String(error)),
          ),
        );
      },
    );
    // Abort only work still running: aborting a settled unit would build an exception for nothing.
    return () => {
      if (!settled) controller.abort();
    };
  });
}
