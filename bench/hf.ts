/**
 * Throughput of a SmolLM2-135M-shaped Llama (30 blocks, width 576, 9 query / 3 key-value heads, SwiGLU 1536,
 * vocabulary 49 152, tied head) at batch 1 × sequence 128: forward tokens/s, and forward + backward (every
 * weight's gradient of the mean next-token NLL) tokens/s, on each TF.js backend asked for, then the same model in
 * PyTorch CPU (`bench/torch_hf.py`, 2 threads) in the same run when `python3` can import torch and transformers,
 * with the ratios.
 *
 * The weights are random (seeded), or those of `--model-dir` (default: SmolLM2-135M-Instruct when
 * `npm run model:smollm2` has built it). A full Adam step (`train_tok_s`) is timed on every backend but wasm:
 * weights, gradients and two moments of 135 M parameters (2.2 GB) do not fit in what the wasm backend can address
 * (~2 GB); it is rxrl's Adam (lib/train/adam.ts), the trainer's. The default backends are every installed one of tensorflow and wasm.
 *
 * With `--lora R` both sides also time a LoRA step (`lora_train_tok_s`): a rank-R adapter (alpha 2R) on every
 * attention and MLP projection, forward + backward + Adam over the adapter only (PyTorch: PEFT, AdamW), the shape of
 * `recipes/smollm2-arithmetic.yaml`'s training. `--torch-device cuda` runs PyTorch's side on the GPU (as
 * `npm run bench -- gpu` does).
 *
 * Usage: `npm run bench -- hf [--backends tensorflow,wasm,cpu] [--reps 3] [--batch 1] [--seq 128] [--threads 2]
 * [--model-dir DIR] [--lora R] [--no-torch] [--torch-device cpu|cuda]`. Prints one JSON object per backend, one for
 * PyTorch, and a summary with ratios.
 *
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { homedir, loadavg } from 'node:os';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';

import { initBackend, nativeBackendInstalled, type BackendName } from '../lib/model/backend.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';
import { Adam } from '../lib/train/adam.js';
import { LORA_TARGETS } from '../lib/model/adapter.js';
import { LoraAdapter } from '../lib/model/lora.js';
import { ratio, runTorchHf } from './_torch.js';
import { median } from './_stats.js';
import { benchArgs } from './_args.js';

/** SmolLM2-135M's architecture (its config.json). */
export const SMOLLM2_135M: PolicyConfig = {
  modelType: 'llama',
  vocabSize: 49152,
  dModel: 576,
  nLayers: 30,
  nHeads: 9,
  nKvHeads: 3,
  dFF: 1536,
  maxSeqLen: 2048,
  ropeTheta: 100000,
  rmsNormEps: 1e-5,
  tieWordEmbeddings: true,
};

/** Where `npm run model:smollm2` builds SmolLM2-135M-Instruct (scripts/smollm2.py's default). */
export const SMOLLM2_DIR = join(homedir(), '.cache', 'rxrl-models', 'SmolLM2-135M-Instruct');

/** SmolLM2-135M-Instruct's directory when `npm run model:smollm2` has built it (else the benches use random weights). */
export function defaultModelDir(): string | undefined {
  return existsSync(join(SMOLLM2_DIR, 'config.json')) ? SMOLLM2_DIR : undefined;
}

interface Options {
  readonly backends: readonly BackendName[];
  readonly reps: number;
  readonly batch: number;
  readonly seq: number;
  readonly threads: number;
  readonly modelDir: string | undefined;
  readonly torch: boolean;
  readonly torchDevice: string;
  /** LoRA rank of the adapter step (0: no LoRA step). */
  readonly lora: number;
}

function parse(args: readonly string[]): Options {
  const { value, int, flag } = benchArgs(args);
  const modelDir = value('model-dir') ?? defaultModelDir();
  return {
    backends: value('backends')
      ?.split(',')
      .map((b) => b.trim() as BackendName) ?? [...(nativeBackendInstalled() ? (['tensorflow'] as const) : []), 'wasm'],
    reps: int('reps', 3),
    batch: int('batch', 1),
    seq: int('seq', 128),
    threads: int('threads', 2),
    modelDir,
    torch: !flag('no-torch'),
    torchDevice: value('torch-device') ?? 'cpu',
    lora: value('lora') === undefined ? 0 : int('lora', 16),
  };
}

/** Median seconds of `reps` runs after one warm-up run. */
export async function timed(fn: () => Promise<void>, reps: number): Promise<number> {
  await fn();
  const times: number[] = [];
  for (let i = 0; i < reps; i++) {
    const start = performance.now();
    await fn();
    times.push((performance.now() - start) / 1000);
  }
  return median(times);
}

/**
 * The bench's token rows for a `B × T` forward (`inputs`, `mask`, `positions`) and a `B × (T + 1)` scoring pass
 * (`sequence`, `seqMask`, `seqPositions`): the same deterministic ids, every position attended.
 */
export function benchRows(B: number, T: number, V: number): BenchRows {
  const ids = Int32Array.from({ length: B * (T + 1) }, (_, i) => (i * 7919 + 13) % V);
  const inputs = tf.tensor2d(
    ids.filter((_, i) => i % (T + 1) !== T),
    [B, T],
    'int32',
  );
  const mask = tf.ones([B, T]) as tf.Tensor2D;
  const positions = tf.tensor2d(
    Int32Array.from({ length: B * T }, (_, i) => i % T),
    [B, T],
    'int32',
  );
  const sequence = tf.tensor2d(ids, [B, T + 1], 'int32');
  const seqMask = tf.ones([B, T + 1]) as tf.Tensor2D;
  const seqPositions = tf.tensor2d(
    Int32Array.from({ length: B * (T + 1) }, (_, i) => i % (T + 1)),
    [B, T + 1],
    'int32',
  );
  return { inputs, mask, positions, sequence, seqMask, seqPositions };
}

/** What {@link benchRows} makes. */
export interface BenchRows {
  readonly inputs: tf.Tensor2D;
  readonly mask: tf.Tensor2D;
  readonly positions: tf.Tensor2D;
  readonly sequence: tf.Tensor2D;
  readonly seqMask: tf.Tensor2D;
  readonly seqPositions: tf.Tensor2D;
}

async function benchBackend(backend: BackendName, options: Options): Promise<Record<string, unknown>> {
  await initBackend(backend, { logger: { info: () => undefined } });
  const model = options.modelDir ? (await loadModelDir(options.modelDir)).model : PolicyModel.create(SMOLLM2_135M, 1);
  const { batch: B, seq: T } = options;
  const rows = benchRows(B, T, model.config.vocabSize);
  const { inputs, mask, positions, sequence, seqMask, seqPositions } = rows;
  try {
    // Waits for the logits by reading one of them: reading all B·T·V back (805 MB at 32 × 128) would time a copy that
    // PyTorch's side does not make.
    const forward = await timed(async () => {
      const last = tf.tidy(() => tf.slice(model.logits(inputs, mask, positions), [B - 1, T - 1, 0], [1, 1, 1]));
      await last.data();
      last.dispose();
    }, options.reps);
    const grad = await timed(async () => {
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.mean(model.tokenLogprobs(sequence, seqMask, seqPositions).logprobs)) as tf.Scalar,
      );
      await value.data();
      tf.dispose([value, ...Object.values(grads)]);
    }, options.reps);
    const train = backend === 'wasm' ? null : await adamStep(model, rows, options.reps);
    let loraTrain: number | null = null;
    if (options.lora > 0) {
      const lora = { rank: options.lora, alpha: 2 * options.lora, targetModules: LORA_TARGETS };
      const adapter = LoraAdapter.create(model.config, lora, 1);
      const view = PolicyModel.withAdapter(model, adapter);
      loraTrain = await adamStep(view, rows, options.reps);
      view.dispose();
      adapter.dispose();
    }
    return {
      bench: 'hf',
      backend: tf.getBackend(),
      batch: B,
      seq: T,
      params: model.numParameters(),
      forward_tok_s: Number(((B * T) / forward).toFixed(1)),
      grad_tok_s: Number(((B * T) / grad).toFixed(1)),
      train_tok_s: train === null ? null : Number(((B * T) / train).toFixed(1)),
      ...(options.lora > 0
        ? { lora_rank: options.lora, lora_train_tok_s: loraTrain === null ? null : Number(((B * T) / loraTrain).toFixed(1)) }
        : {}),
      forward_s: Number(forward.toFixed(3)),
      grad_s: Number(grad.toFixed(3)),
      reps: options.reps,
      model: options.modelDir ?? 'random:SmolLM2-135M',
    };
  } finally {
    tf.dispose([inputs, mask, positions, sequence, seqMask, seqPositions]);
    model.dispose();
  }
}

/** Median seconds of one training step of `model`'s trainable variables (all, or an adapter's) with the trainer's Adam. */
export async function adamStep(model: PolicyModel, rows: BenchRows, reps: number): Promise<number> {
  const { step, dispose } = adamStepper(model, rows);
  try {
    return await timed(step, reps);
  } finally {
    dispose();
  }
}

/**
 * One training step of `model`'s trainable variables with the trainer's Adam, to run as often as wanted: the mean
 * next-token NLL of `rows`' sequences, its gradient, Adam's update, then a wait for the loss.
 */
export function adamStepper(model: PolicyModel, rows: BenchRows): { step: () => Promise<void>; dispose: () => void } {
  const variables = model.trainableVariables();
  const optimizer = new Adam(variables, { learningRate: 1e-5 });
  const step = async (): Promise<void> => {
    const { value, grads } = tf.variableGrads(
      () => tf.neg(tf.mean(model.tokenLogprobs(rows.sequence, rows.seqMask, rows.seqPositions).logprobs)) as tf.Scalar,
      variables,
    );
    const ordered = variables.map((v) => grads[v.name]);
    optimizer.apply(ordered);
    await value.data();
    tf.dispose([value, ...ordered]);
  };
  return { step, dispose: () => optimizer.dispose() };
}

function benchTorch(options: Options): Record<string, unknown> {
  const args = [
    '--threads',
    String(options.threads),
    '--reps',
    String(options.reps),
    '--batch',
    String(options.batch),
    '--seq',
    String(options.seq),
  ];
  if (options.modelDir) args.push('--model-dir', options.modelDir);
  if (options.lora > 0) args.push('--lora', String(options.lora));
  if (options.torchDevice !== 'cpu') args.push('--device', options.torchDevice);
  return runTorchHf(args);
}

export async function main(args: readonly string[]): Promise<void> {
  const options = parse(args);
  const load = loadavg()[0];
  const rows: Record<string, unknown>[] = [];
  for (const backend of options.backends) {
    const row = await benchBackend(backend, options);
    rows.push(row);
    console.log(JSON.stringify(row));
  }
  const torch = options.torch ? benchTorch(options) : { bench: 'hf-torch', skipped: '--no-torch' };
  console.log(JSON.stringify(torch));
  console.log(
    JSON.stringify({
      bench: 'hf-summary',
      loadavg_1m_at_start: Number(load.toFixed(2)),
      vs_torch: rows.map((r) => ({
        backend: r.backend,
        forward: ratio(r.forward_tok_s, torch.forward_tok_s),
        grad: ratio(r.grad_tok_s, torch.grad_tok_s),
        train: ratio(r.train_tok_s, torch.train_tok_s),
        ...(options.lora > 0 ? { lora_train: ratio(r.lora_train_tok_s, torch.lora_train_tok_s) } : {}),
      })),
    }),
  );
}
