import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { ALL_BACKENDS } from '../helpers/backends.js';

/** Central finite difference step and tolerance (float32 arithmetic). */
const STEP = 1e-2;
const TOLERANCE = 2e-2;

function randn(shape: number[], seed: number, shift = 0): tf.Tensor {
  const size = shape.reduce((p, d) => p * d, 1);
  return tf.tensor(
    Float32Array.from(normalArray(size, 1, createRng(seed, 'grad')), (v) => v + shift),
    shape,
  );
}

/** Checks `tf.grad(f)` against central differences at every element of `x`. */
function checkGradient(name: string, f: (x: tf.Tensor) => tf.Tensor, x: tf.Tensor): void {
  const loss = (t: tf.Tensor): tf.Scalar => {
    const y = f(t);
    const weights = tf.reshape(tf.div(tf.range(1, y.size + 1), y.size), y.shape); // distinct weight per output
    return tf.sum(tf.mul(y, weights));
  };
  const analytic = tf.tidy(() => tf.grad(loss)(x).dataSync());
  const base = x.dataSync();
  for (let i = 0; i < base.length; i++) {
    const plus = Float32Array.from(base);
    const minus = Float32Array.from(base);
    plus[i] += STEP;
    minus[i] -= STEP;
    const numeric = tf.tidy(
      () => (loss(tf.tensor(plus, x.shape)).dataSync()[0] - loss(tf.tensor(minus, x.shape)).dataSync()[0]) / (2 * STEP),
    );
    expect(Math.abs(analytic[i] - numeric), `${name}[${i}]: ${analytic[i]} vs ${numeric}`).toBeLessThanOrEqual(
      TOLERANCE * Math.max(1, Math.abs(numeric)),
    );
  }
}

describe('core gradients (tfjs-core alone registers none in Node)', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
  });

  const b = (): tf.Tensor => randn([1, 3], 99, 0.5);
  const cases: [string, (x: tf.Tensor) => tf.Tensor, tf.Tensor | (() => tf.Tensor)][] = [
    ['add (broadcast)', (x) => tf.add(x, b()), () => randn([2, 3], 1)],
    ['sub (broadcast, rhs)', (x) => tf.sub(b(), x), () => randn([2, 3], 2)],
    ['mul (broadcast lhs)', (x) => tf.mul(x, randn([2, 3], 50)), () => randn([1, 3], 3)],
    ['div', (x) => tf.div(randn([2, 3], 51), tf.add(tf.square(x), 1)), () => randn([2, 3], 4)],
    ['maximum/minimum', (x) => tf.add(tf.maximum(x, 0.1), tf.minimum(x, -0.2)), () => randn([2, 3], 5)],
    ['pow', (x) => tf.pow(tf.add(tf.square(x), 1), randn([2, 3], 52)), () => randn([2, 3], 6)],
    ['squaredDifference', (x) => tf.squaredDifference(x, b()), () => randn([2, 3], 7)],
    ['addN', (x) => tf.addN([x, tf.mul(x, 2), tf.square(x)]), () => randn([2, 3], 8)],
    ['neg/abs/exp', (x) => tf.add(tf.neg(tf.abs(x)), tf.exp(x)), () => randn([2, 3], 9)],
    [
      'log/log1p/sqrt/rsqrt',
      (x) => {
        const p = tf.add(tf.square(x), 0.5);
        return tf.addN([tf.log(p), tf.log1p(p), tf.sqrt(p), tf.rsqrt(p), tf.reciprocal(p)]);
      },
      () => randn([2, 3], 10),
    ],
    ['tanh/sigmoid/softplus/relu', (x) => tf.addN([tf.tanh(x), tf.sigmoid(x), tf.softplus(x), tf.relu(x)]), () => randn([2, 3], 11)],
    ['sin/cos/erf/expm1', (x) => tf.addN([tf.sin(x), tf.cos(x), tf.erf(x), tf.expm1(x)]), () => randn([2, 3], 12)],
    ['clipByValue', (x) => tf.clipByValue(x, -0.5, 0.5), () => randn([2, 3], 13)],
    ['where/greater', (x) => tf.where(tf.greater(x, 0), tf.mul(x, 3), tf.square(x)), () => randn([2, 3], 14)],
    ['sum/mean', (x) => tf.add(tf.sum(x, 1, true), tf.mean(x, 0)), () => randn([2, 3], 15)],
    ['max/min', (x) => tf.add(tf.max(x, -1), tf.sum(tf.min(x, 0, false))), () => randn([2, 3], 16)],
    ['reshape/transpose/expandDims', (x) => tf.transpose(tf.expandDims(tf.reshape(x, [3, 2]), 0), [2, 0, 1]), () => randn([2, 3], 17)],
    [
      'slice/pad',
      (x) =>
        tf.pad(tf.slice(x, [0, 1], [2, -1]), [
          [1, 0],
          [0, 2],
        ]),
      () => randn([2, 3], 18),
    ],
    // Copy before reversing: the array tf.split returns is the tape's own output list.
    ['concat/split', (x) => tf.concat([...tf.split(tf.concat([x, tf.square(x)], 1), [1, 5], 1)].reverse(), 1), () => randn([2, 3], 19)],
    [
      'stack/unstack',
      (x) =>
        tf.stack(
          tf.unstack(x, 1).map((t, i) => tf.mul(t, i + 1)),
          0,
        ),
      () => randn([2, 3], 20),
    ],
    ['tile', (x) => tf.tile(x, [2, 3]), () => randn([2, 3], 21)],
    ['gather', (x) => tf.gather(x, tf.tensor1d([2, 0, 2], 'int32'), 1), () => randn([2, 3], 22)],
    ['softmax/logSoftmax', (x) => tf.add(tf.softmax(x), tf.logSoftmax(x)), () => randn([2, 3], 23)],
    ['matMul', (x) => tf.matMul(x, randn([3, 4], 53)), () => randn([2, 3], 24)],
    ['cast/clone', (x) => tf.mul(tf.clone(tf.cast(x, 'float32')), 2), () => randn([2, 3], 25)],
  ];
  for (const [name, f, make] of cases) {
    it(`${name} matches finite differences`, () => {
      const x = typeof make === 'function' ? make() : make;
      checkGradient(name, f, x);
      x.dispose();
    });
  }
});

describe.each(ALL_BACKENDS)('Sum and Mean gradients (%s backend)', (backend) => {
  beforeAll(async () => {
    await initBackend(backend, { logger: { info: () => undefined } });
  });

  /** Sizes of every tensor made from JavaScript values while `f` runs. */
  function hostTensorSizes(f: () => void): number[] {
    const engine = tf.engine() as unknown as { makeTensor: (values: ArrayLike<unknown>, ...rest: unknown[]) => tf.Tensor };
    const makeTensor = engine.makeTensor;
    const sizes: number[] = [];
    engine.makeTensor = (values, ...rest) => {
      sizes.push(values.length);
      return makeTensor.call(engine, values, ...rest);
    };
    try {
      f();
    } finally {
      engine.makeTensor = makeTensor;
    }
    return sizes;
  }

  it("equal dy spread over the reduced axes (÷ their size for Mean), built on the device, not from a host array of x's size", () => {
    const x = randn([6, 50], 40);
    const w = randn([6], 41);
    const w3 = randn([2, 1, 5], 42);
    const x3 = randn([2, 3, 5], 43);
    const cases: [string, () => tf.Tensor, tf.Tensor][] = [
      [
        'sum, last axis',
        () => tf.grad((t: tf.Tensor) => tf.sum(tf.mul(tf.sum(t, -1), w)))(x),
        tf.mul(tf.reshape(w, [6, 1]), tf.onesLike(x)),
      ],
      [
        'mean, last axis',
        () => tf.grad((t: tf.Tensor) => tf.sum(tf.mul(tf.mean(t, -1), w)))(x),
        tf.div(tf.mul(tf.reshape(w, [6, 1]), tf.onesLike(x)), 50),
      ],
      ['sum, middle axis kept', () => tf.grad((t: tf.Tensor) => tf.sum(tf.mul(tf.sum(t, 1, true), w3)))(x3), tf.mul(w3, tf.onesLike(x3))],
      ['mean, every axis', () => tf.grad((t: tf.Tensor) => tf.mul(tf.mean(t), 3))(x3), tf.div(tf.mul(tf.onesLike(x3), 3), 30)],
    ];
    for (const [name, grad, expected] of cases) {
      let g: tf.Tensor | undefined;
      const sizes = hostTensorSizes(() => (g = grad()));
      expect(Array.from(g!.dataSync()), name).toEqual(Array.from(expected.dataSync()));
      expect(Math.max(0, ...sizes), `${name}: largest host tensor`).toBeLessThan(x3.size);
      tf.dispose([g!, expected]);
    }
    tf.dispose([x, w, w3, x3]);
  });
});
