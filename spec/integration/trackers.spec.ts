/**
 * Dashboards against their real counterparts, brought by `npm test` (PyPI `tensorboard`, `mlflow`): a run with
 * `logging.tensorboard` and `logging.mlflow` logs every metric, step-aligned; resumed from an earlier checkpoint, it
 * repeats no step in TensorBoard's reader (`EventAccumulator`) nor in the MLflow run (`MlflowClient`), which it
 * continues. A live `mlflow server` on loopback takes the calls.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { TensorBoardWriter, crc32c } from '../../lib/observe/tensorboard.js';
import { runTraining } from '../../pipelines/run.js';
import { waitFor } from '../kafka/helpers.js';

let server: ChildProcess | undefined;
let trackingUri: string;

async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.listen(0, '127.0.0.1', () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

function python(script: string, ...args: string[]): unknown {
  const result = spawnSync('python3', ['-c', script, ...args], { encoding: 'utf8' });
  if (result.status !== 0) throw new Error(`python3 failed:\n${result.stderr}`);
  return JSON.parse(result.stdout.trim().split('\n').at(-1) ?? 'null');
}

beforeAll(async () => {
  const dir = mkdtempSync(join(tmpdir(), 'rxrl-mlflow-'));
  const port = await freePort();
  trackingUri = `http://127.0.0.1:${port}`;
  server = spawn(
    'python3',
    ['-m', 'mlflow', 'server', '--host', '127.0.0.1', '--port', String(port), '--workers', '1'].concat([
      '--backend-store-uri',
      `sqlite:///${join(dir, 'mlflow.db')}`,
      '--default-artifact-root',
      join(dir, 'artifacts'),
    ]),
    { stdio: 'ignore', detached: true },
  );
  await waitFor(async () => (await fetch(`${trackingUri}/health`).catch(() => undefined))?.ok === true, {
    timeoutMs: 90_000,
    intervalMs: 250,
  });
}, 120_000);

afterAll(() => {
  if (server?.pid !== undefined) process.kill(-server.pid, 'SIGTERM');
});

/** The tiny bundled recipe with both trackers on. */
function recipe(dir: string, steps: number, resume?: string) {
  return loadConfig({
    env: {},
    values: {
      run: { dir, seed: 3, steps, backend: 'cpu' },
      data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
      sync: { batchSize: 2 },
      rollout: { groupSize: 2 },
      checkpoint: { every: 2, keepLast: 0 },
      logging: { tensorboard: true, mlflow: { trackingUri, experiment: 'rxrl-spec' } },
      ...(resume ? { resume: { mode: 'from_path', path: resume } } : {}),
    },
  });
}

describe('TensorBoard and MLflow', () => {
  it('log every metric step-aligned, and a run resumed from an earlier checkpoint repeats no step', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'rxrl-trackers-')), 'run');
    await runTraining(recipe(dir, 3), { log: () => undefined });
    // Resumed from step 2: step 3 is trained again (metrics.jsonl drops its line; TensorBoard and MLflow keep one).
    const summary = await runTraining(recipe(dir, 4, join(dir, 'global_step_2')), { log: () => undefined });
    expect(summary.steps).toBe(4);
    const lines = readFileSync(join(dir, 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { step: number; 'rollout/reward_mean'?: number; 'reward/accuracy/mean'?: number });
    const rewards = lines.filter((l) => l['rollout/reward_mean'] !== undefined);
    expect(rewards.map((l) => l.step)).toEqual([0, 1, 2, 3]);
    // The evaluator's own metrics (the reverse task's accuracy and length_match), per step, in every sink.
    for (const line of rewards) {
      expect(line).toHaveProperty('reward/accuracy/mean');
      expect(line).toHaveProperty('reward/accuracy/std');
      expect(line).toHaveProperty('reward/length_match/mean');
    }
    const board = python(
      [
        'import json, sys',
        'from tensorboard.backend.event_processing.event_accumulator import EventAccumulator',
        'ea = EventAccumulator(sys.argv[1]); ea.Reload()',
        "print(json.dumps({tag: [[e.step, e.value] for e in ea.Scalars(tag)] for tag in ['rollout/reward_mean', 'actor/pg_loss', 'val/reward_mean', 'reward/accuracy/mean', 'reward/length_match/std']}))",
      ].join('\n'),
      join(dir, 'tensorboard'),
    ) as Record<string, [number, number][]>;
    expect(board['rollout/reward_mean'].map(([step]) => step)).toEqual([1, 2, 3, 4]);
    expect(board['actor/pg_loss'].map(([step]) => step)).toEqual([1, 2, 3, 4]);
    // Step-aligned: the value at each step is the one of metrics.jsonl (float32 in the event file).
    for (const [i, [, value]] of board['rollout/reward_mean'].entries()) expect(value).toBeCloseTo(rewards[i]['rollout/reward_mean']!, 6);
    expect(board['val/reward_mean'].map(([step]) => step)).toContain(0);
    expect(board['reward/accuracy/mean'].map(([step]) => step)).toEqual([1, 2, 3, 4]);
    expect(board['reward/length_match/std'].map(([step]) => step)).toEqual([1, 2, 3, 4]);
    for (const [i, [, value]] of board['reward/accuracy/mean'].entries()) expect(value).toBeCloseTo(rewards[i]['reward/accuracy/mean']!, 6);
    const state = JSON.parse(readFileSync(join(dir, 'mlflow.json'), 'utf8')) as { runId: string; lastVersion: number };
    expect(state.lastVersion).toBe(4);
    const mlflow = python(
      [
        'import json, sys',
        'from mlflow.tracking import MlflowClient',
        'c = MlflowClient(sys.argv[1]); run = c.get_run(sys.argv[2])',
        "history = [[m.step, m.value] for m in c.get_metric_history(sys.argv[2], 'rollout/reward_mean')]",
        "accuracy = [[m.step, m.value] for m in c.get_metric_history(sys.argv[2], 'reward/accuracy/mean')]",
        "print(json.dumps({'status': run.info.status, 'params': run.data.params, 'history': history, 'accuracy': accuracy, 'experiment': c.get_experiment(run.info.experiment_id).name}))",
      ].join('\n'),
      trackingUri,
      state.runId,
    ) as { status: string; params: Record<string, string>; history: [number, number][]; accuracy: [number, number][]; experiment: string };
    expect(mlflow.status).toBe('FINISHED');
    expect(mlflow.experiment).toBe('rxrl-spec');
    expect(mlflow.params).toMatchObject({ 'sync.batchSize': '2', 'run.seed': '3', 'trainer.learningRate': expect.any(String) });
    // Secrets are params by name only, redacted by the rule `rxrl config` prints with (null or empty: none given).
    const secrets = Object.entries(mlflow.params).filter(([key]) => /apiKey/i.test(key));
    expect(secrets.length).toBeGreaterThan(0);
    for (const [, value] of secrets) expect(['[redacted]', 'null', '']).toContain(value);
    expect(mlflow.history.map(([step]) => step)).toEqual([1, 2, 3, 4]);
    expect(mlflow.accuracy.map(([step]) => step)).toEqual([1, 2, 3, 4]);
  }, 180_000);

  it('an MLflow server that cannot be reached stops the run before it starts, naming the key', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'rxrl-trackers-')), 'run');
    const config = recipe(dir, 1);
    const port = await freePort();
    const unreachable = {
      ...config,
      logging: { ...config.logging, mlflow: { ...config.logging.mlflow, trackingUri: `http://127.0.0.1:${port}`, experiment: 'x' } },
    };
    await expect(runTraining(unreachable, { log: () => undefined })).rejects.toThrow(ConfigError);
    await expect(runTraining(unreachable, { log: () => undefined })).rejects.toThrow(/logging\.mlflow\.trackingUri: http:\/\/127\.0\.0\.1/);
  });

  it('writes TFRecord framing with masked CRC-32C (the reference value of "123456789")', () => {
    expect(crc32c(new TextEncoder().encode('123456789'))).toBe(0xe3069283);
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-tb-'));
    const writer = TensorBoardWriter.open(dir, { now: () => 1_700_000_000_000 });
    writer.write({ step: 0, version: 1, metrics: { a: 1, b: Number.NaN } });
    writer.close();
    const bytes = readFileSync(writer.path);
    // Two records: the header event, then one summary; each framed by length, its CRC, the data, the data's CRC.
    let at = 0;
    let records = 0;
    while (at < bytes.length) {
      const length = Number(bytes.readBigUInt64LE(at));
      at += 12 + length + 4;
      records++;
    }
    expect(at).toBe(bytes.length);
    expect(records).toBe(2);
  });
});
