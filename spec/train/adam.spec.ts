/**
 * rxrl's Adam: the same updates as TF.js's `tf.train.adam` (which the trainer used before) and as a float64
 * plain loop of PyTorch's `torch.optim.Adam`, in the kernels it promises, with a state that round-trips.
 */
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { createRng } from '../../lib/core/random.js';
import { Adam, gradientSquares } from '../../lib/train/adam.js';
import { ALL_BACKENDS } from '../helpers/backends.js';

/**
 * Largest relative difference of a weight or a moment from TF.js's (float32 arithmetic on both sides). TF.js
 * takes its bias corrections in float32 (`1 − β2^t` is 9.99987e-4 at t = 1, PyTorch's and ours 1e-3), so the
 * updates themselves differ by ~6e-6; on weights of order 0.1 to 1 moved by five steps of 1e-3 that is ~1e-7.
 */
const REL_TOLERANCE = 1e-6;
/**
 * The same for a second moment of the fused kernel: TensorFlow's kernel takes `1 − β2` in float32 as the nearest
 * multiple of 2^−24 to 1e-3, 0.9999871e-3, so `v` is 1.3e-5 smaller relatively (the update 6e-6, as TF.js's own).
 */
const FUSED_MOMENT_TOLERANCE = 2e-5;
/** Largest relative difference of an update (new − old weight, read back in float32) from float64 PyTorch. */
const UPDATE_TOLERANCE = 1e-4;
const SHAPES: readonly number[][] = [[7, 5], [5], [3, 4, 2], [1]];
const HYPER = { learningRate: 1e-3, beta1: 0.9, beta2: 0.999, epsilon: 1e-8 };
const STEPS = 5;

/** Seeded values of every shape, uniform in ±0.5 times `spread` to a power uniform in [−1, 1]. */
function values(seed: number, salt: string, spread: number): Float32Array[] {
  const rng = createRng(seed, salt);
  return SHAPES.map((shape) =>
    Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => (rng.next() - 0.5) * spread ** (rng.next() * 2 - 1)),
  );
}

function variables(init: readonly Float32Array[], prefix: string): tf.Variable[] {
  return init.map((data, i) => tf.variable(tf.tensor(data, SHAPES[i]), true, `${tf.getBackend()}/${prefix}${i}`));
}

function read(xs: readonly tf.Tensor[]): Float32Array[] {
  return xs.map((x) => x.dataSync() as Float32Array);
}

/** Largest `max|a − b| / max|b|` over the tensors (each tensor's error relative to its largest value). */
function worst(a: readonly ArrayLike<number>[], b: readonly ArrayLike<number>[]): number {
  let out = 0;
  a.forEach((x, i) => {
    let error = 0;
    let size = 0;
    for (let j = 0; j < x.length; j++) {
      error = Math.max(error, Math.abs(x[j] - b[i][j]));
      size = Math.max(size, Math.abs(b[i][j]));
    }
    out = Math.max(out, size > 0 ? error / size : error);
  });
  return out;
}

/** PyTorch's Adam (`torch/optim/adam.py`, single-tensor path, no amsgrad, no weight decay) in float64. */
function torchAdam(w: Float64Array[], grads: readonly Float32Array[][], scale: number): Float64Array[] {
  const m = w.map((x) => new Float64Array(x.length));
  const v = w.map((x) => new Float64Array(x.length));
  grads.forEach((step, s) => {
    const t = s + 1;
    const stepSize = HYPER.learningRate / (1 - HYPER.beta1 ** t);
    const root2 = Math.sqrt(1 - HYPER.beta2 ** t);
    w.forEach((x, i) => {
      for (let j = 0; j < x.length; j++) {
        const g = step[i][j] * scale;
        m[i][j] = HYPER.beta1 * m[i][j] + (1 - HYPER.beta1) * g;
        v[i][j] = HYPER.beta2 * v[i][j] + (1 - HYPER.beta2) * g * g;
        x[j] -= (stepSize * m[i][j]) / (Math.sqrt(v[i][j]) / root2 + HYPER.epsilon);
      }
    });
  });
  return w;
}

describe.each(ALL_BACKENDS)('Adam (%s backend)', (backend) => {
  beforeAll(async () => {
    await initBackend(backend, { logger: { info: () => undefined } });
  });

  // Weights of magnitude 0.25 … 0.75 with either sign (a weight near 0 would measure only TF.js's bias correction).
  const init = values(1, 'w', 1).map((x) => x.map((y) => Math.sign(y) * (0.25 + Math.abs(y))));
  const grads = Array.from({ length: STEPS }, (_, s) => values(2, `g${s}`, 1e2));

  it.each([1, 0.37])('matches TF.js tf.train.adam over %s-scaled gradients for five steps (weights and moments)', async (scale) => {
    const ours = variables(init, `ours${scale}/`);
    const theirs = variables(init, `theirs${scale}/`);
    const adam = new Adam(ours, HYPER);
    const reference = tf.train.adam(HYPER.learningRate, HYPER.beta1, HYPER.beta2, HYPER.epsilon);
    for (const step of grads) {
      const g = step.map((data, i) => tf.tensor(data, SHAPES[i]));
      adam.apply(g, { scale });
      tf.tidy(() => reference.applyGradients(theirs.map((w, i) => ({ name: w.name, tensor: tf.mul(g[i], scale) }))));
      tf.dispose(g);
      expect(worst(read(ours), read(theirs))).toBeLessThan(REL_TOLERANCE);
    }
    const [, ...moments] = await reference.getWeights();
    const state = await adam.state();
    expect(state.step).toBe(STEPS);
    const tolerance = adam.kernelName === 'fused' ? FUSED_MOMENT_TOLERANCE : REL_TOLERANCE;
    expect(worst([...state.m, ...state.v], read(moments.map((x) => x.tensor)))).toBeLessThan(tolerance);
    tf.dispose([...ours, ...theirs]);
    adam.dispose();
    reference.dispose();
  });

  it('matches a float64 loop of PyTorch Adam on the updates themselves (clip scale folded in)', () => {
    const scale = 0.37;
    const ours = variables(init, 'torch/');
    const adam = new Adam(ours, HYPER);
    for (const step of grads) {
      const g = step.map((data, i) => tf.tensor(data, SHAPES[i]));
      adam.apply(g, { scale });
      tf.dispose(g);
    }
    const expected = torchAdam(
      init.map((x) => Float64Array.from(x)),
      grads,
      scale,
    );
    const update = (w: ArrayLike<number>[]): Float64Array[] => w.map((x, i) => Float64Array.from(x, (y, j) => y - init[i][j]));
    // Relative to the updates, not the weights: float32 weights of order 1 round an update of order 1e-3 to ~6e-5.
    expect(worst(update(read(ours)), update(expected))).toBeLessThan(UPDATE_TOLERANCE);
    tf.dispose(ours);
    adam.dispose();
  });

  it("runs TensorFlow's fused kernel on the native backend, else 11 TF.js kernels a variable with the squares at hand, 12 without; leaks no tensor", async () => {
    const ours = variables(init, 'kernels/');
    const start = tf.memory().numTensors;
    const adam = new Adam(ours, HYPER);
    expect(adam.kernelName).toBe(backend === 'tensorflow' ? 'fused' : 'ops');
    const g = grads[0].map((data, i) => tf.tensor(data, SHAPES[i]));
    adam.apply(g); // the moments are made here
    const before = tf.memory().numTensors;
    const count = async (fn: () => void): Promise<number> => (await tf.profile(fn)).kernels.length;
    const { squares, norm } = adam.gradientNorm(g);
    expect(squares.every((x) => x === undefined)).toBe(adam.kernelName === 'fused'); // the fused kernel needs none
    if (adam.kernelName === 'ops') {
      expect(await count(() => adam.apply(g))).toBe(12 * SHAPES.length);
      expect(await count(() => adam.apply(g, { squares, scale: 0.5 }))).toBe(11 * SHAPES.length);
    } else {
      // The fused kernel runs outside TF.js's kernel registry; what TF.js sees is the clip's one multiply a variable.
      expect(await count(() => adam.apply(g))).toBe(0);
      expect(await count(() => adam.apply(g, { squares, scale: 0.5 }))).toBe(SHAPES.length);
    }
    const expectedNorm = Math.sqrt(grads[0].reduce((s, x) => s + x.reduce((a, b) => a + b * b, 0), 0));
    expect(Math.abs(norm - expectedNorm) / expectedNorm).toBeLessThan(1e-6);
    const normOf = (xs: (tf.Tensor | undefined)[], kernel = adam.gradientNorm.bind(adam)): number => {
      const out = kernel(xs);
      tf.dispose(out.squares.filter((x): x is tf.Tensor => x !== undefined));
      return out.norm;
    };
    expect(Math.abs(normOf(g, gradientSquares) - norm) / norm).toBeLessThan(1e-6);
    const [nan, inf] = [tf.tensor1d([1, NaN]), tf.tensor1d([Infinity])];
    expect(normOf([nan, undefined, undefined, undefined])).toBeNaN();
    expect(normOf([undefined, undefined, inf, undefined])).toBe(Infinity);
    expect(normOf([undefined, undefined, undefined, undefined])).toBe(0);
    tf.dispose([nan, inf]);
    tf.dispose([...g, ...squares.filter((x): x is tf.Tensor => x !== undefined)]);
    expect(tf.memory().numTensors).toBe(before - SHAPES.length);
    adam.dispose();
    expect(tf.memory().numTensors).toBe(start);
    tf.dispose(ours);
  });

  it('changes the variables only: a tensor that held a weight before an update keeps its values', () => {
    const ours = variables(init, 'kept/');
    const kept = ours.map((w) => tf.clone(w)); // shares the variable's data until the variable is assigned
    const adam = new Adam(ours, HYPER);
    for (const step of grads.slice(0, 2)) {
      const g = step.map((data, i) => tf.tensor(data, SHAPES[i]));
      adam.apply(g);
      tf.dispose(g);
    }
    expect(read(kept)).toEqual(init);
    expect(read(ours)).not.toEqual(init);
    tf.dispose([...ours, ...kept]);
    adam.dispose();
  });

  it('round-trips its state: a copy set on fresh variables continues with the same updates', async () => {
    const a = variables(init, 'a/');
    const b = variables(init, 'b/');
    const adam = new Adam(a, HYPER);
    expect(await adam.state()).toEqual({ step: 0, m: [], v: [] });
    const apply = (opt: Adam, step: readonly Float32Array[]): void => {
      const g = step.map((data, i) => tf.tensor(data, SHAPES[i]));
      opt.apply(g);
      tf.dispose(g);
    };
    apply(adam, grads[0]);
    apply(adam, grads[1]);
    read(a).forEach((data, i) => b[i].assign(tf.tensor(data, SHAPES[i])));
    const resumed = new Adam(b, HYPER);
    resumed.setState(await adam.state());
    expect(resumed.step).toBe(2);
    apply(adam, grads[2]);
    apply(resumed, grads[2]);
    expect(read(b)).toEqual(read(a));
    expect(await resumed.state()).toEqual(await adam.state());
    tf.dispose([...a, ...b]);
    adam.dispose();
    resumed.dispose();
  });

  it("continues from TF.js Adam's state (what checkpoints written before held) as TF.js Adam continues", async () => {
    const ours = variables(init, 'cont-ours/');
    const theirs = variables(init, 'cont-theirs/');
    const reference = tf.train.adam(HYPER.learningRate, HYPER.beta1, HYPER.beta2, HYPER.epsilon);
    const tensors = (step: readonly Float32Array[]): tf.Tensor[] => step.map((data, i) => tf.tensor(data, SHAPES[i]));
    const applyReference = (step: readonly Float32Array[]): void => {
      const g = tensors(step);
      reference.applyGradients(theirs.map((w, i) => ({ name: w.name, tensor: g[i] })));
      tf.dispose(g);
    };
    applyReference(grads[0]);
    applyReference(grads[1]);
    read(theirs).forEach((data, i) => ours[i].assign(tf.tensor(data, SHAPES[i])));
    const [iter, ...moments] = await reference.getWeights();
    const saved = read(moments.map((x) => x.tensor));
    const adam = new Adam(ours, HYPER);
    adam.setState({ step: (await iter.tensor.data())[0], m: saved.slice(0, SHAPES.length), v: saved.slice(SHAPES.length) });
    tf.dispose(iter.tensor);
    for (const step of grads.slice(2)) {
      applyReference(step);
      const g = tensors(step);
      adam.apply(g);
      tf.dispose(g);
    }
    expect(adam.step).toBe(STEPS);
    expect(worst(read(ours), read(theirs))).toBeLessThan(REL_TOLERANCE);
    tf.dispose([...ours, ...theirs]);
    adam.dispose();
    reference.dispose();
  });

  it('leaves a variable without a gradient alone and refuses mismatched input with ConfigError', async () => {
    const ours = variables(init, 'skip/');
    const adam = new Adam(ours, HYPER);
    const g = grads[0].map((data, i) => (i === 1 ? undefined : tf.tensor(data, SHAPES[i])));
    adam.apply(g);
    expect(read([ours[1]])[0]).toEqual(init[1]);
    expect(read([ours[0]])[0]).not.toEqual(init[0]);
    expect(() => adam.apply(g.slice(1))).toThrow(ConfigError);
    const state = await adam.state();
    expect(() => adam.setState({ ...state, m: state.m.slice(1) })).toThrow(ConfigError);
    expect(() => adam.setState({ ...state, v: state.v.map((x) => x.subarray(1)) })).toThrow(ConfigError);
    expect(() => adam.setState({ ...state, step: -1 })).toThrow(ConfigError);
    expect(() => new Adam(ours, { learningRate: 0 })).toThrow(ConfigError);
    expect(() => new Adam(ours, { learningRate: 1, beta2: 1 })).toThrow(ConfigError);
    tf.dispose([...ours, ...g.filter((x): x is tf.Tensor => x !== undefined)]);
    adam.dispose();
  });

  it('gives each variable what it would get alone, bit for bit (the ops kernel stacks the variables of one shape, in fewer kernels)', async () => {
    // A model's blocks repeat their shapes: three [4, 3], two [5], one [2].
    const shapes = [[4, 3], [5], [4, 3], [4, 3], [5], [2]];
    const rng = createRng(7, 'stacked');
    const data = (): Float32Array[] =>
      shapes.map((shape) => Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, () => rng.next() - 0.5));
    const start = data();
    const make = (prefix: string): tf.Variable[] =>
      start.map((x, i) => tf.variable(tf.tensor(x, shapes[i]), true, `${tf.getBackend()}/${prefix}${i}`));
    const [stacked, alone] = [make('stacked/'), make('alone/')];
    const adam = new Adam(stacked, HYPER);
    const single = alone.map((w) => new Adam([w], HYPER));
    // Step 2 leaves one [4, 3] variable without a gradient: its group is then updated one variable at a time.
    for (const [step, skip] of [
      [0, -1],
      [1, 2],
      [2, -1],
    ]) {
      const g = data().map((x, i) => (i === skip ? undefined : tf.tensor(x, shapes[i])));
      adam.apply(g, { scale: 0.6 });
      single.forEach((opt, i) => opt.apply([g[i]], { scale: 0.6 })); // a step for each, with a gradient or not
      tf.dispose(g.filter((x): x is tf.Tensor => x !== undefined));
      expect(read(stacked), `step ${step}`).toEqual(read(alone));
    }
    const state = await adam.state();
    const states = await Promise.all(single.map((opt) => opt.state()));
    expect(state.m).toEqual(states.map((x) => x.m[0]));
    expect(state.v).toEqual(states.map((x) => x.v[0]));
    const resumed = new Adam(make('resumed/'), HYPER);
    resumed.setState(state);
    expect(await resumed.state()).toEqual(state);
    const g = data().map((x, i) => tf.tensor(x, shapes[i]));
    const before = tf.memory().numTensors;
    const kernels = (await tf.profile(() => adam.apply(g))).kernels.length;
    expect(tf.memory().numTensors).toBe(before); // nothing left behind
    // ops, per group: stack the weights, the gradients, eleven elementwise kernels and the square, unstack the
    // weights. fused: nothing in TF.js's registry (one TensorFlow kernel a variable).
    if (adam.kernelName === 'ops') expect(kernels).toBeLessThan(12 * shapes.length);
    else expect(kernels).toBe(0);
    tf.dispose([...g, ...stacked, ...alone, ...resumed.variables]);
    [adam, resumed, ...single].forEach((opt) => opt.dispose());
  });
});
