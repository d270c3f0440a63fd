/**
 * The machine's rates on a TF.js backend, measured in this process, for the bounds of `bench/_bounds.ts`: an sgemm
 * rate and a memory bandwidth. Each is the best of several timed runs (a bound is what the machine can do at its
 * best, so a slow run, say while another process ran, must not lower it).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { initBackend, type BackendKind } from '../lib/model/backend.js';

/** What {@link measureRates} gives. */
export interface MachineRates {
  /** The backend TF.js runs on. */
  readonly backend: string;
  /** sgemm GFLOP/s: the best of the products below. */
  readonly gflops: number;
  /**
   * Memory GB/s: the fastest of reading a 128 MB matrix whole (its sum, and a row vector times it: what a decoding
   * step does with each weight) and adding two 64 MB vectors (two reads and a write a float).
   */
  readonly bandwidthGBs: number;
}

/**
 * Products whose rate bounds a step of a SmolLM2-sized model (width 576, MLP 1536): a training pass's
 * `[tokens, d] × [d, dFF]` at two token counts (a small batch's ~500 and a 16-row batch's ~1,100), and the MLP's
 * down projection.
 */
const SGEMM_SHAPES: readonly (readonly [number, number, number])[] = [
  [512, 576, 1536],
  [1024, 576, 1536],
  [1024, 1536, 576],
];

/** Timed runs of each measurement; the best counts. */
const TRIALS = 3;

const round = (x: number, digits = 1): number => Number(x.toFixed(digits));

/** Runs of `op` per second, the best of {@link TRIALS} timings of `reps` runs each (after one warm-up run). */
async function bestRate(reps: number, op: () => tf.Tensor): Promise<number> {
  tf.dispose(op()); // warm up: kernels, first allocations
  let best = 0;
  for (let trial = 0; trial < TRIALS; trial++) {
    const started = performance.now();
    let last: tf.Tensor | undefined;
    for (let i = 0; i < reps; i++) {
      tf.dispose(last);
      last = op();
    }
    await last!.data();
    tf.dispose(last);
    best = Math.max(best, reps / ((performance.now() - started) / 1000));
  }
  return best;
}

/**
 * Memory GB/s ({@link MachineRates.bandwidthGBs}). Reading is measured on its own: an addition also writes, and a
 * write costs a read of the line first, so its three streams alone understate how fast the weights can be read
 * (about 11 GB/s against 20–25 GB/s for the reads on two cores of the machines the docs' tables come from).
 */
async function bandwidth(): Promise<number> {
  const [rows, cols] = [4096, 8192]; // 128 MB: beyond any cache
  const matrix = tf.randomUniform([rows, cols]);
  const row = tf.ones([1, rows]);
  const matrixBytes = rows * cols * 4;
  const read = Math.max(await bestRate(5, () => tf.sum(matrix)), await bestRate(5, () => tf.matMul(row, matrix))) * matrixBytes;
  tf.dispose([matrix, row]);
  const floats = (64 * 2 ** 20) / 4;
  const [x, y] = [tf.randomUniform([floats]), tf.randomUniform([floats])];
  const added = (await bestRate(5, () => tf.add(x, y))) * 3 * floats * 4;
  tf.dispose([x, y]);
  return Math.max(read, added) / 1e9;
}

/** The sgemm rate and the memory bandwidth of `backend`, measured now (see the module's comment). */
export async function measureRates(backend: BackendKind): Promise<MachineRates> {
  await initBackend(backend, { logger: { info: () => undefined } });
  let gflops = 0;
  for (const [m, k, n] of SGEMM_SHAPES) {
    const [a, b] = [tf.randomUniform([m, k]), tf.randomUniform([k, n])];
    gflops = Math.max(gflops, ((await bestRate(8, () => tf.matMul(a, b))) * 2 * m * k * n) / 1e9);
    tf.dispose([a, b]);
  }
  return { backend: tf.getBackend(), gflops: round(gflops), bandwidthGBs: round(await bandwidth()) };
}
