import type { OperatorFunction } from 'rxjs';
import { collate } from '../lib/data/collate.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Batch, Group, ModelTag } from '../lib/core/types.js';
import { preparing, scoreMean } from './internal/batchStats.js';

/** Options of {@link sftPrepare}. */
export interface SftPrepareOptions {
  /** Token id written on padding. */
  readonly padId: number;
  /**
   * Rows whose reward is below this are left out (rejection-sampling fine-tuning: imitate only the rollouts that
   * scored). Default: every row (reference outputs from a dataset).
   */
  readonly minReward?: number | undefined;
  /** Model tag of the batches. Default: the first group's. */
  readonly modelTag?: ModelTag;
  /**
   * The trained model's context length: a row longer fails the batch with a `ContextLengthError` before anything is
   * allocated for it (see `collate`). Default: no bound.
   */
  readonly maxSeqLen?: number | undefined;
}

/**
 * Turns a batch of groups into a padded, columnar training {@link Batch} for the cross-entropy (SFT) loss: every
 * row whose reward reaches `minReward`, with advantage 1 on each of its loss-mask tokens (so a batch reads the same
 * to every trainer), and the metrics of the preparation — `critic/score_mean` (over every row, kept or not),
 * `batch/rows`, `batch/rows_filtered`, the groups' counts and the rollout's timing, as `grpoPrepare` reports them.
 * A batch with no rows left is still emitted, with size 0, so the step counter and the admission gate move on.
 *
 * ```
 * groups:  --[A,B]------[C,D]--|
 * sftPrepare({ padId: 0, minReward: 1 })
 * output:  --x----------y------|      x = Batch of A's and B's rows that scored 1
 * ```
 *
 * @example
 * ```ts
 * import { batchGroups, sftPrepare } from 'rxrl/operators';
 * groups$.pipe(batchGroups({ batchSize: 16 }), sftPrepare({ padId: tokenizer.padId, minReward: 1 }));
 * ```
 * @param options - padding and the reward threshold.
 * @returns an operator from arrays of groups to batches.
 * @see grpoPrepare
 */
export function sftPrepare(options: SftPrepareOptions): OperatorFunction<readonly Group[], Batch> {
  const { minReward } = options;
  if (minReward !== undefined && Number.isNaN(minReward))
    throw new ConfigError('sftPrepare minReward must be a number, got NaN', { context: { key: 'minReward' } });
  return preparing(options.modelTag, (rows, modelTag) => {
    const kept = minReward === undefined ? rows : rows.filter((t) => t.reward >= minReward);
    const batch = collate(kept, { padId: options.padId, modelTag, advantages: kept.map(() => 1), maxSeqLen: options.maxSeqLen });
    return { ...batch, metrics: { ...scoreMean(rows), 'batch/rows': batch.size, 'batch/rows_filtered': rows.length - kept.length } };
  });
}
