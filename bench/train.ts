/**
 * Training-step throughput of the policy model: forward, `tf.variableGrads` of the mean token NLL, and an
 * Adam update, in tokens per second (`B · T` tokens per step), for two model sizes on every available backend.
 *
 * Usage: `npm run bench -- train [--backends wasm,cpu,tensorflow] [--sizes small,medium] [--steps N] [--no-torch]`.
 * Prints one JSON object per (backend, size); then, when `python3` imports torch and transformers, PyTorch CPU's
 * train step on the same shape, batch and sequence (`bench/torch_hf.py --shape`, AdamW, 2 threads and 1), and a
 * `train-summary` line with every backend's ratio to both and the tensorflow / wasm ratio, all from this run.
 *
 * @packageDocumentation
 */
import { loadavg } from 'node:os';

import * as tf from '@tensorflow/tfjs-core';

import { initBackend, type BackendName } from '../lib/model/backend.js';
import { createRng } from '../lib/core/random.js';
import { ratio, torchBySize, torchShape, vsTorch } from './_torch.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';

/** One benchmarked model size and its batch. */
interface TrainCase {
  readonly name: string;
  readonly config: PolicyConfig;
  readonly batch: number;
  readonly seqLen: number;
}

const CASES: readonly TrainCase[] = [
  {
    name: 'small',
    config: { vocabSize: 64, dModel: 128, nLayers: 2, nHeads: 4, dFF: 512, maxSeqLen: 32 },
    batch: 32,
    seqLen: 32,
  },
  {
    name: 'medium',
    config: { vocabSize: 64, dModel: 256, nLayers: 4, nHeads: 4, dFF: 1024, maxSeqLen: 64 },
    batch: 16,
    seqLen: 64,
  },
];

/** Timed steps per backend: the pure-JS cpu backend is ~25× slower than wasm. */
const TIMED_STEPS: Readonly<Record<BackendName, number>> = { tensorflow: 10, wasm: 8, cpu: 2 };
/**
 * The cpu backend trains on a quarter of each batch (same model, same sequence length), so the whole benchmark
 * stays under two minutes; tokens per second hardly depend on the batch at these sizes.
 */
const BATCH_DIVISOR: Readonly<Record<BackendName, number>> = { tensorflow: 1, wasm: 1, cpu: 4 };
/** Warm-up steps before timing (kernel setup, first allocations). */
const WARMUP_STEPS: Readonly<Record<BackendName, number>> = { tensorflow: 2, wasm: 2, cpu: 1 };
/** Adam learning rate (irrelevant to speed; small so the loss stays finite). */
const LEARNING_RATE = 1e-3;

function parseList(args: readonly string[], flag: string): string[] | undefined {
  const at = args.indexOf(flag);
  return at >= 0 && at + 1 < args.length ? args[at + 1].split(',') : undefined;
}

/** Runs the benchmark; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const backends = (parseList(args, '--backends') ?? ['tensorflow', 'wasm', 'cpu']) as BackendName[];
  const sizes = parseList(args, '--sizes') ?? CASES.map((c) => c.name);
  const stepsArg = parseList(args, '--steps');
  const quiet = { info: (): void => undefined };
  const load = loadavg()[0];
  const rows: Record<string, unknown>[] = [];
  for (const backend of backends) {
    try {
      await initBackend(backend, { logger: quiet });
    } catch (error) {
      console.log(JSON.stringify({ bench: 'train', backend, skipped: error instanceof Error ? error.message : String(error) }));
      continue;
    }
    for (const c of CASES.filter((k) => sizes.includes(k.name))) {
      const steps = stepsArg !== undefined ? Number(stepsArg[0]) : TIMED_STEPS[backend];
      const batch = Math.max(1, Math.floor(c.batch / BATCH_DIVISOR[backend]));
      const row = await runCase(backend, { ...c, batch }, WARMUP_STEPS[backend], steps);
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  }
  if (args.includes('--no-torch')) return;
  const torch = torchBySize(
    CASES.filter((k) => sizes.includes(k.name)).map((c) => c.name),
    (size, threads) =>
      benchTorchArgs(
        CASES.find((c) => c.name === size)!,
        threads,
      ),
    'train_tok_s',
  );
  const tokS = (backend: string, size: string): unknown => rows.find((r) => r.backend === backend && r.size === size)?.tokensPerSecond;
  console.log(
    JSON.stringify({
      bench: 'train-summary',
      loadavg_1m_at_start: Number(load.toFixed(2)),
      rows: vsTorch(rows, 'tokensPerSecond', torch),
      tensorflow_vs_wasm: CASES.filter((k) => sizes.includes(k.name)).map((c) => ({
        size: c.name,
        ratio: ratio(tokS('tensorflow', c.name), tokS('wasm', c.name)),
      })),
    }),
  );
}

/** `bench/torch_hf.py` arguments of PyTorch CPU's train step (AdamW) on the case's shape, batch and sequence. */
function benchTorchArgs(c: TrainCase, threads: number): string[] {
  return [
    '--threads',
    String(threads),
    '--reps',
    '3',
    '--batch',
    String(c.batch),
    '--seq',
    String(c.seqLen),
    '--shape',
    torchShape(c.config),
  ];
}

async function runCase(backend: BackendName, c: TrainCase, warmup: number, steps: number): Promise<Record<string, unknown>> {
  const model = PolicyModel.create(c.config, 1);
  const optimizer = tf.train.adam(LEARNING_RATE);
  const { batch: B, seqLen: T } = c;
  const rng = createRng(2, 'bench-train');
  const ids = Int32Array.from({ length: B * T }, () => 3 + Math.floor(rng.next() * (c.config.vocabSize - 3)));
  const positions = Int32Array.from({ length: B * T }, (_, i) => i % T);
  const inputIds = tf.tensor2d(ids, [B, T], 'int32');
  const mask = tf.ones([B, T], 'float32') as tf.Tensor2D;
  const positionIds = tf.tensor2d(positions, [B, T], 'int32');
  const vars = model.trainableVariables();
  let loss = 0;
  const step = async (): Promise<void> => {
    const { value, grads } = tf.variableGrads(() => {
      const { logprobs } = model.tokenLogprobs(inputIds, mask, positionIds);
      return tf.neg(tf.mean(logprobs)) as tf.Scalar;
    }, vars);
    optimizer.applyGradients(Object.entries(grads).map(([name, tensor]) => ({ name, tensor })));
    loss = (await value.data())[0];
    value.dispose();
    tf.dispose(grads);
  };
  for (let i = 0; i < warmup; i++) {
    await step();
  }
  const start = performance.now();
  for (let i = 0; i < steps; i++) {
    await step();
  }
  const seconds = (performance.now() - start) / 1000;
  const tokensPerStep = B * T;
  const result = {
    bench: 'train',
    backend,
    size: c.name,
    params: model.numParameters(),
    ...c.config,
    batch: B,
    seqLen: T,
    tokensPerStep,
    steps,
    msPerStep: Math.round((seconds * 1000) / steps),
    tokensPerSecond: Math.round((tokensPerStep * steps) / seconds),
    loss: Number(loss.toFixed(4)),
  };
  optimizer.dispose();
  tf.dispose([inputIds, mask, positionIds]);
  model.dispose();
  return result;
}
