/**
 * What every prepare stage (`grpoPrepare`, `sftPrepare`, `distillPrepare`) shares: one batch per array of groups, in
 * order, and what it reports of them.
 *
 * @packageDocumentation
 */
import { concatMap, type OperatorFunction } from 'rxjs';
import { spanSeconds } from '../../lib/observe/spans.js';
import type { Batch, Group, Metrics, ModelTag, Trajectory } from '../../lib/core/types.js';

/**
 * A prepare stage around `prepare`, which makes the batch of a batch's rows (in group order) with its own metrics:
 * one batch per array of groups, in order, with `meta.groups` (every group's key) and the metrics every stage reports
 * added — the groups' counts ({@link groupMetrics}), the rewards and evaluator metrics of its samples
 * ({@link rewardMetrics}), the rollout's timing ({@link rolloutSeconds}) and `timing/prepare_s`, the seconds of the
 * whole preparation.
 *
 * @param modelTag - the batches' model tag; default the first group's (else `policy`).
 */
export function preparing(
  modelTag: ModelTag | undefined,
  prepare: (rows: readonly Trajectory[], modelTag: ModelTag) => Promise<Batch> | Batch,
): OperatorFunction<readonly Group[], Batch> {
  return concatMap(async (groups) => {
    const started = performance.now();
    const rows = groups.flatMap((g) => g.trajectories);
    const batch = await prepare(rows, modelTag ?? groups[0]?.modelTag ?? 'policy');
    const metrics: Metrics = {
      ...groupMetrics(groups),
      ...batch.metrics,
      ...rewardMetrics(rows),
      ...rolloutSeconds(rows),
      'timing/prepare_s': (performance.now() - started) / 1000,
    };
    return { ...batch, meta: { ...batch.meta, groups: groups.map((g) => g.key.join('/')) }, metrics };
  });
}

/** `batch/groups`, the empty, timed-out and dropped ones, and `rollout/failed_samples` of a batch's groups. */
export function groupMetrics(groups: readonly Group[]): Metrics {
  return {
    'batch/groups': groups.length,
    'batch/groups_empty': groups.filter((g) => g.trajectories.length === 0).length,
    'batch/groups_timed_out': groups.filter((g) => g.closedBy === 'timeout').length,
    'batch/trajectories_dropped': groups.reduce((n, g) => n + (g.dropped ?? 0), 0),
    'rollout/failed_samples': groups.reduce((n, g) => n + (g.failed ?? 0), 0),
  };
}

/** `critic/score_mean`: the mean reward of a batch's samples, kept or not (0 for none). */
export function scoreMean(rows: readonly Trajectory[]): Metrics {
  return { 'critic/score_mean': rows.length === 0 ? 0 : rows.reduce((sum, t) => sum + t.reward, 0) / rows.length };
}

/**
 * The rewards of a batch's samples (every row, kept by the prepare stage or not) and each metric their evaluator
 * returned, as TRL logs each reward function: `reward/mean` and `reward/std` of the rewards, and
 * `reward/<name>/mean` and `reward/<name>/std` of each metric `<name>` (for example `reward/accuracy/mean`). A
 * metric's mean and std are over the samples that have it as a finite number (failed samples have none); a metric
 * no sample has is absent. The std is the sample standard deviation (N − 1, as TRL's), 0 for a single sample. An agent
 * worker's metrics (`agent/turns`, `agent/tool_calls`, …) keep their names: `agent/turns/mean`, `agent/turns/std`.
 *
 * @param rows - the batch's trajectories.
 * @returns the metrics; empty for no rows.
 */
export function rewardMetrics(rows: readonly Trajectory[]): Metrics {
  const values = new Map<string, number[]>();
  const add = (key: string, value: number): void => {
    if (!Number.isFinite(value)) return;
    const list = values.get(key);
    if (list === undefined) values.set(key, [value]);
    else list.push(value);
  };
  for (const row of rows) {
    add('reward', row.reward);
    // The agent worker's own counts (`agent/turns`, `agent/tool_calls`, …) are not the evaluator's: under their name.
    for (const [name, value] of Object.entries(row.metrics)) add(name.startsWith('agent/') ? name : `reward/${name}`, value);
  }
  const metrics: Metrics = {};
  for (const [key, list] of values) {
    const mean = list.reduce((a, b) => a + b, 0) / list.length;
    const squares = list.reduce((a, b) => a + (b - mean) ** 2, 0);
    metrics[`${key}/mean`] = mean;
    metrics[`${key}/std`] = list.length > 1 ? Math.sqrt(squares / (list.length - 1)) : 0;
  }
  return metrics;
}

/**
 * `timing/generate_s` and `timing/reward_s` of a batch: the wall time during which at least one of its samples was
 * being generated, or scored (the union of their spans, so concurrent samples count once). Absent when no row has
 * timing (trajectories that crossed Kafka).
 */
export function rolloutSeconds(rows: readonly Trajectory[]): Metrics {
  const timed = rows.flatMap((t) => (t.timing ? [t.timing] : []));
  if (timed.length === 0) return {};
  return {
    'timing/generate_s': spanSeconds(timed.map((t) => t.generate)),
    'timing/reward_s': spanSeconds(timed.map((t) => t.reward)),
  };
}
