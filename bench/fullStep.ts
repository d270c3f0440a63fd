/**
 * Where a full fine-tuning GRPO step goes on SmolLM2-135M-Instruct (every weight trained), on the native
 * backend: the bench recipe's batch (recipes/smollm2-arithmetic-full.yaml: 16 rows = 4 prompts × 4 samples,
 * ~45-token prompts, 16-token responses, micro-batches of 8, lr 1e-5, clip at norm 1).
 *
 * Sections, each interleaving its variants in this one process, `--reps` rounds after a warm-up, medians:
 * - `adam`: one Adam update of the model's 273 variables with seeded random gradients, TF.js's
 *   `tf.train.adam` (`tfjs`) against rxrl's {@link Adam} (`rxrl`);
 * - `phases`: the step taken apart, the way the trainer did it before rxrl's Adam (`baseline`: forward+backward
 *   of each micro-batch, accumulation by `tf.add`, global norm, clip, TF.js's `applyGradients`, `weightsChanged`)
 *   and the way it does now (`rxrl`: the same gradients, their global norm, rxrl's Adam with the clip
 *   folded in), each part timed and its kernels counted (`tf.profile`, deterministic);
 * - `step`: the whole step, `GrpoTrainer.trainStep` (`trainer`) against that replica of the old step
 *   (`baseline`), with the kernels of each.
 *
 * Usage: `npm run bench -- fullStep [--sections adam,phases,step] [--reps 5] [--model-dir DIR]`. Prints one JSON
 * object per section and variant.
 *
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';

import { aggregateLoss } from '../lib/algos/aggregate.js';
import { ppoClipLoss } from '../lib/algos/policyLoss.js';
import { collate } from '../lib/data/collate.js';
import { initBackend } from '../lib/model/backend.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import type { PolicyModel } from '../lib/model/transformer.js';
import { createRng } from '../lib/core/random.js';
import { modelScorer } from '../lib/engine/teacher.js';
import { Adam } from '../lib/train/adam.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { Batch, Trajectory } from '../lib/core/types.js';
import { median } from './_stats.js';
import { benchArgs } from './_args.js';
import { SMOLLM2_DIR } from './hf.js';

/** The bench recipe's trainer settings. */
const RECIPE = { learningRate: 1e-5, microBatchSize: 8, maxGradNorm: 1, groups: 4, groupSize: 4, prompt: 45, response: 16 };

interface Options {
  readonly sections: readonly string[];
  readonly reps: number;
  readonly modelDir: string;
}

function parse(args: readonly string[]): Options {
  const { value, int } = benchArgs(args);
  const reps = int('reps', 5);
  const modelDir = value('model-dir') ?? SMOLLM2_DIR;
  if (!existsSync(join(modelDir, 'config.json'))) throw new Error(`no model at ${modelDir} (npm run model:smollm2)`);
  return { sections: (value('sections') ?? 'adam,phases,step').split(','), reps, modelDir };
}

/** The recipe's batch: 4 prompts (43–47 tokens) × 4 samples of up to 16 tokens, rollout log-probs of `model`. */
async function recipeBatch(model: PolicyModel): Promise<Batch> {
  const rng = createRng(7, 'fullStep');
  const token = (): number => 100 + Math.floor(rng.next() * 49000);
  const rows: Trajectory[] = [];
  const rewards: number[] = [];
  for (let g = 0; g < RECIPE.groups; g++) {
    const promptTokens = Array.from({ length: RECIPE.prompt - 2 + g }, token);
    for (let s = 0; s < RECIPE.groupSize; s++) {
      const responseTokens = Array.from({ length: s === 3 ? 11 : RECIPE.response }, token);
      const reward = rng.next() < 0.5 ? 1 : 0;
      rewards.push(reward);
      rows.push({
        id: `g${g}/${s}`,
        taskId: `g${g}`,
        groupId: `g${g}`,
        runId: s,
        modelTag: 'policy',
        policyVersion: 0,
        promptTokens,
        responseTokens,
        logprobs: responseTokens.map(() => 0),
        lossMask: responseTokens.map(() => 1),
        reward,
        finishReason: s === 3 ? 'stop' : 'length',
        metrics: {},
        task: { id: `g${g}`, prompt: '' },
      });
    }
  }
  const advantages = rewards.map((r, i) => {
    const group = rewards.slice(i - (i % RECIPE.groupSize), i - (i % RECIPE.groupSize) + RECIPE.groupSize);
    const mean = group.reduce((a, b) => a + b, 0) / group.length;
    const std = Math.sqrt(group.reduce((a, b) => a + (b - mean) ** 2, 0) / (group.length - 1));
    return (r - mean) / (std + 1e-6);
  });
  const batch = collate(rows, { padId: 0, modelTag: 'policy', advantages });
  // modelScorer leaves 0 on padding: the rollout's log-probs of these rows are the model's own.
  const oldLogprobs = await modelScorer(model).responseLogprobs(batch);
  return { ...batch, oldLogprobs };
}

/** Wall seconds and kernel count of `fn` (kernels from `tf.profile`, when `count`). */
async function measured(fn: () => void | Promise<void>, count: boolean): Promise<{ s: number; kernels: number }> {
  if (!count) {
    const start = performance.now();
    await fn();
    return { s: (performance.now() - start) / 1000, kernels: 0 };
  }
  let s = 0;
  const info = await tf.profile(async () => {
    const start = performance.now();
    await fn();
    s = (performance.now() - start) / 1000;
  });
  return { s, kernels: info.kernels.length };
}

/** Runs each variant once per round, `reps` rounds after a warm-up one, and prints medians and kernel counts. */
async function interleaved(section: string, variants: Record<string, () => void | Promise<void>>, reps: number): Promise<void> {
  const times: Record<string, number[]> = {};
  const kernels: Record<string, number> = {};
  for (let round = 0; round <= reps; round++) {
    for (const [name, fn] of Object.entries(variants)) {
      const { s, kernels: k } = await measured(fn, round === 0);
      if (round === 0) kernels[name] = k;
      else (times[name] ??= []).push(s);
    }
  }
  for (const name of Object.keys(variants)) {
    console.log(
      JSON.stringify({
        bench: 'fullStep',
        section,
        variant: name,
        median_s: round3(median(times[name])),
        kernels: kernels[name],
        times_s: times[name].map(round3),
        reps,
      }),
    );
  }
}

function round3(x: number): number {
  return Number(x.toFixed(3));
}

/** One Adam update of every variable with seeded gradients: TF.js's against rxrl's. */
async function adamSection(model: PolicyModel, reps: number): Promise<void> {
  const variables = model.trainableVariables();
  const grads = variables.map((v, i) => tf.randomNormal(v.shape, 0, 1e-3, 'float32', 1000 + i));
  const tfjs = tf.train.adam(RECIPE.learningRate, 0.9, 0.999, 1e-8);
  const rxrl = new Adam(variables, { learningRate: RECIPE.learningRate, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 });
  try {
    await interleaved(
      'adam',
      {
        tfjs: () => tfjs.applyGradients(variables.map((v, i) => ({ name: v.name, tensor: grads[i] }))),
        rxrl: () => rxrl.apply(grads),
      },
      reps,
    );
  } finally {
    tfjs.dispose();
    rxrl.dispose();
    tf.dispose(grads);
  }
}

/** A micro-batch's tensors: rows `[from, to)` of the batch. */
function microTensors(batch: Batch, from: number, to: number): tf.Tensor2D[] {
  const T = batch.promptLength + batch.responseLength;
  const R = batch.responseLength;
  const n = to - from;
  return [
    tf.tensor2d(batch.inputIds.subarray(from * T, to * T), [n, T], 'int32'),
    tf.tensor2d(batch.attentionMask.subarray(from * T, to * T), [n, T]),
    tf.tensor2d(batch.positionIds.subarray(from * T, to * T), [n, T], 'int32'),
    tf.tensor2d(batch.lossMask.subarray(from * R, to * R), [n, R]),
    tf.tensor2d(batch.oldLogprobs.subarray(from * R, to * R), [n, R]),
    tf.tensor2d(batch.advantages.subarray(from * R, to * R), [n, R]),
  ];
}

/** Runs a named part of a step; the phases section times it and counts its kernels. */
type Part = <T>(name: string, fn: () => T) => Promise<T>;

/**
 * The gradients of the step's loss as the trainer computes them: per micro-batch the token-mean PPO loss weighted
 * by its share under `tf.variableGrads` (with the entropy metric), accumulated by `tf.add`.
 */
async function stepGradients(model: PolicyModel, batch: Batch, part: Part): Promise<Record<string, tf.Tensor>> {
  const variables = model.trainableVariables();
  const R = batch.responseLength;
  const tokens = batch.lossMask.reduce((a, b) => a + b, 0);
  let grads: Record<string, tf.Tensor> = {};
  for (let from = 0; from < batch.size; from += RECIPE.microBatchSize) {
    const to = Math.min(batch.size, from + RECIPE.microBatchSize);
    const share = batch.lossMask.subarray(from * R, to * R).reduce((a, b) => a + b, 0) / tokens;
    const [ids, attention, positions, mask, old, advantages] = microTensors(batch, from, to);
    const g = await part(`forward_backward_${from / RECIPE.microBatchSize}`, () => {
      const { value, grads: out } = tf.variableGrads(() => {
        const { logprobs, entropy } = model.responseLogprobs(ids, attention, positions, batch.promptLength);
        const pg = ppoClipLoss(
          { logprob: logprobs, oldLogprob: old, advantages, mask },
          { clipLow: 0.2, mode: 'token-mean', maxLength: R },
        );
        aggregateLoss(entropy, mask, 'token-mean', { maxLength: R });
        return tf.mul(pg.loss, share) as tf.Scalar;
      }, variables);
      value.dataSync();
      value.dispose();
      return out;
    });
    tf.dispose([ids, attention, positions, mask, old, advantages]);
    if (from === 0) grads = g;
    else {
      await part('accumulate', () => {
        for (const [name, x] of Object.entries(g)) {
          const prev = grads[name];
          grads[name] = tf.add(prev, x);
          tf.dispose([prev, x]);
        }
      });
    }
  }
  return grads;
}

/**
 * The step as the trainer took it before rxrl's Adam (`GrpoTrainer` at 1056d86): {@link stepGradients}, the global
 * norm (`sum(square)` per tensor, `addN`, `sqrt`), the clip (`mul` per tensor when the norm is over the bound),
 * TF.js's Adam `applyGradients`, `weightsChanged`.
 */
async function baselineStep(model: PolicyModel, batch: Batch, optimizer: tf.Optimizer, part: Part): Promise<void> {
  const grads = await stepGradients(model, batch, part);
  const tensors = Object.values(grads);
  const norm = await part('norm', () => tf.tidy(() => tf.sqrt(tf.addN(tensors.map((x) => tf.sum(tf.square(x)))))).dataSync()[0]);
  const scale = Math.min(1, RECIPE.maxGradNorm / (norm + 1e-6));
  const clipped = await part('clip', () => Object.entries(grads).map(([name, x]) => ({ name, tensor: scale < 1 ? tf.mul(x, scale) : x })));
  await part('adam', () => optimizer.applyGradients(clipped));
  await part('weights_changed', () => model.weightsChanged());
  tf.dispose(scale < 1 ? [...tensors, ...clipped.map((c) => c.tensor)] : tensors);
}

/**
 * The step as the trainer takes it now: {@link stepGradients}, the global norm ({@link Adam.gradientNorm}, with the
 * squares where Adam's kernel reuses them), rxrl's {@link Adam} with the clip, `weightsChanged`.
 */
async function rxrlStep(model: PolicyModel, batch: Batch, optimizer: Adam, part: Part): Promise<void> {
  const grads = await stepGradients(model, batch, part);
  const ordered = model.trainableVariables().map((v) => grads[v.name]);
  const { squares, norm } = await part('norm', () => optimizer.gradientNorm(ordered));
  const scale = Math.min(1, RECIPE.maxGradNorm / (norm + 1e-6));
  await part('adam', () => optimizer.apply(ordered, { scale, squares }));
  await part('weights_changed', () => model.weightsChanged());
  tf.dispose([...ordered, ...squares.filter((x): x is tf.Tensor => x !== undefined)]);
}

/** The step taken apart, the baseline's and rxrl's interleaved: each part's median seconds and kernels. */
async function phasesSection(model: PolicyModel, batch: Batch, reps: number): Promise<void> {
  const tfjs = tf.train.adam(RECIPE.learningRate, 0.9, 0.999, 1e-8);
  const rxrl = new Adam(model.trainableVariables(), { learningRate: RECIPE.learningRate });
  const steps = {
    baseline: (part: Part) => baselineStep(model, batch, tfjs, part),
    rxrl: (part: Part) => rxrlStep(model, batch, rxrl, part),
  };
  const times = new Map<string, number[]>();
  const kernels = new Map<string, number>();
  const add = (key: string, s: number): void => void times.set(key, [...(times.get(key) ?? []), s]);
  try {
    for (let round = 0; round <= reps; round++) {
      for (const [variant, step] of Object.entries(steps)) {
        const total = performance.now();
        await step(async <T>(name: string, fn: () => T): Promise<T> => {
          let out: T | undefined;
          const { s, kernels: k } = await measured(() => void (out = fn()), round === 0);
          if (round === 0) kernels.set(`${variant}/${name}`, (kernels.get(`${variant}/${name}`) ?? 0) + k);
          else add(`${variant}/${name}`, s);
          return out as T;
        });
        if (round > 0) add(`${variant}/total`, (performance.now() - total) / 1000);
      }
    }
  } finally {
    tfjs.dispose();
    rxrl.dispose();
  }
  for (const [key, xs] of times) {
    const [variant, part] = key.split('/');
    console.log(
      JSON.stringify({
        bench: 'fullStep',
        section: 'phases',
        variant,
        part,
        median_s: round3(median(xs)),
        kernels: kernels.get(key) ?? null,
        reps,
      }),
    );
  }
}

/** The whole step: the trainer's against the baseline's, interleaved. */
async function stepSection(model: PolicyModel, batch: Batch, reps: number): Promise<void> {
  const optimizer = tf.train.adam(RECIPE.learningRate, 0.9, 0.999, 1e-8);
  const trainer = new GrpoTrainer(model, {
    learningRate: RECIPE.learningRate,
    microBatchSize: RECIPE.microBatchSize,
    maxGradNorm: RECIPE.maxGradNorm,
  });
  const direct: Part = async (_name, fn) => fn();
  try {
    await interleaved(
      'step',
      {
        baseline: () => baselineStep(model, batch, optimizer, direct),
        trainer: async () => void (await trainer.trainStep(batch)),
      },
      reps,
    );
  } finally {
    optimizer.dispose();
    trainer.dispose();
  }
}

export async function main(args: readonly string[]): Promise<void> {
  const options = parse(args);
  await initBackend('tensorflow', { logger: { info: () => undefined } });
  const { model } = await loadModelDir(options.modelDir);
  console.log(
    JSON.stringify({
      bench: 'fullStep',
      params: model.numParameters(),
      variables: model.trainableVariables().length,
      loadavg_1m: loadavg()[0],
    }),
  );
  try {
    const batch = await recipeBatch(model);
    if (options.sections.includes('adam')) await adamSection(model, options.reps);
    if (options.sections.includes('phases')) await phasesSection(model, batch, options.reps);
    if (options.sections.includes('step')) await stepSection(model, batch, options.reps);
  } finally {
    model.dispose();
  }
}
