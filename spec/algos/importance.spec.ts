import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import {
  DEFAULT_IS_WEIGHT_CAP,
  LOG_RATIO_CLAMP,
  importanceRatio,
  readMetricsSync,
  stopGradient,
  truncatedImportanceWeights,
} from '../../lib/algos/index.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { mulberry32, randomInt, randomMask, randomMatrix } from '../helpers/random.js';
import { expectClose, expectMetricsClose, expectNoLeak, mat, useCpuBackend, values } from './support.js';

useCpuBackend();

function weights(
  lp: number[][],
  rollout: number[][],
  mask: number[][],
  cap?: number,
): { weights: number[]; metrics: Record<string, number> } {
  const out = tf.tidy(() => {
    const result = truncatedImportanceWeights(mat(lp), mat(rollout), mat(mask), { cap });
    return { weights: values(result.weights), metrics: result.metrics };
  });
  return { weights: out.weights, metrics: readMetricsSync(out.metrics) };
}

/** Plain-loop reference (float64). */
function referenceWeights(lp: number[][], rollout: number[][], mask: number[][], cap: number) {
  let n = 0;
  let sum = 0;
  let clipped = 0;
  const w = lp.flatMap((row, b) =>
    row.map((x, t) => {
      if (!(mask[b][t] > 0)) return 0;
      const r = Math.exp(Math.min(Math.max(x - rollout[b][t], -LOG_RATIO_CLAMP), LOG_RATIO_CLAMP));
      n += 1;
      if (r > cap) clipped += 1;
      sum += Math.min(r, cap);
      return Math.min(r, cap);
    }),
  );
  return {
    weights: w,
    metrics: { 'actor/is_weight_mean': n ? sum / n : 0, 'actor/is_weight_clipfrac': n ? clipped / n : 0 },
  };
}

describe('truncatedImportanceWeights', () => {
  it('truncates the ratio at the cap and reports mean and clip fraction', () => {
    const lp = [[Math.log(0.5), Math.log(1.5), Math.log(3), 0]];
    const out = weights(lp, [[0, 0, 0, 0]], [[1, 1, 1, 0]]);
    expect(DEFAULT_IS_WEIGHT_CAP).toBe(2);
    expectClose(out.weights, [0.5, 1.5, 2, 0]);
    expectMetricsClose(out.metrics, { 'actor/is_weight_mean': 4 / 3, 'actor/is_weight_clipfrac': 1 / 3 });
  });

  it('agrees with a plain-loop reference on seeded random inputs', () => {
    for (let seed = 1; seed <= 15; seed++) {
      const rng = mulberry32(seed);
      const rows = randomInt(rng, 1, 6);
      const width = randomInt(rng, 1, 8);
      const lp = randomMatrix(rng, rows, width, -3, 0);
      const rollout = randomMatrix(rng, rows, width, -3, 0);
      const mask = randomMask(rng, rows, width, 0.2);
      const cap = [1.5, 2, 5][seed % 3];
      const expected = referenceWeights(lp, rollout, mask, cap);
      const actual = weights(lp, rollout, mask, cap);
      expectClose(actual.weights, expected.weights);
      expectMetricsClose(actual.metrics, expected.metrics);
    }
  });

  it('handles ±1e4 log-ratios, NaN at masked positions and all-masked input', () => {
    const out = weights([[1e4, -1e4, NaN]], [[0, 0, 0]], [[1, 1, 0]]);
    expectClose(out.weights, [2, Math.exp(-LOG_RATIO_CLAMP), 0]);
    const empty = weights([[1, 2]], [[0, 0]], [[0, 0]]);
    expect(empty.weights).toEqual([0, 0]);
    expect(empty.metrics).toEqual({ 'actor/is_weight_mean': 0, 'actor/is_weight_clipfrac': 0 });
  });

  it('carries no gradient', () => {
    const grad = tf.tidy(() => {
      const rollout = mat([[0, -1, 0.5]]);
      const mask = mat([[1, 1, 1]]);
      // f(lp) = Σ w(lp)·lp: with w constant, df/dlp = w.
      const f = (lp: tf.Tensor): tf.Scalar => {
        const { weights: w } = truncatedImportanceWeights(lp as tf.Tensor2D, rollout, mask);
        return tf.sum(tf.mul(w, lp));
      };
      return values(tf.grad(f)(mat([[0.2, -0.5, 0.5]])));
    });
    expectClose(grad, [Math.exp(0.2), Math.exp(0.5), 1]);
  });

  it('leaks no tensors and validates its inputs', () => {
    const a = mat([[0, -1]]);
    const b = mat([[-0.5, -0.5]]);
    const m = mat([[1, 1]]);
    expectNoLeak(() => truncatedImportanceWeights(a, b, m, { cap: 1.2 }));
    expect(() => truncatedImportanceWeights(a, b, m, { cap: 0 })).toThrow(ConfigError);
    const wide = mat([[0, 0, 0]]);
    expect(() => truncatedImportanceWeights(a, wide, m)).toThrow(ShapeError);
    tf.dispose([a, b, m, wide]);
  });
});

describe('stopGradient and importanceRatio', () => {
  it('stopGradient passes values and blocks gradients', () => {
    const out = tf.tidy(() => {
      const x = tf.tensor1d([1, -2, 3]);
      const y = stopGradient(x);
      const grad = tf.grad((v: tf.Tensor) => tf.sum(tf.mul(stopGradient(tf.square(v)), v)))(x);
      return { y: values(y), dtype: y.dtype, grad: values(grad) };
    });
    expect(out.y).toEqual([1, -2, 3]);
    expect(out.dtype).toBe('float32');
    // d/dv Σ sg(v²)·v = v² (the v² factor is a constant).
    expect(out.grad).toEqual([1, 4, 9]);
  });

  it('importanceRatio clamps the log-ratio before exp', () => {
    const out = tf.tidy(() => values(importanceRatio(mat([[0, 1e4, -1e4, Math.log(2)]]), mat([[0, 0, 0, 0]]))));
    expectClose([out[0], out[2], out[3]], [1, Math.exp(-20), 2]);
    expect(out[1] / Math.exp(LOG_RATIO_CLAMP)).toBeCloseTo(1, 5);
  });

  it('neither leaks', () => {
    const x = tf.tensor1d([1, 2]);
    expectNoLeak(() => stopGradient(x));
    expectNoLeak(() => importanceRatio(x, x));
    x.dispose();
  });
});
