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
 * added — the groups' counts ({@link groupMetrics}), the rollout's timing ({@link rolloutSeconds}) and
 * `timing/prepare_s`, the seconds of the whole preparation.
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
