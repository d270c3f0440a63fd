/**
 * Masked reductions over response tokens. A mask is a 0/1 indicator (`[B, R]`); any positive value counts as 1.
 *
 * Masking uses `tf.where`, not multiplication, so a NaN or infinity at a masked position never reaches the
 * result, and the gradient at masked positions is exactly 0.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { assertSameShape } from './shapes.js';

/**
 * Smallest denominator of a masked mean. Counts are whole numbers, so for any non-empty selection the guard
 * changes nothing; for an empty one the mean is `0 / MASK_EPSILON = 0` instead of `0 / 0 = NaN`.
 */
export const MASK_EPSILON = 1e-8;

/**
 * Boolean view of a mask: true where `mask > 0`.
 *
 * @param mask - 0/1 mask of any shape.
 * @returns Boolean tensor of the same shape.
 */
export function maskToBool(mask: tf.Tensor): tf.Tensor {
  return tf.greater(mask, 0);
}

/**
 * Keeps `x` where the mask is set and puts 0 elsewhere (NaN-safe).
 *
 * @param x - Values, `[B, R]` (any shape equal to the mask's).
 * @param mask - 0/1 mask, `[B, R]`.
 * @returns `x` on masked-in positions, 0 elsewhere, `[B, R]`, float32.
 */
export function applyMask<T extends tf.Tensor>(x: T, mask: T): T {
  assertSameShape('applyMask', { x, mask });
  return tf.tidy(() => tf.where(maskToBool(mask), tf.cast(x, 'float32'), tf.zeros(mask.shape))) as T;
}

/**
 * Sum of `x` over masked-in positions.
 *
 * @param x - Values, `[B, R]`.
 * @param mask - 0/1 mask, `[B, R]`.
 * @param axis - Axis to reduce; all axes when omitted.
 * @returns The masked sum: `[]` without `axis`, `[B]` for `axis = 1`.
 */
export function maskedSum(x: tf.Tensor, mask: tf.Tensor, axis?: number): tf.Tensor {
  return tf.tidy(() => tf.sum(applyMask(x, mask), axis));
}

/**
 * Mean of `x` over masked-in positions: `Σ x·m / max(Σ m, MASK_EPSILON)`; 0 where nothing is masked in.
 *
 * @param x - Values, `[B, R]`.
 * @param mask - 0/1 mask, `[B, R]`.
 * @param axis - Axis to reduce; all axes when omitted.
 * @returns The masked mean: `[]` without `axis`, `[B]` for `axis = 1`.
 */
export function maskedMean(x: tf.Tensor, mask: tf.Tensor, axis?: number): tf.Tensor {
  return tf.tidy(() => {
    const total = tf.sum(applyMask(x, mask), axis);
    const count = tf.sum(tf.cast(maskToBool(mask), 'float32'), axis);
    return tf.div(total, tf.maximum(count, MASK_EPSILON));
  });
}
