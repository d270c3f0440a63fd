/**
 * Token-level rewards: an outcome reward becomes a per-token signal on the last response token.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { assertLength, assertRank } from './shapes.js';

/**
 * Places each sequence's scalar reward on its last response token whose mask is 1, and 0 everywhere else
 * (as RLHF with outcome rewards does; cf. Ouyang et al., arXiv:2203.02155, and verl's token-level scores).
 *
 * ```
 * rewards = [2, 5, 7]    mask = [[1, 1, 0],   →   [[0, 2, 0],
 *                                [1, 0, 1],        [0, 0, 5],
 *                                [0, 0, 0]]        [0, 0, 0]]   (an all-zero row gets nothing)
 * ```
 * A non-finite reward is placed as it is (it affects its own row only).
 *
 * @param rewards - Scalar reward of each row, `[B]`.
 * @param mask - 0/1 response (or loss) mask, `[B, R]`.
 * @returns Token-level rewards, `[B, R]`, float32.
 * @throws {@link ShapeError} unless `rewards` is `[B]` and `mask` is `[B, R]`.
 */
export function tokenLevelRewards(rewards: tf.Tensor1D, mask: tf.Tensor2D): tf.Tensor2D {
  assertRank(mask, 2, 'mask', 'tokenLevelRewards');
  assertLength(rewards, mask.shape[0], 'rewards', 'tokenLevelRewards');
  const [rows, width] = mask.shape;
  if (width === 0) return tf.zeros([rows, 0]);
  return tf.tidy(() => {
    const positions = tf.range(0, width, 1, 'float32'); // [R]
    const grid = tf.broadcastTo(tf.expandDims(positions, 0), [rows, width]); // [B, R]
    const lastIndex = tf.max(tf.where(tf.greater(mask, 0), grid, tf.fill([rows, width], -1)), 1); // [B], −1 if empty
    const isLast = tf.equal(grid, tf.expandDims(lastIndex, 1)); // [B, R] bool
    const perRow = tf.broadcastTo(tf.expandDims(tf.cast(rewards, 'float32'), 1), [rows, width]); // [B, R]
    return tf.where(isLast, perRow, tf.zeros([rows, width])) as tf.Tensor2D; // [B, R]
  });
}
