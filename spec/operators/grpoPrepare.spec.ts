import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';
import { from, lastValueFrom, throwError, toArray, concat } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { grpoPrepare, type ReferencePolicy } from '../../operators/grpoPrepare.js';
import type { Batch, Group } from '../../lib/core/types.js';
import { groupOf, traj } from '../helpers/fixtures.js';

const group = groupOf;

async function prepare(batches: Group[][], options: Parameters<typeof grpoPrepare>[0]): Promise<Batch[]> {
  return lastValueFrom(from(batches).pipe(grpoPrepare(options), toArray()));
}

describe('grpoPrepare', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it('computes group-normalized advantages over each row loss mask, and places rewards on the last token', async () => {
    const [batch] = await prepare([[group('a@0', [1, 0]), group('b@0', [0.5, 0.5])]], { padId: 0, std: 'population' });
    expect(batch.size).toBe(4);
    const R = batch.responseLength;
    const rowAdvantage = (b: number): number => batch.advantages[b * R];
    expect(rowAdvantage(0)).toBeCloseTo(1, 4);
    expect(rowAdvantage(1)).toBeCloseTo(-1, 4);
    expect([rowAdvantage(2), rowAdvantage(3)]).toEqual([0, 0]);
    expect([...batch.tokenRewards.subarray(0, R)]).toEqual([0, 1]);
    expect(batch.metrics).toMatchObject({ 'batch/groups': 2, 'batch/rows': 4, 'critic/groups_zero_variance': 1 });
  });

  it("reports the rollout's generate and reward seconds as the union of its rows' spans", async () => {
    const timed = (id: string, spans: [[number, number], [number, number]][]): Group => ({
      key: [id],
      modelTag: 'policy',
      trajectories: spans.map(([generate, reward], runId) => ({ ...traj(id, runId, { reward: runId }), timing: { generate, reward } })),
    });
    const [batch] = await prepare(
      [
        [
          timed('a@0', [
            [
              [0, 2000],
              [2000, 2010],
            ],
            [
              [500, 2500],
              [2500, 2520],
            ],
          ]),
          timed('b@0', [
            [
              [4000, 5000],
              [5000, 5005],
            ],
            [
              [4000, 4500],
              [4500, 4505],
            ],
          ]),
        ],
      ],
      { padId: 0 },
    );
    expect(batch.metrics?.['timing/generate_s']).toBeCloseTo(3.5, 9);
    expect(batch.metrics?.['timing/reward_s']).toBeCloseTo(0.04, 9);
    // Trajectories without timing (decoded from Kafka) give no such metrics.
    const [untimed] = await prepare([[group('a@0', [1, 0])]], { padId: 0 });
    expect(untimed.metrics).not.toHaveProperty('timing/generate_s');
  });

  it('filters zero-variance groups when asked, counting them', async () => {
    const [batch] = await prepare([[group('a@0', [1, 0]), group('b@0', [0.5, 0.5]), group('c@0', [])]], {
      padId: 0,
      filterZeroVariance: true,
    });
    expect(batch.meta.groupIds).toEqual(['a@0', 'a@0']);
    expect(batch.metrics).toMatchObject({ 'batch/groups_filtered': 1, 'batch/rows_filtered': 2, 'batch/groups_empty': 1 });
  });

  it('trains the first maxGroups groups left by the filter, in batch order, counting the surplus (dynamic sampling)', async () => {
    const groups = [group('a@0', [1, 1]), group('b@0', [1, 0]), group('c@0', [0, 0]), group('d@0', [0, 1]), group('e@0', [1, 0])];
    const [batch] = await prepare([groups], { padId: 0, filterZeroVariance: true, maxGroups: 2 });
    expect(batch.meta.groupIds).toEqual(['b@0', 'b@0', 'd@0', 'd@0']);
    expect(batch.meta.groups).toEqual(['a@0', 'b@0', 'c@0', 'd@0', 'e@0']);
    expect(batch.metrics).toMatchObject({ 'batch/groups': 5, 'batch/groups_filtered': 2, 'batch/groups_surplus': 1, 'batch/rows': 4 });
    // Fewer informative groups than maxGroups: every one of them trains, nothing is surplus.
    const [few] = await prepare([groups.slice(0, 3)], { padId: 0, filterZeroVariance: true, maxGroups: 2 });
    expect(few.meta.groupIds).toEqual(['b@0', 'b@0']);
    expect(few.metrics).toMatchObject({ 'batch/groups_surplus': 0 });
    // Without the filter the first groups train whatever their rewards.
    const [plain] = await prepare([groups], { padId: 0, maxGroups: 1 });
    expect(plain.meta.groupIds).toEqual(['a@0', 'a@0']);
    expect(() => grpoPrepare({ padId: 0, maxGroups: 0 })).toThrow(/maxGroups must be an integer >= 1/);
  });

  it('emits an empty batch when no rows are left, so the step counter can move on', async () => {
    const [batch] = await prepare([[group('a@0', [])]], { padId: 0 });
    expect(batch.size).toBe(0);
    expect(batch.metrics!['batch/rows']).toBe(0);
  });

  it('subtracts a KL penalty against the reference policy and scores by the penalized sum', async () => {
    // Old log-probs are [-0.5, -0.25] per row (fixtures); the reference says [-1, -1] → k1 = [0.5, 0.75].
    const reference: ReferencePolicy = {
      responseLogprobs: async (batch) => new Float32Array(batch.size * batch.responseLength).fill(-1),
    };
    const [batch] = await prepare([[group('a@0', [1, 0])]], {
      padId: 0,
      std: 'population',
      klInReward: { reference, controller: { type: 'fixed', coef: 0.1 } },
    });
    expect([...batch.tokenRewards].map((x) => Number(x.toFixed(4)))).toEqual([-0.05, 0.925, -0.05, -0.075]);
    expect([...batch.refLogprobs!]).toEqual([-1, -1, -1, -1]);
    expect(batch.metrics!['actor/reward_kl_penalty']).toBeCloseTo(0.625, 5);
    expect(batch.metrics!['actor/reward_kl_penalty_coeff']).toBeCloseTo(0.1, 6);
    expect(batch.advantages[0]).toBeCloseTo(1, 4);
  });

  it('keeps batch order and passes errors through', async () => {
    const out = await prepare([[group('a@0', [1, 0])], [group('b@0', [0, 1])]], { padId: 0 });
    expect(out.map((b) => b.meta.groupIds[0])).toEqual(['a@0', 'b@0']);
    const failing = concat(
      from([[group('a@0', [1])]]),
      throwError(() => new Error('upstream')),
    );
    await expect(lastValueFrom(failing.pipe(grpoPrepare({ padId: 0 })))).rejects.toThrow('upstream');
  });
});
