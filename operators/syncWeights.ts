import { concatMap, from, map, type OperatorFunction } from 'rxjs';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { StepResult } from '../lib/train/types.js';

/** Options of {@link syncWeights}. */
export interface SyncWeightsOptions {
  /** Called after every engine holds the new version (for example to open the admission gate). */
  readonly onPublished?: (version: number) => void;
}

/**
 * Publishes the weights of each step to every rollout engine, as version `step + 1`, and passes the step result
 * on once all engines hold it. Steps are published in order, one at a time.
 *
 * ```
 * step:    --X-----Y----|
 * syncWeights([e1, e2])                (loading takes --)
 * output:  ----X-----Y--|              X re-emitted after e1 and e2 loaded version X.version
 * ```
 *
 * @example
 * ```ts
 * import { syncWeights, train } from 'rxrl/operators';
 * batches$.pipe(train(trainer), syncWeights([engine], { onPublished: (v) => gate.publish(v) }));
 * ```
 * @param engines - every engine that samples for this trainer.
 * @param options - a hook called after each publication.
 * @returns an operator that re-emits each step result after its weights are published.
 * @see train
 */
export function syncWeights(
  engines: readonly RolloutEngine[],
  options: SyncWeightsOptions = {},
): OperatorFunction<StepResult, StepResult> {
  return (source) =>
    source.pipe(
      concatMap((result) => {
        const weights = engines.length > 0 ? result.weights() : undefined;
        const loads = weights ? engines.map((engine) => engine.loadWeights(result.version, weights)) : [];
        return from(Promise.all(loads)).pipe(
          map(() => {
            options.onPublished?.(result.version);
            return result;
          }),
        );
      }),
    );
}
