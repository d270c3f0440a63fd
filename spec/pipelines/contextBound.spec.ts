/**
 * Issue 53, row 4, on every path: a trajectory longer than the model's context is refused where its batch is made
 * (`collate`), whatever made it. The load-time check of reference outputs (`checkPrompts`) runs only where the run
 * knows how prompts are encoded; with a chat template (`rollout.chatTemplate: model`) it did not, and an SFT run
 * trained 600-token sequences on a 128-token model silently.
 */
import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ContextLengthError } from '../../lib/core/errors.js';
import { runTraining } from '../../pipelines/run.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** A Qwen2-shaped model directory with a chat template and a 128-token context. */
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-context-bound-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('a trained row longer than the context', () => {
  it("SFT through the model's chat template: a reference output past the context is a ContextLengthError naming the task and the limit; nothing is trained", async () => {
    const trainFile = join(dir, 'sft.jsonl');
    // The first task fits; the second's reference is some 600 tokens, on a model of 128.
    const long = Array.from({ length: 300 }, (_, i) => String(i % 97)).join(' ');
    await writeFile(
      trainFile,
      [
        { prompt: '1+1', response: '2' },
        { prompt: '2+2', response: long },
      ]
        .map((t) => JSON.stringify(t))
        .join('\n'),
    );
    const runDir = join(dir, 'run');
    const config = loadConfig({
      env: {},
      values: {
        model: { path: fixture },
        data: { source: 'jsonl', trainFile, alphabet: '0123456789+ ', shuffle: false },
        trainer: { algorithm: 'sft', learningRate: 0.01 },
        sft: { source: 'dataset' },
        rollout: { chatTemplate: 'model', groupSize: 1, maxTokens: 4 },
        sync: { mode: 'sync', batchSize: 2 },
        run: { dir: runDir, steps: 2, backend: 'cpu', seed: 1 },
        checkpoint: { every: 1, keepLast: 0 },
        validation: { beforeTrain: false, every: 0 },
      },
    });
    const steps: number[] = [];
    const started = performance.now();
    const error = await runTraining(config, { log: () => undefined, onStep: (step) => steps.push(step.step) }).catch((e: unknown) => e);
    console.log(`SFT reference past the context: refused after ${((performance.now() - started) / 1000).toFixed(2)} s`);
    expect(error).toBeInstanceOf(ContextLengthError);
    const context = (error as ContextLengthError).context;
    expect(context).toMatchObject({ taskId: 'sft.jsonl#2', limit: 128 });
    expect(context.tokens).toBeGreaterThan(128);
    expect((error as ContextLengthError).message).toMatch(/^task sft\.jsonl#2: /);
    // Refused before its step: no step was trained and no checkpoint holds one.
    expect(steps).toEqual([]);
    const saved = (await readdir(runDir)).filter((name) => name.startsWith('global_step_'));
    expect(saved).toEqual([]);
  }, 120_000);
});
