import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import {
  ADVANTAGE_EPSILON,
  GROUP_ADVANTAGE_METRIC_KEYS,
  type GroupAdvantageOptions,
  type StdKind,
  broadcastAdvantages,
  computeGroupAdvantages,
  computeGroupAdvantagesTensor,
  indexGroups,
  readMetricsSync,
} from '../../lib/algos/index.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { type Rng, mulberry32, randomInt, uniform } from '../helpers/random.js';
import { expectClose, expectMetricsClose, expectNoLeak, mat, useCpuBackend, values } from './support.js';

useCpuBackend();

const EPS = ADVANTAGE_EPSILON;

/** Plain-loop reference: advantages only, float64, written independently of the library. */
function referenceAdvantages(
  scores: number[],
  groupIds: string[],
  runIds: number[] | undefined,
  normalize: boolean,
  std: StdKind,
): number[] {
  const out = scores.map(() => 0);
  const groupNames = [...new Set(groupIds)];
  for (const g of groupNames) {
    const members = scores.map((_, i) => i).filter((i) => groupIds[i] === g);
    if (members.some((i) => !Number.isFinite(scores[i]))) continue;
    const runKeys = [...new Set(members.map((i) => (runIds === undefined ? i : runIds[i])))];
    const runOf = (i: number): number => runKeys.indexOf(runIds === undefined ? i : runIds[i]);
    const runScores = runKeys.map((_, k) => {
      const ms = members.filter((i) => runOf(i) === k);
      let s = 0;
      for (const i of ms) s += scores[i];
      return s / ms.length;
    });
    const n = runScores.length;
    if (n < 2) continue;
    if (Math.max(...runScores) === Math.min(...runScores)) continue;
    let mean = 0;
    for (const s of runScores) mean += s / n;
    let ss = 0;
    for (const s of runScores) ss += (s - mean) * (s - mean);
    const sd = Math.sqrt(ss / (std === 'sample' ? n - 1 : n));
    for (const i of members) {
      const c = runScores[runOf(i)] - mean;
      out[i] = normalize ? c / (sd + EPS) : c;
    }
  }
  return out;
}

/** Runs the tensor version on the indices built from ids; returns advantages and metrics as numbers. */
function tensorAdvantages(
  scores: number[],
  groupIds: (string | number)[],
  options: GroupAdvantageOptions & { runIds?: (string | number)[] } = {},
): { advantages: number[]; metrics: Record<string, number> } {
  const index = indexGroups(groupIds, options.runIds);
  const s = tf.tensor1d(scores, 'float32');
  const g = tf.tensor1d(index.groupIndex, 'int32');
  const r = tf.tensor1d(index.runIndex, 'int32');
  const result = computeGroupAdvantagesTensor(s, g, index.numGroups, {
    ...options,
    ...(options.runIds !== undefined ? { runIndex: r, numRuns: index.numRuns } : {}),
  });
  const advantages = values(result.advantages);
  tf.dispose([s, g, r, result.advantages]);
  return { advantages, metrics: readMetricsSync(result.metrics) };
}

/** Both versions, checked against each other; returns the array version's result. */
function both(
  scores: number[],
  groupIds: (string | number)[],
  options: GroupAdvantageOptions & { runIds?: (string | number)[] } = {},
): ReturnType<typeof computeGroupAdvantages> {
  const plain = computeGroupAdvantages(scores, groupIds, options);
  const tensor = tensorAdvantages(scores, groupIds, options);
  expectClose(tensor.advantages, plain.advantages);
  expectMetricsClose(tensor.metrics, plain.metrics);
  return plain;
}

/** Random groups of 1..6 trajectories with 0/1, discrete or continuous scores and optional multi-turn runs. */
function randomCase(rng: Rng): { scores: number[]; groupIds: string[]; runIds: number[] } {
  const scores: number[] = [];
  const groupIds: string[] = [];
  const runIds: number[] = [];
  const groups = randomInt(rng, 1, 8);
  for (let g = 0; g < groups; g++) {
    const kind = randomInt(rng, 0, 2);
    const runs = randomInt(rng, 1, 6);
    for (let r = 0; r < runs; r++) {
      const turns = randomInt(rng, 1, 3);
      for (let t = 0; t < turns; t++) {
        const score = kind === 0 ? randomInt(rng, 0, 1) : kind === 1 ? randomInt(rng, 0, 4) / 4 : uniform(rng, -2, 2);
        scores.push(Math.fround(score));
        groupIds.push(`g${g}`);
        runIds.push(r);
      }
    }
  }
  // Shuffle so groups interleave.
  const order = scores.map((_, i) => i).sort(() => rng() - 0.5);
  return {
    scores: order.map((i) => scores[i]),
    groupIds: order.map((i) => groupIds[i]),
    runIds: order.map((i) => runIds[i]),
  };
}

describe('computeGroupAdvantages / computeGroupAdvantagesTensor', () => {
  it('normalizes within each group with the population std', () => {
    const { advantages, groups } = both([1, 0, 1, 0.5], ['a', 'a', 'b', 'b'], { std: 'population' });
    expectClose(advantages, [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.25 / (0.25 + EPS), -0.25 / (0.25 + EPS)]);
    expect(groups.map((g) => [g.groupId, g.kind, g.mean, g.std])).toEqual([
      ['a', 'normal', 0.5, 0.5],
      ['b', 'normal', 0.75, 0.25],
    ]);
  });

  it('uses the sample std (n − 1) by default', () => {
    const { advantages } = both([1, 2, 3], ['g', 'g', 'g']);
    expectClose(advantages, [-1 / (1 + EPS), 0, 1 / (1 + EPS)]);
    const population = both([1, 2, 3], ['g', 'g', 'g'], { std: 'population' });
    const sd = Math.sqrt(2 / 3);
    expectClose(population.advantages, [-1 / (sd + EPS), 0, 1 / (sd + EPS)]);
  });

  it('only centers without std normalization (Dr.GRPO)', () => {
    const { advantages } = both([1, 2, 6, 10, 10], ['g', 'g', 'g', 'h', 'h'], { normalizeByStd: false });
    expectClose(advantages, [-2, -1, 3, 0, 0]);
  });

  it('gives 0 to singleton and zero-variance groups and counts them', () => {
    const { advantages, metrics, groups } = both([0.1, 0.1, 0.1, 5, 1, 0], ['z', 'z', 'z', 's', 'n', 'n'], {
      std: 'population',
    });
    expect(advantages.slice(0, 4)).toEqual([0, 0, 0, 0]);
    expect(groups.map((g) => g.kind)).toEqual(['zero-variance', 'singleton', 'normal']);
    expect(metrics['critic/groups']).toBe(3);
    expect(metrics['critic/groups_singleton']).toBe(1);
    expect(metrics['critic/groups_zero_variance']).toBe(1);
    expect(metrics['critic/groups_nonfinite']).toBe(0);
    // Zero variance gives exactly 0 even without std normalization (no rounding residue of the mean).
    const centered = computeGroupAdvantages([0.1, 0.1, 0.1], ['z', 'z', 'z'], { normalizeByStd: false });
    expect(centered.advantages).toEqual([0, 0, 0]);
  });

  it('zeroes a group with a NaN or infinite score, counts it, and leaves other groups untouched', () => {
    const scores = [1, NaN, 0, 1, 0, Infinity, 2];
    const groupIds = ['bad', 'bad', 'bad', 'ok', 'ok', 'inf', 'inf'];
    const { advantages, metrics, groups } = both(scores, groupIds, { std: 'population' });
    expectClose(advantages, [0, 0, 0, 0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0, 0]);
    expect(groups.map((g) => g.kind)).toEqual(['nonfinite', 'normal', 'nonfinite']);
    expect(metrics['critic/nonfinite_scores']).toBe(2);
    expect(metrics['critic/groups_nonfinite']).toBe(2);
    // Score statistics are over finite scores only.
    expect(metrics['critic/score_mean']).toBeCloseTo(4 / 5, 6);
    expect(metrics['critic/score_max']).toBe(2);
    expect(metrics['critic/score_min']).toBe(0);
    expect(advantages.every(Number.isFinite)).toBe(true);
  });

  it('is scale-invariant at ±1e4 and keeps large groups from affecting small ones', () => {
    const { advantages } = both([1e4, -1e4, 1e4, -1e4, 0.25, 0.75], ['big', 'big', 'big', 'big', 'small', 'small'], {
      std: 'population',
    });
    const a = 0.25 / (0.25 + EPS);
    expectClose(advantages, [1, -1, 1, -1, -a, a]);
    const centered = both([1e4, -1e4, 3], ['a', 'a', 'b'], { normalizeByStd: false });
    expectClose(centered.advantages, [1e4, -1e4, 0], 1e-3);
  });

  it('collapses the turns of one run to the run mean and counts each run once', () => {
    // Group g: run 0 has two turns (1, 0 → 0.5), run 1 has one (1), run 2 has three (0, 0, 0 → 0).
    const scores = [1, 0, 1, 0, 0, 0];
    const groupIds = ['g', 'g', 'g', 'g', 'g', 'g'];
    const runIds = [0, 0, 1, 2, 2, 2];
    const { advantages, groups, metrics } = both(scores, groupIds, { runIds });
    // Run scores [0.5, 1, 0]: mean 0.5, sample std 0.5.
    const a = 0.5 / (0.5 + EPS);
    expectClose(advantages, [0, 0, a, -a, -a, -a]);
    expect(groups[0]).toMatchObject({ kind: 'normal', runs: 3, trajectories: 6, mean: 0.5, std: 0.5 });
    expect(metrics['critic/runs']).toBe(3);
    // Run ids are local to a group: run 0 of group h is a different run.
    const split = both([1, 1, 0, 0], ['g', 'h', 'g', 'h'], { runIds: [0, 0, 1, 1], std: 'population' });
    expectClose(
      split.advantages,
      [1, 1, -1, -1].map((x) => x * (0.5 / (0.5 + EPS))),
    );
    // One run with many turns is a singleton group.
    const single = both([1, 0, 1], ['g', 'g', 'g'], { runIds: [7, 7, 7] });
    expect(single.advantages).toEqual([0, 0, 0]);
    expect(single.metrics['critic/groups_singleton']).toBe(1);
  });

  it('agrees with a plain-loop reference, and the tensor version with the array version, on seeded random data', () => {
    for (let seed = 1; seed <= 30; seed++) {
      const rng = mulberry32(seed);
      const { scores, groupIds, runIds } = randomCase(rng);
      for (const std of ['sample', 'population'] as const) {
        for (const normalizeByStd of [true, false]) {
          const withRuns = both(scores, groupIds, { std, normalizeByStd, runIds });
          expectClose(withRuns.advantages, referenceAdvantages(scores, groupIds, runIds, normalizeByStd, std));
          const perTrajectory = both(scores, groupIds, { std, normalizeByStd });
          expectClose(perTrajectory.advantages, referenceAdvantages(scores, groupIds, undefined, normalizeByStd, std));
        }
      }
    }
  });

  it('returns zeros and zero metrics for empty input', () => {
    const { advantages, metrics } = both([], []);
    expect(advantages).toEqual([]);
    expect(Object.keys(metrics).sort()).toEqual([...GROUP_ADVANTAGE_METRIC_KEYS].sort());
    expect(Object.values(metrics).every((v) => v === 0)).toBe(true);
  });

  it('gives 0 to trajectories whose group index is out of range (tensor version)', () => {
    const result = tf.tidy(() => {
      const out = computeGroupAdvantagesTensor(tf.tensor1d([1, 0, 5]), tf.tensor1d([0, 0, 3], 'int32'), 1, {
        std: 'population',
      });
      return { adv: values(out.advantages), metrics: readMetricsSync(out.metrics) };
    });
    expectClose(result.adv, [1 / (1 + 2 * EPS), -1 / (1 + 2 * EPS), 0]);
    expect(result.metrics['critic/groups']).toBe(1);
  });

  it('numbers groups and (group, run) pairs by first appearance', () => {
    const index = indexGroups(['b', 'a', 'b', 'a', 'b'], [0, 0, 1, 0, 0]);
    expect(Array.from(index.groupIndex)).toEqual([0, 1, 0, 1, 0]);
    expect(Array.from(index.runIndex)).toEqual([0, 1, 2, 1, 0]);
    expect([index.numGroups, index.numRuns]).toEqual([2, 3]);
    const noRuns = indexGroups(['x', 'x']);
    expect(Array.from(noRuns.runIndex)).toEqual([0, 1]);
    expect(() => indexGroups(['x'], [0, 1])).toThrow(ConfigError);
  });

  it('leaks no tensors', () => {
    const s = tf.tensor1d([1, 0, NaN, 2, 2, 3]);
    const g = tf.tensor1d([0, 0, 1, 1, 2, 2], 'int32');
    const r = tf.tensor1d([0, 1, 2, 3, 4, 4], 'int32');
    expectNoLeak(() => computeGroupAdvantagesTensor(s, g, 3));
    expectNoLeak(() => computeGroupAdvantagesTensor(s, g, 3, { runIndex: r, numRuns: 5, normalizeByStd: false }));
    const empty = tf.tensor1d([]);
    const emptyIndex = tf.tensor1d([], 'int32');
    expectNoLeak(() => computeGroupAdvantagesTensor(empty, emptyIndex, 0));
    tf.dispose([s, g, r, empty, emptyIndex]);
  });

  it('rejects invalid options and shapes', () => {
    expect(() => computeGroupAdvantages([1, 2], ['a'])).toThrow(ConfigError);
    expect(() => computeGroupAdvantages([1, 2], ['a', 'a'], { runIds: [0] })).toThrow(ConfigError);
    expect(() => computeGroupAdvantages([1], ['a'], { std: 'unbiased' as StdKind })).toThrow(/sample, population/);
    expect(() => computeGroupAdvantages([1], ['a'], { epsilon: -1 })).toThrow(ConfigError);
    tf.tidy(() => {
      expect(() => computeGroupAdvantagesTensor(tf.tensor1d([1, 2]), tf.tensor1d([0], 'int32'), 1)).toThrow(ShapeError);
      expect(() => computeGroupAdvantagesTensor(tf.tensor1d([1]), tf.tensor1d([0], 'int32'), 1.5)).toThrow(ConfigError);
      expect(() =>
        computeGroupAdvantagesTensor(tf.tensor1d([1]), tf.tensor1d([0], 'int32'), 1, {
          runIndex: tf.tensor1d([0], 'int32'),
          numRuns: 0,
        }),
      ).toThrow(ConfigError);
    });
  });
});

describe('broadcastAdvantages', () => {
  it('multiplies each row advantage by its mask', () => {
    const out = tf.tidy(() =>
      values(
        broadcastAdvantages(
          tf.tensor1d([2, -1, 3]),
          mat([
            [1, 1, 0],
            [0, 1, 1],
            [0, 0, 0],
          ]),
        ),
      ),
    );
    expect(out).toEqual([2, 2, 0, 0, -1, -1, 0, 0, 0]);
  });

  it('leaks no tensors and checks shapes', () => {
    const adv = tf.tensor1d([1, 2]);
    const mask = mat([
      [1, 0],
      [1, 1],
    ]);
    expectNoLeak(() => broadcastAdvantages(adv, mask));
    expect(() => broadcastAdvantages(tf.tensor1d([1, 2, 3]), mask)).toThrow(ShapeError);
    tf.dispose([adv, mask]);
  });
});
