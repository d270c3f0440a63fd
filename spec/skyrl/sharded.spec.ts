/**
 * A run trained on SkyRL's Tinker server sharded over two JAX processes (`jax.distributed`: the engine is process
 * 0 and a `skyrl.backends.jax` worker process 1, fully-sharded data parallel of size 2), as it would span two GPUs
 * or hosts: the run is the same, the weights change, every metric is finite.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { runTraining } from '../../pipelines/run.js';
import { trainedLines } from '../helpers/runDir.js';
import { startSkyrl, type SkyrlServer } from '../helpers/skyrl.js';
import { lacks } from '../helpers/testSetup.js';
import { expectFiniteMetrics, largestChange, logprobsOfStates, savedStatePath, skyrlRun } from './skyrlRuns.js';

describe.skipIf(lacks('skyrl'))("a run on SkyRL's Tinker server sharded over two JAX processes", () => {
  let server: SkyrlServer;
  let dir: string;

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rxrl-skyrl-sharded-'));
    server = await startSkyrl(join(dir, 'server'), 2);
  }, 600_000);

  afterAll(async () => server?.stop());

  it('GRPO in sync trains on both processes: every metric finite, the saved states differ', async () => {
    const runDir = join(dir, 'run');
    const summary = await runTraining(skyrlRun(server, runDir, 2));
    expect(summary.steps).toBe(2);
    expect(trainedLines(runDir).map((l) => l.version)).toEqual([1, 2]);
    expectFiniteMetrics(runDir);
    const [one, two] = await logprobsOfStates(
      server,
      [1, 2].map((s) => savedStatePath(runDir, s)),
    );
    expect(largestChange(one, two)).toBeGreaterThan(1e-4);
    // The worker joined the engine's JAX cluster and took its share of the model.
    expect(readFileSync(join(server.dir, 'worker.log'), 'utf8')).toMatch(/Worker process_id=1 \(2 total\)/);
  }, 900_000);
});
