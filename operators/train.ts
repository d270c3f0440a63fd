import { Observable, concatMap, type OperatorFunction } from 'rxjs';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Batch } from '../lib/core/types.js';
import type { TrackWork } from '../lib/observe/activity.js';

/** Options of {@link train}. */
export interface TrainOptions {
  /** Cancels the step in progress (the trainer sees it) and errors the stream. */
  readonly signal?: AbortSignal | undefined;
  /** Runs each step as a unit of work of the run's activity tracker (`tracker.tracking('trainer')`). */
  readonly track?: TrackWork | undefined;
}

/**
 * Trains on each batch, one at a time: a step starts only after the previous one finished, whatever the
 * arrival rate (the admission gate upstream keeps the queue short).
 *
 * ```
 * batch:   --x--y-----------|
 * train(trainer)                       (each step takes ----)
 * output:  ------X----Y-----|          X = step result of x; y waits for X
 * ```
 *
 * @example
 * ```ts
 * import { train } from 'rxrl/operators';
 * batches$.pipe(train(trainer)).subscribe((r) => console.log(r.step, r.metrics['actor/pg_loss']));
 * ```
 * @param trainer - takes the steps.
 * @param options - an optional abort signal.
 * @returns an operator from batches to step results, in order.
 * @see syncWeights
 */
export function train(trainer: Trainer, options: TrainOptions = {}): OperatorFunction<Batch, StepResult> {
  return (source) =>
    source.pipe(
      concatMap(
        (batch) =>
          new Observable<StepResult>((subscriber) => {
            const controller = new AbortController();
            const signal = options.signal ? AbortSignal.any([options.signal, controller.signal]) : controller.signal;
            let settled = false;
            const step = (): Promise<StepResult> => trainer.trainStep(batch, signal);
            (options.track ? options.track(step) : step()).then(
              (result) => {
                settled = true;
                subscriber.next(result);
                subscriber.complete();
              },
              (error: unknown) => {
                settled = true;
                subscriber.error(error);
              },
            );
            return () => {
              if (!settled) controller.abort();
            };
          }),
      ),
    );
}
