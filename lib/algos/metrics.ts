/**
 * Scalar metrics produced by the tensor functions of `lib/algos/`, and helpers to read them.
 *
 * Tensor functions return metrics as `tf.Scalar`s so they can be computed inside `tf.tidy` or
 * `tf.variableGrads` without a device read per metric. Read them in one place with {@link readMetrics}.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { Metrics } from '../core/types.js';

/** Scalar tensors keyed by namespaced metric names (`actor/pg_clipfrac`, `critic/advantages_mean`, ...). */
export type ScalarMetrics = Record<string, tf.Scalar>;

/**
 * What every loss function returns: the scalar loss to differentiate and its metrics.
 *
 * Inside `tf.grad` / `tf.variableGrads` every tensor the loss closure creates is disposed except the loss
 * itself; pass the metrics through {@link keepMetrics} there if you want to read them afterwards.
 */
export interface LossOutput {
  /** Scalar loss, `[]`. */
  readonly loss: tf.Scalar;
  /** Scalar metrics with namespaced keys. */
  readonly metrics: ScalarMetrics;
}

/**
 * Reads every metric to a plain number and disposes the tensors.
 *
 * @param metrics - Scalar metrics; each tensor is disposed after it is read.
 * @returns The same keys with plain numbers.
 */
export async function readMetrics(metrics: Readonly<ScalarMetrics>): Promise<Metrics> {
  const entries = Object.entries(metrics);
  try {
    const values = await Promise.all(entries.map(([, scalar]) => scalar.data()));
    return Object.fromEntries(entries.map(([key], i) => [key, values[i][0]]));
  } finally {
    disposeMetrics(metrics);
  }
}

/**
 * Synchronous {@link readMetrics}: blocks on each device read, then disposes the tensors.
 *
 * @param metrics - Scalar metrics; each tensor is disposed after it is read.
 * @returns The same keys with plain numbers.
 */
export function readMetricsSync(metrics: Readonly<ScalarMetrics>): Metrics {
  try {
    return Object.fromEntries(Object.entries(metrics).map(([key, scalar]) => [key, scalar.dataSync()[0]]));
  } finally {
    disposeMetrics(metrics);
  }
}

/**
 * Marks every metric tensor with `tf.keep`, so it survives the enclosing `tf.tidy` / `tf.variableGrads`.
 *
 * @param metrics - Scalar metrics.
 * @returns The same object.
 */
export function keepMetrics<T extends Readonly<ScalarMetrics>>(metrics: T): T {
  for (const scalar of Object.values(metrics)) tf.keep(scalar);
  return metrics;
}

/**
 * Disposes every metric tensor without reading it.
 *
 * @param metrics - Scalar metrics.
 */
export function disposeMetrics(metrics: Readonly<ScalarMetrics>): void {
  for (const scalar of Object.values(metrics)) scalar.dispose();
}
