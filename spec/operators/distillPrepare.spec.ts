import { from, lastValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import type { Batch, Group, ReferencePolicy } from '../../lib/core/types.js';
import { distillPrepare } from '../../operators/distillPrepare.js';
import { traj } from '../helpers/fixtures.js';

const row = (id: string, logprobs: number[], reward: number) =>
  traj(id, 0, { responseTokens: logprobs.map((_, i) => 10 + i), logprobs, lossMask: logprobs.map(() => 1), reward });

/** A teacher that gives every response token the same log-prob, and records the batches it scored. */
function teacher(logprob: number, seen: Batch[]): ReferencePolicy {
  return {
    responseLogprobs: async (batch) => {
      seen.push(batch);
      return Float32Array.from(batch.responseMask, (m) => (m === 1 ? logprob : 0));
    },
  };
}

describe('distillPrepare', () => {
  it('gives each response token the advantage teacher − student log-prob (+ rewardCoef · reward), and the reverse KL', async () => {
    const seen: Batch[] = [];
    const groups: Group[] = [{ key: ['a@0'], modelTag: 'policy', trajectories: [row('a@0', [-1, -3], 1), row('b@0', [-2], 0)] }];
    const [batch] = await lastValueFrom(
      from([groups]).pipe(distillPrepare({ padId: 0, teacher: teacher(-2, seen), rewardCoef: 0.5 }), toArray()),
    );
    expect(seen).toHaveLength(1);
    const R = batch.responseLength;
    expect(R).toBe(2);
    // Row a: −2 − (−1) + 0.5 = −0.5, −2 − (−3) + 0.5 = 1.5; row b: −2 − (−2) + 0 = 0, then padding.
    expect([...batch.advantages]).toEqual([-0.5, 1.5, 0, 0]);
    expect([...batch.refLogprobs!]).toEqual([-2, -2, -2, 0]);
    // Student − teacher over the three tokens: (1 − 1 + 0) / 3.
    expect(batch.metrics).toMatchObject({
      'distill/reverse_kl': 0,
      'distill/teacher_logprob_mean': -2,
      'critic/score_mean': 0.5,
      'batch/rows': 2,
    });
  });

  it('an empty batch asks the teacher nothing and still goes on', async () => {
    const seen: Batch[] = [];
    const empty: Group[] = [{ key: ['a@0'], modelTag: 'policy', trajectories: [], failed: 2 }];
    const [batch] = await lastValueFrom(from([empty]).pipe(distillPrepare({ padId: 0, teacher: teacher(-1, seen) }), toArray()));
    expect(seen).toEqual([]);
    expect(batch.size).toBe(0);
    expect(batch.metrics).toMatchObject({ 'rollout/failed_samples': 2, 'distill/reverse_kl': 0 });
  });
});
