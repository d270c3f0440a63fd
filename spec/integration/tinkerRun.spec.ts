/**
 * Runs trained on a Tinker-API service (`trainer.backend: tinker`) — rxrl's own, in this process or as an `rxrl
 * tinker` process: every staleness mode, checkpoints that record the service's state and a resume that makes the
 * training client from it, and a service killed mid-run: a typed error under `stop_on_error`, and under `continue`
 * a run that waits for the restarted service and goes on from its last checkpoint, training exactly what an
 * uninterrupted run trains.
 */
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, readdirSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { RxrlConfig } from '../../lib/config/schema.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { RxrlError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { saveModelDir, specialIdsOf } from '../../lib/model/modelDir.js';
import { loadSafetensors } from '../../lib/model/safetensors.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { tinkerService, type TinkerService } from '../../lib/tinker/service.js';
import { loadRollout } from '../../pipelines/parts/data.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from '../checkpoint/tinyRun.js';
import { trainedLines } from '../helpers/runDir.js';

const execFileAsync = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
let tokenizer: Tokenizer;
let base: PolicyModel;
let modelDir: string;

/** Each step's policy loss from metrics.jsonl (the lines of trained steps). */
function losses(runDir: string): number[] {
  return readFileSync(join(runDir, 'metrics.jsonl'), 'utf8')
    .split('\n')
    .filter((line) => line.includes('actor/pg_loss'))
    .map((line) => (JSON.parse(line) as Record<string, number>)['actor/pg_loss']);
}

/** The adapter and Adam state the service saved for a run's checkpoint (`tinker.json` names it). */
async function savedState(runDir: string, step: number, stateDir: string): Promise<Map<string, Float32Array>> {
  const { path } = JSON.parse(readFileSync(join(runDir, `global_step_${step}`, 'tinker.json'), 'utf8')) as { path: string };
  const [, model, name] = /^tinker:\/\/([^/]+)\/weights\/([^/]+)$/.exec(path) ?? [];
  const { weights } = await loadSafetensors(join(stateDir, encodeURIComponent(model), `${encodeURIComponent(name)}.safetensors`));
  return new Map([...weights].map(([key, w]) => [key, Float32Array.from(w.data)]));
}

/** The tiny recipe, trained on the service at `url` (base model 'tiny', rank 2). */
function recipe(dir: string, steps: number, url: string, values: Record<string, unknown> = {}): RxrlConfig {
  return tinyRun(join(dir, 'run'), steps, {
    trainer: { backend: 'tinker', learningRate: 0.05 },
    tinker: { baseUrl: url, baseModel: 'tiny', rank: 2, recoverTimeoutMs: 60_000 },
    ...values,
  });
}

/** `rxrl tinker` over the model directory on `port` (0: a free one), its states in `stateDir`; resolves once it listens. */
async function startService(port: number, stateDir: string): Promise<{ child: ChildProcess; url: string; port: number }> {
  const child = spawn(
    process.execPath,
    [
      cli,
      'tinker',
      '--model',
      modelDir,
      '--served-model-name',
      'tiny',
      '--port',
      String(port),
      '--state-dir',
      stateDir,
      '--backend',
      'cpu',
    ],
    {
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let stderr = '';
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve, reject) => {
    let out = '';
    child.stdout!.on('data', (d: Buffer) => {
      out += d.toString();
      const line = out.split('\n').find((l) => l.includes('"listening"'));
      if (line) {
        const url = (JSON.parse(line) as { url: string }).url;
        resolve({ child, url, port: Number(new URL(url).port) });
      }
    });
    child.on('exit', (code) => reject(new Error(`rxrl tinker exited ${code}: ${stderr}`)));
  });
}

function kill(child: ChildProcess): Promise<void> {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    child.once('exit', () => resolve());
    child.kill('SIGKILL');
  });
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  // The run's own tokenizer (the bundled task's characters), and a base model of the recipe's shape over it.
  tokenizer = (await loadRollout(tinyRun('/unused', 1), root)).tokenizer;
  base = PolicyModel.create({ vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 }, 7);
  modelDir = join(await mkdtemp(join(tmpdir(), 'rxrl-tinker-model-')), 'tiny');
  await saveModelDir(modelDir, base, { tokenizerFiles: tokenizer.files(), special: specialIdsOf(tokenizer) });
});

afterAll(() => base?.dispose());

describe('a run trained on a Tinker-API service (trainer.backend: tinker)', () => {
  let service: TinkerService;
  afterAll(async () => service?.close());

  it.each([
    { mode: 'sync', sync: { mode: 'sync', batchSize: 2 } },
    { mode: 'batch-async', sync: { mode: 'batch-async', batchSize: 2, stalenessThreshold: 1 } },
    { mode: 'fully-async', sync: { mode: 'fully-async', batchSize: 2, capacity: 4 } },
  ])(
    'trains in $mode, checkpoints the service state, and resumes from it',
    async ({ mode, sync }) => {
      service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny' });
      const dir = await mkdtemp(join(tmpdir(), `rxrl-tinker-run-${mode}-`));
      const runDir = join(dir, 'run');
      const first = await runTraining(recipe(dir, 3, service.url, { sync }));
      expect(first.steps).toBe(3);
      expect(first.failedSamples).toBe(0);
      const lines = trainedLines(runDir);
      expect(lines.map((l) => l.version)).toEqual([1, 2, 3]);
      // The version rules are the embedded ones: sync trains on the newest version, batch-async within η = 1.
      const bound = mode === 'sync' ? 0 : mode === 'batch-async' ? 1 : Infinity;
      for (const line of lines) for (const v of line.policyVersions) expect(line.step - v).toBeLessThanOrEqual(bound);
      // A checkpoint records where the service keeps the state: no weights are written here.
      const checkpoint = join(runDir, 'global_step_3');
      expect(readdirSync(checkpoint).sort()).toEqual(['buffered.jsonl', 'state.json', 'tinker.json']);
      const state = JSON.parse(readFileSync(join(checkpoint, 'tinker.json'), 'utf8')) as { path: string; baseModel: string; rank: number };
      expect(state).toMatchObject({ baseModel: 'tiny', rank: 2 });
      expect(state.path).toMatch(/^tinker:\/\/.+\/weights\/step-3$/);

      // Resume: the training client is made from the saved state; the step counter and the loader go on.
      const resumed = await runTraining(recipe(dir, 5, service.url, { sync }));
      expect(resumed.resumedFrom).toBe(checkpoint);
      expect(resumed.steps).toBe(5);
      const all = trainedLines(runDir);
      expect(all.map((l) => l.version)).toEqual([1, 2, 3, 4, 5]);
      const trajectories = all.flatMap((l) => l.trajectoryIds);
      expect(new Set(trajectories).size).toBe(trajectories.length);
      await service.close();
    },
    120_000,
  );

  it("trains trainer.algorithm 'sft' on a JSONL dataset with the service's cross_entropy loss, which goes down", async () => {
    service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny' });
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-sft-'));
    // Four reference outputs, no evaluator (they are not scored), one epoch a step.
    const rows = ['ab', 'ba', 'abc', 'cab'].map((p, i) => ({ id: i, prompt: p, response: [...p].reverse().join('') }));
    await writeFile(join(dir, 'train.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
    const summary = await runTraining(
      recipe(dir, 8, service.url, {
        data: { source: 'jsonl', trainFile: join(dir, 'train.jsonl'), alphabet: 'abc', epochs: 0 },
        rollout: { groupSize: 1, maxTokens: 4 },
        trainer: { backend: 'tinker', algorithm: 'sft', learningRate: 0.05 },
        sync: { batchSize: 4 },
      }),
    );
    expect(summary.steps).toBe(8);
    const sft = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
      .split('\n')
      .filter((line) => line.includes('actor/sft_loss'))
      .map((line) => (JSON.parse(line) as Record<string, number>)['actor/sft_loss']);
    expect(sft).toHaveLength(8);
    expect(losses(join(dir, 'run'))).toEqual([]);
    // The same four rows every step: their loss falls step after step.
    for (let i = 1; i < sft.length; i++) expect(sft[i]).toBeLessThan(sft[i - 1]);
    await service.close();
  }, 60_000);

  it('runs from the CLI: rxrl run with the service from TINKER_BASE_URL and its key from TINKER_API_KEY', async () => {
    service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', apiKey: 'tml-secret' });
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-cli-'));
    const file = join(dir, 'recipe.json');
    const values = {
      run: { dir: join(dir, 'run'), seed: 3, steps: 2, backend: 'cpu' },
      data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
      rollout: { groupSize: 2 },
      sync: { batchSize: 2 },
      trainer: { backend: 'tinker' },
      tinker: { baseModel: 'tiny', rank: 2 },
    };
    await writeFile(file, JSON.stringify(values));
    const env = { ...process.env, TINKER_BASE_URL: service.url, TINKER_API_KEY: 'tml-secret', RXRL_LOG_LEVEL: 'silent' };
    const { stdout } = await execFileAsync(process.execPath, [cli, 'run', file], { env, timeout: 60_000 });
    expect(JSON.parse(stdout.trim().split('\n').at(-1) ?? '')).toMatchObject({ steps: 2, failedSamples: 0 });
    // A wrong key is the service's 401: a typed error, exit code 1.
    const refused = await execFileAsync(process.execPath, [cli, 'run', file, '--set', 'resume.mode=disable'], {
      env: { ...env, TINKER_API_KEY: 'tml-wrong' },
      timeout: 60_000,
    }).catch((e: unknown) => e);
    expect((refused as { code?: number }).code).toBe(1);
    expect(String((refused as { stderr?: string }).stderr)).toMatch(/TinkerError.*401/);
    await service.close();
  }, 120_000);

  it('refuses what it cannot do with typed errors naming the key', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-refuse-'));
    expect(() => tinyRun(join(dir, 'run'), 1, { trainer: { backend: 'tinker', klLoss: { coef: 0.1 } } })).toThrow(
      /tinker\.baseUrl: required[\s\S]*tinker\.baseModel: required[\s\S]*trainer\.klLoss\.coef: must be 0/,
    );
    // A local run's checkpoint cannot resume a Tinker-backed one.
    await runTraining(tinyRun(join(dir, 'run'), 1));
    service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny' });
    await expect(runTraining(recipe(dir, 2, service.url))).rejects.toThrow(/holds local weights, not a state on a Tinker service/);
    // Nor the other way round.
    const other = await mkdtemp(join(tmpdir(), 'rxrl-tinker-refuse-'));
    await runTraining(recipe(other, 1, service.url));
    await expect(runTraining(tinyRun(join(other, 'run'), 2))).rejects.toThrow(/holds a state on a Tinker service/);
    // A base the service does not hold is refused by the service: a typed error.
    const wrong = await runTraining(
      recipe(await mkdtemp(join(tmpdir(), 'rxrl-tinker-refuse-')), 1, service.url, {
        tinker: { baseUrl: service.url, baseModel: 'other' },
      }),
    ).catch((e: unknown) => e);
    expect(wrong).toBeInstanceOf(RxrlError);
    expect(String(wrong)).toMatch(/trains 'tiny', not 'other'/);
    await service.close();
  }, 60_000);
});

describe('the Tinker service killed mid-run (rxrl tinker, SIGKILL)', () => {
  const steps = 5;
  const killAfter = 2;

  it('stop_on_error: the run fails with a typed error; the last checkpoint stays', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-kill-'));
    const svc = await startService(0, join(dir, 'states'));
    try {
      const config = recipe(dir, steps, svc.url, {
        run: { dir: join(dir, 'run'), seed: 3, steps, backend: 'cpu', errorPolicy: 'stop_on_error' },
      });
      const error = await runTraining(config, {
        onStep: (step) => {
          if (step.version === killAfter) void kill(svc.child);
        },
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RxrlError);
      expect((error as Error).name).toMatch(/^(EngineError|RetriesExhaustedError|TinkerError)$/);
      expect((error as Error).message).toMatch(/Tinker service|HTTP/);
      expect(trainedLines(join(dir, 'run')).map((l) => l.version)).toEqual([1, 2]);
      expect(existsSync(join(dir, 'run', 'global_step_2', 'tinker.json'))).toBe(true);
    } finally {
      await kill(svc.child);
    }
  }, 120_000);

  it('continue: a service that does not come back within tinker.recoverTimeoutMs ends the run with a TinkerError naming the key', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-gone-'));
    const svc = await startService(0, join(dir, 'states'));
    try {
      const config = recipe(dir, steps, svc.url, {
        run: { dir: join(dir, 'run'), seed: 3, steps, backend: 'cpu', errorPolicy: 'continue' },
        tinker: { baseUrl: svc.url, baseModel: 'tiny', rank: 2, recoverTimeoutMs: 300 },
      });
      const log: string[] = [];
      const error = await runTraining(config, {
        log: (line) => log.push(line),
        onStep: (step) => {
          if (step.version === killAfter) void kill(svc.child);
        },
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RxrlError);
      expect((error as Error).name).toBe('TinkerError');
      expect((error as RxrlError).context).toEqual({ key: 'tinker.recoverTimeoutMs' });
      expect((error as Error).cause).toBeInstanceOf(RxrlError); // what lost the service
      expect(log.some((line) => /tinker service lost/.test(line))).toBe(true);
      expect(trainedLines(join(dir, 'run')).map((l) => l.version)).toEqual([1, 2]);
    } finally {
      await kill(svc.child);
    }
  }, 120_000);

  it('continue: the run waits for the restarted service and trains exactly what an uninterrupted run trains', async () => {
    // The uninterrupted run, on a service of its own.
    const reference = await mkdtemp(join(tmpdir(), 'rxrl-tinker-ref-'));
    const refService = await startService(0, join(reference, 'states'));
    try {
      await runTraining(
        recipe(reference, steps, refService.url, {
          run: { dir: join(reference, 'run'), seed: 3, steps, backend: 'cpu', errorPolicy: 'continue' },
        }),
      );
    } finally {
      await kill(refService.child);
    }

    const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-kill-'));
    const states = join(dir, 'states');
    let svc = await startService(0, states);
    const port = svc.port;
    const log: string[] = [];
    let restarted: Promise<void> | undefined;
    try {
      const config = recipe(dir, steps, svc.url, {
        run: { dir: join(dir, 'run'), seed: 3, steps, backend: 'cpu', errorPolicy: 'continue' },
      });
      const summary = await runTraining(config, {
        log: (line) => log.push(line),
        onStep: (step) => {
          if (step.version !== killAfter || restarted) return;
          // Killed after its second step; a new process on the same port and state directory a second later.
          restarted = kill(svc.child)
            .then(() => new Promise((resolve) => setTimeout(resolve, 1_000)))
            .then(async () => {
              svc = await startService(port, states);
            });
        },
      });
      expect(summary.steps).toBe(steps);
      expect(summary.recoveries).toBe(1);
      expect(log.some((line) => /tinker service lost .* restarting from .*global_step_2/.test(line))).toBe(true);
      // Each step once, the same tasks and trajectories as the uninterrupted run, and the same losses: the restarted
      // service's client was made from the step-2 state (adapter and Adam) and nothing was trained twice.
      const lines = trainedLines(join(dir, 'run'));
      const expected = trainedLines(join(reference, 'run'));
      expect(lines.map((l) => l.version)).toEqual([1, 2, 3, 4, 5]);
      expect(lines.map((l) => [l.taskIds, l.trajectoryIds, l.policyVersions])).toEqual(
        expected.map((l) => [l.taskIds, l.trajectoryIds, l.policyVersions]),
      );
      const mine = losses(join(dir, 'run'));
      const theirs = losses(join(reference, 'run'));
      expect(mine).toHaveLength(steps);
      mine.forEach((loss, i) => expect(loss).toBeCloseTo(theirs[i], 5));
      // The final adapter and Adam moments equal the uninterrupted run's: the step-2 state was restored whole.
      const final = await savedState(join(dir, 'run'), steps, states);
      const expectedFinal = await savedState(join(reference, 'run'), steps, join(reference, 'states'));
      expect([...final.keys()].sort()).toEqual([...expectedFinal.keys()].sort());
      expect(final.get('step')?.[0]).toBe(steps);
      for (const [key, values] of final) {
        const other = expectedFinal.get(key) as Float32Array;
        let worst = 0;
        values.forEach((v, i) => (worst = Math.max(worst, Math.abs(v - other[i]))));
        expect(worst, key).toBeLessThan(1e-5);
      }
    } finally {
      await restarted?.catch(() => undefined);
      await kill(svc.child);
    }
  }, 180_000);
});
