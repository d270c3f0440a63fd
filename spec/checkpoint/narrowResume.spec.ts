/**
 * A checkpoint saved in bfloat16 (`checkpoint.dtype`) keeps its float32 master weights in `master.safetensors`, and a
 * resume reads them. When they are gone together with their record in `state.json` (so the checkpoint verifies), the
 * run still resumes, from the bfloat16 weights, but says so: a warning naming the precision loss, and the summary's
 * `resumedPrecision`.
 */
import { cpSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadCheckpoint, MASTER_WEIGHTS_FILE, verifyCheckpoint, type CheckpointState } from '../../lib/checkpoint/checkpoint.js';
import { readModelDir } from '../../lib/model/modelDir.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from './tinyRun.js';

const BF16 = { checkpoint: { every: 1, keepLast: 0, dtype: 'bfloat16' } };

/** A finished 2-step run saved in bfloat16, with checkpoints after steps 1 and 2: each case changes a copy. */
let finished: string;
beforeAll(async () => {
  finished = join(await mkdtemp(join(tmpdir(), 'rxrl-narrow-')), 'run');
  await runTraining(tinyRun(finished, 2, BF16));
}, 120_000);

async function copyOfFinished(): Promise<string> {
  const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-narrow-')), 'run');
  cpSync(finished, dir, { recursive: true });
  return dir;
}

/** Removes `master.safetensors` from a checkpoint and its record from `state.json`: the checkpoint still verifies. */
function dropMaster(checkpoint: string): void {
  rmSync(join(checkpoint, MASTER_WEIGHTS_FILE));
  const state = JSON.parse(readFileSync(join(checkpoint, 'state.json'), 'utf8')) as CheckpointState;
  const { [MASTER_WEIGHTS_FILE]: _master, ...files } = state.files ?? {};
  writeFileSync(join(checkpoint, 'state.json'), JSON.stringify({ ...state, files }));
}

describe('resuming a bfloat16 checkpoint whose float32 master weights are missing', () => {
  it('an intact one resumes from its master weights, with no warning', async () => {
    const dir = await copyOfFinished();
    expect((await loadCheckpoint(join(dir, 'global_step_2'))).narrowDtype).toBeUndefined();
    const lines: string[] = [];
    const summary = await runTraining(tinyRun(dir, 3, BF16), { log: (line) => lines.push(line) });
    expect(summary.resumedFrom).toBe(join(dir, 'global_step_2'));
    expect(summary.resumedPrecision).toBeUndefined();
    expect(lines.filter((line) => line.startsWith('warning: '))).toEqual([]);
  }, 120_000);

  it('without master.safetensors and its record: resumes from the bfloat16 weights with a warning naming the precision loss', async () => {
    const dir = await copyOfFinished();
    const newest = join(dir, 'global_step_2');
    dropMaster(newest);
    await verifyCheckpoint(newest);
    const loaded = await loadCheckpoint(newest);
    expect(loaded.narrowDtype).toBe('bfloat16');
    const narrow = (await readModelDir(newest)).weights;
    for (const [name, tensor] of narrow) expect(loaded.weights.get(name)?.data, name).toEqual(tensor.data);

    const lines: string[] = [];
    const summary = await runTraining(tinyRun(dir, 3, BF16), { log: (line) => lines.push(line) });
    expect(lines.filter((line) => line.startsWith('warning: '))).toEqual([
      `warning: checkpoint ${newest} has no float32 master weights (master.safetensors): resuming from its bfloat16 weights, ` +
        'rounded to bfloat16 (precision lost); training goes on from the rounded weights',
    ]);
    expect(summary).toMatchObject({ resumedFrom: newest, resumedPrecision: 'bfloat16', steps: 3 });
    // The next checkpoint is whole again: it has float32 master weights of its own.
    expect((await loadCheckpoint(join(dir, 'global_step_3'))).narrowDtype).toBeUndefined();
  }, 120_000);
});
