import { cpSync, existsSync, statSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';

import { describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { resolveModelDir } from '../../lib/model/hubCache.js';
import { runTraining } from '../../pipelines/run.js';
import { FORMAT_CREDIT, arithmeticTask, equationEvaluator } from '../../recipes/arithmetic.js';

const recipes = join(import.meta.dirname, '..', '..', 'recipes');
const fixture = join(import.meta.dirname, '..', 'fixtures', 'hf', 'tiny-qwen2');
const task = { id: 'q', prompt: 'What is 7 times 8?', answer: '7 * 8 = 56' };

describe('arithmetic task', () => {
  it('scores the asked equation with the right result 1, with a wrong one the format credit, anything else 0', () => {
    const stopped = { finishReason: 'stop' as const, tokens: [1, 2] };
    expect(equationEvaluator.evaluate(task, '7 * 8 = 56', undefined, stopped)).toMatchObject({
      reward: 1,
      metrics: { format: 1, correct: 1 },
    });
    expect(equationEvaluator.evaluate(task, 'Sure! 7*8=56.', undefined, stopped)).toMatchObject({ reward: 1 });
    expect(equationEvaluator.evaluate(task, '7 * 8 = 54', undefined, stopped)).toMatchObject({
      reward: FORMAT_CREDIT,
      metrics: { format: 1, correct: 0 },
    });
    expect(equationEvaluator.evaluate(task, '8 * 7 = 56', undefined, stopped)).toMatchObject({ reward: 0, metrics: { format: 0 } });
    expect(equationEvaluator.evaluate(task, '56', undefined, stopped)).toMatchObject({ reward: 0 });
    expect(equationEvaluator.evaluate(task, '7 * 8 = 56', undefined, { finishReason: 'length', tokens: [1, 2] })).toMatchObject({
      reward: 0,
    });
  });

  it('enumerates every question once, holds out a reproducible split, and refuses bad options naming the key', () => {
    const a = arithmeticTask({ operators: '+*', maxOperand: 5, validationSize: 10, seed: 2 });
    const b = arithmeticTask({ operators: '+*', maxOperand: 5, validationSize: 10, seed: 2 });
    expect(a.train.length + a.validation.length).toBe(2 * 25);
    expect(new Set([...a.train, ...a.validation].map((t) => t.id)).size).toBe(50);
    expect(a.validation.map((t) => t.id)).toEqual(b.validation.map((t) => t.id));
    for (const t of a.train) {
      const [, x, op, y, z] = /^(\d+) ([+*]) (\d+) = (\d+)$/.exec(t.answer!)!;
      expect(Number(z)).toBe(op === '+' ? Number(x) + Number(y) : Number(x) * Number(y));
      expect(t.prompt).toMatch(new RegExp(`^What is ${x} (plus|times) ${y}\\?`));
    }
    expect(a.maxAnswerLength).toBe('5 * 5 = 25'.length);
    expect(() => arithmeticTask({ operators: '/' })).toThrow(/data\.arithmetic\.operators/);
    expect(() => arithmeticTask({ maxOperand: 1 })).toThrow(/data\.arithmetic\.maxOperand/);
    expect(() => arithmeticTask({ maxOperand: 2, validationSize: 8 })).toThrow(ConfigError);
  });

  it('model.path ~/ is the home directory; other paths are relative to the recipe', async () => {
    await expect(resolveModelDir('~/.cache/no-such-rxrl-model', { baseDir: '/r' })).rejects.toThrow(
      `model.path: no model at '${join(homedir(), '.cache', 'no-such-rxrl-model')}' (`,
    );
    await expect(resolveModelDir('m', { baseDir: '/r' })).rejects.toThrow("model.path: no model at '/r/m' (");
    expect(() => loadConfig({ env: {}, values: { data: { source: 'arithmetic' } } })).toThrow(
      /model\.path: required when data\.source is 'arithmetic'/,
    );
  });

  // The SmolLM2 recipes run on the tiny Qwen2 fixture for two steps (CI's smoke; the real model is opt-in).
  for (const name of ['smollm2-arithmetic.yaml', 'smollm2-arithmetic-full.yaml', 'smollm2-arithmetic-sft.yaml']) {
    it(`recipes/${name} trains two steps in the model's chat template and checkpoints`, async () => {
      const dir = await mkdtemp(join(tmpdir(), 'rxrl-arith-'));
      const lora = name === 'smollm2-arithmetic.yaml';
      // The LoRA run reads a copy beside its run directory, so its base/ can link the copy's weights (same file system).
      const model = lora ? join(dir, 'model') : fixture;
      if (lora) cpSync(fixture, model, { recursive: true });
      const config = loadConfig({
        env: {},
        file: join(recipes, name),
        set: [
          `model.path=${model}`,
          'run.steps=2',
          `run.dir=${join(dir, 'run')}`,
          'run.backend=wasm',
          'validation.every=0',
          'data.arithmetic.validationSize=4',
          'sync.batchSize=2',
          'rollout.maxTokens=6',
        ],
      });
      expect(config.rollout.chatTemplate).toBe('model');
      const summary = await runTraining(config, { log: () => undefined });
      expect(summary.steps).toBe(2);
      expect(summary.failedSamples).toBe(0);
      expect(summary.valRewardInitial).toBeGreaterThanOrEqual(0);
      expect(existsSync(join(dir, 'run', 'global_step_2', lora ? 'adapter_model.safetensors' : 'model.safetensors'))).toBe(true);
      // The frozen base under base/ is the model directory's own weight file, hard-linked, not a second copy.
      if (lora) expect(statSync(join(dir, 'run', 'base', 'model.safetensors')).ino).toBe(statSync(join(model, 'model.safetensors')).ino);
    });
  }

  const tiny = (dir: string, extra: string[]): string[] => [
    `model.path=${fixture}`,
    'run.steps=2',
    `run.dir=${dir}`,
    'run.backend=wasm',
    'validation.every=0',
    'data.arithmetic.validationSize=4',
    'sync.batchSize=2',
    'rollout.maxTokens=6',
    ...extra,
  ];

  it('the SFT recipe trains on the reference answers, and a GRPO run starts from its checkpoint', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-sft-'));
    const steps: Record<string, number>[] = [];
    const sft = loadConfig({ env: {}, file: join(recipes, 'smollm2-arithmetic-sft.yaml'), set: tiny(join(dir, 'sft'), []) });
    expect(sft.validation.beforeTrain).toBe(true);
    const summary = await runTraining(sft, { log: () => undefined, onStep: (step) => steps.push(step.metrics) });
    // Validation samples the policy (the random fixture), not the references it trains on.
    expect(summary.valRewardInitial).toBeLessThan(0.5);
    // Each step trains every reference (two tasks, one row each), scored 1 by the evaluator, with the cross-entropy.
    expect(steps.map((m) => [m['batch/rows'], m['batch/rows_filtered'], m['critic/score_mean']])).toEqual([
      [2, 0, 1],
      [2, 0, 1],
    ]);
    expect(steps[1]['actor/sft_loss']).toBeGreaterThan(0);
    expect(steps[1]['actor/pg_loss']).toBeUndefined();
    const checkpoint = join(dir, 'sft', 'global_step_2');
    const grpo = loadConfig({
      env: {},
      file: join(recipes, 'smollm2-arithmetic-full.yaml'),
      set: [...tiny(join(dir, 'grpo'), []), `model.path=${checkpoint}`],
    });
    expect((await runTraining(grpo, { log: () => undefined })).steps).toBe(2);
    expect(existsSync(join(dir, 'grpo', 'global_step_2', 'model.safetensors'))).toBe(true);
  });

  it('trains a LoRA adapter with the cross-entropy as well (the LoRA recipe with trainer.algorithm sft)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-sft-lora-'));
    const steps: Record<string, number>[] = [];
    const set = ['trainer.algorithm=sft', 'rollout.groupSize=1', 'sync.generationBatchSize=2', 'algorithm.filterZeroVariance=false'];
    const config = loadConfig({ env: {}, file: join(recipes, 'smollm2-arithmetic.yaml'), set: tiny(join(dir, 'run'), set) });
    await runTraining(config, { log: () => undefined, onStep: (step) => steps.push(step.metrics) });
    expect(steps.map((m) => m['batch/rows'])).toEqual([2, 2]);
    expect(steps[1]['actor/sft_loss']).toBeLessThan(steps[0]['actor/sft_loss']);
    expect(existsSync(join(dir, 'run', 'global_step_2', 'adapter_model.safetensors'))).toBe(true);
  });

  it("the distillation recipe scores the student's tokens under its teacher, and refuses a teacher of another tokenizer", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-distill-'));
    const steps: Record<string, number>[] = [];
    // The teacher is the fixture itself: the student starts at the teacher, so the reverse KL starts at 0.
    const set = tiny(join(dir, 'run'), [`distill.teacher.path=${fixture}`]);
    const config = loadConfig({ env: {}, file: join(recipes, 'smollm2-distill.yaml'), set });
    await runTraining(config, { log: () => undefined, onStep: (step) => steps.push(step.metrics) });
    expect(steps).toHaveLength(2);
    expect(Math.abs(steps[0]['distill/reverse_kl'])).toBeLessThan(1e-4);
    expect(steps[1]['distill/reverse_kl']).toBeGreaterThan(steps[0]['distill/reverse_kl']);
    expect(steps[0]['distill/teacher_logprob_mean']).toBeLessThan(0);
    const other = loadConfig({
      env: {},
      file: join(recipes, 'smollm2-distill.yaml'),
      set: tiny(join(dir, 'other'), [`distill.teacher.path=${join(import.meta.dirname, '..', 'fixtures', 'hf', 'tiny-llama')}`]),
    });
    await expect(runTraining(other, { log: () => undefined })).rejects.toThrow(
      /distill\.teacher: .* does not share the student's tokenizer/,
    );
  });

  it('imitates only the rollouts whose reward reaches sft.minReward (rejection-sampling fine-tuning)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-rft-'));
    const steps: Record<string, number>[] = [];
    // The tiny fixture answers at random: no sample reaches 1, every one reaches 0.
    for (const minReward of [1, 0]) {
      const config = loadConfig({
        env: {},
        file: join(recipes, 'smollm2-arithmetic-sft.yaml'),
        set: tiny(join(dir, String(minReward)), ['sft.source=rollouts', `sft.minReward=${minReward}`, 'rollout.groupSize=2']),
      });
      await runTraining(config, { log: () => undefined, onStep: (step) => steps.push(step.metrics) });
    }
    expect(steps.map((m) => [m['batch/rows'], m['batch/rows_filtered']])).toEqual([
      [0, 4],
      [0, 4],
      [4, 0],
      [4, 0],
    ]);
    expect(steps[0]['actor/skipped_empty']).toBe(1);
    expect(steps[3]['actor/sft_loss']).toBeGreaterThan(0);
  });
});
