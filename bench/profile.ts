/**
 * Where a train step and a decode step spend their time, per kernel, on each backend: `tf.profile` of one Adam
 * train step (forward, `tf.variableGrads` of the mean token NLL, update) of bench train's 4.2 M model (batch 16 ×
 * 64), and of one KV-cache decode step (batch 32) after a 16-token prompt. Kernels are summed by name.
 *
 * Usage: `npm run bench -- profile [--backends tensorflow,wasm] [--top 12]`.
 * Prints per (backend, phase) one JSON object: kernel count, total kernel time, wall time, and the top kernels by
 * time with their call counts and share; kernels that move data rather than compute (casts, transposes, concats,
 * reshapes, slices, copies) are summed as `dataMovementShare`.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { initBackend, nativeBackendInstalled, type BackendName } from '../lib/model/backend.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';
import { createRng } from '../lib/core/random.js';

const CONFIG: PolicyConfig = { vocabSize: 64, dModel: 256, nLayers: 4, nHeads: 4, dFF: 1024, maxSeqLen: 96 };
const TRAIN = { batch: 16, seqLen: 64 };
const DECODE = { batch: 32, prompt: 16, newTokens: 8 };
/** Kernels that rearrange or convert data without arithmetic. */
const DATA_MOVEMENT = new Set([
  'Cast',
  'Transpose',
  'Concat',
  'Reshape',
  'Slice',
  'StridedSlice',
  'Identity',
  'Tile',
  'GatherV2',
  'Pack',
  'Unpack',
  'ExpandDims',
  'Pad',
  'OnesLike',
  'ZerosLike',
  'Fill',
]);

interface KernelRow {
  name: string;
  calls: number;
  ms: number;
}

async function profiled(run: () => Promise<void>): Promise<{ rows: KernelRow[]; kernels: number; kernelMs: number; wallMs: number }> {
  const started = performance.now();
  const info = await tf.profile(run);
  const wallMs = performance.now() - started;
  const byName = new Map<string, KernelRow>();
  let kernelMs = 0;
  for (const k of info.kernels) {
    const ms = Number(await k.kernelTimeMs) || 0;
    kernelMs += ms;
    const row = byName.get(k.name) ?? { name: k.name, calls: 0, ms: 0 };
    row.calls++;
    row.ms += ms;
    byName.set(k.name, row);
  }
  return { rows: [...byName.values()].sort((a, b) => b.ms - a.ms), kernels: info.kernels.length, kernelMs, wallMs };
}

function report(backend: BackendName, phase: string, p: Awaited<ReturnType<typeof profiled>>, top: number): Record<string, unknown> {
  const share = (ms: number): number => Number((ms / Math.max(p.kernelMs, 1e-9)).toFixed(3));
  return {
    bench: 'profile',
    backend,
    phase,
    kernels: p.kernels,
    kernelMs: Number(p.kernelMs.toFixed(1)),
    wallMs: Number(p.wallMs.toFixed(1)),
    dataMovementShare: share(p.rows.filter((r) => DATA_MOVEMENT.has(r.name)).reduce((s, r) => s + r.ms, 0)),
    top: p.rows.slice(0, top).map((r) => ({ kernel: r.name, calls: r.calls, ms: Number(r.ms.toFixed(2)), share: share(r.ms) })),
  };
}

/** Runs the benchmark; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const at = args.indexOf('--backends');
  const backends = (at >= 0 ? args[at + 1].split(',') : [...(nativeBackendInstalled() ? ['tensorflow'] : []), 'wasm']) as BackendName[];
  const topAt = args.indexOf('--top');
  const top = topAt >= 0 ? Number(args[topAt + 1]) : 12;
  for (const backend of backends) {
    await initBackend(backend, { logger: { info: () => undefined } });
    const model = PolicyModel.create(CONFIG, 1);
    const rng = createRng(3, 'bench-profile');
    const token = (): number => 3 + Math.floor(rng.next() * (CONFIG.vocabSize - 3));

    // Train step.
    const { batch: B, seqLen: T } = TRAIN;
    const inputIds = tf.tensor2d(Int32Array.from({ length: B * T }, token), [B, T], 'int32');
    const mask = tf.ones([B, T]) as tf.Tensor2D;
    const positions = tf.tensor2d(
      Int32Array.from({ length: B * T }, (_, i) => i % T),
      [B, T],
      'int32',
    );
    const optimizer = tf.train.adam(1e-3);
    const vars = model.trainableVariables();
    const step = async (): Promise<void> => {
      const { value, grads } = tf.variableGrads(
        () => tf.neg(tf.mean(model.tokenLogprobs(inputIds, mask, positions).logprobs)) as tf.Scalar,
        vars,
      );
      optimizer.applyGradients(Object.entries(grads).map(([name, tensor]) => ({ name, tensor })));
      await value.data();
      value.dispose();
      tf.dispose(grads);
    };
    await step(); // warm-up
    console.log(JSON.stringify(report(backend, 'train-step', await profiled(step), top)));
    optimizer.dispose();
    tf.dispose([inputIds, mask, positions]);

    // Decode: generate a few tokens for a batch (prefill + KV-cache steps), profiled as a whole.
    const requests = Array.from({ length: DECODE.batch }, () => ({
      promptTokens: Array.from({ length: DECODE.prompt }, token),
      maxTokens: DECODE.newTokens,
      temperature: 1,
      stopTokens: [],
      seed: 1,
    }));
    await model.generate(requests); // warm-up
    console.log(
      JSON.stringify(
        report(backend, `generate-${DECODE.newTokens}-tokens`, await profiled(async () => void (await model.generate(requests))), top),
      ),
    );
    model.dispose();
  }
}
