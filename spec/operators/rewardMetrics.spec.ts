import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';
import { from, lastValueFrom, toArray } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { grpoPrepare } from '../../operators/grpoPrepare.js';
import { sftPrepare } from '../../operators/sftPrepare.js';
import { rewardMetrics } from '../../operators/internal/batchStats.js';
import type { Group } from '../../lib/core/types.js';
import { traj } from '../helpers/fixtures.js';

describe('rewardMetrics', () => {
  it("gives each evaluator metric's mean and sample std, and the reward's, as TRL logs each reward function", () => {
    const rows = [
      traj('a@0', 0, { reward: 1, metrics: { accuracy: 1, length_match: 1 } }),
      traj('a@0', 1, { reward: 0.5, metrics: { accuracy: 0, length_match: 1 } }),
      traj('b@0', 0, { reward: 0, metrics: { accuracy: 0, length_match: 0 } }),
    ];
    const metrics = rewardMetrics(rows);
    expect(Object.keys(metrics).sort()).toEqual([
      'reward/accuracy/mean',
      'reward/accuracy/std',
      'reward/length_match/mean',
      'reward/length_match/std',
      'reward/mean',
      'reward/std',
    ]);
    expect(metrics['reward/mean']).toBeCloseTo(0.5, 12);
    expect(metrics['reward/std']).toBeCloseTo(0.5, 12); // squares 0.25 + 0 + 0.25 over N − 1 = 2
    expect(metrics['reward/accuracy/mean']).toBeCloseTo(1 / 3, 12);
    expect(metrics['reward/accuracy/std']).toBeCloseTo(Math.sqrt((4 / 9 + 1 / 9 + 1 / 9) / 2), 12);
    expect(metrics['reward/length_match/mean']).toBeCloseTo(2 / 3, 12);
  });

  it('averages a metric over the samples that have it, and leaves out one that none has', () => {
    const rows = [
      traj('a@0', 0, { reward: 1, metrics: { accuracy: 1 } }),
      traj('a@0', 1, { reward: 0, metrics: {} }),
      traj('a@0', 2, { reward: 0, metrics: { accuracy: 0, format: Number.NaN } }),
    ];
    const metrics = rewardMetrics(rows);
    expect(metrics['reward/accuracy/mean']).toBe(0.5);
    expect(metrics['reward/mean']).toBeCloseTo(1 / 3, 12);
    expect(metrics).not.toHaveProperty('reward/format/mean');
    expect(rewardMetrics([traj('a@0', 0, { reward: 2, metrics: { accuracy: 1 } })])).toEqual({
      'reward/mean': 2,
      'reward/std': 0,
      'reward/accuracy/mean': 1,
      'reward/accuracy/std': 0,
    });
    expect(rewardMetrics([])).toEqual({});
    // An agent worker's counts are not reward metrics: they keep their names.
    expect(rewardMetrics([traj('a@0', 0, { reward: 1, metrics: { 'agent/turns': 3, accuracy: 1 } })])).toEqual({
      'reward/mean': 1,
      'reward/std': 0,
      'reward/accuracy/mean': 1,
      'reward/accuracy/std': 0,
      'agent/turns/mean': 3,
      'agent/turns/std': 0,
    });
  });
});

describe('prepare stages report the reward metrics of every sample of the step', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  const groups: Group[] = [
    {
      key: ['a@0'],
      modelTag: 'policy',
      failed: 1,
      trajectories: [traj('a@0', 0, { reward: 1, metrics: { accuracy: 1 } }), traj('a@0', 1, { reward: 0, metrics: { accuracy: 0 } })],
    },
    // A zero-variance group: filtered from the batch, still counted in the metrics.
    {
      key: ['b@0'],
      modelTag: 'policy',
      trajectories: [traj('b@0', 0, { reward: 0, metrics: { accuracy: 0 } }), traj('b@0', 1, { reward: 0, metrics: { accuracy: 0 } })],
    },
  ];

  it('grpoPrepare', async () => {
    const [batch] = await lastValueFrom(from([groups]).pipe(grpoPrepare({ padId: 0, filterZeroVariance: true }), toArray()));
    expect(batch.size).toBe(2);
    expect(batch.metrics).toMatchObject({ 'reward/accuracy/mean': 0.25, 'reward/mean': 0.25, 'rollout/failed_samples': 1 });
    expect(batch.metrics?.['reward/accuracy/std']).toBeCloseTo(0.5, 12);
  });

  it('sftPrepare', async () => {
    const [batch] = await lastValueFrom(from([groups]).pipe(sftPrepare({ padId: 0, minReward: 1 }), toArray()));
    expect(batch.size).toBe(1);
    expect(batch.metrics).toMatchObject({ 'reward/accuracy/mean': 0.25, 'reward/accuracy/std': 0.5 });
  });
});
