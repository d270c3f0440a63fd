/**
 * What the SkyRL specs share: the recipe of a run trained on a SkyRL server, and the checks that it trained there —
 * every logged metric finite, and the adapter the service saved at two steps giving different log-probs.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'vitest';

import { loadConfig, type RxrlConfig } from '../../lib/config/schema.js';
import { TinkerClient } from '../../lib/tinker/client.js';
import type { WireDatum } from '../../lib/tinker/proto.js';
import { jsonLines } from '../helpers/runDir.js';
import type { SkyrlServer } from '../helpers/skyrl.js';

/** recipes/letters.ts: rewards that differ between an untrained model's samples, so every GRPO step has a gradient. */
const LETTER_SHARE = { module: fileURLToPath(new URL('../../recipes/letters.ts', import.meta.url)), export: 'letterShareEvaluator' };

/** The bundled reverse task on the float32 Qwen3 fixture, trained on `server` for `steps` steps, LoRA rank 4. */
export function skyrlRun(server: SkyrlServer, runDir: string, steps: number, values: Record<string, unknown> = {}): RxrlConfig {
  return loadConfig({
    env: {},
    values: {
      run: { dir: runDir, seed: 3, steps, backend: 'cpu' },
      data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
      model: { path: server.baseModel },
      rollout: { groupSize: 4, maxTokens: 4, evaluator: LETTER_SHARE },
      sync: { mode: 'sync', batchSize: 2 },
      trainer: { backend: 'tinker', learningRate: 0.05 },
      tinker: { baseUrl: server.url, baseModel: server.baseModel, rank: 4, futureTimeoutMs: 600_000 },
      checkpoint: { every: 1, keepLast: 0 },
      resume: { mode: 'auto' },
      validation: { beforeTrain: false },
      ...values,
    },
  });
}

/** Every metric the run logged (`metrics.jsonl`) is a finite number: a `null` is a NaN or an infinity written out. */
export function expectFiniteMetrics(runDir: string): Record<string, unknown>[] {
  const lines = jsonLines<Record<string, unknown>>(join(runDir, 'metrics.jsonl'));
  expect(lines.length).toBeGreaterThan(0);
  for (const line of lines)
    for (const [key, value] of Object.entries(line)) {
      if (typeof value === 'string' || typeof value === 'boolean') continue;
      expect({ key, value, finite: typeof value === 'number' && Number.isFinite(value) }).toMatchObject({ finite: true });
    }
  return lines;
}

/** The `tinker://` path of the state the run's checkpoint of `step` names. */
export function savedStatePath(runDir: string, step: number): string {
  return (JSON.parse(readFileSync(join(runDir, `global_step_${step}`, 'tinker.json'), 'utf8')) as { path: string }).path;
}

/** A fixed sequence of the fixture's vocabulary, as one `cross_entropy` datum of weight 0 (no gradient). */
function probe(): WireDatum {
  const ids = [11, 42, 7, 99, 5, 63, 17, 28, 150, 3];
  const n = ids.length - 1;
  return {
    tokens: ids.slice(0, n),
    lossFnInputs: {
      target_tokens: { dtype: 'int64', data: ids.slice(1), shape: [n] },
      weights: { dtype: 'float32', data: new Float32Array(n), shape: [n] },
    },
  };
}

/**
 * The log-probs of a fixed sequence under each saved state (a training client made from it, `forward` only), from
 * the server itself: states of different steps that give different log-probs were trained on the server.
 */
export async function logprobsOfStates(server: SkyrlServer, paths: readonly string[], rank = 4): Promise<Float32Array[]> {
  const client = await TinkerClient.connect({ baseURL: server.url, apiKey: 'tml-unused', futureTimeoutMs: 600_000 });
  try {
    const out: Float32Array[] = [];
    for (const path of paths) {
      const model = await client.createModelFromState(path, false, server.baseModel, rank);
      out.push(await logprobsOf(client, model));
      await client.unloadModel(model);
    }
    return out;
  } finally {
    await client.close();
  }
}

/** The log-probs of the fixed sequence under the training client `model` as it is now (weight 0: nothing is trained). */
export async function logprobsOf(client: TinkerClient, model: string): Promise<Float32Array> {
  return (await client.forwardBackward(model, [probe()], 'cross_entropy', {})).outputs[0].logprobs;
}

/** The largest difference of two log-prob vectors. */
export function largestChange(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  return Math.max(...Array.from(a, (v, i) => Math.abs(v - b[i])));
}
