import { cpSync, readFileSync, statSync, truncateSync, writeFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { verifyCheckpoint, type CheckpointState } from '../../lib/checkpoint/checkpoint.js';
import { DecodeError } from '../../lib/core/errors.js';
import { runAgents } from '../../pipelines/agents.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from './tinyRun.js';

/** A finished 3-step run with checkpoints after steps 1, 2 and 3: each case damages a copy of it. */
let finished: string;
beforeAll(async () => {
  finished = join(await mkdtemp(join(tmpdir(), 'rxrl-fallback-')), 'run');
  await runTraining(tinyRun(finished, 3));
}, 120_000);

async function copyOfFinished(): Promise<string> {
  const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-fallback-')), 'run');
  cpSync(finished, dir, { recursive: true });
  return dir;
}

function stateOf(checkpoint: string): CheckpointState {
  return JSON.parse(readFileSync(join(checkpoint, 'state.json'), 'utf8')) as CheckpointState;
}

function trainedSteps(dir: string): number[] {
  return readFileSync(join(dir, 'trained.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((line) => (JSON.parse(line) as { step: number }).step);
}

describe('crash-safe checkpoints: state.json records every file, resume verifies and falls back', () => {
  it('state.json records the size and sha256 of every file of the checkpoint; a changed byte is detected', async () => {
    const newest = join(finished, 'global_step_3');
    const { files } = stateOf(newest);
    expect(Object.keys(files ?? {}).sort()).toEqual(
      [
        'buffered.jsonl',
        'config.json',
        'generation_config.json',
        'model.safetensors',
        'optimizer.safetensors',
        'tokenizer.json',
        'tokenizer_config.json',
      ].sort(),
    );
    expect(files?.['model.safetensors']).toEqual({
      size: statSync(join(newest, 'model.safetensors')).size,
      sha256: expect.stringMatching(/^[0-9a-f]{64}$/),
    });
    await verifyCheckpoint(newest);

    const dir = await copyOfFinished();
    const damaged = join(dir, 'global_step_3');
    const bytes = readFileSync(join(damaged, 'model.safetensors'));
    bytes[bytes.length - 1] ^= 0x01; // one bit of the last weight: the file still decodes
    writeFileSync(join(damaged, 'model.safetensors'), bytes);
    const error = await verifyCheckpoint(damaged).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DecodeError);
    expect((error as Error).message).toBe(`checkpoint ${damaged}: model.safetensors does not match its sha256 in state.json`);
  });

  it.each([
    {
      what: 'an empty model.safetensors',
      file: 'model.safetensors',
      damage: (f: string) => writeFileSync(f, ''),
      reason: 'model.safetensors has 0 bytes',
    },
    {
      what: 'an empty optimizer.safetensors',
      file: 'optimizer.safetensors',
      damage: (f: string) => writeFileSync(f, ''),
      reason: 'optimizer.safetensors has 0 bytes',
    },
    {
      what: 'a truncated model.safetensors',
      file: 'model.safetensors',
      damage: (f: string) => truncateSync(f, statSync(f).size - 100),
      reason: 'model.safetensors has ',
    },
  ])(
    'the newest checkpoint with $what: resume warns, naming it, falls back to the previous one and continues',
    async ({ file, damage, reason }) => {
      const dir = await copyOfFinished();
      damage(join(dir, 'global_step_3', file));
      const lines: string[] = [];
      const summary = await runTraining(tinyRun(dir, 4), { log: (line) => lines.push(line) });
      const warning = lines.find((line) => line.startsWith('warning: checkpoint '));
      expect(warning).toContain(`warning: checkpoint ${join(dir, 'global_step_3')} is damaged, falling back to the previous one: `);
      expect(warning).toContain(reason);
      expect(summary.resumedFrom).toBe(join(dir, 'global_step_2'));
      expect(summary.steps).toBe(4);
      // Steps 2 and 3 were trained again (the damaged checkpoint replaced), each logged once.
      expect(trainedSteps(dir)).toEqual([0, 1, 2, 3]);
      await verifyCheckpoint(join(dir, 'global_step_3'));
    },
    120_000,
  );

  it('a checkpoint written before checksums were recorded still loads; damaged, it is caught when its safetensors do not decode', async () => {
    const dir = await copyOfFinished();
    for (const step of [2, 3]) {
      const path = join(dir, `global_step_${step}`);
      const { files: _files, ...old } = stateOf(path);
      writeFileSync(join(path, 'state.json'), JSON.stringify(old));
    }
    writeFileSync(join(dir, 'global_step_3', 'model.safetensors'), '');
    const lines: string[] = [];
    const summary = await runTraining(tinyRun(dir, 4), { log: (line) => lines.push(line) });
    expect(
      lines.some(
        (line) => line.startsWith(`warning: checkpoint ${join(dir, 'global_step_3')} is damaged`) && line.includes('malformed safetensors'),
      ),
    ).toBe(true);
    expect(summary.resumedFrom).toBe(join(dir, 'global_step_2'));
    expect(trainedSteps(dir)).toEqual([0, 1, 2, 3]);
  }, 120_000);

  it('a damaged checkpoint named by resume.mode from_path is an error, not a fallback; so is a run directory with no intact checkpoint', async () => {
    const dir = await copyOfFinished();
    const named = join(dir, 'global_step_3');
    writeFileSync(join(named, 'optimizer.safetensors'), '');
    const error = await runTraining(tinyRun(dir, 4, { resume: { mode: 'from_path', path: named } })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DecodeError);
    expect((error as Error).message).toMatch(
      new RegExp(`^checkpoint ${named}: optimizer.safetensors has 0 bytes, state.json records \\d+$`),
    );
    for (const step of [1, 2]) writeFileSync(join(dir, `global_step_${step}`, 'model.safetensors'), '');
    const lines: string[] = [];
    await expect(runTraining(tinyRun(dir, 4), { log: (line) => lines.push(line) })).rejects.toThrow(
      `${dir}: none of its 3 checkpoints is intact; set resume.mode to 'disable' to start over`,
    );
    expect(lines.filter((line) => line.startsWith('warning: checkpoint '))).toHaveLength(3);
    // Nothing was rolled back: the history of the run is as it was.
    expect(trainedSteps(dir)).toEqual([0, 1, 2]);
  }, 120_000);

  it('a multi-policy checkpoint: an empty optimizer.safetensors of one policy makes resume fall back to the previous one', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-fallback-')), 'run');
    const agents = (steps: number) =>
      tinyRun(dir, steps, {
        agents: {
          environment: 'writer-editor',
          roles: [
            { name: 'writer', policy: 'writer' },
            { name: 'editor', policy: 'editor' },
          ],
        },
        policies: [
          { name: 'writer', specialization: 'lora', lora: { rank: 2, alpha: 4, targetModules: ['q_proj'] } },
          { name: 'editor', specialization: 'full' },
        ],
      });
    await runAgents(agents(2));
    const { files } = stateOf(join(dir, 'global_step_2'));
    expect(Object.keys(files ?? {})).toEqual(
      expect.arrayContaining(['policies/writer/adapter_model.safetensors', 'policies/editor/optimizer.safetensors']),
    );
    writeFileSync(join(dir, 'global_step_2', 'policies', 'editor', 'optimizer.safetensors'), '');
    const lines: string[] = [];
    const summary = await runAgents(agents(3), { log: (line) => lines.push(line) });
    expect(lines).toContain(`resuming from ${join(dir, 'global_step_1')} (step 1)`);
    expect(lines.find((line) => line.startsWith('warning: checkpoint '))).toMatch(
      new RegExp(
        `^warning: checkpoint ${join(dir, 'global_step_2')} is damaged, falling back to the previous one: .*policies/editor/optimizer.safetensors has 0 bytes`,
      ),
    );
    expect(summary.policies.map((p) => p.steps)).toEqual([3, 3]);
    await verifyCheckpoint(join(dir, 'global_step_3'));
  }, 180_000);
});
