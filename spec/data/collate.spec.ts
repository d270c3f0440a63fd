import { describe, expect, it } from 'vitest';
import { collate } from '../../lib/data/collate.js';
import { ContextLengthError, ShapeError } from '../../lib/core/errors.js';
import { traj } from '../helpers/fixtures.js';

describe('collate', () => {
  it('left-pads prompts, right-pads responses to the batch maxima, and places rewards and advantages', () => {
    const rows = [
      traj('a@0', 0, { promptTokens: [1, 5], responseTokens: [6, 7, 2], logprobs: [-1, -2, -3], lossMask: [1, 0, 1], reward: 0.5 }),
      traj('a@0', 1, { promptTokens: [1, 5, 8], responseTokens: [9], logprobs: [-4], lossMask: [1], reward: 1, policyVersion: 2 }),
    ];
    const batch = collate(rows, { padId: 0, modelTag: 'policy', advantages: [-1, 1], refLogprobs: [[-1.5, -2.5, -3.5], [-4.5]] });
    expect([batch.size, batch.promptLength, batch.responseLength]).toEqual([2, 3, 3]);
    expect([...batch.inputIds]).toEqual([0, 1, 5, 6, 7, 2, 1, 5, 8, 9, 0, 0]);
    expect([...batch.attentionMask]).toEqual([0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0]);
    expect([...batch.positionIds]).toEqual([0, 0, 1, 2, 3, 4, 0, 1, 2, 3, 0, 0]);
    expect([...batch.responseMask]).toEqual([1, 1, 1, 1, 0, 0]);
    expect([...batch.lossMask]).toEqual([1, 0, 1, 1, 0, 0]);
    expect([...batch.oldLogprobs]).toEqual([-1, -2, -3, -4, 0, 0]);
    expect([...batch.refLogprobs!]).toEqual([-1.5, -2.5, -3.5, -4.5, 0, 0]);
    expect([...batch.advantages]).toEqual([-1, -0, -1, 1, 0, 0]);
    expect([...batch.tokenRewards]).toEqual([0, 0, 0.5, 1, 0, 0]);
    expect(batch.meta).toMatchObject({ trajectoryIds: ['a@0/0', 'a@0/1'], policyVersions: [0, 2], rewards: [0.5, 1] });
  });

  it('collates no rows into an empty batch, and rejects ragged trajectories', () => {
    const empty = collate([], { padId: 0, modelTag: 'p' });
    expect([empty.size, empty.promptLength, empty.responseLength, empty.inputIds.length]).toEqual([0, 0, 0, 0]);
    expect(() => collate([traj('a@0', 0, { logprobs: [-1] })], { padId: 0, modelTag: 'p' })).toThrow(ShapeError);
  });

  it('refuses a row longer than maxSeqLen, naming its task, trajectory, length and the limit; one that fits is collated', () => {
    const fits = traj('a@0', 0, { promptTokens: [1, 5], responseTokens: [6, 2], logprobs: [-1, -1], lossMask: [1, 1] });
    const long = traj('b@0', 1, { promptTokens: [1, 5, 8], responseTokens: [6, 2], logprobs: [-1, -1], lossMask: [1, 1] });
    expect(collate([fits], { padId: 0, modelTag: 'p', maxSeqLen: 4 }).size).toBe(1);
    let error: unknown;
    try {
      collate([fits, long], { padId: 0, modelTag: 'p', maxSeqLen: 4 });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ContextLengthError);
    expect((error as ContextLengthError).context).toEqual({ taskId: long.taskId, trajectoryId: 'b@0/1', tokens: 5, limit: 4 });
    expect((error as ContextLengthError).message).toContain(`task ${long.taskId}`);
    // Without a bound, nothing is refused.
    expect(collate([fits, long], { padId: 0, modelTag: 'p' }).size).toBe(2);
  });
});
