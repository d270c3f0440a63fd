/**
 * GRPO on SkyRL's Tinker server sharded over two JAX processes (`jax.distributed`: the engine is process 0 and a
 * `skyrl.backends.jax` worker process 1, fully-sharded data parallel of size 2), as it would span two GPUs or hosts:
 * rxrl's pipeline with the Tinker trainer and engine, the weights change, every metric is finite.
 *
 * One training client for the whole file, on purpose: SkyRL 0.4.0's sharded backend does not pass `delete_model`
 * on to its workers, so once a client is unloaded (as rxrl does on close, or as the server does to silent sessions)
 * the next client's adapter slot differs between the processes and its first pass fails ("… passed to device_put is
 * not the same on each process"). The one-process server has no such limit (spec/skyrl/engine.spec.ts).
 */
import { readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { lastValueFrom, toArray } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { TinkerClient, TinkerClientTrainer, TinkerEngine } from '../../lib/tinker/client.js';
import { grpoPipeline } from '../../pipelines/grpoPipeline.js';
import { letterShareEvaluator } from '../../recipes/letters.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { startSkyrl, type SkyrlServer } from '../helpers/skyrl.js';
import { lacks } from '../helpers/testSetup.js';
import { largestChange, logprobsOf } from './skyrlRuns.js';

describe.skipIf(lacks('skyrl'))("GRPO on SkyRL's Tinker server sharded over two JAX processes", () => {
  let server: SkyrlServer;

  beforeAll(async () => {
    server = await startSkyrl(join(await mkdtemp(join(tmpdir(), 'rxrl-skyrl-sharded-')), 'server'), 2);
  }, 600_000);

  afterAll(async () => server?.stop());

  it('trains on both processes: every metric finite, the weights changed', async () => {
    const tokenizer = await loadTokenizer(server.baseModel);
    const task = stringTransformTask({ transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2, seed: 1 });
    const client = await TinkerClient.connect({ baseURL: server.url, apiKey: 'tml-unused', futureTimeoutMs: 600_000 });
    try {
      const trainer = await TinkerClientTrainer.create(client, server.baseModel, 4, { learningRate: 0.05, seed: 3 });
      const before = await logprobsOf(client, trainer.modelId);
      const steps = await lastValueFrom(
        grpoPipeline({
          tasks: task.train,
          loader: { epochs: Infinity, shuffle: true, seed: 2 },
          engines: [new TinkerEngine(trainer, tokenizer)],
          trainer,
          evaluator: letterShareEvaluator,
          mode: 'sync',
          batchSize: 2,
          groupSize: 4,
          maxTokens: 4,
          steps: 2,
          seed: 3,
        }).pipe(toArray()),
      );
      expect(steps.map((s) => s.version)).toEqual([1, 2]);
      for (const step of steps) {
        expect(step.skipped).toBe(false);
        for (const [key, value] of Object.entries(step.metrics))
          expect({ key, finite: Number.isFinite(value) }).toEqual({ key, finite: true });
        expect(step.metrics['actor/grad_norm']).toBeGreaterThanOrEqual(0);
      }
      // A step whose groups all had equal rewards has no gradient; not every step can be like that.
      expect(steps.some((s) => s.metrics['actor/grad_norm'] > 0)).toBe(true);
      expect(largestChange(before, await logprobsOf(client, trainer.modelId))).toBeGreaterThan(1e-4);
    } finally {
      await client.close();
    }
    // The worker joined the engine's JAX cluster and took its share of the model.
    expect(readFileSync(join(server.dir, 'worker.log'), 'utf8')).toMatch(/Worker process_id=1 \(2 total\)/);
  }, 900_000);
});
