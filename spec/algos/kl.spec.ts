import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import {
  ADAPTIVE_KL_ERROR_CLIP,
  KL_ESTIMATOR_NAMES,
  type KlController,
  type KlEstimatorName,
  LOW_VAR_KL_CLAMP,
  applyKlPenalty,
  createKlController,
  getKlEstimator,
  isKlEstimatorName,
  klLoss,
  readMetricsSync,
  updateKlController,
} from '../../lib/algos/index.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { mulberry32, randomInt, randomMatrix } from '../helpers/random.js';
import { expectClose, expectNoLeak, mat, scalar, useCpuBackend, values } from './support.js';

useCpuBackend();

/** Plain reference of each estimator for one token (float64). */
function referenceKl(name: KlEstimatorName, lp: number, ref: number): number {
  const d = lp - ref;
  switch (name) {
    case 'k1':
      return d;
    case 'abs':
      return Math.abs(d);
    case 'mse':
      return 0.5 * d * d;
    case 'k3':
    case 'low_var_kl': {
      const r = Math.min(Math.max(ref - lp, -20), 20);
      return Math.min(Math.max(Math.exp(r) - r - 1, -10), 10);
    }
  }
}

function estimate(name: KlEstimatorName, lp: number[][], ref: number[][]): number[] {
  return tf.tidy(() => values(getKlEstimator(name)(mat(lp), mat(ref))));
}

describe('KL estimators', () => {
  it('compute the documented per-token values', () => {
    const lp = [[-1, -2, -0.5]];
    const ref = [[-2, -1.5, -0.5]];
    expectClose(estimate('k1', lp, ref), [1, -0.5, 0]);
    expectClose(estimate('abs', lp, ref), [1, 0.5, 0]);
    expectClose(estimate('mse', lp, ref), [0.5, 0.125, 0]);
    // k3: r = ref − lp = [−1, 0.5, 0] → e^r − r − 1.
    expectClose(estimate('k3', lp, ref), [Math.exp(-1), Math.exp(0.5) - 1.5, 0]);
    expectClose(estimate('low_var_kl', lp, ref), estimate('k3', lp, ref));
  });

  it('clamp k3 for ±1e4 log-prob differences', () => {
    const out = estimate('k3', [[0, -1e4, -3]], [[-1e4, 0, -3]]);
    expect(out).toEqual([LOW_VAR_KL_CLAMP, LOW_VAR_KL_CLAMP, 0]);
    expect(out.every(Number.isFinite)).toBe(true);
  });

  it('agree with a plain-loop reference on seeded random inputs', () => {
    for (let seed = 1; seed <= 10; seed++) {
      const rng = mulberry32(seed);
      const rows = randomInt(rng, 1, 6);
      const width = randomInt(rng, 1, 8);
      const lp = randomMatrix(rng, rows, width, -3, 0);
      const ref = randomMatrix(rng, rows, width, -3, 0);
      for (const name of KL_ESTIMATOR_NAMES) {
        const expected = lp.flatMap((row, b) => row.map((x, t) => referenceKl(name, x, ref[b][t])));
        expectClose(estimate(name, lp, ref), expected);
      }
    }
  });

  it('are looked up in a registry that lists the valid names on a miss', () => {
    expect(KL_ESTIMATOR_NAMES).toEqual(['k1', 'abs', 'mse', 'k3', 'low_var_kl']);
    expect(getKlEstimator('low_var_kl')).toBe(getKlEstimator('k3'));
    expect(isKlEstimatorName('mse')).toBe(true);
    expect(isKlEstimatorName('kl')).toBe(false);
    expect(() => getKlEstimator('full')).toThrow(ConfigError);
    expect(() => getKlEstimator('full')).toThrow(/k1, abs, mse, k3, low_var_kl/);
  });

  it('leak no tensors', () => {
    const lp = mat([[-1, -2]]);
    const ref = mat([[-1.5, -0.5]]);
    for (const name of KL_ESTIMATOR_NAMES) expectNoLeak(() => getKlEstimator(name)(lp, ref));
    tf.dispose([lp, ref]);
  });
});

describe('applyKlPenalty', () => {
  it('subtracts β·kl on masked-in tokens and reports the KL and β', () => {
    const out = tf.tidy(() => {
      const result = applyKlPenalty(
        {
          tokenRewards: mat([
            [0, 1, 0],
            [0, 0, 0],
          ]),
          logprob: mat([
            [-1, -1, NaN],
            [-2, -1, -1],
          ]),
          refLogprob: mat([
            [-2, -1.5, 0],
            [-1, -1, -1],
          ]),
          mask: mat([
            [1, 1, 0],
            [1, 0, 0],
          ]),
        },
        { coef: 0.1 },
      );
      return { rewards: values(result.tokenRewards), metrics: readMetricsSync(result.metrics) };
    });
    // k1 = [[1, 0.5, ·], [−1, ·, ·]]
    expectClose(out.rewards, [-0.1, 0.95, 0, 0.1, 0, 0]);
    // Per-sequence mean KL [0.75, −1], then mean over sequences.
    expect(out.metrics['actor/reward_kl_penalty']).toBeCloseTo(-0.125, 6);
    expect(out.metrics['actor/reward_kl_penalty_coeff']).toBeCloseTo(0.1, 7);
  });

  it('leaks no tensors and checks shapes and estimator names', () => {
    const m = mat([[1, 1]]);
    const input = { tokenRewards: m, logprob: m, refLogprob: m, mask: m };
    expectNoLeak(() => applyKlPenalty(input, { coef: 0.5, estimator: 'k3' }));
    const short = mat([[1]]);
    expect(() => applyKlPenalty({ ...input, logprob: short }, { coef: 1 })).toThrow(ShapeError);
    expect(() => applyKlPenalty(input, { coef: 1, estimator: 'k2' as KlEstimatorName })).toThrow(ConfigError);
    tf.dispose([m, short]);
  });
});

describe('klLoss', () => {
  const lpRows = [
    [-1, -2, -3],
    [-0.5, -1, -1],
  ];
  const refRows = [
    [-1.5, -2, -2],
    [-0.5, -0.5, 7],
  ];
  const maskRows = [
    [1, 1, 1],
    [1, 1, 0],
  ];

  it('scales the aggregated KL by its coefficient', () => {
    const out = tf.tidy(() => {
      const result = klLoss(
        { logprob: mat(lpRows), refLogprob: mat(refRows), mask: mat(maskRows) },
        { coef: 2, estimator: 'k1', mode: 'seq-mean-token-sum' },
      );
      return { loss: scalar(result.loss), metrics: readMetricsSync(result.metrics) };
    });
    // k1 = [[0.5, 0, −1], [0, −0.5, ·]]: sums −0.5 and −0.5 → mean −0.5, × 2.
    expect(out.loss).toBeCloseTo(-1, 6);
    expect(out.metrics['actor/kl_loss']).toBeCloseTo(-0.5, 6);
    expect(out.metrics['actor/kl_coef']).toBe(2);
  });

  it('is differentiable with respect to logprob (k3, token-mean)', () => {
    const grad = tf.tidy(() => {
      const ref = mat(refRows);
      const mask = mat(maskRows);
      const f = (lp: tf.Tensor): tf.Scalar => klLoss({ logprob: lp as tf.Tensor2D, refLogprob: ref, mask }, { coef: 1 }).loss;
      const g = tf.grad(f);
      return values(g(mat(lpRows)));
    });
    // d/dlp (e^{ref−lp} − (ref−lp) − 1) = 1 − e^{ref−lp}, divided by 5 tokens; 0 on the masked token.
    const expected = lpRows.flatMap((row, b) => row.map((lp, t) => (maskRows[b][t] ? (1 - Math.exp(refRows[b][t] - lp)) / 5 : 0)));
    expectClose(grad, expected);
  });

  it('leaks no tensors', () => {
    const lp = mat(lpRows);
    const ref = mat(refRows);
    const mask = mat(maskRows);
    expectNoLeak(() => klLoss({ logprob: lp, refLogprob: ref, mask }, { coef: 0.1, mode: 'seq-mean-token-mean' }));
    tf.dispose([lp, ref, mask]);
  });
});

describe('KL controllers', () => {
  it('keeps a fixed coefficient', () => {
    const fixed = createKlController({ type: 'fixed', coef: 0.05 });
    expect(updateKlController(fixed, 100, 1000)).toEqual({ type: 'fixed', coef: 0.05 });
  });

  it('adapts β by the clipped proportional error times n / horizon', () => {
    const adaptive = createKlController({ type: 'adaptive', coef: 0.1, targetKl: 6, horizon: 10000 });
    const coefAfter = (kl: number, n: number): number => updateKlController(adaptive, kl, n).coef;
    expect(coefAfter(12, 256)).toBeCloseTo(0.1 * (1 + ADAPTIVE_KL_ERROR_CLIP * 0.0256), 12);
    expect(coefAfter(3, 256)).toBeCloseTo(0.1 * (1 - ADAPTIVE_KL_ERROR_CLIP * 0.0256), 12);
    expect(coefAfter(6.6, 256)).toBeCloseTo(0.1 * (1 + 0.1 * 0.0256), 12);
    expect(coefAfter(6, 256)).toBeCloseTo(0.1, 12);
    // Never negative, and unchanged by a non-finite KL or an empty update.
    expect(coefAfter(0, 100000)).toBe(0);
    expect(coefAfter(NaN, 256)).toBe(0.1);
    expect(coefAfter(12, 0)).toBe(0.1);
  });

  it('compounds over several updates and stays plain data', () => {
    let controller: KlController = createKlController({ type: 'adaptive', coef: 1, targetKl: 1, horizon: 10 });
    for (let i = 0; i < 3; i++) controller = updateKlController(controller, 2, 5);
    expect(controller.coef).toBeCloseTo(1.1 ** 3, 12);
    expect(JSON.parse(JSON.stringify(controller))).toEqual(controller);
  });

  it('rejects invalid configurations, listing the valid types', () => {
    expect(() => createKlController({ type: 'pid' } as unknown as KlController)).toThrow(/fixed, adaptive/);
    expect(() => createKlController({ type: 'fixed', coef: -1 })).toThrow(ConfigError);
    expect(() => createKlController({ type: 'adaptive', coef: 0.1, targetKl: 0, horizon: 10 })).toThrow(ConfigError);
    expect(() => createKlController({ type: 'adaptive', coef: 0.1, targetKl: 1, horizon: -1 })).toThrow(ConfigError);
  });
});
