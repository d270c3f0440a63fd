import { defer, tap, type MonoTypeOperatorFunction } from 'rxjs';
import { Progress, type ProgressStep, type ProgressStream } from '../lib/observe/progress.js';

/** Options of {@link printProgress}. */
export interface PrintProgressOptions {
  /** The step budget: the line reads `step 30/800` with an ETA, and the bar fills. Omit when unknown. */
  readonly total?: number;
  /** Where to write. Default `process.stderr`. */
  readonly stream?: ProgressStream;
  /** Without a terminal, a line every this many steps (the last one always gets one). Default 1. */
  readonly every?: number;
  /** Force the live bar on (`true`) or off (`false`). Default: whether `stream` is a terminal. */
  readonly tty?: boolean;
  /** A multi-policy pipeline: each line names the step's `modelTag` and reads its metrics (see `Progress`). */
  readonly perPolicy?: boolean;
  /** Clock in milliseconds, for tests. Default `performance.now`. */
  readonly now?: () => number;
}

/**
 * Shows the progress of a training pipeline: taps each step result and writes its progress line through
 * {@link Progress} — a live bar redrawn in place on a terminal, plain lines otherwise —
 * `step 30/800 · 12.4 s/it · ETA 2:41 · reward 0.512 · loss 0.0123 · entropy 1.204 · staleness 0`; the pace is
 * timed from the subscription. The display is ended (the bar's line finished, or the last step printed) when the
 * stream completes, errors or is unsubscribed. The values pass through unchanged.
 *
 * ```
 * steps:   --a--b--c--|
 * printProgress({ total: 3 })
 * output:  --a--b--c--|     stderr: step 1/3 · …  step 2/3 · …  step 3/3 · …
 * ```
 *
 * @example
 * ```ts
 * import { grpoPrepare, printProgress, train } from 'rxrl/operators';
 * batches$.pipe(grpoPrepare({ padId }), train(trainer), printProgress({ total: 30 }));
 * ```
 * @param options - step budget, stream, cadence.
 * @returns an operator that passes step results through and prints their progress.
 * @throws ConfigError at subscription, for a `total` or `every` that is not a positive integer.
 */
export function printProgress<T extends ProgressStep>(options: PrintProgressOptions = {}): MonoTypeOperatorFunction<T> {
  const now = options.now ?? (() => performance.now());
  return (source) =>
    defer(() => {
      const { now: _now, ...rest } = options;
      const progress = new Progress(rest);
      const started = now();
      return source.pipe(
        tap({
          next: (step) => progress.update(step, (now() - started) / 1000),
          finalize: () => progress.done(),
        }),
      );
    });
}
