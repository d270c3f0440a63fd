import { from, lastValueFrom, reduce } from 'rxjs';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { Evaluator } from '../lib/evaluator.js';
import { isSampleFailure, type Metrics, type Task } from '../lib/types.js';
import type { RolloutWorker } from '../lib/worker.js';
import { rollout } from '../operators/rollout.js';

/** Options of {@link validate}. */
export interface ValidateOptions {
  /** Largest response length in tokens. */
  readonly maxTokens: number;
  /** Sampling temperature; 0 (greedy, the default) makes validation deterministic. */
  readonly temperature?: number;
  /** Samples per task. Default 1. */
  readonly samplesPerTask?: number;
  /** Most samples in flight. Default 256. */
  readonly concurrency?: number;
  /** Seed of the sampling streams. Default 0. */
  readonly seed?: number;
  /** Cancels the validation. */
  readonly signal?: AbortSignal;
  /** Produces each sample (a chat-formatted or multi-turn worker, as in training). Default: `singleTurnWorker`. */
  readonly worker?: RolloutWorker;
}

/**
 * Scores an engine on held-out tasks: one rollout per task (greedy by default) through the same `rollout`
 * operator as training, with `val/`-prefixed metrics: `val/reward_mean`, `val/<metric>_mean` for each evaluator
 * metric, `val/samples`, `val/failures`.
 *
 * @param engine - the engine to score.
 * @param tasks - held-out tasks.
 * @param evaluator - scores each response.
 * @param options - sampling settings.
 * @returns the metrics.
 */
export async function validate(
  engine: RolloutEngine,
  tasks: readonly Task[],
  evaluator: Evaluator,
  options: ValidateOptions,
): Promise<Metrics> {
  const totals = await lastValueFrom(
    from(tasks).pipe(
      rollout(engine, {
        samplesPerTask: options.samplesPerTask ?? 1,
        concurrency: options.concurrency ?? 256,
        evaluator,
        maxTokens: options.maxTokens,
        temperature: options.temperature ?? 0,
        seed: options.seed,
        signal: options.signal,
        ...(options.worker ? { worker: options.worker } : {}),
      }),
      reduce(
        (acc, output) => {
          if (isSampleFailure(output)) {
            acc.failures++;
            return acc;
          }
          acc.samples++;
          acc.sums.reward = (acc.sums.reward ?? 0) + output.reward;
          for (const [key, value] of Object.entries(output.metrics)) acc.sums[key] = (acc.sums[key] ?? 0) + value;
          return acc;
        },
        { samples: 0, failures: 0, sums: {} as Record<string, number> },
      ),
    ),
    { defaultValue: { samples: 0, failures: 0, sums: {} as Record<string, number> } },
  );
  const metrics: Metrics = { 'val/samples': totals.samples, 'val/failures': totals.failures };
  for (const [key, value] of Object.entries(totals.sums)) {
    metrics[`val/${key}_mean`] = totals.samples > 0 ? value / totals.samples : 0;
  }
  return metrics;
}
