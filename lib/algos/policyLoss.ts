/**
 * The PPO clipped surrogate objective, with DAPO's asymmetric clip range and dual clip.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import { type LossAggMode, aggregateLoss } from './aggregate.js';
import { applyMask, maskToBool, maskedMean } from './masked.js';
import type { LossOutput, ScalarMetrics } from './metrics.js';
import { LOG_RATIO_CLAMP } from './ratio.js';
import { assertRank, assertSameShape } from './shapes.js';

/** Default clip range ε of the surrogate (PPO, arXiv:1707.06347). */
export const DEFAULT_CLIP_RATIO = 0.2;

/** Inputs of {@link ppoClipLoss}; every tensor is `[B, R]`. */
export interface PolicyLossInput {
  /** Log-probs of the response tokens under the policy being trained, `[B, R]`; the loss is differentiable in it. */
  readonly logprob: tf.Tensor2D;
  /** Log-probs under the policy that produced the data (the "old" policy), `[B, R]`. */
  readonly oldLogprob: tf.Tensor2D;
  /** Per-token advantages (see `broadcastAdvantages`), `[B, R]`. */
  readonly advantages: tf.Tensor2D;
  /** 0/1 loss mask, `[B, R]`. */
  readonly mask: tf.Tensor2D;
  /** Optional per-token weights multiplying the per-token loss (see `truncatedImportanceWeights`), `[B, R]`. */
  readonly importanceWeights?: tf.Tensor2D | undefined;
}

/** Options of {@link ppoClipLoss}. */
export interface PpoClipOptions {
  /** Lower clip range: the ratio is clipped from below at `1 − clipLow`. In `[0, 1)`. Default 0.2. */
  readonly clipLow?: number;
  /** Upper clip range: the ratio is clipped from above at `1 + clipHigh` (DAPO raises it). ≥ 0. Default `clipLow`. */
  readonly clipHigh?: number | undefined;
  /** Dual-clip bound `c > 1` for negative advantages (Ye et al., arXiv:1912.09729). Default: no dual clip. */
  readonly clipRatioC?: number | undefined;
  /** Loss aggregation. Default `'token-mean'`. */
  readonly mode?: LossAggMode;
  /** `maxLength` for `seq-mean-token-sum-norm`. */
  readonly maxLength?: number | undefined;
}

/**
 * PPO clipped surrogate (Schulman et al., arXiv:1707.06347, eq. 7) as a loss to minimize, with the asymmetric
 * clip range of DAPO (Yu et al., arXiv:2503.14476, "clip-higher") and the dual clip of Ye et al.
 * (arXiv:1912.09729). Per token, with `r = exp(clamp(logprob − oldLogprob, ±LOG_RATIO_CLAMP))`:
 * ```
 * L     = max(−A·r, −A·clip(r, 1 − clipLow, 1 + clipHigh))
 * L     = min(L, −A·clipRatioC)             where A < 0 (dual clip, when clipRatioC is set)
 * L     = L · importanceWeights             (when given)
 * loss  = aggregateLoss(L, mask, mode)
 * ```
 * Masked positions are replaced by 0 before any arithmetic, so NaN or infinite values there change neither
 * the loss nor the gradient (exactly 0 at those positions). A NaN at an unmasked position propagates to the loss.
 *
 * Metrics (masked token means): `actor/pg_clipfrac` (tokens where the clipped term is the larger one),
 * `actor/pg_clipfrac_lower` (tokens where the dual clip bound is active), `actor/ppo_kl` (`oldLogprob − logprob`),
 * `actor/pg_loss` (the loss).
 *
 * @param input - `logprob`, `oldLogprob`, `advantages`, `mask` and optional `importanceWeights`, all `[B, R]`.
 * @param options - Clip ranges, dual clip, aggregation.
 * @returns `{ loss, metrics }`; `loss` is differentiable with respect to `logprob`.
 * @throws {@link ShapeError} on mismatched shapes; {@link ConfigError} on an invalid clip setting.
 */
export function ppoClipLoss(input: PolicyLossInput, options: PpoClipOptions = {}): LossOutput {
  const fn = 'ppoClipLoss';
  const { logprob, oldLogprob, advantages, mask, importanceWeights } = input;
  assertRank(mask, 2, 'mask', fn);
  assertSameShape(fn, { mask, logprob, oldLogprob, advantages });
  if (importanceWeights !== undefined) assertSameShape(fn, { mask, importanceWeights });
  const clipLow = options.clipLow ?? DEFAULT_CLIP_RATIO;
  const clipHigh = options.clipHigh ?? clipLow;
  const clipRatioC = options.clipRatioC;
  if (!(clipLow >= 0 && clipLow < 1)) {
    throw new ConfigError(`${fn}: clipLow must be in [0, 1), got ${clipLow}`, { context: { clipLow } });
  }
  if (!(clipHigh >= 0) || !Number.isFinite(clipHigh)) {
    throw new ConfigError(`${fn}: clipHigh must be a finite number ≥ 0, got ${clipHigh}`, { context: { clipHigh } });
  }
  if (clipRatioC !== undefined && !(clipRatioC > 1 && Number.isFinite(clipRatioC))) {
    throw new ConfigError(`${fn}: clipRatioC must be a finite number > 1, got ${clipRatioC}`, {
      context: { clipRatioC },
    });
  }

  return tf.tidy(() => {
    const lp = applyMask(logprob, mask); // [B, R]
    const old = applyMask(oldLogprob, mask); // [B, R]
    const adv = applyMask(advantages, mask); // [B, R]
    const logRatio = tf.sub(lp, old); // [B, R]
    const ratio = tf.exp(tf.clipByValue(logRatio, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)); // [B, R]
    const negAdv = tf.neg(adv); // [B, R]
    const unclipped = tf.mul(negAdv, ratio); // [B, R]
    const clipped = tf.mul(negAdv, tf.clipByValue(ratio, 1 - clipLow, 1 + clipHigh)); // [B, R]
    const clipLoss = tf.maximum(unclipped, clipped); // [B, R]
    const maskBool = maskToBool(mask); // [B, R]
    const clipActive = tf.logicalAnd(tf.greater(clipped, unclipped), maskBool); // [B, R]

    let perToken: tf.Tensor = clipLoss; // [B, R]
    let lowerActive: tf.Tensor = tf.zerosLike(maskBool); // [B, R] bool
    if (clipRatioC !== undefined) {
      const bound = tf.mul(negAdv, clipRatioC); // [B, R]
      const negative = tf.less(adv, 0); // [B, R]
      perToken = tf.where(negative, tf.minimum(clipLoss, bound), clipLoss); // [B, R]
      lowerActive = tf.logicalAnd(tf.logicalAnd(negative, tf.greater(clipLoss, bound)), maskBool); // [B, R]
    }
    if (importanceWeights !== undefined) perToken = tf.mul(perToken, applyMask(importanceWeights, mask)); // [B, R]

    const loss = aggregateLoss(perToken, mask, options.mode ?? 'token-mean', { maxLength: options.maxLength });
    const metrics: ScalarMetrics = {
      'actor/pg_clipfrac': maskedMean(tf.cast(clipActive, 'float32'), mask) as tf.Scalar,
      'actor/pg_clipfrac_lower': maskedMean(tf.cast(lowerActive, 'float32'), mask) as tf.Scalar,
      'actor/ppo_kl': maskedMean(tf.neg(logRatio), mask) as tf.Scalar,
      'actor/pg_loss': tf.clone(loss),
    };
    return { loss, metrics };
  });
}
