import { createRequire } from 'node:module';

import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it, vi } from 'vitest';

import { BackendUnavailableError, ConfigError } from '../../lib/core/errors.js';
import { initBackend, installBackendFixes, type BackendKind } from '../../lib/model/backend.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { identityKernelsInstalled } from '../../lib/model/identityKernels.js';
import { ALL_BACKENDS } from '../helpers/backends.js';

const TOLERANCE = 1e-4;

/** Whether a native backend package is installed (it is not on the reference machine). */
const nativeInstalled = ['@tensorflow/tfjs-node-gpu', '@tensorflow/tfjs-node'].some((pkg) => {
  try {
    createRequire(import.meta.url).resolve(pkg);
    return true;
  } catch {
    return false;
  }
});
const quiet = { info: (): void => undefined };

function randn(shape: number[], seed: number): tf.Tensor {
  const size = shape.reduce((p, d) => p * d, 1);
  return tf.tensor(normalArray(size, 1, createRng(seed, 'spec')), shape);
}

/** Runs `f` on the named backend and returns plain arrays of its outputs. */
async function on(backend: 'cpu' | 'wasm' | 'tensorflow', f: () => tf.Tensor[]): Promise<Float32Array[]> {
  await initBackend(backend, { logger: quiet });
  const outs = f();
  const values = outs.map((t) => t.dataSync() as Float32Array).map((a) => Float32Array.from(a));
  tf.dispose(outs);
  return values;
}

function expectClose(a: Float32Array, b: Float32Array, tol = TOLERANCE): void {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    worst = Math.max(worst, Math.abs(a[i] - b[i]));
  }
  expect(worst).toBeLessThanOrEqual(tol);
}

describe('initBackend', () => {
  // Where `npm run native` has installed tfjs-node these name a package that is not there, so they run everywhere.
  const absent = nativeInstalled ? { nativePackages: ['@rxrl-spec/no-such-native-backend'] } : {};

  it('forcing the tensorflow backend without tfjs-node throws BackendUnavailableError naming the command to run', async () => {
    await initBackend('cpu', { logger: quiet });
    const error = await initBackend('tensorflow', { logger: quiet, ...absent }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(BackendUnavailableError);
    expect((error as Error).message).toContain('@tensorflow/tfjs-node');
    expect((error as Error).message).toContain('npm run native');
  });

  it('auto falls back to wasm without a native package and logs the choice once', async () => {
    const records: { obj: Record<string, unknown>; msg: string }[] = [];
    const name = await initBackend('auto', { logger: { info: (obj, msg) => records.push({ obj, msg }) }, ...absent });
    expect(name).toBe('wasm');
    expect(tf.getBackend()).toBe('wasm');
    expect(records).toHaveLength(1);
    expect(records[0].obj).toMatchObject({ backend: 'wasm', requested: 'auto' });
    expect(Object.keys(records[0].obj['tried'] as object)).toContain('tensorflow');
  });

  it('logs one line to stderr without a logger', async () => {
    const write = vi.spyOn(process.stderr, 'write').mockImplementation(() => true);
    let written: string[];
    try {
      await initBackend('cpu');
    } finally {
      written = write.mock.calls.map((c) => String(c[0]));
      write.mockRestore();
    }
    const lines = written.filter((l) => l.includes('tfjs backend'));
    expect(lines).toHaveLength(1);
    expect(lines[0]).toContain('cpu');
  });

  it('selects cpu and wasm by name, and rejects unknown names', async () => {
    expect(await initBackend('cpu', { logger: quiet })).toBe('cpu');
    expect(tf.getBackend()).toBe('cpu');
    expect(await initBackend('wasm', { logger: quiet })).toBe('wasm');
    expect(tf.getBackend()).toBe('wasm');
    await expect(initBackend('gpu' as BackendKind, { logger: quiet })).rejects.toBeInstanceOf(ConfigError);
  });

  it('overlapping calls run in call order: the last one wins, and tensors made after either work', async () => {
    await initBackend('cpu', { logger: quiet });
    // wasm's activation awaits its package and setBackend; without ordering, the cpu call would finish first.
    const chosen = await Promise.all([initBackend('wasm', { logger: quiet }), initBackend('cpu', { logger: quiet })]);
    expect(chosen).toEqual(['wasm', 'cpu']);
    expect(tf.getBackend()).toBe('cpu');
    const t = tf.tensor2d([1, 2, 3, 4], [2, 2]);
    expect(Array.from(await tf.transpose(t).data())).toEqual([1, 3, 2, 4]);
    t.dispose();
  });
});

describe('the BatchMatMul gradient override', () => {
  it('survives a TF.js bundle that registers the stock gradients again (as importing tfjs-node does)', async () => {
    installBackendFixes();
    const ours = tf.getGradient(tf.BatchMatMul);
    // What @tensorflow/tfjs does on import: every stock gradient registered, BatchMatMul's included.
    const stock = (await import('@tensorflow/tfjs-core/dist/gradients/BatchMatMul_grad.js' as string)) as {
      batchMatMulGradConfig: tf.GradConfig;
    };
    tf.registerGradient(stock.batchMatMulGradConfig);
    expect(tf.getGradient(tf.BatchMatMul)).toBe(stock.batchMatMulGradConfig);
    await initBackend(nativeInstalled ? 'tensorflow' : 'cpu', { logger: quiet });
    expect(tf.getGradient(tf.BatchMatMul)).toBe(ours);
    expect(ours).not.toBe(stock.batchMatMulGradConfig);
  });
});

describe('wasm BatchMatMul gradients agree with cpu', () => {
  beforeAll(() => {
    installBackendFixes();
  });

  it('BatchMatMul gradients (all flag combinations, batched and broadcast) match cpu', async () => {
    const cases: { a: number[]; b: number[]; ta: boolean; tb: boolean }[] = [
      { a: [5, 3], b: [3, 4], ta: false, tb: false },
      { a: [3, 5], b: [3, 4], ta: true, tb: false },
      { a: [5, 3], b: [4, 3], ta: false, tb: true },
      { a: [3, 5], b: [4, 3], ta: true, tb: true },
      { a: [2, 5, 3], b: [2, 3, 4], ta: false, tb: false },
      { a: [2, 3, 5], b: [2, 4, 3], ta: true, tb: true },
      { a: [2, 6, 3], b: [3, 4], ta: false, tb: false },
      { a: [2, 6, 3], b: [4, 3], ta: false, tb: true },
      { a: [2, 3, 6, 3], b: [3, 4], ta: false, tb: false },
      { a: [5, 3], b: [2, 3, 4], ta: false, tb: false },
    ];
    for (const [i, c] of cases.entries()) {
      const run = (): tf.Tensor[] => {
        const a = randn(c.a, 10 + i);
        const b = randn(c.b, 20 + i);
        const w = randn([...tf.matMul(a, b, c.ta, c.tb).shape], 30 + i);
        const grads = tf.grads((x: tf.Tensor, y: tf.Tensor) => tf.sum(tf.mul(tf.matMul(x, y, c.ta, c.tb), w)))([a, b]);
        return [tf.matMul(a, b, c.ta, c.tb), ...grads];
      };
      const cpu = await on('cpu', run);
      const wasm = await on('wasm', run);
      // Reference: the same gradients written out with explicit transposes on cpu.
      const ref = await on('cpu', () => {
        const a = randn(c.a, 10 + i);
        const b = randn(c.b, 20 + i);
        const out = tf.matMul(a, b, c.ta, c.tb);
        const w = randn([...out.shape], 30 + i);
        return [out, ...tf.grads((x: tf.Tensor, y: tf.Tensor) => tf.sum(tf.mul(tf.matMul(x, y, c.ta, c.tb), w)))([a, b])];
      });
      cpu.forEach((v, k) => expectClose(v, wasm[k]));
      cpu.forEach((v, k) => expectClose(v, ref[k]));
      // The native backend too, where `npm run native` installed it.
      if (nativeInstalled) (await on('tensorflow', run)).forEach((v, k) => expectClose(cpu[k], v));
    }
  });

  it('BatchMatMul gradients equal finite differences', async () => {
    await initBackend('cpu', { logger: quiet });
    const a = randn([2, 3, 4], 1);
    const b = randn([4, 2], 2);
    const f = (x: tf.Tensor, y: tf.Tensor): tf.Scalar => tf.sum(tf.square(tf.matMul(x, y)));
    const [da] = tf.grads(f)([a, b]);
    const analytic = da.dataSync();
    const base = a.dataSync();
    const h = 1e-2;
    for (const idx of [0, 5, 17, 23]) {
      const plus = Float32Array.from(base);
      const minus = Float32Array.from(base);
      plus[idx] += h;
      minus[idx] -= h;
      const fp = f(tf.tensor(plus, a.shape), b).dataSync()[0];
      const fm = f(tf.tensor(minus, a.shape), b).dataSync()[0];
      expect(analytic[idx]).toBeCloseTo((fp - fm) / (2 * h), 2);
    }
  });
});

describe('wasm kernels written in JS agree with cpu', () => {
  beforeAll(() => {
    installBackendFixes();
  });

  it('UnsortedSegmentSum on wasm matches cpu, and so does the gradient of gather', async () => {
    const run = (): tf.Tensor[] => {
      const x = randn([5, 3], 3);
      const ids = tf.tensor1d([2, 0, 2, 7, 1], 'int32'); // 7 is out of range and dropped
      const table = randn([6, 4], 4);
      const idx = tf.tensor1d([1, 4, 1, 0], 'int32');
      const w = randn([4, 4], 5);
      const [dTable] = tf.grads((t: tf.Tensor) => tf.sum(tf.mul(tf.gather(t, idx, 0), w)))([table]);
      const table3 = randn([2, 5, 3], 6);
      const idx3 = tf.tensor1d([4, 4, 0], 'int32');
      const w3 = randn([2, 3, 3], 7);
      const [dTable3] = tf.grads((t: tf.Tensor) => tf.sum(tf.mul(tf.gather(t, idx3, 1), w3)))([table3]);
      return [tf.unsortedSegmentSum(x, ids, 4), dTable, dTable3];
    };
    const cpu = await on('cpu', run);
    const wasm = await on('wasm', run);
    cpu.forEach((v, k) => expectClose(v, wasm[k]));
    expect(Array.from(cpu[1].subarray(4, 8))).toEqual(Array.from(wasm[1].subarray(4, 8)));
  });

  it('GatherV2 and Tile on wasm (rxrl JS kernels) equal cpu exactly: every axis, batchDims, int32 and bool', async () => {
    const run = (): tf.Tensor[] => {
      const x = randn([3, 4, 5, 2], 8);
      const ints = tf.tensor3d(
        Array.from({ length: 24 }, (_, i) => i * 7 - 30),
        [2, 3, 4],
        'int32',
      );
      const rows = tf.tensor1d([2, 0, 2, 1], 'int32');
      return [
        tf.gather(x, rows, 0),
        tf.gather(x, tf.tensor1d([3, 3, 0], 'int32'), 1),
        tf.gather(x, tf.tensor2d([4, 1, 0, 2], [2, 2], 'int32'), 2),
        tf.gather(x, tf.tensor1d([1], 'int32'), -1),
        tf.gather(x, tf.tensor2d([1, 0, 2, 3, 3, 0], [3, 2], 'int32'), 1, 1), // batchDims 1
        tf.gather(ints, tf.tensor1d([1, 1], 'int32'), 0),
        tf.cast(tf.gather(tf.greater(x, 0), rows, 0), 'float32'),
        tf.gather(randn([10, 64], 9), tf.tensor1d([9, 0, 4], 'int32'), 0), // rows long enough for a block copy
        tf.tile(x, [2, 1, 3, 2]),
        tf.tile(randn([2, 1, 40], 10), [1, 3, 1]),
        tf.tile(tf.tensor1d([1, 2, 3]), [3]),
        tf.tile(ints, [1, 2, 1]),
        tf.cast(tf.tile(tf.greater(x, 0), [1, 2, 1, 1]), 'float32'),
        tf.tile(tf.zeros([0, 2]), [3, 1]),
        tf.tile(randn([3, 1], 11), [1, 7]), // a column spread across the last axis (a reduction's gradient)
        tf.tile(randn([2, 1, 1], 12), [2, 3, 5]),
        tf.tile(tf.reshape(ints, [24, 1]), [1, 3]),
      ];
    };
    const cpu = await on('cpu', run);
    const wasm = await on('wasm', run);
    // rxrl's kernels are the ones registered (the stock ones come with a setup function that binds their C++)
    expect([tf.GatherV2, tf.Tile].map((k) => tf.getKernel(k, 'wasm')?.setupFunc)).toEqual([undefined, undefined]);
    expect(wasm.map((v) => Array.from(v))).toEqual(cpu.map((v) => Array.from(v)));
    const shapes = (): number[][] => {
      const outs = run();
      const s = outs.map((t) => t.shape);
      tf.dispose(outs);
      return s;
    };
    await initBackend('cpu', { logger: quiet });
    const cpuShapes = shapes();
    await initBackend('wasm', { logger: quiet });
    expect(shapes()).toEqual(cpuShapes);
  });

  it('GatherV2 on wasm refuses an index out of range, as the stock kernel does', async () => {
    await initBackend('wasm', { logger: quiet });
    const x = randn([3, 2], 11);
    const index = tf.tensor1d([0, 3], 'int32');
    const buffers = tf.backend().numDataIds();
    expect(() => tf.gather(x, index, 0)).toThrow('GatherV2: the index value 3 is not in [0, 2]');
    expect(tf.backend().numDataIds()).toBe(buffers); // nothing allocated on the heap and left there
    expect(() => tf.gather(x, tf.tensor1d([-1], 'int32'), 1)).toThrow('is not in [0, 1]');
    tf.dispose([x, index]);
  });
});

describe('a reshape to the same shape and a cast to the same dtype', () => {
  for (const backend of ALL_BACKENDS) {
    it(`share the input's data on ${backend}; other reshapes and casts compute as before`, async () => {
      await initBackend(backend, { logger: quiet });
      const before = tf.memory();
      const x = randn([2, 3], 13);
      const ints = tf.tensor1d([1, -2, 3], 'int32');
      const same = [tf.reshape(x, [2, 3]), tf.reshape(x, [-1, 3]), tf.reshape(x, [2, -1]), tf.cast(x, 'float32')];
      const intsSame = tf.cast(ints, 'int32');
      // The same data, nothing computed (on tensorflow each was a TensorFlow op of its own; on wasm the cast a copy).
      expect(same.map((t) => t.dataId === x.dataId)).toEqual([true, true, true, true]);
      expect(intsSame.dataId).toBe(ints.dataId);
      const values = Array.from(x.dataSync());
      const changed = [tf.reshape(x, [3, 2]), tf.reshape(x, [-1]), tf.cast(x, 'int32'), tf.cast(ints, 'float32')];
      expect(changed.map((t) => t.shape)).toEqual([[3, 2], [6], [2, 3], [3]]);
      expect(Array.from(changed[0].dataSync())).toEqual(values);
      expect(Array.from(changed[2].dataSync())).toEqual(values.map((v) => Math.trunc(v) + 0)); // + 0: no -0 in int32
      expect(Array.from(changed[3].dataSync())).toEqual([1, -2, 3]);
      // The input disposed, the shared tensors still hold its values; once all are disposed nothing is left.
      tf.dispose([x, ints]);
      expect(same.map((t) => Array.from(t.dataSync()))).toEqual([values, values, values, values]);
      expect(Array.from(intsSame.dataSync())).toEqual([1, -2, 3]);
      tf.dispose([...same, intsSame, ...changed]);
      expect(tf.memory().numTensors).toBe(before.numTensors);
      expect(tf.memory().numDataBuffers).toBe(before.numDataBuffers);
      // Gradients pass through them unchanged: d/dx Σ reshape(x)·cast(x) = 2x.
      const y = randn([2, 3], 14);
      const dy = tf.grad((v: tf.Tensor) => tf.sum(tf.mul(tf.reshape(v, [-1, 3]), tf.cast(v, 'float32'))))(y);
      expect(Array.from(dy.dataSync())).toEqual(Array.from(tf.mul(y, 2).dataSync()));
      tf.dispose([y, dy]);
      if (backend !== 'cpu') {
        expect(identityKernelsInstalled(backend)).toBe(true);
        // The backend's package registering its own Cast again (a second copy of it): the next fix-up wraps it again.
        const stock = { ...tf.getKernel(tf.Cast, backend)! };
        tf.unregisterKernel(tf.Cast, backend);
        tf.registerKernel({ ...stock, kernelFunc: (args) => (stock.kernelFunc as tf.KernelFunc)(args) });
        expect(identityKernelsInstalled(backend)).toBe(false);
        installBackendFixes();
        expect(identityKernelsInstalled(backend)).toBe(true);
        const z = randn([4], 15);
        const r = tf.cast(z, 'float32');
        expect(r.dataId).toBe(z.dataId);
        tf.dispose([z, r]);
      }
    });
  }
});
