import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-core/dist/register_all_gradients';
import { beforeAll, describe, expect, it } from 'vitest';

import {
  LOSS_AGG_MODES,
  aggregateLoss,
  applyKlPenalty,
  broadcastAdvantages,
  computeGroupAdvantagesTensor,
  indexGroups,
  ppoClipLoss,
  readMetricsSync,
  tokenLevelRewards,
  truncatedImportanceWeights,
} from '../../lib/algos/index.js';
import { mulberry32, randomMask, randomMatrix, randomNormal } from '../helpers/random.js';
import { expectClose, expectMetricsClose, mat, scalar, values } from './support.js';

/** Everything computed by one backend, as plain numbers. */
type Results = Record<string, number[]>;

const rng = mulberry32(2024);
const B = 6;
const R = 9;
const OLD = randomMatrix(rng, B, R, -4, 0);
const NOISE = randomMatrix(rng, B, R, -0.7, 0.7);
const LP = OLD.map((row, b) => row.map((x, t) => Math.fround(x + NOISE[b][t])));
const REF = randomMatrix(rng, B, R, -4, 0);
const ADV = Array.from({ length: B }, () => Array.from({ length: R }, () => Math.fround(randomNormal(rng))));
const MASK = randomMask(rng, B, R, 0.1).map((row, b) => (b === 0 ? row.map(() => 0) : row)); // row 0 empty
const WEIGHTS = randomMatrix(rng, B, R, 0, 2);
const SCORES = [1, 0, 1, 1, 0.5, 0.5, NaN, 2, 3, 0.25, 0.75, 7];
const GROUPS = ['a', 'a', 'a', 'b', 'b', 'c', 'c', 'd', 'd', 'e', 'e', 'f'];
const RUNS = [0, 1, 1, 0, 1, 0, 1, 0, 1, 0, 0, 0];

function compute(): Results {
  const out: Results = {};
  const put = (key: string, metrics: Record<string, tf.Scalar>): void => {
    for (const [name, value] of Object.entries(readMetricsSync(metrics))) out[`${key} ${name}`] = [value];
  };
  for (const mode of LOSS_AGG_MODES) {
    for (const clipRatioC of [undefined, 3]) {
      const key = `ppo ${mode} c=${clipRatioC}`;
      const { loss, metrics, grad } = tf.tidy(() => {
        const input = {
          oldLogprob: mat(OLD),
          advantages: mat(ADV),
          mask: mat(MASK),
          importanceWeights: clipRatioC === undefined ? undefined : mat(WEIGHTS),
        };
        const options = { clipLow: 0.2, clipHigh: 0.28, clipRatioC, mode };
        const result = ppoClipLoss({ ...input, logprob: mat(LP) }, options);
        const f = (lp: tf.Tensor): tf.Scalar => ppoClipLoss({ ...input, logprob: lp as tf.Tensor2D }, options).loss;
        const g = tf.grad(f)(mat(LP));
        return { loss: scalar(result.loss), metrics: result.metrics, grad: values(g) };
      });
      out[`${key} loss`] = [loss];
      out[`${key} grad`] = grad;
      put(key, metrics);
    }
    out[`aggregate ${mode}`] = [tf.tidy(() => scalar(aggregateLoss(mat(ADV), mat(MASK), mode)))];
  }
  const index = indexGroups(GROUPS, RUNS);
  for (const runs of [false, true]) {
    const { advantages, metrics } = tf.tidy(() => {
      const groupIndex = tf.tensor1d(index.groupIndex, 'int32');
      const runOptions = runs ? { runIndex: tf.tensor1d(index.runIndex, 'int32'), numRuns: index.numRuns } : {};
      const result = computeGroupAdvantagesTensor(tf.tensor1d(SCORES), groupIndex, index.numGroups, runOptions);
      return { advantages: values(result.advantages), metrics: result.metrics };
    });
    out[`advantages runs=${runs}`] = advantages;
    put(`advantages runs=${runs}`, metrics);
  }
  out['broadcast'] = tf.tidy(() => values(broadcastAdvantages(tf.tensor1d(ADV.map((row) => row[0])), mat(MASK))));
  out['token rewards'] = tf.tidy(() => values(tokenLevelRewards(tf.tensor1d(ADV.map((row) => row[1])), mat(MASK))));
  const penalty = tf.tidy(() => {
    const result = applyKlPenalty(
      { tokenRewards: mat(ADV), logprob: mat(LP), refLogprob: mat(REF), mask: mat(MASK) },
      { coef: 0.05, estimator: 'low_var_kl' },
    );
    return { rewards: values(result.tokenRewards), metrics: result.metrics };
  });
  out['kl penalty'] = penalty.rewards;
  put('kl penalty', penalty.metrics);
  const is = tf.tidy(() => {
    const result = truncatedImportanceWeights(mat(LP), mat(OLD), mat(MASK), { cap: 1.5 });
    return { weights: values(result.weights), metrics: result.metrics };
  });
  out['is weights'] = is.weights;
  put('is weights', is.metrics);
  return out;
}

describe('wasm backend smoke test', () => {
  let cpu: Results;
  let wasm: Results;

  beforeAll(async () => {
    await import('@tensorflow/tfjs-backend-cpu');
    await import('@tensorflow/tfjs-backend-wasm');
    await tf.setBackend('cpu');
    cpu = compute();
    expect(await tf.setBackend('wasm')).toBe(true);
    const before = tf.memory().numTensors;
    wasm = compute();
    expect(tf.memory().numTensors).toBe(before);
  });

  it('ran on both backends', () => {
    expect(tf.getBackend()).toBe('wasm');
    expect(Object.keys(wasm).sort()).toEqual(Object.keys(cpu).sort());
  });

  it('gives the same surrogate, aggregation and gradients as cpu within 1e-5', () => {
    const keys = Object.keys(cpu).filter((k) => k.startsWith('ppo ') || k.startsWith('aggregate '));
    expect(keys.length).toBeGreaterThan(40);
    for (const key of keys) expectClose(wasm[key], cpu[key]);
    expect(cpu['ppo token-mean c=3 grad'].some((g) => g !== 0)).toBe(true);
  });

  it('gives the same advantages, token rewards, KL penalty and importance weights as cpu within 1e-5', () => {
    const keys = Object.keys(cpu).filter((k) => !k.startsWith('ppo ') && !k.startsWith('aggregate '));
    const flat = (r: Results): Record<string, number> => Object.fromEntries(keys.flatMap((k) => r[k].map((v, i) => [`${k}[${i}]`, v])));
    expectMetricsClose(flat(wasm), flat(cpu));
  });
});
