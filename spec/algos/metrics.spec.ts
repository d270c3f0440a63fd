import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import { applyMask, disposeMetrics, keepMetrics, maskedMean, maskedSum, readMetrics, readMetricsSync } from '../../lib/algos/index.js';
import { ShapeError } from '../../lib/core/errors.js';
import { expectNoLeak, mat, useCpuBackend, values } from './support.js';

useCpuBackend();

describe('metric helpers', () => {
  it('readMetrics reads and disposes every scalar', async () => {
    const before = tf.memory().numTensors;
    const metrics = { 'actor/a': tf.scalar(1.5), 'critic/b': tf.scalar(-2) };
    expect(await readMetrics(metrics)).toEqual({ 'actor/a': 1.5, 'critic/b': -2 });
    expect(tf.memory().numTensors).toBe(before);
    expect(metrics['actor/a'].isDisposed).toBe(true);
  });

  it('readMetricsSync reads and disposes every scalar', () => {
    const before = tf.memory().numTensors;
    expect(readMetricsSync({ x: tf.scalar(3) })).toEqual({ x: 3 });
    expect(tf.memory().numTensors).toBe(before);
  });

  it('keepMetrics lets metrics survive tf.tidy and tf.grad; disposeMetrics frees them', () => {
    const x = tf.tensor1d([1, 2]);
    const before = tf.memory().numTensors;
    let kept: Record<string, tf.Scalar> = {};
    const grad = tf.grad((v: tf.Tensor) => {
      const loss = tf.sum(tf.square(v));
      kept = keepMetrics({ 'actor/loss': tf.clone(loss) as tf.Scalar });
      return loss;
    })(x);
    expect(values(grad)).toEqual([2, 4]);
    expect(kept['actor/loss'].isDisposed).toBe(false);
    expect(readMetricsSync(kept)).toEqual({ 'actor/loss': 5 });
    grad.dispose();
    expect(tf.memory().numTensors).toBe(before);
    x.dispose();
    const other = { y: tf.scalar(1) };
    disposeMetrics(other);
    expect(other.y.isDisposed).toBe(true);
  });
});

describe('masked reductions', () => {
  const x = [
    [1, NaN, 3],
    [4, 5, Infinity],
  ];
  const m = [
    [1, 0, 1],
    [0, 1, 0],
  ];

  it('ignore masked-out values, even NaN and infinities', () => {
    const out = tf.tidy(() => ({
      masked: values(applyMask(mat(x), mat(m))),
      sum: values(maskedSum(mat(x), mat(m))),
      rowSum: values(maskedSum(mat(x), mat(m), 1)),
      mean: values(maskedMean(mat(x), mat(m))),
      rowMean: values(maskedMean(mat(x), mat(m), 1)),
      empty: values(
        maskedMean(
          mat(x),
          mat([
            [0, 0, 0],
            [0, 0, 0],
          ]),
        ),
      ),
    }));
    expect(out.masked).toEqual([1, 0, 3, 0, 5, 0]);
    expect(out.sum).toEqual([9]);
    expect(out.rowSum).toEqual([4, 5]);
    expect(out.mean).toEqual([3]);
    expect(out.rowMean).toEqual([2, 5]);
    expect(out.empty).toEqual([0]);
  });

  it('leak no tensors and check shapes', () => {
    const a = mat(x);
    const b = mat(m);
    expectNoLeak(() => maskedMean(a, b, 1));
    expectNoLeak(() => maskedSum(a, b));
    const wrong = mat([[1, 1]]);
    expect(() => applyMask(a, wrong)).toThrow(ShapeError);
    tf.dispose([a, b, wrong]);
  });
});
