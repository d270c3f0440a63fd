/**
 * Issue 53, rows 5 and 8, for multi-agent runs (the parts `runTraining` has, through the same `SkippedSteps`): under
 * `stop_on_error` a step of no rows fails the run, and so does a policy whose every update was skipped. Before, a
 * multi-agent run of such steps ended as if it had trained, and saved its policies.
 */
import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { StepFailedError } from '../../lib/core/errors.js';
import { runAgents } from '../../pipelines/agents.js';

const roles = [
  { name: 'writer', policy: 'writer' },
  { name: 'editor', policy: 'editor' },
];

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-agents-skipped-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A tiny two-policy writer-editor run in `runDir` (one-layer model, cpu backend), with `values` merged in. */
function recipe(runDir: string, errorPolicy: string, values: Record<string, unknown> = {}): ReturnType<typeof loadConfig> {
  return loadConfig({
    env: {},
    values: {
      run: { dir: runDir, seed: 1, steps: 2, backend: 'cpu', errorPolicy },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32 },
      sync: { mode: 'sync', batchSize: 2 },
      rollout: { groupSize: 2 },
      data: { task: { validationSize: 2 } },
      checkpoint: { every: 0, onStop: false },
      resume: { mode: 'disable' },
      validation: { beforeTrain: false },
      agents: { environment: 'writer-editor', roles },
      policies: roles.map((r) => ({ name: r.policy, specialization: 'full' })),
      ...values,
    },
  });
}

/** What a run left in `runDir`: its saved policies. */
async function savedPolicies(runDir: string): Promise<string[]> {
  return readdir(join(runDir, 'policies')).catch(() => []);
}

describe('a multi-agent run whose steps trained nothing, under stop_on_error', () => {
  it('fails with a StepFailedError naming the policy whose every update was skipped; under continue it ends', async () => {
    // An entropy coefficient past float32 (1e39 is +∞ there) makes every loss non-finite: each update is skipped.
    const values = { trainer: { entropyCoef: 1e39 } };
    const skipped: string[] = [];
    const runDir = join(dir, 'nonfinite');
    const error = await runAgents(recipe(runDir, 'stop_on_error', values), {
      onStep: (step) => skipped.push(`${step.modelTag}:${step.step}:${step.skipped}`),
    }).catch((e: unknown) => e);
    expect(skipped.sort()).toEqual(['editor:0:true', 'editor:1:true', 'writer:0:true', 'writer:1:true']);
    expect(error).toBeInstanceOf(StepFailedError);
    expect((error as StepFailedError).context).toEqual({ steps: 2, skipped: 2, modelTag: 'writer' });
    expect((error as StepFailedError).message).toMatch(/^all 2 steps of policy 'writer' skipped their update/);
    // Nothing trained, nothing saved.
    expect(await savedPolicies(runDir)).toEqual([]);
    const summary = await runAgents(recipe(join(dir, 'nonfinite-continue'), 'continue', values));
    expect(summary.policies.map((p) => p.steps)).toEqual([2, 2]);
  }, 120_000);

  it('fails with a StepFailedError at a step of no rows (every episode timed out), before that step is taken', async () => {
    // An episode may run 1 ms: each fails, and every policy's first batch has no rows, none of them filtered out.
    const steps: string[] = [];
    const runDir = join(dir, 'empty');
    const error = await runAgents(recipe(runDir, 'stop_on_error', { rollout: { groupSize: 2, sampleTimeoutMs: 1 } }), {
      onStep: (step) => steps.push(`${step.modelTag}:${step.step}`),
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(StepFailedError);
    expect((error as StepFailedError).context).toEqual({ step: 0, rows: 0 });
    expect(steps).toEqual([]);
    expect(await savedPolicies(runDir)).toEqual([]);
  }, 120_000);
});
