/**
 * Group-relative advantages (GRPO): each trajectory is scored against the other samples of its prompt.
 *
 * Shao et al., "DeepSeekMath: Pushing the Limits of Mathematical Reasoning in Open Language Models"
 * (arXiv:2402.03300), §4.1.2: `A_i = (r_i − mean(r)) / std(r)` within a group. Dr.GRPO (Liu et al.,
 * arXiv:2503.20783) drops the division by the std: `A_i = r_i − mean(r)`.
 *
 * Defined cases (both versions, which agree):
 * - A group is classified once, in this order:
 *   1. `nonfinite`: some score in it is NaN or ±Infinity, or its mean / std overflow. Every trajectory of the
 *      group gets advantage 0; the group counts in `critic/groups_nonfinite` and each bad score in
 *      `critic/nonfinite_scores`. Other groups are unaffected.
 *   2. `singleton`: one run. Advantage 0 (there is nothing to compare with); `critic/groups_singleton`.
 *   3. `zero-variance`: two or more runs, all with exactly the same score. Advantage exactly 0 (no rounding
 *      residue); `critic/groups_zero_variance`.
 *   4. `normal`: `(s − mean) / (std + ε)`, or `s − mean` without std normalization.
 * - With run ids, trajectories sharing `(groupId, runId)` (for example the turns of one multi-turn agent run)
 *   form one run whose score is their mean; the statistics are taken over runs, so each run counts once, and
 *   every trajectory gets its run's advantage.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import type { Metrics } from '../core/types.js';
import type { ScalarMetrics } from './metrics.js';
import { assertLength, assertRank } from './shapes.js';

/** Added to the group std before dividing, so a tiny spread cannot blow advantages up. */
export const ADVANTAGE_EPSILON = 1e-6;

/** Keys of the metrics both advantage functions return. */
export const GROUP_ADVANTAGE_METRIC_KEYS: readonly string[] = [
  'critic/score_mean',
  'critic/score_max',
  'critic/score_min',
  'critic/advantages_mean',
  'critic/advantages_max',
  'critic/advantages_min',
  'critic/groups',
  'critic/runs',
  'critic/groups_singleton',
  'critic/groups_zero_variance',
  'critic/groups_nonfinite',
  'critic/nonfinite_scores',
];

/** Which standard deviation normalizes advantages: `sample` divides by `n − 1`, `population` by `n`. */
export type StdKind = 'sample' | 'population';

/** Every {@link StdKind}. */
export const STD_KINDS: readonly StdKind[] = ['sample', 'population'];

/** How a group was treated; see the module documentation for the order of the checks. */
export type GroupKind = 'normal' | 'singleton' | 'zero-variance' | 'nonfinite';

/** Ids that key groups and runs. */
export type AdvantageKey = string | number;

/** Options shared by {@link computeGroupAdvantages} and {@link computeGroupAdvantagesTensor}. */
export interface GroupAdvantageOptions {
  /** Divide by `std + epsilon` (GRPO). `false` gives Dr.GRPO's `s − mean`. Default `true`. */
  readonly normalizeByStd?: boolean | undefined;
  /** Standard deviation over a group's runs. Default `'sample'` (divides by `n − 1`, as `torch.std` does). */
  readonly std?: StdKind | undefined;
  /** Added to the std before dividing. Default {@link ADVANTAGE_EPSILON}. */
  readonly epsilon?: number | undefined;
}

/** Options of {@link computeGroupAdvantages}. */
export interface GroupAdvantageArrayOptions extends GroupAdvantageOptions {
  /**
   * Run id of each trajectory, `[N]`. Trajectories with the same `(groupId, runId)` are one run: its score is
   * their mean, it counts once in the group statistics, and each of them gets the run's advantage. Default:
   * every trajectory is its own run.
   */
  readonly runIds?: readonly AdvantageKey[] | undefined;
}

/** Options of {@link computeGroupAdvantagesTensor}. */
export interface GroupAdvantageTensorOptions extends GroupAdvantageOptions {
  /**
   * Run index of each trajectory, `[N]` int32 in `[0, numRuns)`, numbering `(group, run)` pairs across the
   * whole batch (see {@link indexGroups}). Trajectories with the same index must share a group.
   */
  readonly runIndex?: tf.Tensor1D;
  /** Number of distinct run indices. Default `N`. */
  readonly numRuns?: number;
}

/** Statistics of one group, as computed by {@link computeGroupAdvantages}. */
export interface GroupAdvantageStats {
  /** The group id. */
  readonly groupId: AdvantageKey;
  /** How the group was treated. */
  readonly kind: GroupKind;
  /** Number of trajectories. */
  readonly trajectories: number;
  /** Number of runs (equal to `trajectories` without run ids). */
  readonly runs: number;
  /** Mean run score (NaN for `nonfinite` groups). */
  readonly mean: number;
  /** Std of the run scores with the chosen {@link StdKind}; 0 for singleton groups, NaN for `nonfinite`. */
  readonly std: number;
}

/** Result of {@link computeGroupAdvantages}. */
export interface GroupAdvantageResult {
  /** Advantage of each trajectory, `[N]`, in input order; always finite. */
  readonly advantages: number[];
  /** One entry per group, in order of first appearance. */
  readonly groups: GroupAdvantageStats[];
  /**
   * `critic/score_mean|max|min` (over finite scores; 0 when there are none), `critic/advantages_mean|max|min`
   * (over all trajectories), `critic/groups`, `critic/runs`, `critic/groups_singleton`,
   * `critic/groups_zero_variance`, `critic/groups_nonfinite`, `critic/nonfinite_scores`.
   */
  readonly metrics: Metrics;
}

/** Result of {@link computeGroupAdvantagesTensor}. */
export interface GroupAdvantageTensorResult {
  /** Advantage of each trajectory, `[N]`; always finite. */
  readonly advantages: tf.Tensor1D;
  /** The metrics of {@link GroupAdvantageResult.metrics}, as scalars. */
  readonly metrics: ScalarMetrics;
}

/** Dense indices for the tensor version, built from ids by {@link indexGroups}. */
export interface GroupIndex {
  /** Group index of each trajectory, `[N]`, in `[0, numGroups)`, numbered by first appearance. */
  readonly groupIndex: Int32Array;
  /** Number of distinct group ids. */
  readonly numGroups: number;
  /** Index of each trajectory's `(groupId, runId)` pair, `[N]`, in `[0, numRuns)`. */
  readonly runIndex: Int32Array;
  /** Number of distinct `(groupId, runId)` pairs (`N` without run ids). */
  readonly numRuns: number;
}

interface ResolvedOptions {
  readonly normalizeByStd: boolean;
  readonly ddof: number;
  readonly epsilon: number;
}

function resolveOptions(options: GroupAdvantageOptions, fn: string): ResolvedOptions {
  const std = options.std ?? 'sample';
  if (!STD_KINDS.includes(std)) {
    throw new ConfigError(`${fn}: unknown std '${String(std)}'; valid: ${STD_KINDS.join(', ')}`, {
      context: { std, valid: STD_KINDS },
    });
  }
  const epsilon = options.epsilon ?? ADVANTAGE_EPSILON;
  if (!(epsilon >= 0) || !Number.isFinite(epsilon)) {
    throw new ConfigError(`${fn}: epsilon must be a finite number ≥ 0, got ${epsilon}`, { context: { epsilon } });
  }
  return { normalizeByStd: options.normalizeByStd ?? true, ddof: std === 'sample' ? 1 : 0, epsilon };
}

/**
 * Numbers group ids and `(groupId, runId)` pairs densely, by first appearance, for
 * {@link computeGroupAdvantagesTensor}.
 *
 * @param groupIds - Group id of each trajectory, `[N]`.
 * @param runIds - Run id of each trajectory, `[N]`; omitted, every trajectory is its own run.
 * @returns Dense indices and their counts.
 * @throws {@link ConfigError} when `runIds` and `groupIds` differ in length.
 */
export function indexGroups(groupIds: readonly AdvantageKey[], runIds?: readonly AdvantageKey[]): GroupIndex {
  if (runIds !== undefined && runIds.length !== groupIds.length) {
    throw new ConfigError(`indexGroups: ${runIds.length} run ids for ${groupIds.length} group ids`);
  }
  const groups = new Map<AdvantageKey, number>();
  const runs = new Map<AdvantageKey, Map<AdvantageKey, number>>();
  const groupIndex = new Int32Array(groupIds.length);
  const runIndex = new Int32Array(groupIds.length);
  let numRuns = 0;
  groupIds.forEach((groupId, i) => {
    let g = groups.get(groupId);
    if (g === undefined) {
      g = groups.size;
      groups.set(groupId, g);
      runs.set(groupId, new Map());
    }
    groupIndex[i] = g;
    const groupRuns = runs.get(groupId) ?? new Map<AdvantageKey, number>();
    const runKey = runIds === undefined ? i : runIds[i];
    let r = groupRuns.get(runKey);
    if (r === undefined) {
      r = numRuns++;
      groupRuns.set(runKey, r);
    }
    runIndex[i] = r;
  });
  return { groupIndex, numGroups: groups.size, runIndex, numRuns };
}

/**
 * Group-relative advantages on plain arrays (what the pipeline calls). See the module documentation for the
 * formula and the singleton / zero-variance / non-finite cases.
 *
 * @example
 * ```ts
 * const { advantages } = computeGroupAdvantages([1, 0, 1, 0.5], ['a', 'a', 'b', 'b'], { std: 'population' });
 * // group a: mean 0.5, std 0.5 → [≈1, ≈−1]; group b: mean 0.75, std 0.25 → [≈1, ≈−1]
 * ```
 *
 * @param scores - Scalar score (reward) of each trajectory, `[N]`.
 * @param groupIds - Group id of each trajectory, `[N]`.
 * @param options - Std normalization, std kind, epsilon, run ids.
 * @returns Advantages `[N]`, per-group statistics and metrics.
 * @throws {@link ConfigError} when the arrays differ in length or an option is invalid.
 */
export function computeGroupAdvantages(
  scores: readonly number[],
  groupIds: readonly AdvantageKey[],
  options: GroupAdvantageArrayOptions = {},
): GroupAdvantageResult {
  const fn = 'computeGroupAdvantages';
  const { normalizeByStd, ddof, epsilon } = resolveOptions(options, fn);
  if (groupIds.length !== scores.length || (options.runIds !== undefined && options.runIds.length !== scores.length)) {
    throw new ConfigError(`${fn}: scores, groupIds and runIds must have the same length`, {
      context: { scores: scores.length, groupIds: groupIds.length, runIds: options.runIds?.length },
    });
  }
  const { groupIndex, numGroups, runIndex, numRuns } = indexGroups(groupIds, options.runIds);

  // Trajectories of each run, runs of each group.
  const runMembers: number[][] = Array.from({ length: numRuns }, () => []);
  const groupRuns: number[][] = Array.from({ length: numGroups }, () => []);
  const groupSizes = new Array<number>(numGroups).fill(0);
  const groupKeys = new Array<AdvantageKey>(numGroups);
  scores.forEach((_, i) => {
    const r = runIndex[i];
    const g = groupIndex[i];
    if (runMembers[r].length === 0) groupRuns[g].push(r);
    runMembers[r].push(i);
    groupSizes[g] += 1;
    groupKeys[g] = groupIds[i];
  });

  const advantages = new Array<number>(scores.length).fill(0);
  const groups: GroupAdvantageStats[] = [];
  let nonfiniteScores = 0;
  for (let g = 0; g < numGroups; g++) {
    const runs = groupRuns[g];
    const badScores = runs.reduce((n, r) => n + runMembers[r].filter((i) => !Number.isFinite(scores[i])).length, 0);
    nonfiniteScores += badScores;
    const base = { groupId: groupKeys[g], trajectories: groupSizes[g], runs: runs.length };
    if (badScores > 0) {
      groups.push({ ...base, kind: 'nonfinite', mean: Number.NaN, std: Number.NaN });
      continue;
    }
    const runScores = runs.map((r) => runMembers[r].reduce((sum, i) => sum + scores[i], 0) / runMembers[r].length);
    const n = runScores.length;
    const mean = runScores.reduce((a, b) => a + b, 0) / n;
    if (n === 1) {
      groups.push({ ...base, kind: 'singleton', mean, std: 0 });
      continue;
    }
    if (runScores.every((s) => s === runScores[0])) {
      groups.push({ ...base, kind: 'zero-variance', mean: runScores[0], std: 0 });
      continue;
    }
    const std = Math.sqrt(runScores.reduce((acc, s) => acc + (s - mean) ** 2, 0) / (n - ddof));
    if (!Number.isFinite(mean) || !Number.isFinite(std)) {
      groups.push({ ...base, kind: 'nonfinite', mean: Number.NaN, std: Number.NaN });
      continue;
    }
    groups.push({ ...base, kind: 'normal', mean, std });
    runs.forEach((r, k) => {
      const centered = runScores[k] - mean;
      const advantage = normalizeByStd ? centered / (std + epsilon) : centered;
      for (const i of runMembers[r]) advantages[i] = advantage;
    });
  }

  const finiteScores = scores.filter((s) => Number.isFinite(s));
  const count = (kind: GroupKind): number => groups.filter((group) => group.kind === kind).length;
  const metrics: Metrics = {
    'critic/score_mean': average(finiteScores),
    'critic/score_max': finiteScores.length > 0 ? Math.max(...finiteScores) : 0,
    'critic/score_min': finiteScores.length > 0 ? Math.min(...finiteScores) : 0,
    'critic/advantages_mean': average(advantages),
    'critic/advantages_max': advantages.length > 0 ? Math.max(...advantages) : 0,
    'critic/advantages_min': advantages.length > 0 ? Math.min(...advantages) : 0,
    'critic/groups': numGroups,
    'critic/runs': numRuns,
    'critic/groups_singleton': count('singleton'),
    'critic/groups_zero_variance': count('zero-variance'),
    'critic/groups_nonfinite': count('nonfinite'),
    'critic/nonfinite_scores': nonfiniteScores,
  };
  return { advantages, groups, metrics };
}

function average(values: readonly number[]): number {
  return values.length === 0 ? 0 : values.reduce((a, b) => a + b, 0) / values.length;
}

/**
 * Group-relative advantages on tensors; agrees with {@link computeGroupAdvantages} (to float32 precision) given
 * the indices {@link indexGroups} builds. Groups and runs are handled with 0/1 membership matrices
 * (`[G, N]`, `[U, N]`) and matrix products, so only kernels every backend has are used.
 *
 * Float32 limits: scores must stay below about `1e18` in magnitude, or the squared deviations overflow and the
 * group is treated as `nonfinite` (advantage 0) where the float64 array version still computes one.
 *
 * @param scores - Scalar score of each trajectory, `[N]`.
 * @param groupIndex - Group index of each trajectory, `[N]` int32 in `[0, numGroups)`; a trajectory whose index
 *   is out of range belongs to no group and gets advantage 0.
 * @param numGroups - `G`, the number of group indices.
 * @param options - Std normalization, std kind, epsilon, run indices.
 * @returns Advantages `[N]` and scalar metrics (same keys as the array version).
 * @throws {@link ShapeError} on mismatched shapes; {@link ConfigError} on invalid options.
 */
export function computeGroupAdvantagesTensor(
  scores: tf.Tensor1D,
  groupIndex: tf.Tensor1D,
  numGroups: number,
  options: GroupAdvantageTensorOptions = {},
): GroupAdvantageTensorResult {
  const fn = 'computeGroupAdvantagesTensor';
  const { normalizeByStd, ddof, epsilon } = resolveOptions(options, fn);
  const { n, numRuns } = checkTensorArguments(scores, groupIndex, numGroups, options, fn);
  if (n === 0) {
    const metrics: ScalarMetrics = {};
    for (const key of GROUP_ADVANTAGE_METRIC_KEYS) metrics[key] = tf.scalar(0);
    return { advantages: tf.zeros([0]) as tf.Tensor1D, metrics };
  }

  return tf.tidy(() => {
    const s = tf.cast(scores, 'float32'); // [N]
    const finite = tf.isFinite(s); // [N] bool
    const clean = tf.where(finite, s, tf.zerosLike(s)); // [N], non-finite → 0 so products stay finite
    const badF = tf.cast(tf.logicalNot(finite), 'float32'); // [N]
    const groupMember = membership(groupIndex, numGroups); // [G, N]

    // Units are runs (with run indices) or trajectories (without).
    let runMember: tf.Tensor2D | undefined; // [U, N]
    let unitScore: tf.Tensor1D; // [U]
    let unitGroup: tf.Tensor2D; // [G, U]
    if (options.runIndex !== undefined) {
      runMember = membership(options.runIndex, numRuns); // [U, N]
      const runSize = tf.sum(runMember, 1); // [U]
      unitScore = tf.div(matVec(runMember, clean), tf.maximum(runSize, 1)) as tf.Tensor1D; // [U]
      const shared = tf.matMul(groupMember, runMember, false, true); // [G, U] trajectories of run u in group g
      unitGroup = tf.cast(tf.greater(shared, 0), 'float32') as tf.Tensor2D; // [G, U]
    } else {
      unitScore = clean as tf.Tensor1D; // [N]
      unitGroup = groupMember as tf.Tensor2D; // [G, N]
    }
    const inGroup = tf.cast(unitGroup, 'bool'); // [G, U]

    const units = tf.sum(unitGroup, 1); // [G] runs per group
    const groupBad = matVec(groupMember, badF); // [G] non-finite scores per group
    const groupMean = tf.div(matVec(unitGroup, unitScore), tf.maximum(units, 1)); // [G]
    const deviation = tf.sub(tf.expandDims(unitScore, 0), tf.expandDims(groupMean, 1)); // [G, U]
    const squares = tf.where(inGroup, tf.square(deviation), tf.zerosLike(deviation)); // [G, U]
    const groupStd = tf.sqrt(tf.div(tf.sum(squares, 1), tf.maximum(tf.sub(units, ddof), 1))); // [G]
    const broadcastScores = tf.broadcastTo(tf.expandDims(unitScore, 0), inGroup.shape); // [G, U]
    const groupMax = tf.max(tf.where(inGroup, broadcastScores, tf.fill(inGroup.shape, -Infinity)), 1); // [G]
    const groupMin = tf.min(tf.where(inGroup, broadcastScores, tf.fill(inGroup.shape, Infinity)), 1); // [G]

    const present = tf.greater(units, 0); // [G]
    const statsFinite = tf.logicalAnd(tf.isFinite(groupMean), tf.isFinite(groupStd)); // [G]
    const poisoned = tf.logicalOr(tf.greater(groupBad, 0), tf.logicalNot(statsFinite)); // [G]
    const isNonfinite = tf.logicalAnd(present, poisoned); // [G]
    const eligible = tf.logicalAnd(present, tf.logicalNot(isNonfinite)); // [G]
    const isSingleton = tf.logicalAnd(eligible, tf.equal(units, 1)); // [G]
    const isZeroVariance = tf.logicalAnd(tf.logicalAnd(eligible, tf.greater(units, 1)), tf.equal(groupMax, groupMin)); // [G]
    const isNormal = tf.logicalAnd(tf.logicalAnd(eligible, tf.greater(units, 1)), tf.logicalNot(isZeroVariance)); // [G]

    // Each unit's group statistics: a product with the membership matrix (0 outside normal groups, never NaN).
    const normalF = tf.cast(isNormal, 'float32'); // [G]
    const safeMean = tf.where(isNormal, groupMean, tf.zerosLike(groupMean)); // [G]
    const safeStd = tf.where(isNormal, groupStd, tf.zerosLike(groupStd)); // [G]
    const unitNormal = tf.greater(vecMat(normalF, unitGroup), 0); // [U]
    const centered = tf.sub(unitScore, vecMat(safeMean, unitGroup)); // [U]
    const raw = normalizeByStd ? tf.div(centered, tf.add(vecMat(safeStd, unitGroup), epsilon)) : centered; // [U]
    const unitAdvantage = tf.where(unitNormal, raw, tf.zerosLike(raw)) as tf.Tensor1D; // [U]
    const advantages = runMember === undefined ? unitAdvantage : vecMat(unitAdvantage, runMember); // [N]

    const countOf = (flags: tf.Tensor): tf.Scalar => tf.sum(tf.cast(flags, 'float32'));
    const finiteCount = countOf(finite);
    const hasFinite = tf.greater(finiteCount, 0);
    const orZero = (x: tf.Scalar, ok: tf.Tensor): tf.Scalar => tf.where(ok, x, tf.zerosLike(x));
    const sFill = (value: number): tf.Tensor1D => tf.fill([n], value) as tf.Tensor1D;
    const metrics: ScalarMetrics = {
      'critic/score_mean': tf.div(tf.sum(clean), tf.maximum(finiteCount, 1)),
      'critic/score_max': orZero(tf.max(tf.where(finite, s, sFill(-Infinity))), hasFinite),
      'critic/score_min': orZero(tf.min(tf.where(finite, s, sFill(Infinity))), hasFinite),
      'critic/advantages_mean': tf.mean(advantages),
      'critic/advantages_max': tf.max(advantages),
      'critic/advantages_min': tf.min(advantages),
      'critic/groups': countOf(present),
      'critic/runs': tf.sum(units),
      'critic/groups_singleton': countOf(isSingleton),
      'critic/groups_zero_variance': countOf(isZeroVariance),
      'critic/groups_nonfinite': countOf(isNonfinite),
      'critic/nonfinite_scores': tf.sum(badF),
    };
    return { advantages, metrics };
  });
}

/**
 * Checks the shapes and counts {@link computeGroupAdvantagesTensor} is given and returns the number of
 * trajectories `N` and of runs (`numRuns`, default `N`).
 *
 * @throws {@link ShapeError} for a tensor of the wrong rank or length; {@link ConfigError} for a bad count.
 */
function checkTensorArguments(
  scores: tf.Tensor1D,
  groupIndex: tf.Tensor1D,
  numGroups: number,
  options: GroupAdvantageTensorOptions,
  fn: string,
): { n: number; numRuns: number } {
  assertRank(scores, 1, 'scores', fn);
  const n = scores.shape[0];
  assertLength(groupIndex, n, 'groupIndex', fn);
  if (options.runIndex !== undefined) assertLength(options.runIndex, n, 'runIndex', fn);
  const numRuns = options.numRuns ?? n;
  for (const [name, value] of [
    ['numGroups', numGroups],
    ['numRuns', numRuns],
  ] as const) {
    if (!Number.isInteger(value) || value < 0) {
      throw new ConfigError(`${fn}: ${name} must be an integer ≥ 0, got ${value}`, { context: { [name]: value } });
    }
  }
  if (options.runIndex !== undefined && n > 0 && numRuns < 1) {
    throw new ConfigError(`${fn}: numRuns must be ≥ 1 when runIndex is given`, { context: { numRuns } });
  }
  return { n, numRuns };
}

/** 0/1 membership matrix `[K, N]`: row `k` marks the trajectories whose index is `k` (indices ∉ [0, K) match none). */
function membership(index: tf.Tensor1D, count: number): tf.Tensor2D {
  const rows = tf.expandDims(tf.range(0, count, 1, 'int32'), 1); // [K, 1]
  const columns = tf.expandDims(tf.cast(index, 'int32'), 0); // [1, N]
  return tf.cast(tf.equal(rows, columns), 'float32') as tf.Tensor2D; // [K, N]
}

/** `matrix · vector`: `[G, U] × [U] → [G]`. */
function matVec(matrix: tf.Tensor, vector: tf.Tensor): tf.Tensor1D {
  return tf.squeeze(tf.matMul(matrix as tf.Tensor2D, tf.expandDims(vector, 1) as tf.Tensor2D), [1]); // [G]
}

/** `vectorᵀ · matrix`: `[G] × [G, U] → [U]`. */
function vecMat(vector: tf.Tensor, matrix: tf.Tensor): tf.Tensor1D {
  return tf.squeeze(tf.matMul(tf.expandDims(vector, 0) as tf.Tensor2D, matrix as tf.Tensor2D), [0]); // [U]
}

/**
 * Broadcasts one advantage per sequence over its response tokens: `advantages[b] · mask[b, t]`.
 *
 * @param advantages - Advantage of each row, `[B]`.
 * @param mask - 0/1 response (or loss) mask, `[B, R]`.
 * @returns Per-token advantages, `[B, R]`, 0 where the mask is 0.
 * @throws {@link ShapeError} unless `advantages` is `[B]` and `mask` is `[B, R]`.
 */
export function broadcastAdvantages(advantages: tf.Tensor1D, mask: tf.Tensor2D): tf.Tensor2D {
  assertRank(mask, 2, 'mask', 'broadcastAdvantages');
  assertLength(advantages, mask.shape[0], 'advantages', 'broadcastAdvantages');
  return tf.tidy(() => {
    const perToken = tf.broadcastTo(tf.expandDims(tf.cast(advantages, 'float32'), 1), mask.shape); // [B, R]
    return tf.where(tf.greater(mask, 0), perToken, tf.zeros(mask.shape)) as tf.Tensor2D; // [B, R]
  });
}
