/**
 * Shared test support for `spec/algos/`: backend setup, leak checks and numeric comparisons.
 */
import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-core/dist/register_all_gradients';
import { beforeAll, expect } from 'vitest';

import type { LossAggMode } from '../../lib/algos/index.js';

/** Selects the cpu backend before the tests of the calling file. */
export function useCpuBackend(): void {
  beforeAll(async () => {
    await import('@tensorflow/tfjs-backend-cpu');
    await tf.setBackend('cpu');
    await tf.ready();
  });
}

/** Float32 comparison tolerance used throughout. */
export const TOL = 1e-5;

/** Every tensor reachable from `value` (tensors, arrays, plain objects). */
export function tensorsIn(value: unknown): tf.Tensor[] {
  if (value instanceof tf.Tensor) return [value];
  if (Array.isArray(value)) return value.flatMap(tensorsIn);
  if (typeof value === 'object' && value !== null) return Object.values(value).flatMap(tensorsIn);
  return [];
}

/**
 * Runs `fn`, checks that the only tensors it left alive are the ones it returned, disposes them, and checks
 * that the tensor count is back where it started.
 */
export function expectNoLeak<T>(fn: () => T): void {
  const before = tf.memory().numTensors;
  const result = fn();
  const returned = tensorsIn(result);
  expect(tf.memory().numTensors - before).toBe(returned.length);
  tf.dispose(returned);
  expect(tf.memory().numTensors).toBe(before);
}

/** Reads a tensor to a flat array of numbers. */
export function values(tensor: tf.Tensor): number[] {
  return Array.from(tensor.dataSync());
}

/** Reads a scalar tensor to a number. */
export function scalar(tensor: tf.Tensor): number {
  expect(tensor.size).toBe(1);
  return tensor.dataSync()[0];
}

/** Asserts two equally long arrays agree elementwise within `tol` (NaN only matches NaN). */
export function expectClose(actual: readonly number[], expected: readonly number[], tol = TOL): void {
  expect(actual.length).toBe(expected.length);
  actual.forEach((a, i) => {
    const e = expected[i];
    if (Number.isNaN(e)) {
      expect(a, `index ${i}`).toBeNaN();
    } else {
      expect(Math.abs(a - e), `index ${i}: ${a} vs ${e}`).toBeLessThanOrEqual(tol);
    }
  });
}

/** Asserts two metric records have the same keys and agree within `tol`. */
export function expectMetricsClose(actual: Readonly<Record<string, number>>, expected: Readonly<Record<string, number>>, tol = TOL): void {
  expect(Object.keys(actual).sort()).toEqual(Object.keys(expected).sort());
  for (const key of Object.keys(expected)) {
    expect(Math.abs(actual[key] - expected[key]), `${key}: ${actual[key]} vs ${expected[key]}`).toBeLessThanOrEqual(tol);
  }
}

/** A `[B, R]` float32 tensor from nested arrays (`R` given for the `B = 0` case). */
export function mat(rows: readonly (readonly number[])[], width?: number): tf.Tensor2D {
  const cols = width ?? rows[0]?.length ?? 0;
  return tf.tensor2d(rows.flat(), [rows.length, cols], 'float32');
}

/** Plain-loop reference of every mode (float64). */
export function referenceAggregate(loss: number[][], mask: number[][], mode: LossAggMode, maxLength?: number): number {
  const rows = loss.length;
  const width = rows > 0 ? loss[0].length : 0;
  const sums: number[] = [];
  const counts: number[] = [];
  for (let b = 0; b < rows; b++) {
    let s = 0;
    let n = 0;
    for (let t = 0; t < width; t++) {
      if (mask[b][t] > 0) {
        s += loss[b][t];
        n += 1;
      }
    }
    sums.push(s);
    counts.push(n);
  }
  const nonEmpty = counts.map((n, b) => ({ n, s: sums[b] })).filter(({ n }) => n > 0);
  const total = (xs: number[]): number => xs.reduce((a, c) => a + c, 0);
  switch (mode) {
    case 'token-mean': {
      const n = total(counts);
      return n === 0 ? 0 : total(sums) / n;
    }
    case 'seq-mean-token-sum':
      return nonEmpty.length === 0 ? 0 : total(nonEmpty.map(({ s }) => s)) / nonEmpty.length;
    case 'seq-mean-token-mean':
      return nonEmpty.length === 0 ? 0 : total(nonEmpty.map(({ s, n }) => s / n)) / nonEmpty.length;
    case 'seq-mean-token-sum-norm':
      return rows === 0 ? 0 : total(sums.map((s) => s / (maxLength ?? width))) / rows;
  }
}
