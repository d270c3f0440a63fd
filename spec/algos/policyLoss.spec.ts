import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import {
  LOG_RATIO_CLAMP,
  LOSS_AGG_MODES,
  type LossAggMode,
  type PpoClipOptions,
  ppoClipLoss,
  readMetricsSync,
} from '../../lib/algos/index.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { mulberry32, randomInt, randomMask, randomMatrix, randomNormal } from '../helpers/random.js';
import { expectClose, expectMetricsClose, expectNoLeak, mat, referenceAggregate, scalar, useCpuBackend, values } from './support.js';

useCpuBackend();

interface Case {
  lp: number[][];
  old: number[][];
  adv: number[][];
  mask: number[][];
  weights?: number[][] | undefined;
}

/** Plain-loop reference of the surrogate and its metrics (float64). */
function referencePpo(c: Case, options: PpoClipOptions): { loss: number; metrics: Record<string, number> } {
  const clipLow = options.clipLow ?? 0.2;
  const clipHigh = options.clipHigh ?? clipLow;
  const perToken: number[][] = [];
  let tokens = 0;
  let clipped = 0;
  let lower = 0;
  let kl = 0;
  c.lp.forEach((row, b) => {
    perToken.push(
      row.map((lp, t) => {
        if (!(c.mask[b][t] > 0)) return 0;
        const a = c.adv[b][t];
        const d = lp - c.old[b][t];
        const r = Math.exp(Math.min(Math.max(d, -LOG_RATIO_CLAMP), LOG_RATIO_CLAMP));
        const u = -a * r;
        const cl = -a * Math.min(Math.max(r, 1 - clipLow), 1 + clipHigh);
        let l = Math.max(u, cl);
        tokens += 1;
        kl += -d;
        if (cl > u) clipped += 1;
        if (options.clipRatioC !== undefined && a < 0) {
          const bound = -a * options.clipRatioC;
          if (l > bound) lower += 1;
          l = Math.min(l, bound);
        }
        return c.weights === undefined ? l : l * c.weights[b][t];
      }),
    );
  });
  const loss = referenceAggregate(perToken, c.mask, options.mode ?? 'token-mean', options.maxLength);
  const frac = (x: number): number => (tokens === 0 ? 0 : x / tokens);
  return {
    loss,
    metrics: {
      'actor/pg_clipfrac': frac(clipped),
      'actor/pg_clipfrac_lower': frac(lower),
      'actor/ppo_kl': frac(kl),
      'actor/pg_loss': loss,
    },
  };
}

/** The surrogate on tensors, read back to numbers. */
function tensorPpo(c: Case, options: PpoClipOptions): { loss: number; metrics: Record<string, number> } {
  const { loss, metrics } = tf.tidy(() => {
    const out = ppoClipLoss(
      {
        logprob: mat(c.lp),
        oldLogprob: mat(c.old),
        advantages: mat(c.adv),
        mask: mat(c.mask),
        importanceWeights: c.weights === undefined ? undefined : mat(c.weights),
      },
      options,
    );
    return { loss: scalar(out.loss), metrics: out.metrics };
  });
  return { loss, metrics: readMetricsSync(metrics) };
}

/** Gradient of the loss with respect to `logprob`, via `tf.grad`. */
function tensorGrad(c: Case, options: PpoClipOptions): number[] {
  return tf.tidy(() => {
    const old = mat(c.old);
    const adv = mat(c.adv);
    const mask = mat(c.mask);
    const weights = c.weights === undefined ? undefined : mat(c.weights);
    const rest = { oldLogprob: old, advantages: adv, mask, importanceWeights: weights };
    const f = (lp: tf.Tensor): tf.Scalar => ppoClipLoss({ ...rest, logprob: lp as tf.Tensor2D }, options).loss;
    return values(tf.grad(f)(mat(c.lp)));
  });
}

function randomCase(seed: number, withWeights: boolean): Case {
  const rng = mulberry32(seed);
  const rows = randomInt(rng, 1, 5);
  const width = randomInt(rng, 1, 8);
  const old = randomMatrix(rng, rows, width, -4, 0);
  const noise = randomMatrix(rng, rows, width, -0.6, 0.6);
  const lp = old.map((row, b) => row.map((x, t) => Math.fround(x + noise[b][t])));
  const adv = Array.from({ length: rows }, () => Array.from({ length: width }, () => Math.fround(randomNormal(rng))));
  const mask = randomMask(rng, rows, width, 0.15);
  const weights = withWeights ? randomMatrix(rng, rows, width, 0, 2) : undefined;
  return { lp, old, adv, mask, weights };
}

// Five tokens with ratios r and advantages A chosen to hit every branch (clip ε = 0.2, dual clip c = 3):
// (A, r) = (1, 1.5) clipped above, (1, 0.5) unclipped, (−1, 1.5) unclipped, (−1, 0.5) clipped below,
// (−1, 5) dual clip.
const RATIOS = [1.5, 0.5, 1.5, 0.5, 5];
const HAND: Case = {
  lp: [RATIOS.map(Math.log)],
  old: [[0, 0, 0, 0, 0]],
  adv: [[1, 1, -1, -1, -1]],
  mask: [[1, 1, 1, 1, 1]],
};
const HAND_KL = -RATIOS.map(Math.log).reduce((a, b) => a + b, 0) / 5;

describe('ppoClipLoss', () => {
  it('computes hand-checked values for every branch, with dual clip', () => {
    const { loss, metrics } = tensorPpo(HAND, { clipLow: 0.2, clipRatioC: 3 });
    // Per token: −1.2, −0.5, 1.5, 0.8, min(5, 3) = 3.
    expect(loss).toBeCloseTo(3.6 / 5, 5);
    expectMetricsClose(metrics, {
      'actor/pg_clipfrac': 2 / 5,
      'actor/pg_clipfrac_lower': 1 / 5,
      'actor/ppo_kl': HAND_KL,
      'actor/pg_loss': 3.6 / 5,
    });
  });

  it('without dual clip lets the negative-advantage loss grow with the ratio', () => {
    const { loss, metrics } = tensorPpo(HAND, { clipLow: 0.2 });
    expect(loss).toBeCloseTo(5.6 / 5, 5);
    expect(metrics['actor/pg_clipfrac_lower']).toBe(0);
  });

  it('clips asymmetrically with DAPO clipLow / clipHigh', () => {
    const { loss } = tensorPpo(HAND, { clipLow: 0.2, clipHigh: 0.28 });
    // Token 1 becomes −1.28; token 4 stays 0.8 (1 − clipLow).
    expect(loss).toBeCloseTo((-1.28 - 0.5 + 1.5 + 0.8 + 5) / 5, 5);
  });

  it('multiplies the per-token loss by importance weights', () => {
    const { loss } = tensorPpo({ ...HAND, weights: [[2, 0, 1, 0.5, 0]] }, { clipRatioC: 3 });
    expect(loss).toBeCloseTo((-2.4 + 0 + 1.5 + 0.4 + 0) / 5, 5);
  });

  it('has the hand-derived gradient with respect to logprob', () => {
    // d/dlp(−A·r) = −A·r where unclipped, 0 where a clip is active; token-mean divides by 5.
    expectClose(tensorGrad(HAND, { clipRatioC: 3 }), [0, -0.5 / 5, 1.5 / 5, 0, 0]);
    expectClose(tensorGrad(HAND, {}), [0, -0.5 / 5, 1.5 / 5, 0, 5 / 5]);
  });

  it('agrees with a plain-loop reference on seeded random inputs, for every mode and clip setting', () => {
    const settings: PpoClipOptions[] = [
      {},
      { clipLow: 0.2, clipHigh: 0.28 },
      { clipLow: 0.1, clipHigh: 0.3, clipRatioC: 3 },
      { clipLow: 0.2, clipRatioC: 1.5 },
    ];
    for (let seed = 1; seed <= 12; seed++) {
      const c = randomCase(seed, seed % 2 === 0);
      for (const setting of settings) {
        for (const mode of LOSS_AGG_MODES) {
          const options = { ...setting, mode, maxLength: mode === 'seq-mean-token-sum-norm' ? 16 : undefined };
          const expected = referencePpo(c, options);
          const actual = tensorPpo(c, options);
          expectClose([actual.loss], [expected.loss]);
          expectMetricsClose(actual.metrics, expected.metrics);
        }
      }
    }
  });

  it('has gradients equal to central finite differences', () => {
    const options: PpoClipOptions = { clipLow: 0.2, clipHigh: 0.28, clipRatioC: 3, mode: 'seq-mean-token-mean' };
    const kinks = [0.8, 1.28];
    for (let seed = 1; seed <= 6; seed++) {
      const c = randomCase(100 + seed, seed % 2 === 0);
      const grad = tensorGrad(c, options);
      const width = c.lp[0].length;
      c.lp.forEach((row, b) =>
        row.forEach((lp, t) => {
          const r = Math.exp(lp - c.old[b][t]);
          if (kinks.some((k) => Math.abs(r - k) < 0.05)) return; // a kink inside the stencil
          const at = (x: number, h: number, f: (c: Case) => number): number => {
            const shifted = c.lp.map((rr) => [...rr]);
            shifted[b][t] = x + h;
            return f({ ...c, lp: shifted });
          };
          // Float64 reference with a tiny step: checks tf.grad to 1e-5.
          const ref = (cc: Case): number => referencePpo(cc, options).loss;
          const h64 = 1e-6;
          const fd64 = (at(lp, h64, ref) - at(lp, -h64, ref)) / (2 * h64);
          expect(Math.abs(grad[b * width + t] - fd64), `seed ${seed} [${b}, ${t}]`).toBeLessThanOrEqual(1e-5);
          // The tensor function itself (float32) with a larger step.
          const ten = (cc: Case): number => tensorPpo(cc, options).loss;
          const h32 = 1e-2;
          const fd32 = (at(lp, h32, ten) - at(lp, -h32, ten)) / (2 * h32);
          expect(Math.abs(grad[b * width + t] - fd32), `seed ${seed} [${b}, ${t}] f32`).toBeLessThanOrEqual(1e-3);
        }),
      );
    }
  });

  it('ignores NaN and infinities at masked positions, in the loss and in the gradient', () => {
    const clean: Case = {
      lp: [
        [-1, -0.5, 0],
        [-2, 0, 0],
      ],
      old: [
        [-1.2, -0.4, 0],
        [-1.9, 0, 0],
      ],
      adv: [
        [1, -1, 0],
        [0.5, 0, 0],
      ],
      mask: [
        [1, 1, 0],
        [1, 0, 0],
      ],
    };
    const dirty: Case = {
      ...clean,
      lp: [
        [-1, -0.5, NaN],
        [-2, Infinity, -Infinity],
      ],
      old: [
        [-1.2, -0.4, -Infinity],
        [-1.9, NaN, 0],
      ],
      adv: [
        [1, -1, NaN],
        [0.5, Infinity, NaN],
      ],
    };
    for (const mode of LOSS_AGG_MODES) {
      expect(tensorPpo(dirty, { mode }).loss).toBeCloseTo(tensorPpo(clean, { mode }).loss, 6);
    }
    const grad = tensorGrad(dirty, { clipRatioC: 3 });
    expect(grad.every(Number.isFinite)).toBe(true);
    expect([grad[2], grad[4], grad[5]].map(Math.abs)).toEqual([0, 0, 0]);
    expectClose(grad, tensorGrad(clean, { clipRatioC: 3 }));
    // A NaN at an unmasked position is not hidden.
    expect(
      tensorPpo(
        {
          ...clean,
          adv: [
            [NaN, -1, 0],
            [0.5, 0, 0],
          ],
        },
        {},
      ).loss,
    ).toBeNaN();
  });

  it('stays finite for ±1e4 log-ratios and advantages', () => {
    const c: Case = {
      lp: [[1e4, -1e4, 0, 0]],
      old: [[0, 0, 0, 0]],
      adv: [[-1, 1, 1e4, -1e4]],
      mask: [[1, 1, 1, 1]],
    };
    const withDual = tensorPpo(c, { clipRatioC: 3 });
    expect(Number.isFinite(withDual.loss)).toBe(true);
    expectClose([withDual.loss], [referencePpo(c, { clipRatioC: 3 }).loss], 1e-5 * 1e4);
    // Without dual clip, a negative advantage at the clamped ratio e^20 still gives a finite loss.
    const noDual = tensorPpo(c, {});
    expect(noDual.loss).toBeCloseTo(referencePpo(c, {}).loss, -2);
    expect(Number.isFinite(noDual.loss)).toBe(true);
    // Beyond the clamp the ratio is constant: no gradient there.
    const grad = tensorGrad(c, {});
    expect(grad.slice(0, 2)).toEqual([0, 0]);
    expect(grad.every(Number.isFinite)).toBe(true);
  });

  it('returns 0 loss and 0 metrics when everything is masked', () => {
    const c: Case = { ...HAND, mask: [[0, 0, 0, 0, 0]] };
    for (const mode of LOSS_AGG_MODES) {
      const { loss, metrics } = tensorPpo(c, { mode, clipRatioC: 3 });
      expect(loss).toBe(0);
      expect(Object.values(metrics)).toEqual([0, 0, 0, 0]);
    }
  });

  it('leaks no tensors, including under tf.grad', () => {
    const input = {
      logprob: mat(HAND.lp),
      oldLogprob: mat(HAND.old),
      advantages: mat(HAND.adv),
      mask: mat(HAND.mask),
      importanceWeights: mat([[1, 1, 1, 1, 1]]),
    };
    expectNoLeak(() => ppoClipLoss(input, { clipRatioC: 3 }));
    expectNoLeak(() => ppoClipLoss({ ...input, importanceWeights: undefined }, { mode: 'seq-mean-token-sum' }));
    const f = (lp: tf.Tensor): tf.Scalar => ppoClipLoss({ ...input, logprob: lp as tf.Tensor2D }, { clipRatioC: 3 }).loss;
    expectNoLeak(() => tf.grad(f)(input.logprob));
    tf.dispose(Object.values(input));
  });

  it('rejects invalid clip settings and mismatched shapes', () => {
    tf.tidy(() => {
      const m = mat([[1, 1]]);
      const input = { logprob: m, oldLogprob: m, advantages: m, mask: m };
      expect(() => ppoClipLoss(input, { clipLow: 1 })).toThrow(ConfigError);
      expect(() => ppoClipLoss(input, { clipHigh: -0.1 })).toThrow(ConfigError);
      expect(() => ppoClipLoss(input, { clipRatioC: 1 })).toThrow(ConfigError);
      expect(() => ppoClipLoss(input, { mode: 'sum' as LossAggMode })).toThrow(ConfigError);
      expect(() => ppoClipLoss({ ...input, advantages: mat([[1]]) })).toThrow(ShapeError);
      expect(() => ppoClipLoss({ ...input, importanceWeights: mat([[1], [1]]) })).toThrow(ShapeError);
    });
  });
});
