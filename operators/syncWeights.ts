import { concatMap, defer, from, map, type OperatorFunction } from 'rxjs';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { NamedWeights } from '../lib/model/types.js';
import type { StepResult } from '../lib/train/types.js';
import type { Metrics } from '../lib/core/types.js';
import type { TrackWork } from '../lib/observe/activity.js';

/** Options of {@link syncWeights}. */
export interface SyncWeightsOptions {
  /** Called after every engine holds the new version (for example to open the admission gate). */
  readonly onPublished?: (version: number) => void;
  /** Runs each publication as a unit of work of the run's activity tracker (`tracker.tracking('sync')`). */
  readonly track?: TrackWork | undefined;
  /** Stops a publication in progress (the engines' loads reject with an `AbortError`). */
  readonly signal?: AbortSignal | undefined;
}

/**
 * Publishes the weights of each step to every rollout engine, as version `step + 1`, and passes the step result
 * on once all engines hold it. Steps are published in order, one at a time. The weights are copied once for all
 * engines, and not at all when every engine samples from the trainer's own model
 * ({@link RolloutEngine.sharesTrainerWeights}).
 *
 * It also accounts for the step's wall time, into the step's metrics: `timing/sync_s` (this publication),
 * `timing/total_s` (since the previous step left this operator, or since subscription for the first step), and
 * `timing/wait_s`, the rest once `timing/prepare_s` (grpoPrepare), `timing/step_s` (the trainer) and the sync are
 * taken out: the time the trainer waited for its batch (rollouts, rewards, grouping; in a pipeline, also whatever
 * ran after the previous step, such as its checkpoint and validation). So wait + prepare + step + sync = total.
 * Within the wait, `timing/generate_s` and `timing/reward_s` (grpoPrepare, from the rollout's spans) say how long
 * the batch's samples were being generated and scored; within the step, the trainer may report its own parts
 * (`timing/forward_backward_s`, `timing/optimizer_s`).
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
 * @param options - a hook called after each publication, activity tracking and a stop signal.
 * @returns an operator that re-emits each step result after its weights are published.
 * @see train
 */
export function syncWeights(engines: readonly RolloutEngine[], options: SyncWeightsOptions = {}): OperatorFunction<StepResult, StepResult> {
  return (source) =>
    defer(() => {
      let previous = performance.now();
      return source.pipe(
        concatMap((result) => {
          const started = performance.now();
          // An engine sampling from the trainer's own model reads no copy: none is made when every engine does.
          const weights = engines.some((engine) => engine.sharesTrainerWeights !== true) ? result.weights() : NO_WEIGHTS;
          const load = (): Promise<unknown> =>
            Promise.all(engines.map((engine) => engine.loadWeights(result.version, weights, options.signal)));
          return from(options.track ? options.track(load) : load()).pipe(
            map(() => {
              const now = performance.now();
              Object.assign(result.metrics, stepTiming(result.metrics, (now - started) / 1000, (now - previous) / 1000));
              previous = now;
              options.onPublished?.(result.version);
              return result;
            }),
          );
        }),
      );
    });
}

/** What an engine that shares the trainer's weights is given. */
const NO_WEIGHTS: NamedWeights = new Map();

/** `timing/sync_s`, `timing/total_s` and `timing/wait_s` (the total less the measured stages, never below 0). */
function stepTiming(metrics: Metrics, sync: number, total: number): Metrics {
  const measured = (metrics['timing/prepare_s'] ?? 0) + (metrics['timing/step_s'] ?? 0) + sync;
  return { 'timing/sync_s': sync, 'timing/total_s': total, 'timing/wait_s': Math.max(0, total - measured) };
}
