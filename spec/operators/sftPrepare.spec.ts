import { from, lastValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../lib/core/errors.js';
import type { Batch, Group } from '../../lib/core/types.js';
import { sftPrepare } from '../../operators/sftPrepare.js';
import { groupOf } from '../helpers/fixtures.js';

const group = groupOf;

async function prepare(batches: Group[][], options: Parameters<typeof sftPrepare>[0]): Promise<Batch[]> {
  return lastValueFrom(from(batches).pipe(sftPrepare(options), toArray()));
}

describe('sftPrepare', () => {
  it('keeps every row with advantage 1 on its loss mask, and reports the batch', async () => {
    const [batch] = await prepare([[group('a@0', [0]), group('b@0', [1])]], { padId: 0 });
    expect(batch.size).toBe(2);
    expect([...batch.advantages]).toEqual([...batch.lossMask]);
    expect(batch.meta.groups).toEqual(['a@0', 'b@0']);
    expect(batch.metrics).toMatchObject({ 'batch/groups': 2, 'batch/rows': 2, 'batch/rows_filtered': 0, 'critic/score_mean': 0.5 });
  });

  it('with minReward keeps only the rows that reach it, and an empty batch still goes on', async () => {
    const [kept, empty] = await prepare([[group('a@0', [1, 0.2, 1]), group('b@0', [0])], [group('c@0', [0.5])]], {
      padId: 0,
      minReward: 1,
    });
    expect(kept.meta.trajectoryIds).toEqual(['a@0/0', 'a@0/2']);
    expect(kept.metrics).toMatchObject({ 'batch/rows': 2, 'batch/rows_filtered': 2, 'critic/score_mean': 0.55 });
    expect(empty.size).toBe(0);
    expect(empty.metrics).toMatchObject({ 'batch/groups': 1, 'batch/rows': 0, 'batch/rows_filtered': 1 });
    expect(() => sftPrepare({ padId: 0, minReward: Number.NaN })).toThrow(ConfigError);
  });
});
