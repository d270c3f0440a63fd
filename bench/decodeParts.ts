/**
 * `npm run bench -- decodeParts [--model DIR] [--rows 16] [--new 16] [--prompt 54] [--group 4] [--lora 16]
 * [--backend tensorflow] [--exec graph|eager]`
 *
 * Where one decoding step of the sampling loop goes, beside its memory bound: the shape of `bench trl`'s generation
 * (SmolLM2-135M-Instruct, `--rows` completions of `--new` tokens, `--group` of them sharing each prompt of
 * `--prompt` tokens). The model is `--model`'s directory, else the one `npm run model:smollm2` built, else
 * SmolLM2-135M's architecture with seeded random weights (a step's time does not depend on the weights' values).
 * `bench decode` compares the fused sampling copy with the variables; this one splits the step that runs. `--lora R` samples through a rank-R adapter on all
 * seven projections, as `recipes/smollm2-arithmetic.yaml` trains (`--lora 0`: the base alone, as full fine-tuning).
 * `--exec` chooses how a decoding step runs on the native backend (`PolicyModel.setGraphDecoding`): `graph` (the
 * default there) runs it as one TensorFlow session call, whose kernels `tf.profile` does not see (they fall in
 * `overhead_s`), `eager` op by op, split into kernels by kind.
 *
 * Prints one JSON line, `{"bench":"decode-parts",…}`: the machine's rates (`bench/_rates.ts`), the step's memory bound
 * (every weight read once: `decode_bound_s`), and measured medians of three runs each:
 * - `fuse_s`: building the fused, adapter-merged sampling copy (`lib/model/samplingWeights.ts`), which a training
 *   run pays once per step, after each update;
 * - `prefill_s`: the prompts' forward pass and the first token;
 * - `step_s`: one more decoding step of every row (the whole generation less the prefill, over the steps), split
 *   into `parts`: the kernels by kind (`body_matmul_s`: the blocks' projections, `head_s`: the `[V, d]` logits
 *   product, `attention_s`: scores and weighted values, `kv_write_s`: the key/value caches' concatenations,
 *   `other_kernels_s`), `logits_read_s` (the `[rows, V]` logits to host memory), `sample_s` (drawing each row's
 *   token from them), and `overhead_s`, the rest: TF.js's own work around each kernel (dispatch, tensor
 *   bookkeeping, tidy) and the loop's;
 * - `kernels_per_step`, and `step_over_bound`: `step_s` over `decode_bound_s`.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../lib/core/errors.js';
import { createRng } from '../lib/core/random.js';
import type { BackendKind } from '../lib/model/backend.js';
import { LORA_TARGETS, LoraAdapter } from '../lib/model/lora.js';
import { readStep, sampleRow } from '../lib/model/generate.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import type { GenerateRequest } from '../lib/model/types.js';
import { benchArgs } from './_args.js';
import { modelSizes } from './_bounds.js';
import { measureRates } from './_rates.js';
import { SMOLLM2_135M, defaultModelDir } from './hf.js';
import { median } from './_stats.js';

const RUNS = 3;
const round = (x: number, digits = 4): number => Number(x.toFixed(digits));

/** The policy to sample from: the directory's model or SmolLM2's shape, with a fresh adapter when `lora` > 0. */
async function samplingModel(dir: string | undefined, lora: number): Promise<{ model: PolicyModel; base: PolicyModel }> {
  const base = dir === undefined ? PolicyModel.create(SMOLLM2_135M, 1) : (await loadModelDir(dir)).model;
  if (lora === 0) return { model: base, base };
  const adapter = LoraAdapter.create(base.config, { rank: lora, alpha: 2 * lora, targetModules: [...LORA_TARGETS] }, 2);
  return { model: PolicyModel.withAdapter(base, adapter), base };
}

/** `rows` requests of `maxTokens` new tokens, `group` of them per prompt of `promptTokens` seeded ids. */
function requests(shape: { rows: number; group: number; prompt: number; vocab: number }, maxTokens: number): GenerateRequest[] {
  const rng = createRng(3, 'bench-decode');
  const prompts = Array.from({ length: Math.ceil(shape.rows / shape.group) }, () =>
    Array.from({ length: shape.prompt }, () => 3 + Math.floor(rng.next() * (shape.vocab - 3))),
  );
  // No stop tokens: every row decodes all its steps.
  return Array.from({ length: shape.rows }, (_, i) => ({
    promptTokens: prompts[Math.floor(i / shape.group)],
    maxTokens,
    temperature: 1,
    seed: 100 + i,
    stopTokens: [],
  }));
}

/** Median seconds of `RUNS` runs of `f`. */
async function timed(f: () => Promise<unknown>): Promise<number> {
  const seconds: number[] = [];
  for (let i = 0; i < RUNS; i++) {
    const started = performance.now();
    await f();
    seconds.push((performance.now() - started) / 1000);
  }
  return median(seconds);
}

/** Kernel milliseconds of one profiled generation, by kind, and how many kernels ran. */
async function kernelsByKind(
  model: PolicyModel,
  batch: readonly GenerateRequest[],
  vocab: number,
): Promise<{ ms: Record<string, number>; count: number }> {
  const profile = await tf.profile(async () => {
    await model.generate(batch);
    return [];
  });
  const ms: Record<string, number> = { body_matmul: 0, head: 0, attention: 0, kv_write: 0, other_kernels: 0 };
  for (const k of profile.kernels) {
    // A custom-gradient function (RMSNorm's) is profiled as a scope around its own kernels, which are profiled too.
    if (k.name === 'unnamed scope') continue;
    const shapes = k.inputShapes;
    let kind = 'other_kernels';
    if (k.name === 'BatchMatMul' || k.name === '_FusedMatMul') {
      if (shapes.some((s) => s?.length === 4)) kind = 'attention';
      else if (shapes.some((s) => s?.[0] === vocab || s?.[1] === vocab)) kind = 'head';
      else kind = 'body_matmul';
    } else if (k.name === 'Concat' && shapes.every((s) => s?.length === 4)) kind = 'kv_write';
    ms[kind] += k.kernelTimeMs as number;
  }
  return { ms, count: profile.kernels.filter((k) => k.name !== 'unnamed scope').length };
}

/**
 * Seconds to read `[rows, V]` logits to host memory (with the softmax numerators the native backend computes beside
 * them: `lib/model/expGraph.ts`), and to draw every row's token from them, as the sampling loop does.
 */
async function hostParts(rows: number, vocab: number): Promise<{ read: number; sample: number }> {
  const reads: number[] = [];
  const draws: number[] = [];
  const rng = createRng(4, 'bench-decode-host');
  const params = { temperature: 1, topP: 1 };
  for (let i = 0; i < RUNS + 2; i++) {
    const logits = tf.randomNormal<tf.Rank.R2>([rows, vocab]);
    const started = performance.now();
    const step = await readStep(logits, true);
    reads.push((performance.now() - started) / 1000);
    const drawing = performance.now();
    for (let r = 0; r < rows; r++) sampleRow(step, r, params, rng);
    draws.push((performance.now() - drawing) / 1000);
  }
  return { read: median(reads), sample: median(draws) };
}

export async function main(argv: readonly string[]): Promise<void> {
  const args = benchArgs(argv);
  const rows = args.int('rows', 16);
  const steps = args.int('new', 16);
  const lora = Number(args.value('lora') ?? '16');
  const backend = (args.value('backend') ?? 'tensorflow') as BackendKind;
  const rates = await measureRates(backend);
  const dir = args.value('model') ?? defaultModelDir();
  const { model, base } = await samplingModel(dir, lora);
  const exec = args.value('exec') ?? 'graph';
  if (exec !== 'graph' && exec !== 'eager')
    throw new ConfigError(`--exec must be graph or eager, got ${exec}`, { context: { key: 'exec' } });
  model.setGraphDecoding(exec === 'graph');
  const vocab = model.config.vocabSize;
  const shape = { rows, group: args.int('group', 4), prompt: args.int('prompt', 54), vocab };
  const all = requests(shape, steps);
  const first = requests(shape, 1);
  await model.generate(requests(shape, 2)); // warm up: kernels, the fused copy, first allocations
  const fuse = await timed(async () => {
    model.weightsChanged();
    model.samplingLeaseInternal().release();
  });
  const prefill = await timed(() => model.generate(first));
  const whole = await timed(() => model.generate(all));
  const perStep = (whole - prefill) / (steps - 1);
  const [wholeKernels, firstKernels] = [await kernelsByKind(model, all, vocab), await kernelsByKind(model, first, vocab)];
  const parts: Record<string, number> = {};
  for (const kind of Object.keys(wholeKernels.ms))
    parts[`${kind}_s`] = (wholeKernels.ms[kind] - firstKernels.ms[kind]) / 1000 / (steps - 1);
  const host = await hostParts(rows, vocab);
  const accounted = Object.values(parts).reduce((a, b) => a + b, 0) + host.read + host.sample;
  const sizes = modelSizes(model.config);
  const bound = (sizes.params * 4) / (rates.bandwidthGBs * 1e9);
  console.log(
    JSON.stringify({
      bench: 'decode-parts',
      ...rates,
      model: dir ?? 'SmolLM2-135M shape, random weights',
      lora: lora > 0 ? lora : null,
      exec,
      rows,
      new_tokens: steps,
      prompt_tokens: shape.prompt,
      group: shape.group,
      decode_bytes: sizes.params * 4,
      decode_bound_s: round(bound),
      fuse_s: round(fuse),
      prefill_s: round(prefill),
      step_s: round(perStep),
      parts: {
        ...Object.fromEntries(Object.entries(parts).map(([k, v]) => [k, round(v)])),
        logits_read_s: round(host.read),
        sample_s: round(host.sample),
        overhead_s: round(perStep - accounted),
      },
      kernels_per_step: Math.round((wholeKernels.count - firstKernels.count) / (steps - 1)),
      step_over_bound: round(perStep / bound, 2),
    }),
  );
  model.dispose();
  if (base !== model) base.dispose();
}
