import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import { LOSS_AGG_MODES, type LossAggMode, aggregateLoss, isLossAggMode, parseLossAggMode } from '../../lib/algos/index.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { mulberry32, randomInt, randomMask, randomMatrix } from '../helpers/random.js';
import { expectClose, expectNoLeak, mat, referenceAggregate, scalar, useCpuBackend, values } from './support.js';

useCpuBackend();

const LOSS = [
  [1, 2, 3],
  [4, 5, 6],
  [7, 8, 9],
];
const MASK = [
  [1, 1, 0],
  [1, 0, 0],
  [0, 0, 0],
];

function agg(loss: number[][], mask: number[][], mode: LossAggMode, maxLength?: number): number {
  return tf.tidy(() => scalar(aggregateLoss(mat(loss), mat(mask), mode, { maxLength })));
}

describe('aggregateLoss', () => {
  it('matches the worked example of its documentation', () => {
    expect(agg(LOSS, MASK, 'token-mean')).toBeCloseTo(7 / 3, 5);
    expect(agg(LOSS, MASK, 'seq-mean-token-sum')).toBeCloseTo(3.5, 5);
    expect(agg(LOSS, MASK, 'seq-mean-token-mean')).toBeCloseTo(2.75, 5);
    expect(agg(LOSS, MASK, 'seq-mean-token-sum-norm')).toBeCloseTo(7 / 9, 5);
  });

  it('seq-mean-token-sum is a true per-sequence sum (not divided by the length)', () => {
    // Two rows with 4 and 1 unmasked tokens of loss 1: sums 4 and 1, mean 2.5.
    const loss = [
      [1, 1, 1, 1],
      [1, 1, 1, 1],
    ];
    const mask = [
      [1, 1, 1, 1],
      [1, 0, 0, 0],
    ];
    expect(agg(loss, mask, 'seq-mean-token-sum')).toBeCloseTo(2.5, 6);
    expect(agg(loss, mask, 'seq-mean-token-mean')).toBeCloseTo(1, 6);
    expect(agg(loss, mask, 'token-mean')).toBeCloseTo(1, 6);
    expect(agg(loss, mask, 'seq-mean-token-sum-norm')).toBeCloseTo(5 / 8, 6);
  });

  it('divides by a constant maxLength in seq-mean-token-sum-norm', () => {
    expect(agg(LOSS, MASK, 'seq-mean-token-sum-norm', 10)).toBeCloseTo((3 / 10 + 4 / 10) / 3, 6);
    expect(() => agg(LOSS, MASK, 'seq-mean-token-sum-norm', 0)).toThrow(ConfigError);
  });

  it('returns 0, not NaN, when everything is masked, for every mode', () => {
    const zeros = [
      [0, 0, 0],
      [0, 0, 0],
    ];
    for (const mode of LOSS_AGG_MODES) {
      expect(
        agg(
          [
            [NaN, 1, 2],
            [3, Infinity, 5],
          ],
          zeros,
          mode,
        ),
        mode,
      ).toBe(0);
      expect(
        tf.tidy(() => scalar(aggregateLoss(tf.zeros([0, 3]), tf.zeros([0, 3]), mode))),
        mode,
      ).toBe(0);
    }
  });

  it('ignores NaN and infinities at masked positions and propagates them at unmasked ones', () => {
    const loss = [
      [1, NaN, -Infinity],
      [2, 4, Infinity],
    ];
    const mask = [
      [1, 0, 0],
      [1, 1, 0],
    ];
    for (const mode of LOSS_AGG_MODES) {
      expect(agg(loss, mask, mode), mode).toBeCloseTo(
        referenceAggregate(
          [
            [1, 0, 0],
            [2, 4, 0],
          ],
          mask,
          mode,
        ),
        5,
      );
      expect(
        agg(
          loss,
          [
            [1, 1, 0],
            [1, 1, 0],
          ],
          mode,
        ),
        mode,
      ).toBeNaN();
    }
  });

  it('agrees with a plain-loop reference on seeded random inputs', () => {
    for (let seed = 1; seed <= 20; seed++) {
      const rng = mulberry32(seed);
      const rows = randomInt(rng, 1, 8);
      const width = randomInt(rng, 1, 12);
      const loss = randomMatrix(rng, rows, width, -3, 3);
      const mask = randomMask(rng, rows, width, 0.2);
      const maxLength = randomInt(rng, width, 2 * width);
      for (const mode of LOSS_AGG_MODES) {
        expectClose([agg(loss, mask, mode, maxLength)], [referenceAggregate(loss, mask, mode, maxLength)]);
      }
    }
  });

  it('handles ±1e4 losses exactly enough', () => {
    const loss = [
      [1e4, -1e4, 1e4],
      [-1e4, 1e4, 3],
    ];
    const mask = [
      [1, 1, 1],
      [1, 0, 1],
    ];
    for (const mode of LOSS_AGG_MODES) {
      const expected = referenceAggregate(loss, mask, mode);
      expect(Math.abs(agg(loss, mask, mode) - expected), mode).toBeLessThanOrEqual(1e-6 * 1e4);
    }
  });

  it('has the expected gradient with respect to the loss matrix', () => {
    const mask = mat(MASK);
    const grads = LOSS_AGG_MODES.map((mode) => tf.tidy(() => values(tf.grad((x: tf.Tensor) => aggregateLoss(x, mask, mode))(mat(LOSS)))));
    const [tokenMean, seqSum, seqMean, sumNorm] = grads;
    expectClose(tokenMean, [1 / 3, 1 / 3, 0, 1 / 3, 0, 0, 0, 0, 0]);
    expectClose(seqSum, [1 / 2, 1 / 2, 0, 1 / 2, 0, 0, 0, 0, 0]);
    expectClose(seqMean, [1 / 4, 1 / 4, 0, 1 / 2, 0, 0, 0, 0, 0]);
    expectClose(sumNorm, [1 / 9, 1 / 9, 0, 1 / 9, 0, 0, 0, 0, 0]);
    mask.dispose();
  });

  it('leaks no tensors', () => {
    const loss = mat(LOSS);
    const mask = mat(MASK);
    for (const mode of LOSS_AGG_MODES) expectNoLeak(() => aggregateLoss(loss, mask, mode));
    tf.dispose([loss, mask]);
  });

  it('rejects mismatched shapes and unknown modes', () => {
    tf.tidy(() => {
      const loss = mat(LOSS);
      expect(() => aggregateLoss(loss, tf.zeros([3, 2]), 'token-mean')).toThrow(ShapeError);
      expect(() => aggregateLoss(tf.zeros([3]), tf.zeros([3]), 'token-mean')).toThrow(ShapeError);
      expect(() => aggregateLoss(loss, mat(MASK), 'token-sum' as LossAggMode)).toThrow(ConfigError);
    });
    expect(() => parseLossAggMode('token-sum')).toThrow(/token-mean, seq-mean-token-sum, seq-mean-token-mean/);
    expect(parseLossAggMode('seq-mean-token-sum')).toBe('seq-mean-token-sum');
    expect(isLossAggMode('seq-mean-token-sum-norm')).toBe(true);
    expect(isLossAggMode('sum')).toBe(false);
  });
});
