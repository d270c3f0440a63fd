import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';
import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError, DecodeError, StepFailedError } from '../../lib/core/errors.js';
import type { BackendName } from '../../lib/model/backend.js';
import { runTraining } from '../../pipelines/run.js';
import { SPEC_BACKENDS } from '../helpers/backends.js';

async function fixture(): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), 'rxrl-run-'));
  const tasks = ['ab', 'ba', 'aa', 'bb', 'aab', 'abb'].map((s, i) => ({ id: `t${i}`, prompt: `${s}=`, answer: [...s].reverse().join('') }));
  await writeFile(
    join(dir, 'train.jsonl'),
    tasks
      .slice(0, 4)
      .map((t) => JSON.stringify(t))
      .join('\n'),
  );
  await writeFile(
    join(dir, 'val.jsonl'),
    tasks
      .slice(4)
      .map((t) => JSON.stringify(t))
      .join('\n'),
  );
  await writeFile(
    join(dir, 'evaluator.mjs'),
    'export const half = { evaluate: (task, response) => ({ reward: 0.5, metrics: { custom: response === task.answer ? 1 : 0 } }) };\n' +
      "export const flaky = { evaluate: (task) => { if (task.id === 't1') throw new Error('judge unavailable'); return { reward: 1 }; } };\n" +
      "export const broken = { evaluate: () => { throw new Error('judge down'); } };\n",
  );
  return dir;
}

// The backend of the runs in each block (`describe.each` below sets it before the block's tests start).
let backend: BackendName = 'cpu';

const base = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  run: { dir: 'run', steps: 3, backend, seed: 2 },
  data: { source: 'jsonl', trainFile: 'train.jsonl', validationFile: 'val.jsonl', alphabet: 'ab=', epochs: 0 },
  model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
  rollout: { groupSize: 2, maxTokens: 4, evaluator: { module: './evaluator.mjs', export: 'half' } },
  sync: { batchSize: 2 },
  checkpoint: { every: 1, keepLast: 2 },
  validation: { beforeTrain: true, every: 2 },
  ...extra,
});

describe.each(SPEC_BACKENDS)('runTraining (%s backend)', (name) => {
  beforeAll(() => {
    backend = name;
  });

  it('trains JSONL tasks with an evaluator loaded by module path, validating and checkpointing as configured', async () => {
    const dir = await fixture();
    const summary = await runTraining(loadConfig({ values: base(), env: {} }), { baseDir: dir });
    expect(summary).toMatchObject({ recipe: 'train', steps: 3, mode: 'sync', runDir: join(dir, 'run') });
    expect(summary.lastStep['rollout/reward_mean']).toBe(0.5);
    const metrics = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    // before training (the step it follows: −1); each step's line, then its sync and wall time on a line of their
    // own (with the validation at version 2), and the final validation
    expect(metrics.map((m) => m.step)).toEqual([-1, 0, 0, 1, 1, 2, 2, 2]);
    expect(metrics.map((m) => m.version)).toEqual([0, 1, 1, 2, 2, 3, 3, 3]);
    expect(metrics[0]['val/custom_mean']).toBeTypeOf('number');
    expect(metrics[4]['val/reward_mean']).toBe(0.5);
    expect(metrics[4]['actor/pg_loss']).toBeUndefined();
    expect(metrics[3]['actor/pg_loss']).toBeTypeOf('number');
    expect(metrics[3]['val/reward_mean']).toBeUndefined();
    for (const [train, after] of [
      [1, 2],
      [3, 4],
      [5, 6],
    ].map(([a, b]) => [metrics[a], metrics[b]])) {
      const parts = after['timing/wait_s'] + train['timing/prepare_s'] + train['timing/step_s'] + after['timing/sync_s'];
      expect(parts).toBeCloseTo(after['timing/total_s'], 9);
      // Generating and scoring the batch happen while the trainer waits for it; the trainer's parts inside its step.
      expect(train['timing/generate_s']).toBeGreaterThan(0);
      expect(train['timing/generate_s']).toBeLessThanOrEqual(after['timing/wait_s']);
      expect(train['timing/reward_s']).toBeLessThanOrEqual(after['timing/wait_s']);
      expect(train['timing/forward_backward_s'] + train['timing/optimizer_s']).toBeLessThanOrEqual(train['timing/step_s']);
    }
    // Every validation says its seconds; the one after version 2 delays the next step, inside its wait.
    for (const val of [metrics[0], metrics[4], metrics[7]]) expect(val['timing/val_s']).toBeGreaterThan(0);
    expect(metrics[6]['timing/wait_s']).toBeGreaterThanOrEqual(metrics[4]['timing/val_s']);
    expect(
      readdirSync(join(dir, 'run'))
        .filter((n) => n.startsWith('global_step_'))
        .sort(),
    ).toEqual(['global_step_2', 'global_step_3']);
    const trained = readFileSync(join(dir, 'run', 'trained.jsonl'), 'utf8')
      .trim()
      .split('\n');
    expect(trained).toHaveLength(3);
    expect(existsSync(join(dir, 'run', 'validation'))).toBe(false);
  });

  it("keeps each validation's samples as text with validation.generations, one file per validated version", async () => {
    const dir = await fixture();
    const validation = { beforeTrain: true, every: 2, generations: true };
    await runTraining(loadConfig({ values: base({ validation }), env: {} }), { baseDir: dir });
    expect(readdirSync(join(dir, 'run', 'validation')).sort()).toEqual(['0.jsonl', '2.jsonl', '3.jsonl']);
    const metrics = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>)
      .filter((m) => 'val/reward_mean' in m);
    for (const m of metrics) {
      const lines = readFileSync(join(dir, 'run', 'validation', `${m.version}.jsonl`), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as { taskId: string; answer: string; response: string; reward: number; metrics: { custom: number } });
      // The held-out tasks t4 and t5, with their answers, what the policy wrote and its scores, as metrics.jsonl averaged them.
      expect(lines.map((l) => [l.taskId, l.answer])).toEqual([
        ['t4', 'baa'],
        ['t5', 'bba'],
      ]);
      for (const line of lines) {
        expect(line.response).toBeTypeOf('string');
        expect(line.reward).toBe(0.5);
        expect(line.metrics.custom).toBe(line.response === line.answer ? 1 : 0);
      }
      expect(m['val/custom_mean']).toBe((lines[0].metrics.custom + lines[1].metrics.custom) / 2);
    }
  });

  it('scores a last step that validation.every already validated once, and reports those scores as the final ones', async () => {
    const dir = await fixture();
    const validation = { beforeTrain: true, every: 2, generations: true };
    const summary = await runTraining(
      loadConfig({ values: base({ run: { dir: 'run', steps: 4, backend, seed: 2 }, validation }), env: {} }),
      {
        baseDir: dir,
      },
    );
    const vals = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>)
      .filter((m) => 'val/reward_mean' in m);
    // Before training, after step 2 and after step 4 — the end adds no fourth scoring of version 4.
    expect(vals.map((m) => m.version)).toEqual([0, 2, 4]);
    expect(readdirSync(join(dir, 'run', 'validation')).sort()).toEqual(['0.jsonl', '2.jsonl', '4.jsonl']);
    expect(summary.valRewardFinal).toBe(vals[2]['val/reward_mean']);
  });

  it('resumes from the newest checkpoint and trains only the remaining steps', async () => {
    const dir = await fixture();
    await runTraining(loadConfig({ values: base(), env: {} }), { baseDir: dir });
    const resumed = await runTraining(loadConfig({ values: base({ run: { dir: 'run', steps: 5, backend, seed: 2 } }), env: {} }), {
      baseDir: dir,
    });
    expect(resumed.steps).toBe(5);
    expect(resumed.resumedFrom).toBe(join(dir, 'run', 'global_step_3'));
    const steps = readFileSync(join(dir, 'run', 'trained.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { step: number }).step);
    expect(steps).toEqual([0, 1, 2, 3, 4]);
  });

  it('counts failed samples and goes on under continue; stops gracefully, with a checkpoint, under stop_on_error', async () => {
    const dir = await fixture();
    const flaky = { groupSize: 2, maxTokens: 4, evaluator: { module: './evaluator.mjs', export: 'flaky' } };
    const going = await runTraining(
      loadConfig({ values: base({ rollout: flaky, run: { dir: 'go', steps: 4, backend, seed: 2, errorPolicy: 'continue' } }), env: {} }),
      { baseDir: dir },
    );
    expect(going.steps).toBe(4);
    expect(going.failedSamples).toBeGreaterThan(0);
    expect(going.stoppedBy).toBeUndefined();
    const lines = readFileSync(join(dir, 'go', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    expect(lines.reduce((n, m) => n + (m['rollout/failed_samples'] ?? 0), 0)).toBe(going.failedSamples);

    const stopped = await runTraining(
      loadConfig({
        values: base({ rollout: flaky, run: { dir: 'stop', steps: 50, backend, seed: 2, errorPolicy: 'stop_on_error' } }),
        env: {},
      }),
      { baseDir: dir },
    );
    expect(stopped.steps).toBeLessThan(50);
    expect(stopped.stoppedBy).toMatch(/EvaluationError/);
    // Stopped early: no final validation ran, and the summary says so rather than reporting 0.
    expect(stopped.valRewardFinal).toBeNull();
    expect(going.valRewardFinal).toBe(1);
  });

  it('fails a run under stop_on_error when every sample of a step failed (no checkpoint of it); goes on under continue', async () => {
    const dir = await fixture();
    const broken = { groupSize: 2, maxTokens: 4, evaluator: { module: './evaluator.mjs', export: 'broken' } };
    const run = runTraining(
      loadConfig({
        values: base({ rollout: broken, run: { dir: 'fail', steps: 3, backend, seed: 2, errorPolicy: 'stop_on_error' } }),
        env: {},
      }),
      { baseDir: dir },
    );
    await expect(run).rejects.toBeInstanceOf(StepFailedError);
    await expect(run).rejects.toMatchObject({ cause: { name: 'EvaluationError' }, context: { batch: 0 } });
    expect(readdirSync(join(dir, 'fail')).filter((n) => n.startsWith('global_step_'))).toEqual([]);

    const going = await runTraining(
      loadConfig({
        values: base({ rollout: broken, run: { dir: 'go-on', steps: 2, backend, seed: 2, errorPolicy: 'continue' } }),
        env: {},
      }),
      { baseDir: dir },
    );
    expect(going.steps).toBe(2);
    expect(going.failedSamples).toBe(2 * 2 * 2); // two steps of 2 tasks × 2 samples (held-out validation counts its own)
    expect(
      readdirSync(join(dir, 'go-on'))
        .filter((n) => n.startsWith('global_step_'))
        .sort(),
    ).toEqual(['global_step_1', 'global_step_2']);
  });

  it('ends every run with a checkpoint of its last step, even one shorter than checkpoint.every', async () => {
    const dir = await fixture();
    const summary = await runTraining(
      loadConfig({ values: base({ run: { dir: 'short', steps: 2, backend, seed: 2 }, checkpoint: { every: 50, keepLast: 2 } }), env: {} }),
      { baseDir: dir },
    );
    expect(summary.steps).toBe(2);
    expect(readdirSync(join(dir, 'short')).filter((n) => n.startsWith('global_step_'))).toEqual(['global_step_2']);
  });
});

describe('runTraining rejects bad set-ups', () => {
  beforeAll(() => {
    backend = 'cpu';
  });

  it('rejects a model too short for the bundled task before anything runs', async () => {
    const config = loadConfig({ values: { run: { dir: null, backend: 'cpu' }, model: { maxSeqLen: 8 } }, env: {} });
    // The bundled 4-letter prompts are 6 tokens (BOS, letters, separator) and the response budget 5: 6 > 8 − 5.
    await expect(runTraining(config)).rejects.toThrow(
      /^data\.train\[0\]: task reverse-abcde-4\/\w+: prompt is 6 tokens, longer than model\.maxSeqLen − rollout\.maxTokens = 8 − 5 = 3$/,
    );
    await expect(runTraining(config)).rejects.toBeInstanceOf(DecodeError);
  });

  it('names a missing evaluator export', async () => {
    const dir = await fixture();
    const config = loadConfig({
      values: base({ rollout: { groupSize: 2, maxTokens: 4, evaluator: { module: './evaluator.mjs', export: 'nope' } } }),
      env: {},
    });
    await expect(runTraining(config, { baseDir: dir })).rejects.toThrow(ConfigError);
    await expect(runTraining(config, { baseDir: dir })).rejects.toThrow(/rollout\.evaluator\.export/);
  });
});
