/**
 * Runs trained on SkyRL's Tinker server (PyPI `skyrl` 0.4.0, JAX on this CPU), the real one, which `npm test`'s
 * setup installs: GRPO in sync and fully-async, SFT, a resume from a checkpoint, runs back to back. Each checks
 * that every metric the run logged is finite and that the server's weights changed (two saved states of the run
 * give different log-probs of a fixed sequence on the server).
 *
 * Where this server differs from the API as rxrl's own service speaks it, rxrl's client behaves as the SDK does:
 * int32 sampling seeds (it refuses larger ones), no `loss:sum` metric (the loss is summed from `elementwise_loss`),
 * its own grad-norm key, `load_weights` only into a client made first (a resume), no `sessions/{id}/finish` (each
 * client is unloaded on close, or the next run finds no adapter slot), settings it drops (said at start).
 */
import { readFileSync } from 'node:fs';
import { mkdtemp, readdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { AbortError } from '../../lib/core/errors.js';
import { TinkerClient } from '../../lib/tinker/client.js';
import { runTraining } from '../../pipelines/run.js';
import { trainedLines } from '../helpers/runDir.js';
import { startSkyrl, type SkyrlServer } from '../helpers/skyrl.js';
import { lacks } from '../helpers/testSetup.js';
import { expectFiniteMetrics, largestChange, logprobsOfStates, savedStatePath, skyrlRun } from './skyrlRuns.js';

/** Adapter slots of the server: fewer than this file's runs make, so runs that did not free theirs would fill it. */
const ADAPTER_SLOTS = 3;

describe.skipIf(lacks('skyrl'))("runs trained on SkyRL's Tinker server (JAX, one process)", () => {
  let server: SkyrlServer;
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rxrl-skyrl-'));
    server = await startSkyrl(join(dir, 'server'), 1, { max_lora_adapters: ADAPTER_SLOTS });
  }, 600_000);

  afterAll(async () => server?.stop());

  it('GRPO in sync: trains, every metric finite, the saved states differ; a resume goes on from the last checkpoint', async () => {
    const runDir = join(dir, 'sync');
    const lines: string[] = [];
    const first = await runTraining(skyrlRun(server, runDir, 2), { log: (line) => lines.push(line) });
    expect(first.steps).toBe(2);
    expect(first.failedSamples).toBe(0);
    // SkyRL drops adam_params.grad_clip_norm: the run says so once, and the checkpoint records it.
    expect(lines.filter((l) => l.includes('does not take'))).toHaveLength(1);
    expect(lines.find((l) => l.includes('does not take'))).toContain('trainer.maxGradNorm');
    const recorded = JSON.parse(readFileSync(join(runDir, 'global_step_2', 'tinker.json'), 'utf8')) as { metadata: Record<string, string> };
    expect(recorded.metadata['rxrl.tinker.unhonoured']).toContain('trainer.maxGradNorm');

    const resumed = await runTraining(skyrlRun(server, runDir, 4));
    expect(resumed.resumedFrom).toBe(join(runDir, 'global_step_2'));
    expect(trainedLines(runDir).map((l) => l.version)).toEqual([1, 2, 3, 4]);
    const metrics = expectFiniteMetrics(runDir);
    // Losses and grad norms are the server's, read where it reports them: never missing, no step marked skipped.
    const trained = metrics.filter((m) => 'actor/pg_loss' in m);
    expect(trained).toHaveLength(4);
    for (const m of trained) expect(m['actor/grad_norm']).toBeGreaterThanOrEqual(0);
    expect(trained.some((m) => (m['actor/grad_norm'] as number) > 0)).toBe(true);

    const [one, two, four] = await logprobsOfStates(
      server,
      [1, 2, 4].map((s) => savedStatePath(runDir, s)),
    );
    expect(largestChange(one, two)).toBeGreaterThan(1e-4);
    expect(largestChange(two, four)).toBeGreaterThan(1e-4);
  }, 900_000);

  it('GRPO in fully-async: trains within the capacity, every metric finite, the saved states differ', async () => {
    const runDir = join(dir, 'fully-async');
    const summary = await runTraining(skyrlRun(server, runDir, 3, { sync: { mode: 'fully-async', batchSize: 2, capacity: 4 } }));
    expect(summary.steps).toBe(3);
    expect(trainedLines(runDir).map((l) => l.version)).toEqual([1, 2, 3]);
    expectFiniteMetrics(runDir);
    const [one, three] = await logprobsOfStates(
      server,
      [1, 3].map((s) => savedStatePath(runDir, s)),
    );
    expect(largestChange(one, three)).toBeGreaterThan(1e-4);
  }, 900_000);

  it("SFT on a JSONL dataset with the server's cross_entropy: the loss of the same rows falls", async () => {
    const runDir = join(dir, 'sft');
    const rows = ['ab', 'ba', 'abc', 'cab'].map((p, i) => ({ id: i, prompt: p, response: [...p].reverse().join('') }));
    await writeFile(join(dir, 'train.jsonl'), rows.map((r) => JSON.stringify(r)).join('\n'));
    const summary = await runTraining(
      skyrlRun(server, runDir, 4, {
        data: { source: 'jsonl', trainFile: join(dir, 'train.jsonl'), epochs: 0 },
        rollout: { groupSize: 1, maxTokens: 4, evaluator: { module: null } },
        trainer: { backend: 'tinker', algorithm: 'sft', learningRate: 0.05 },
        sync: { batchSize: 4 },
      }),
    );
    expect(summary.steps).toBe(4);
    const sft = expectFiniteMetrics(runDir)
      .map((m) => m['actor/sft_loss'])
      .filter((v): v is number => typeof v === 'number');
    expect(sft).toHaveLength(4);
    expect(sft[3]).toBeLessThan(sft[0]);
  }, 900_000);

  it('a step whose samples all failed sends the server nothing (no empty forward_backward, which it never finishes)', async () => {
    const runDir = join(dir, 'all-failed');
    const values = { run: { dir: runDir, seed: 3, steps: 2, backend: 'cpu', errorPolicy: 'continue' } };
    // A judge that is down: every sample of every group fails.
    const down = join(dir, 'down.mjs');
    await writeFile(down, "export default { evaluate: () => { throw new Error('judge down'); } };\n");
    const config = skyrlRun(server, runDir, 2, values);
    const summary = await runTraining({ ...config, rollout: { ...config.rollout, evaluator: { module: down, export: 'default' } } });
    expect(summary.steps).toBe(2);
    expect(summary.failedSamples).toBe(2 * 2 * 4);
    const steps = expectFiniteMetrics(runDir).filter((m) => 'actor/skipped_empty' in m);
    expect(steps.map((m) => m['actor/skipped_empty'])).toEqual([1, 1]);
  }, 900_000);

  it('polls a future as the SDK does: each poll given up after pollTimeoutMs and polled again; a stop ends the wait at once', async () => {
    const stop = new AbortController();
    const client = await TinkerClient.connect({ baseURL: server.url, apiKey: 'tml-unused', pollTimeoutMs: 50, signal: stop.signal });
    try {
      // Making a client takes the engine seconds: many polls, each abandoned, and the answer still arrives.
      const model = await client.createLoraModel(server.baseModel, 4, 1);
      const sampler = await client.samplerOf(model);
      const pending = client.sample(sampler, [11, 42, 7], 4, { maxTokens: 64, temperature: 1, topP: 1, seed: 2 ** 32 - 1, stop: [] });
      const reason = new Error('SIGTERM');
      setTimeout(() => stop.abort(reason), 20);
      // Ended by the stop: its reason (the request in flight) or an AbortError caused by it (the poll in flight).
      const error = await pending.then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error === reason || (error instanceof AbortError && error.cause === reason)).toBe(true);
    } finally {
      await client.close();
    }
  }, 900_000);

  it(`runs back to back: each frees its adapter, so more runs than the server's ${ADAPTER_SLOTS} slots all train`, async () => {
    for (let i = 0; i < ADAPTER_SLOTS + 1; i++) {
      const runDir = join(dir, `again-${i}`);
      const summary = await runTraining(skyrlRun(server, runDir, 1, { checkpoint: { every: 0 } }));
      expect(summary.steps).toBe(1);
      expectFiniteMetrics(runDir);
    }
    expect((await readdir(dir)).filter((d) => d.startsWith('again-'))).toHaveLength(ADAPTER_SLOTS + 1);
  }, 900_000);
});
