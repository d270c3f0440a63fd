import * as tf from '@tensorflow/tfjs-core';
import type { OperatorFunction } from 'rxjs';
import { computeGroupAdvantages, type StdKind } from '../lib/algos/advantages.js';
import { applyKlPenalty, type KlEstimatorName } from '../lib/algos/kl.js';
import { type KlController, createKlController, updateKlController } from '../lib/algos/klController.js';
import { readMetricsSync } from '../lib/algos/metrics.js';
import { broadcastAdvantages, collate } from '../lib/data/collate.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Batch, Group, Metrics, ModelTag, ReferencePolicy, Trajectory } from '../lib/core/types.js';
import { preparing } from './internal/batchStats.js';

export type { ReferencePolicy } from '../lib/core/types.js';

/** KL-in-reward settings of {@link grpoPrepare}. */
export interface KlInRewardOptions {
  /** Scores the response tokens under the reference policy. */
  readonly reference: ReferencePolicy;
  /** Coefficient controller (fixed or adaptive). */
  readonly controller: KlController;
  /** KL estimator. Default `k1`. */
  readonly estimator?: KlEstimatorName;
}

/** Options of {@link grpoPrepare}. */
export interface GrpoPrepareOptions {
  /** Token id written on padding. */
  readonly padId: number;
  /** Divide advantages by the group std (GRPO); `false` for Dr.GRPO. Default true. */
  readonly normalizeByStd?: boolean | undefined;
  /** Group std: `sample` (N−1) or `population`. Default `sample`. */
  readonly std?: StdKind | undefined;
  /** Added to the std. Default the algos' `ADVANTAGE_EPSILON`. */
  readonly epsilon?: number | undefined;
  /** Drop groups whose advantages are all 0 (zero variance, singletons, non-finite): DAPO's dynamic sampling. */
  readonly filterZeroVariance?: boolean | undefined;
  /**
   * Most groups a batch trains: the first ones in batch order (after the zero-variance filter); the rest are dropped
   * and counted in `batch/groups_surplus`. With a larger admission batch and the filter this is DAPO's dynamic
   * sampling: each step trains `maxGroups` groups whose rewards differ. Default: every group.
   */
  readonly maxGroups?: number | undefined;
  /** Subtract `β·KL(policy ‖ reference)` from the token rewards before scoring. */
  readonly klInReward?: KlInRewardOptions | undefined;
  /** Model tag of the batches. Default: the first group's. */
  readonly modelTag?: ModelTag;
  /**
   * The trained model's context length: a row longer fails the batch with a `ContextLengthError` before anything is
   * allocated for it (see `collate`). Default: no bound.
   */
  readonly maxSeqLen?: number | undefined;
  /** Cancels reference scoring. */
  readonly signal?: AbortSignal | undefined;
}

/**
 * Turns a batch of groups into a padded, columnar training {@link Batch}: token rewards (scalar reward on the last
 * response token, optionally minus a KL penalty against a reference policy), group-normalized advantages
 * broadcast over each row's loss mask, and the metrics of the preparation (`critic/*`, `batch/*`, and
 * `timing/prepare_s`: its seconds, reference log-probs included), with the rollout's `timing/generate_s` and
 * `timing/reward_s` where the trajectories carry their {@link Trajectory.timing} (the wall time in which some row of
 * the batch was being generated, or scored).
 * A batch with no rows left (every group empty or filtered) is still emitted, with size 0, so the step counter
 * and the admission gate move on.
 *
 * ```
 * groups:  --[A,B]------[C,D]--|
 * grpoPrepare({ padId: 0 })
 * output:  --x----------y------|      x = Batch of A's and B's rows with advantages
 * ```
 *
 * @example
 * ```ts
 * import { batchGroups, grpoPrepare } from 'rxrl/operators';
 * groups$.pipe(batchGroups({ batchSize: 16 }), grpoPrepare({ padId: tokenizer.padId, std: 'sample' }));
 * ```
 * @param options - advantage estimator settings, zero-variance filter and KL in reward.
 * @returns an operator from arrays of groups to batches.
 * @see train
 */
export function grpoPrepare(options: GrpoPrepareOptions): OperatorFunction<readonly Group[], Batch> {
  const filter = options.filterZeroVariance ?? false;
  const { maxGroups } = options;
  if (maxGroups !== undefined && !(Number.isInteger(maxGroups) && maxGroups >= 1))
    throw new ConfigError(`grpoPrepare maxGroups must be an integer >= 1, got ${maxGroups}`, { context: { key: 'maxGroups' } });
  let controller = options.klInReward ? createKlController(options.klInReward.controller) : undefined;
  return preparing(options.modelTag, async (rows, modelTag) => {
    const base = collate(rows, { padId: options.padId, modelTag, maxSeqLen: options.maxSeqLen });
    const R = base.responseLength;
    const metrics: Metrics = {};
    let tokenRewards = base.tokenRewards; // [B, R]
    let refLogprobs: Float32Array | undefined; // [B, R]
    if (options.klInReward && controller && base.size > 0) {
      refLogprobs = await options.klInReward.reference.responseLogprobs(base, options.signal);
      const penalty = klPenalty(base, refLogprobs, controller.coef, options.klInReward.estimator ?? 'k1');
      tokenRewards = penalty.tokenRewards;
      Object.assign(metrics, penalty.metrics);
      controller = updateKlController(controller, metrics['actor/reward_kl_penalty'], base.size);
    }
    // Scores are the per-row sums of the token rewards: the reward itself unless a KL penalty applies.
    const scores = rows.map((_, b) => tokenRewards.subarray(b * R, (b + 1) * R).reduce((a, x) => a + x, 0));
    const advantage = computeGroupAdvantages(scores, base.meta.groupIds, {
      normalizeByStd: options.normalizeByStd,
      std: options.std,
      epsilon: options.epsilon,
    });
    Object.assign(metrics, advantage.metrics);

    let kept = rows.map((_, i) => i);
    if (filter) {
      const informative = new Set(advantage.groups.filter((g) => g.kind === 'normal').map((g) => String(g.groupId)));
      kept = kept.filter((i) => informative.has(rows[i].groupId));
      metrics['batch/groups_filtered'] = advantage.groups.length - informative.size;
      metrics['batch/rows_filtered'] = rows.length - kept.length;
    }
    if (maxGroups !== undefined) {
      const first = firstGroups(rows, kept, maxGroups);
      metrics['batch/groups_surplus'] = first.surplus;
      kept = first.kept;
    }
    const rowAdvantages = kept.map((i) => advantage.advantages[i]);
    // Usually nothing is filtered: the batch collated above only needs its advantages.
    const prepared: Batch =
      kept.length === rows.length
        ? {
            ...base,
            advantages: broadcastAdvantages(base.lossMask, R, rowAdvantages),
            tokenRewards,
            ...(refLogprobs ? { refLogprobs } : {}),
          }
        : filteredBatch(rows, kept, rowAdvantages, { padId: options.padId, modelTag, width: R, tokenRewards, refLogprobs });
    metrics['batch/rows'] = prepared.size;
    return { ...prepared, metrics };
  });
}

/** The rows of `kept` that belong to its first `maxGroups` groups (rows come grouped, in batch order), and how many groups went. */
function firstGroups(rows: readonly Trajectory[], kept: readonly number[], maxGroups: number): { kept: number[]; surplus: number } {
  const chosen = new Set<string>();
  const dropped = new Set<string>();
  const out: number[] = [];
  for (const i of kept) {
    const id = rows[i].groupId;
    if (!chosen.has(id) && chosen.size >= maxGroups) dropped.add(id);
    else {
      chosen.add(id);
      out.push(i);
    }
  }
  return { kept: out, surplus: dropped.size };
}

/** Token rewards minus `coef·KL(policy ‖ reference)` over a batch's response tokens, with the penalty metrics. */
function klPenalty(
  batch: Batch,
  refLogprobs: Float32Array,
  coef: number,
  estimator: KlEstimatorName,
): { tokenRewards: Float32Array; metrics: Metrics } {
  const shape: [number, number] = [batch.size, batch.responseLength];
  const out = tf.tidy(() => {
    const result = applyKlPenalty(
      {
        tokenRewards: tf.tensor2d(batch.tokenRewards, shape),
        logprob: tf.tensor2d(batch.oldLogprobs, shape),
        refLogprob: tf.tensor2d(refLogprobs, shape),
        mask: tf.tensor2d(batch.responseMask, shape),
      },
      { coef, estimator },
    );
    return { tokenRewards: result.tokenRewards, metrics: result.metrics };
  });
  const tokenRewards = out.tokenRewards.dataSync() as Float32Array;
  out.tokenRewards.dispose();
  return { tokenRewards, metrics: readMetricsSync(out.metrics) };
}

/** The batch of rows `kept` only, with their advantages, token rewards and reference log-probs carried over. */
function filteredBatch(
  rows: readonly Trajectory[],
  kept: readonly number[],
  rowAdvantages: readonly number[],
  from: { padId: number; modelTag: ModelTag; width: number; tokenRewards: Float32Array; refLogprobs?: Float32Array | undefined },
): Batch {
  const { width, refLogprobs } = from;
  const batch = collate(
    kept.map((i) => rows[i]),
    {
      padId: from.padId,
      modelTag: from.modelTag,
      advantages: rowAdvantages,
      ...(refLogprobs ? { refLogprobs: kept.map((i) => refLogprobs.subarray(i * width, (i + 1) * width)) } : {}),
    },
  );
  return { ...batch, tokenRewards: selectRows(from.tokenRewards, width, kept, batch.responseLength) };
}

/** Rows `index` of a `[B, width]` array, re-laid out with `newWidth` columns (`newWidth ≤ width`). */
function selectRows(data: Float32Array, width: number, index: readonly number[], newWidth: number): Float32Array {
  const out = new Float32Array(index.length * newWidth);
  index.forEach((i, b) => out.set(data.subarray(i * width, i * width + newWidth), b * newWidth));
  return out;
}
