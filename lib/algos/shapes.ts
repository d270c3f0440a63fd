/**
 * Internal shape checks shared by the functions of `lib/algos/`. Not re-exported from the barrel.
 *
 * @internal
 * @packageDocumentation
 */
import type * as tf from '@tensorflow/tfjs-core';

import { ShapeError } from '../core/errors.js';

/**
 * Throws a {@link ShapeError} unless `tensor` has the given rank.
 *
 * @param tensor - Any tensor.
 * @param rank - Expected rank.
 * @param name - Argument name, for the message.
 * @param fn - Calling function, for the message.
 */
export function assertRank(tensor: tf.Tensor, rank: number, name: string, fn: string): void {
  if (tensor.rank !== rank) {
    throw new ShapeError(`${fn}: ${name} must have rank ${rank}, got shape [${tensor.shape.join(', ')}]`, {
      context: { fn, argument: name, shape: tensor.shape, expectedRank: rank },
    });
  }
}

/**
 * Throws a {@link ShapeError} unless every tensor has exactly the shape of the first one.
 *
 * @param fn - Calling function, for the message.
 * @param tensors - Named tensors; the first entry is the reference shape.
 */
export function assertSameShape(fn: string, tensors: Readonly<Record<string, tf.Tensor>>): void {
  const entries = Object.entries(tensors);
  if (entries.length === 0) return;
  const [refName, ref] = entries[0];
  for (const [name, tensor] of entries.slice(1)) {
    const same = tensor.rank === ref.rank && tensor.shape.every((d, i) => d === ref.shape[i]);
    if (!same) {
      throw new ShapeError(`${fn}: ${name} has shape [${tensor.shape.join(', ')}] but ${refName} has [${ref.shape.join(', ')}]`, {
        context: { fn, argument: name, shape: tensor.shape, expected: ref.shape },
      });
    }
  }
}

/**
 * Throws a {@link ShapeError} unless `tensor` is `[B]` where `batch` is `B`.
 *
 * @param tensor - Candidate `[B]` tensor.
 * @param batch - Expected length `B`.
 * @param name - Argument name, for the message.
 * @param fn - Calling function, for the message.
 */
export function assertLength(tensor: tf.Tensor, batch: number, name: string, fn: string): void {
  if (tensor.rank !== 1 || tensor.shape[0] !== batch) {
    throw new ShapeError(`${fn}: ${name} must have shape [${batch}], got [${tensor.shape.join(', ')}]`, {
      context: { fn, argument: name, shape: tensor.shape, expected: [batch] },
    });
  }
}
