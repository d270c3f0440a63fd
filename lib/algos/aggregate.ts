/**
 * Reduction of a per-token loss matrix `[B, R]` to the scalar that is differentiated.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError, assertNever } from '../core/errors.js';
import { MASK_EPSILON, applyMask, maskToBool } from './masked.js';
import { assertRank, assertSameShape } from './shapes.js';

/**
 * How {@link aggregateLoss} reduces a per-token loss over tokens and sequences.
 *
 * - `token-mean`: every unmasked token in the batch weighs the same (DAPO).
 * - `seq-mean-token-sum`: each sequence contributes the sum of its token losses; sequences weigh the same.
 * - `seq-mean-token-mean`: each sequence contributes the mean of its token losses (original GRPO).
 * - `seq-mean-token-sum-norm`: each sequence's sum is divided by a constant length (Dr.GRPO).
 */
export type LossAggMode = 'token-mean' | 'seq-mean-token-sum' | 'seq-mean-token-mean' | 'seq-mean-token-sum-norm';

/** Every {@link LossAggMode}, in documentation order. */
export const LOSS_AGG_MODES: readonly LossAggMode[] = [
  'token-mean',
  'seq-mean-token-sum',
  'seq-mean-token-mean',
  'seq-mean-token-sum-norm',
];

/**
 * True when `name` is a {@link LossAggMode}.
 *
 * @param name - Candidate mode name.
 */
export function isLossAggMode(name: string): name is LossAggMode {
  return (LOSS_AGG_MODES as readonly string[]).includes(name);
}

/**
 * Validates a loss aggregation mode read from configuration.
 *
 * @param name - Candidate mode name.
 * @returns The name, typed.
 * @throws {@link ConfigError} listing the valid modes when `name` is not one.
 */
export function parseLossAggMode(name: string): LossAggMode {
  if (isLossAggMode(name)) return name;
  throw new ConfigError(`unknown loss aggregation mode '${name}'; valid modes: ${LOSS_AGG_MODES.join(', ')}`, {
    context: { name, valid: LOSS_AGG_MODES },
  });
}

/** Options of {@link aggregateLoss}. */
export interface AggregateLossOptions {
  /**
   * Constant divisor of each sequence's token sum in `seq-mean-token-sum-norm` (Dr.GRPO uses the generation
   * budget). Must be positive. Default: `R`, the width of the loss matrix. Ignored by the other modes.
   */
  readonly maxLength?: number | undefined;
}

/**
 * Reduces a per-token loss to a scalar.
 *
 * With `m = mask > 0`, `n_b = Σ_t m[b,t]` (tokens of row `b`), `S_b = Σ_t loss[b,t]·m[b,t]` and
 * `E = {b : n_b > 0}` (rows with at least one unmasked token):
 *
 * | mode | value |
 * | --- | --- |
 * | `token-mean` | `Σ_b S_b / Σ_b n_b` |
 * | `seq-mean-token-sum` | `(1/|E|) Σ_{b∈E} S_b` — a true per-sequence sum, averaged over non-empty rows |
 * | `seq-mean-token-mean` | `(1/|E|) Σ_{b∈E} S_b / n_b` |
 * | `seq-mean-token-sum-norm` | `(1/B) Σ_b S_b / maxLength` — constant normalizer over all `B` rows (Dr.GRPO) |
 *
 * Worked example, `R = 3`:
 * ```
 * loss = [[1, 2, 3],      mask = [[1, 1, 0],     S = [3, 4, 0]   n = [2, 1, 0]   E = {0, 1}
 *         [4, 5, 6],              [1, 0, 0],
 *         [7, 8, 9]]              [0, 0, 0]]
 * token-mean              = (3 + 4) / (2 + 1)        = 7/3 ≈ 2.3333
 * seq-mean-token-sum      = (3 + 4) / 2              = 3.5
 * seq-mean-token-mean     = (3/2 + 4/1) / 2          = 2.75
 * seq-mean-token-sum-norm = (3/3 + 4/3 + 0/3) / 3    = 7/9 ≈ 0.7778
 * ```
 * An all-masked input (or `B = 0`) gives 0, never NaN: denominators are floored at {@link MASK_EPSILON},
 * which changes nothing when they are whole numbers ≥ 1. Values at masked positions (even NaN) are ignored.
 *
 * Modes follow verl's `agg_loss` (`verl/trainer/ppo/core_algos.py`); the Dr.GRPO normalizer is from Liu et al.,
 * "Understanding R1-Zero-Like Training: A Critical Perspective" (arXiv:2503.20783).
 *
 * @param lossMat - Per-token loss, `[B, R]`.
 * @param mask - 0/1 loss mask, `[B, R]`.
 * @param mode - Reduction, see the table.
 * @param options - `maxLength` for `seq-mean-token-sum-norm`.
 * @returns Scalar loss, `[]`; differentiable with respect to `lossMat`.
 * @throws {@link ConfigError} for an unknown mode or a non-positive `maxLength`.
 */
export function aggregateLoss(lossMat: tf.Tensor, mask: tf.Tensor, mode: LossAggMode, options: AggregateLossOptions = {}): tf.Scalar {
  assertRank(lossMat, 2, 'lossMat', 'aggregateLoss');
  assertSameShape('aggregateLoss', { lossMat, mask });
  const [rows, width] = lossMat.shape;
  const maxLength = options.maxLength ?? width;
  if (!(maxLength > 0)) {
    throw new ConfigError(`aggregateLoss: maxLength must be positive, got ${maxLength}`, { context: { maxLength } });
  }
  return tf.tidy(() => {
    const masked = applyMask(lossMat, mask); // [B, R], 0 on masked positions
    const tokenCounts = tf.sum(tf.cast(maskToBool(mask), 'float32'), 1); // [B]
    const rowSums = tf.sum(masked, 1); // [B]
    const nonEmpty = tf.cast(tf.greater(tokenCounts, 0), 'float32'); // [B]
    const meanOverNonEmpty = (perRow: tf.Tensor): tf.Scalar =>
      tf.div(tf.sum(tf.mul(perRow, nonEmpty)), tf.maximum(tf.sum(nonEmpty), MASK_EPSILON)); // []
    switch (mode) {
      case 'token-mean':
        return tf.div(tf.sum(rowSums), tf.maximum(tf.sum(tokenCounts), MASK_EPSILON)); // []
      case 'seq-mean-token-sum':
        return meanOverNonEmpty(rowSums);
      case 'seq-mean-token-mean':
        return meanOverNonEmpty(tf.div(rowSums, tf.maximum(tokenCounts, MASK_EPSILON))); // [B] → []
      case 'seq-mean-token-sum-norm':
        return tf.div(tf.sum(tf.div(rowSums, maxLength)), Math.max(rows, 1)); // [B] → []
      default:
        return assertNever(mode, `loss aggregation mode (valid: ${LOSS_AGG_MODES.join(', ')})`);
    }
  });
}
