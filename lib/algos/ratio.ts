/**
 * Probability ratios between two policies, computed from log-probs with a clamp so `exp` cannot overflow.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { assertSameShape } from './shapes.js';

/**
 * Bound on `|logprob − baseLogprob|` before it is exponentiated (`e^20 ≈ 4.9e8`). Beyond the bound the ratio is
 * constant, so its gradient there is 0.
 */
export const LOG_RATIO_CLAMP = 20;

/**
 * Probability ratio `π(a)/π_base(a) = exp(clamp(logprob − baseLogprob, ±LOG_RATIO_CLAMP))`, elementwise.
 *
 * @param logprob - Log-probs under the current policy, `[B, R]`.
 * @param baseLogprob - Log-probs under the policy the data came from, `[B, R]`.
 * @returns Ratio, `[B, R]`; differentiable with respect to both inputs inside the clamp.
 */
export function importanceRatio(logprob: tf.Tensor, baseLogprob: tf.Tensor): tf.Tensor {
  assertSameShape('importanceRatio', { logprob, baseLogprob });
  return tf.tidy(() => tf.exp(tf.clipByValue(tf.sub(logprob, baseLogprob), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)));
}
