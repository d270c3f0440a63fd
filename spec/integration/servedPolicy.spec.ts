/**
 * A policy rolling out on a separate OpenAI-compatible server (`openai.baseUrl`): a `rxrl serve` process of the base
 * model. A LoRA policy's every version goes to it as a PEFT adapter through vLLM's `POST /v1/load_lora_adapter`
 * (`<policy>-v<version>`); rollouts name that adapter, and older versions are unloaded — in sync and batch-async, and
 * across a run killed with SIGKILL that resumes from its checkpoint. A full policy's go through the weight update.
 */
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { spawnServe, type SpawnedServer } from '../../lib/serve/spawn.js';
import { runTraining } from '../../pipelines/run.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

let server: SpawnedServer;
beforeAll(async () => {
  server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', fixture, '--served-model-name', 'base'], {
    cliPath: cli,
    stderr: 'ignore',
  });
}, 60_000);
afterAll(async () => {
  await server?.close();
});

/** The LoRA recipe on the tiny fixture, rolling out on the server. */
function recipe(dir: string, steps: number, sync: Record<string, unknown>, name: string): Record<string, unknown> {
  return {
    model: { path: fixture },
    data: { source: 'arithmetic', arithmetic: { operators: '+*', maxOperand: 12, validationSize: 4 } },
    rollout: { chatTemplate: 'model', groupSize: 2, maxTokens: 6 },
    policies: [{ name, specialization: 'lora', lora: { rank: 2, alpha: 4, targetModules: ['q_proj', 'v_proj'] } }],
    sync: { batchSize: 2, ...sync },
    trainer: { learningRate: 0.01 },
    openai: { baseUrl: server.baseURL, model: 'base' },
    run: { dir, steps, backend: 'cpu', seed: 1 },
    checkpoint: { every: 1, keepLast: 0 },
    validation: { beforeTrain: false, every: 0 },
  };
}

async function servedModels(): Promise<string[]> {
  return (await new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' }).models.list()).data.map((m) => m.id).sort();
}

function trained(dir: string): { step: number; policyVersions: number[] }[] {
  return readFileSync(join(dir, 'trained.jsonl'), 'utf8')
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { step: number; policyVersions: number[] });
}

describe('a LoRA policy on an OpenAI-compatible server (openai.baseUrl, load_lora_adapter)', () => {
  it.each([
    { mode: 'sync', eta: 0, sync: { mode: 'sync' }, name: 'adder' },
    { mode: 'batch-async', eta: 1, sync: { mode: 'batch-async', stalenessThreshold: 1 }, name: 'async' },
  ])(
    '$mode: each step samples from the adapter of an admissible version; only the last two stay loaded',
    async ({ eta, sync, name }) => {
      const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-served-lora-')), 'run');
      const versions: number[][] = [];
      const config = loadConfig({ env: {}, values: recipe(dir, 5, sync, name) });
      const summary = await runTraining(config, { log: () => undefined, onStep: (step) => versions.push([step.step]) });
      expect(summary.steps).toBe(5);
      expect(summary.failedSamples).toBe(0);
      // Every sample came from the adapter it asked for (the engine refuses another model's answer), whose version
      // is within the mode's bound of the step that trained it.
      const lines = trained(dir);
      expect(lines.map((l) => l.step)).toEqual([0, 1, 2, 3, 4]);
      for (const line of lines) for (const v of line.policyVersions) expect(line.step - v).toBeGreaterThanOrEqual(0);
      for (const line of lines) for (const v of line.policyVersions) expect(line.step - v).toBeLessThanOrEqual(eta);
      if (eta === 0) expect(lines.map((l) => [...new Set(l.policyVersions)])).toEqual([[0], [1], [2], [3], [4]]);
      // Versions 0..5 were loaded as <policy>-v0..v5; the server keeps the last two, the others are gone.
      expect((await servedModels()).filter((m) => m.startsWith(`${name}-`))).toEqual([`${name}-v4`, `${name}-v5`]);
      expect(existsSync(join(dir, 'served', 'v3'))).toBe(false);
      expect(existsSync(join(dir, 'served', 'v5', 'adapter_config.json'))).toBe(true);
    },
    120_000,
  );

  it('kill -9 mid-run, then the same command resumes from its checkpoint and loads that version first', async () => {
    const work = await mkdtemp(join(tmpdir(), 'rxrl-served-lora-kill-'));
    const dir = join(work, 'run');
    const file = join(work, 'recipe.json');
    await writeFile(file, JSON.stringify(recipe(dir, 6, { mode: 'sync' }, 'killed')));
    const env = { ...process.env, RXRL_LOG_LEVEL: 'silent' };
    const child = spawn(process.execPath, [cli, 'run', file], { env, stdio: 'ignore' });
    // SIGKILL once two checkpoints are written.
    await new Promise<void>((resolve, reject) => {
      const timer = setInterval(() => {
        if (existsSync(join(dir, 'global_step_2', 'state.json'))) {
          clearInterval(timer);
          child.kill('SIGKILL');
          resolve();
        }
      }, 50);
      child.once('exit', (code) => {
        clearInterval(timer);
        if (code !== null) reject(new Error(`rxrl run ended by itself (${code}) before it was killed`));
      });
    });
    await new Promise((resolve) => child.once('exit', resolve));
    const resumed = await new Promise<string>((resolve, reject) => {
      let out = '';
      const again = spawn(process.execPath, [cli, 'run', file], { env, stdio: ['ignore', 'pipe', 'ignore'] });
      again.stdout.on('data', (d: Buffer) => (out += d.toString()));
      again.once('exit', (code) => (code === 0 ? resolve(out) : reject(new Error(`resumed run exited ${code}`))));
    });
    expect(JSON.parse(resumed.trim().split('\n').at(-1) ?? '{}')).toMatchObject({ steps: 6, failedSamples: 0 });
    const steps = trained(dir).map((l) => l.step);
    // Steps after the last checkpoint were trained again by the resumed run; each step's last line is its own.
    expect([...new Set(steps)]).toEqual([0, 1, 2, 3, 4, 5]);
    const models = await servedModels();
    expect(models.filter((m) => m.startsWith('killed-'))).toEqual(['killed-v5', 'killed-v6']);
  }, 180_000);

  it('a full policy publishes each version as a model directory through the weight-update endpoint (last: it changes the base)', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-served-full-')), 'run');
    const values = { ...recipe(dir, 3, { mode: 'sync' }, 'unused'), policies: [] };
    const summary = await runTraining(loadConfig({ env: {}, values }), { log: () => undefined });
    expect(summary.steps).toBe(3);
    expect(trained(dir).map((l) => [...new Set(l.policyVersions)])).toEqual([[0], [1], [2]]);
    expect(existsSync(join(dir, 'served', 'v3', 'model.safetensors'))).toBe(true);
  }, 120_000);
});
