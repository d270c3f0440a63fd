/**
 * What every prepare stage (`grpoPrepare`, `sftPrepare`) reports of the groups it turns into a batch.
 *
 * @packageDocumentation
 */
import { spanSeconds } from '../../lib/observe/spans.js';
import type { Group, Metrics, Trajectory } from '../../lib/core/types.js';

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
