/**
 * Truncated importance weights that correct for data sampled by an older (stale) or different rollout policy.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import { applyMask, maskToBool, maskedMean } from './masked.js';
import type { ScalarMetrics } from './metrics.js';
import { importanceRatio } from './ratio.js';
import { assertRank, assertSameShape } from './shapes.js';
import { stopGradient } from './stopGradient.js';

/** Default truncation cap `C` of the importance weights. */
export const DEFAULT_IS_WEIGHT_CAP = 2;

/** Options of {@link truncatedImportanceWeights}. */
export interface TruncatedImportanceOptions {
  /** Truncation cap `C > 0`. Default {@link DEFAULT_IS_WEIGHT_CAP}. */
  readonly cap?: number | undefined;
}

/** Result of {@link truncatedImportanceWeights}. */
export interface TruncatedImportanceResult {
  /** `min(π/π_rollout, C)` on masked-in tokens, 0 elsewhere, `[B, R]`; carries no gradient. */
  readonly weights: tf.Tensor2D;
  /** `actor/is_weight_mean` (masked mean weight), `actor/is_weight_clipfrac` (fraction of tokens truncated). */
  readonly metrics: ScalarMetrics;
}

/**
 * Truncated importance sampling (TIS) weights per token: `w = min(exp(logprob − rolloutLogprob), cap)`, with the
 * log-ratio clamped to `±LOG_RATIO_CLAMP` before `exp` (Ionides, "Truncated Importance Sampling", 2008; used for
 * rollout/trainer mismatch by Yao et al., "Your Efficient RL Framework Secretly Brings You Off-Policy RL
 * Training", 2025). Multiply the per-token policy loss by `w` (`ppoClipLoss`'s `importanceWeights`).
 *
 * The weights are constants for the optimizer: no gradient flows through them (see `stopGradient`).
 *
 * @param logprob - Log-probs under the policy being corrected toward (recomputed by the trainer), `[B, R]`.
 * @param rolloutLogprob - Log-probs recorded by the rollout engine when the tokens were sampled, `[B, R]`.
 * @param mask - 0/1 loss mask, `[B, R]`.
 * @param options - Truncation cap.
 * @returns Weights `[B, R]` and metrics.
 * @throws {@link ShapeError} on mismatched shapes; {@link ConfigError} on a non-positive cap.
 */
export function truncatedImportanceWeights(
  logprob: tf.Tensor2D,
  rolloutLogprob: tf.Tensor2D,
  mask: tf.Tensor2D,
  options: TruncatedImportanceOptions = {},
): TruncatedImportanceResult {
  const fn = 'truncatedImportanceWeights';
  assertRank(mask, 2, 'mask', fn);
  assertSameShape(fn, { mask, logprob, rolloutLogprob });
  const cap = options.cap ?? DEFAULT_IS_WEIGHT_CAP;
  if (!(cap > 0)) throw new ConfigError(`${fn}: cap must be > 0, got ${cap}`, { context: { cap } });
  return tf.tidy(() => {
    const ratio = importanceRatio(applyMask(logprob, mask), applyMask(rolloutLogprob, mask)); // [B, R]
    const weights = stopGradient(applyMask(tf.minimum(ratio, cap), mask)) as tf.Tensor2D; // [B, R]
    const truncated = tf.cast(tf.logicalAnd(tf.greater(ratio, cap), maskToBool(mask)), 'float32'); // [B, R]
    const metrics: ScalarMetrics = {
      'actor/is_weight_mean': maskedMean(weights, mask) as tf.Scalar,
      'actor/is_weight_clipfrac': maskedMean(truncated, mask) as tf.Scalar,
    };
    return { weights, metrics };
  });
}
