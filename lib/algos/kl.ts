/**
 * Per-token KL estimators between the policy and a reference policy, and the two ways GRPO uses them: as a
 * penalty in the token rewards, or as a loss term.
 *
 * Estimators follow J. Schulman, "Approximating KL Divergence" (2020, http://joschu.net/blog/kl-approx.html),
 * with `d = logprob − refLogprob` for tokens sampled from the policy:
 * `k1 = d` (unbiased, high variance), `abs = |d|`, `mse = ½·d²` (the "k2" estimator) and
 * `k3 = exp(−d) + d − 1` (unbiased, non-negative, low variance; GRPO's KL term, arXiv:2402.03300 eq. 4).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import { type LossAggMode, aggregateLoss } from './aggregate.js';
import { applyMask } from './masked.js';
import type { LossOutput, ScalarMetrics } from './metrics.js';
import { assertRank, assertSameShape } from './shapes.js';

/** Bound on `|refLogprob − logprob|` before `exp` in the `k3` estimator. */
export const LOW_VAR_KL_LOG_RATIO_CLAMP = 20;

/** Bound on the `k3` estimate itself (`[−10, 10]`), which keeps one outlier token from dominating. */
export const LOW_VAR_KL_CLAMP = 10;

/** Name of a KL estimator; `low_var_kl` is an alias of `k3`. */
export type KlEstimatorName = 'k1' | 'abs' | 'mse' | 'k3' | 'low_var_kl';

/**
 * A per-token KL estimator.
 *
 * @param logprob - Log-probs of the sampled tokens under the policy, `[B, R]`.
 * @param refLogprob - Log-probs of the same tokens under the reference policy, `[B, R]`.
 * @returns Per-token estimate, `[B, R]`; differentiable with respect to `logprob`.
 */
export type KlEstimator = (logprob: tf.Tensor, refLogprob: tf.Tensor) => tf.Tensor;

/**
 * `k1 = logprob − refLogprob`.
 *
 * @param logprob - Policy log-probs, `[B, R]`.
 * @param refLogprob - Reference log-probs, `[B, R]`.
 * @returns `[B, R]`.
 */
export function klK1(logprob: tf.Tensor, refLogprob: tf.Tensor): tf.Tensor {
  assertSameShape('klK1', { logprob, refLogprob });
  return tf.sub(logprob, refLogprob);
}

/**
 * `abs = |logprob − refLogprob|`.
 *
 * @param logprob - Policy log-probs, `[B, R]`.
 * @param refLogprob - Reference log-probs, `[B, R]`.
 * @returns `[B, R]`.
 */
export function klAbs(logprob: tf.Tensor, refLogprob: tf.Tensor): tf.Tensor {
  assertSameShape('klAbs', { logprob, refLogprob });
  return tf.tidy(() => tf.abs(tf.sub(logprob, refLogprob)));
}

/**
 * `mse = ½·(logprob − refLogprob)²` (Schulman's `k2`).
 *
 * @param logprob - Policy log-probs, `[B, R]`.
 * @param refLogprob - Reference log-probs, `[B, R]`.
 * @returns `[B, R]`.
 */
export function klMse(logprob: tf.Tensor, refLogprob: tf.Tensor): tf.Tensor {
  assertSameShape('klMse', { logprob, refLogprob });
  return tf.tidy(() => tf.mul(0.5, tf.square(tf.sub(logprob, refLogprob))));
}

/**
 * `k3 = exp(r) − r − 1` with `r = clamp(refLogprob − logprob, ±LOW_VAR_KL_LOG_RATIO_CLAMP)`, then clamped to
 * `±LOW_VAR_KL_CLAMP`.
 *
 * @param logprob - Policy log-probs, `[B, R]`.
 * @param refLogprob - Reference log-probs, `[B, R]`.
 * @returns `[B, R]`, in `[0, LOW_VAR_KL_CLAMP]` up to rounding.
 */
export function klLowVar(logprob: tf.Tensor, refLogprob: tf.Tensor): tf.Tensor {
  assertSameShape('klLowVar', { logprob, refLogprob });
  return tf.tidy(() => {
    const bound = LOW_VAR_KL_LOG_RATIO_CLAMP;
    const logRatio = tf.clipByValue(tf.sub(refLogprob, logprob), -bound, bound); // [B, R]
    const estimate = tf.sub(tf.sub(tf.exp(logRatio), logRatio), 1); // [B, R]
    return tf.clipByValue(estimate, -LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP);
  });
}

const KL_ESTIMATORS: Readonly<Record<KlEstimatorName, KlEstimator>> = {
  k1: klK1,
  abs: klAbs,
  mse: klMse,
  k3: klLowVar,
  low_var_kl: klLowVar,
};

/** Every {@link KlEstimatorName}. */
export const KL_ESTIMATOR_NAMES: readonly KlEstimatorName[] = ['k1', 'abs', 'mse', 'k3', 'low_var_kl'];

/**
 * True when `name` is a {@link KlEstimatorName}.
 *
 * @param name - Candidate name.
 */
export function isKlEstimatorName(name: string): name is KlEstimatorName {
  return (KL_ESTIMATOR_NAMES as readonly string[]).includes(name);
}

/**
 * Looks up a KL estimator by name.
 *
 * @param name - One of {@link KL_ESTIMATOR_NAMES}.
 * @returns The estimator.
 * @throws {@link ConfigError} listing the valid names when `name` is unknown.
 */
export function getKlEstimator(name: string): KlEstimator {
  if (!isKlEstimatorName(name)) {
    throw new ConfigError(`unknown KL estimator '${name}'; valid: ${KL_ESTIMATOR_NAMES.join(', ')}`, {
      context: { name, valid: KL_ESTIMATOR_NAMES },
    });
  }
  return KL_ESTIMATORS[name];
}

/** Inputs of {@link applyKlPenalty}; every tensor is `[B, R]`. */
export interface KlPenaltyInput {
  /** Token-level rewards (see `tokenLevelRewards`), `[B, R]`. */
  readonly tokenRewards: tf.Tensor2D;
  /** Log-probs of the response tokens under the policy that sampled them, `[B, R]`. */
  readonly logprob: tf.Tensor2D;
  /** Log-probs under the reference policy, `[B, R]`. */
  readonly refLogprob: tf.Tensor2D;
  /** 0/1 response mask, `[B, R]`. */
  readonly mask: tf.Tensor2D;
}

/** Options of {@link applyKlPenalty}. */
export interface KlPenaltyOptions {
  /** The coefficient β (for example a controller's `coef`). */
  readonly coef: number;
  /** Estimator. Default `'k1'`. */
  readonly estimator?: KlEstimatorName;
}

/** Result of {@link applyKlPenalty}. */
export interface KlPenaltyResult {
  /** `(tokenRewards − β·kl)` on masked-in tokens, 0 elsewhere, `[B, R]`. */
  readonly tokenRewards: tf.Tensor2D;
  /**
   * `actor/reward_kl_penalty`: the KL, a masked mean per sequence then a mean over non-empty sequences (feed it
   * to `updateKlController`); `actor/reward_kl_penalty_coeff`: β.
   */
  readonly metrics: ScalarMetrics;
}

/**
 * KL in the reward (InstructGPT-style, arXiv:2203.02155 eq. 2): `tokenRewards − β·kl`, masked.
 *
 * @param input - Token rewards, policy and reference log-probs and the mask, all `[B, R]`.
 * @param options - β and the estimator.
 * @returns Penalized token rewards `[B, R]` and metrics.
 * @throws {@link ShapeError} on mismatched shapes; {@link ConfigError} on an unknown estimator.
 */
export function applyKlPenalty(input: KlPenaltyInput, options: KlPenaltyOptions): KlPenaltyResult {
  const { tokenRewards, logprob, refLogprob, mask } = input;
  assertRank(mask, 2, 'mask', 'applyKlPenalty');
  assertSameShape('applyKlPenalty', { mask, tokenRewards, logprob, refLogprob });
  const estimator = getKlEstimator(options.estimator ?? 'k1');
  const coef = options.coef;
  return tf.tidy(() => {
    const kl = applyMask(estimator(applyMask(logprob, mask), applyMask(refLogprob, mask)), mask); // [B, R]
    const penalized = applyMask(tf.sub(tokenRewards, tf.mul(coef, kl)), mask) as tf.Tensor2D; // [B, R]
    const metrics: ScalarMetrics = {
      'actor/reward_kl_penalty': aggregateLoss(kl, mask, 'seq-mean-token-mean'),
      'actor/reward_kl_penalty_coeff': tf.scalar(coef),
    };
    return { tokenRewards: penalized, metrics };
  });
}

/** Inputs of {@link klLoss}; every tensor is `[B, R]`. */
export interface KlLossInput {
  /** Log-probs under the policy being trained, `[B, R]`. */
  readonly logprob: tf.Tensor2D;
  /** Log-probs under the reference policy, `[B, R]`. */
  readonly refLogprob: tf.Tensor2D;
  /** 0/1 loss mask, `[B, R]`. */
  readonly mask: tf.Tensor2D;
}

/** Options of {@link klLoss}. */
export interface KlLossOptions {
  /** Coefficient the aggregated KL is multiplied by. */
  readonly coef: number;
  /** Estimator. Default `'low_var_kl'` (GRPO). */
  readonly estimator?: KlEstimatorName;
  /** Aggregation. Default `'token-mean'`. */
  readonly mode?: LossAggMode;
  /** `maxLength` for `seq-mean-token-sum-norm`. */
  readonly maxLength?: number;
}

/**
 * KL as a loss term (GRPO, arXiv:2402.03300 eq. 3): `coef · aggregate(kl, mask, mode)`.
 *
 * @param input - Policy and reference log-probs and the mask, all `[B, R]`.
 * @param options - Coefficient, estimator, aggregation.
 * @returns `loss` (scaled, differentiable with respect to `logprob`) and metrics `actor/kl_loss` (unscaled) and
 *   `actor/kl_coef`.
 * @throws {@link ShapeError} on mismatched shapes; {@link ConfigError} on an unknown estimator or mode.
 */
export function klLoss(input: KlLossInput, options: KlLossOptions): LossOutput {
  const { logprob, refLogprob, mask } = input;
  assertRank(mask, 2, 'mask', 'klLoss');
  assertSameShape('klLoss', { mask, logprob, refLogprob });
  const estimator = getKlEstimator(options.estimator ?? 'low_var_kl');
  const coef = options.coef;
  return tf.tidy(() => {
    const kl = estimator(applyMask(logprob, mask), applyMask(refLogprob, mask)); // [B, R]
    const aggregated = aggregateLoss(kl, mask, options.mode ?? 'token-mean', { maxLength: options.maxLength });
    const metrics: ScalarMetrics = { 'actor/kl_loss': tf.clone(aggregated), 'actor/kl_coef': tf.scalar(coef) };
    return { loss: tf.mul(coef, aggregated) as tf.Scalar, metrics };
  });
}
