/**
 * `stopGradient` for TF.js: tfjs-core has no such op, so this one is built with `tf.customGrad`.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

/** Identity forward, zero backward. Built once; `tf.customGrad` only wraps a closure. */
const identityWithZeroGradient = tf.customGrad((...inputs: Array<tf.Tensor | tf.GradSaveFunc>) => {
  const x = inputs[0];
  if (!(x instanceof tf.Tensor)) throw new TypeError('stopGradient expects a tensor');
  return { value: tf.clone(x), gradFunc: (dy: tf.Tensor) => tf.zerosLike(dy) };
});

/**
 * Returns a copy of `x` through which no gradient flows (TensorFlow's `tf.stop_gradient`, PyTorch's
 * `.detach()`): the forward value is `x`, the gradient with respect to `x` is all zeros.
 *
 * @param x - Any tensor, any shape.
 * @returns A new tensor with the same shape, dtype and values.
 */
export function stopGradient<T extends tf.Tensor>(x: T): T {
  return identityWithZeroGradient(x) as T;
}
