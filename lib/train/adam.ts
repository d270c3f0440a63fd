/**
 * Adam (Kingma & Ba 2015, Algorithm 1 with the efficient ordering of §2) over a fixed list of variables, in the
 * few kernels of the standard TF.js ops: the variables of one shape are updated as one stacked tensor (a model's
 * 30 blocks share six shapes), so a step runs about fifteen kernels a shape instead of twelve a variable; the step's
 * scalars are made once a step, and the global-norm clip is folded into those scalars.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';

/** Hyper-parameters of {@link Adam}. */
export interface AdamOptions {
  /** Learning rate α. */
  readonly learningRate: number;
  /** Decay of the first moment β1. Default 0.9. */
  readonly beta1?: number | undefined;
  /** Decay of the second moment β2. Default 0.999. */
  readonly beta2?: number | undefined;
  /** ε added to √v̂. Default 1e-8. */
  readonly epsilon?: number | undefined;
}

/** Adam's state: the number of updates taken and each variable's moments (in the variables' shapes). */
export interface AdamState {
  /** Updates taken so far (PyTorch's `step`, TF.js's `iterations`). */
  readonly step: number;
  /** First moments `m`, one per variable in the order of {@link Adam.variables}, or none (zeros: no update yet). */
  readonly m: readonly Float32Array[];
  /** Second moments `v`, as many as `m`. */
  readonly v: readonly Float32Array[];
}

/** Options of {@link Adam.apply}. */
export interface AdamApplyOptions {
  /** Factor on every gradient (a global-norm clip's). Default 1. */
  readonly scale?: number;
  /** Each gradient's elementwise square (as {@link gradientSquares} returns them), or computed. */
  readonly squares?: readonly (tf.Tensor | undefined)[];
}

/**
 * The elementwise square of each gradient and their global L2 norm `√(Σ g²)` (`undefined` gradients count 0):
 * two kernels a gradient, and the squares serve {@link Adam.apply} after a clip by that norm.
 *
 * @param grads - gradients (not disposed).
 * @returns the squares (the caller disposes them) and the norm (NaN or ∞ when a gradient is not finite).
 */
export function gradientSquares(grads: readonly (tf.Tensor | undefined)[]): { squares: (tf.Tensor | undefined)[]; norm: number } {
  const squares = grads.map((g) => (g === undefined ? undefined : tf.square(g)));
  const present = squares.filter((x): x is tf.Tensor => x !== undefined);
  if (present.length === 0) return { squares, norm: 0 };
  const total = tf.tidy(() => tf.addN(present.map((x) => tf.sum(x)))); // []
  try {
    return { squares, norm: Math.sqrt(total.dataSync()[0]) };
  } finally {
    total.dispose();
  }
}

/**
 * Adam as PyTorch's `torch.optim.Adam` computes it: for each variable with gradient `g` scaled by `scale`,
 *
 *     m ← β1·m + (1 − β1)·scale·g
 *     v ← β2·v + (1 − β2)·scale²·g²
 *     w ← w − α_t · m / (√v + ε̂),   α_t = α·√(1 − β2^t) / (1 − β1^t),   ε̂ = ε·√(1 − β2^t)
 *
 * which is `w − α·m̂ / (√v̂ + ε)` with `m̂ = m / (1 − β1^t)`, `v̂ = v / (1 − β2^t)` rearranged so the bias
 * corrections are two numbers a step (computed in float64, as PyTorch does) rather than two kernels a variable.
 * Moments start at zero on the first update; a variable whose gradient is `undefined` is left as it is.
 */
export class Adam {
  private steps = 0;
  /** The variables by shape, each group's moments stacked `[n, ...shape]` (a lone variable's in its own shape). */
  private readonly groups: readonly ShapeGroup[];
  private m: tf.Variable[] | null = null;
  private v: tf.Variable[] | null = null;
  private readonly beta1: number;
  private readonly beta2: number;
  private readonly epsilon: number;

  /**
   * @param variables - the variables it updates, in the order gradients are given.
   * @param options - learning rate, betas and ε.
   */
  constructor(
    readonly variables: readonly tf.Variable[],
    private readonly options: AdamOptions,
  ) {
    this.beta1 = options.beta1 ?? 0.9;
    this.beta2 = options.beta2 ?? 0.999;
    this.epsilon = options.epsilon ?? 1e-8;
    if (!(options.learningRate > 0)) throw new ConfigError(`learningRate must be > 0, got ${options.learningRate}`);
    for (const [name, beta] of [
      ['beta1', this.beta1],
      ['beta2', this.beta2],
    ] as const) {
      if (!(beta >= 0 && beta < 1)) throw new ConfigError(`${name} must be in [0, 1), got ${beta}`);
    }
    if (!(this.epsilon >= 0)) throw new ConfigError(`epsilon must be >= 0, got ${this.epsilon}`);
    this.groups = groupByShape(variables);
  }

  /** Updates taken so far. */
  get step(): number {
    return this.steps;
  }

  /**
   * One update. The arithmetic is elementwise, so stacking a shape's variables gives each weight the values it
   * would get alone, bit for bit.
   *
   * @param grads - the gradient of each variable (same order and shapes as {@link Adam.variables}), or
   *   `undefined` for a variable to leave alone. Not disposed.
   * @param options - `scale`: factor on every gradient (a global-norm clip), folded into the step's scalars,
   *   default 1; `squares`: each gradient's elementwise square, when the caller has them ({@link gradientSquares}),
   *   saving a kernel for a variable of a shape no other has. Not disposed.
   */
  apply(grads: readonly (tf.Tensor | undefined)[], options: AdamApplyOptions = {}): void {
    const n = this.variables.length;
    const { scale = 1, squares } = options;
    if (grads.length !== n || (squares !== undefined && squares.length !== n)) {
      throw new ConfigError(`Adam.apply: ${grads.length} gradients (${squares?.length ?? 'no'} squares) for ${n} variables`);
    }
    const { m, v } = this.moments();
    const t = this.steps + 1;
    const correction1 = 1 - this.beta1 ** t;
    const root2 = Math.sqrt(1 - this.beta2 ** t);
    tf.tidy(() => {
      const step: StepScalars = {
        beta1: tf.scalar(this.beta1),
        beta2: tf.scalar(this.beta2),
        gain1: tf.scalar((1 - this.beta1) * scale),
        gain2: tf.scalar((1 - this.beta2) * scale * scale),
        epsilon: tf.scalar(this.epsilon * root2),
        rate: tf.scalar((this.options.learningRate * root2) / correction1),
      };
      // One tidy a group, so a group's intermediates are released before the next group's are made.
      this.groups.forEach(({ members }, k) =>
        tf.tidy(() => {
          const given = members.filter((i) => grads[i] !== undefined);
          if (given.length === 0) return;
          if (members.length === 1) {
            const [i] = members;
            const g = grads[i]!;
            const next = adamUpdate(this.variables[i], g, squares?.[i] ?? tf.square(g), m[k], v[k], step);
            assignAll([m[k], v[k], this.variables[i]], next);
          } else if (given.length === members.length) {
            const g = tf.stack(members.map((i) => grads[i]!));
            const next = adamUpdate(tf.stack(members.map((i) => this.variables[i])), g, tf.square(g), m[k], v[k], step);
            assignAll([m[k], v[k]], next);
            tf.unstack(next[2]).forEach((w, j) => this.variables[members[j]].assign(w));
          } else {
            this.applySome(members, k, grads, step);
          }
        }),
      );
    });
    this.steps = t;
  }

  /** A stacked group of which only some variables have gradients: those are updated one by one, the rest kept. */
  private applySome(members: readonly number[], k: number, grads: readonly (tf.Tensor | undefined)[], step: StepScalars): void {
    const { m, v } = this.moments();
    const [ms, vs] = [tf.unstack(m[k]), tf.unstack(v[k])];
    members.forEach((i, j) => {
      const g = grads[i];
      if (g === undefined) return;
      const [m1, v1, w1] = adamUpdate(this.variables[i], g, tf.square(g), ms[j], vs[j], step);
      [ms[j], vs[j]] = [m1, v1];
      this.variables[i].assign(w1);
    });
    assignAll([m[k], v[k]], [tf.stack(ms), tf.stack(vs)]);
  }

  /** A copy of the state (with no moments before the first update or a {@link Adam.setState} with some). */
  async state(): Promise<AdamState> {
    if (this.m === null || this.v === null) return { step: this.steps, m: [], v: [] };
    const read = async (stacked: readonly tf.Variable[]): Promise<Float32Array[]> => {
      const out = new Array<Float32Array>(this.variables.length);
      await Promise.all(
        this.groups.map(async ({ members }, k) => {
          const values = (await stacked[k].data()) as Float32Array;
          const size = values.length / members.length;
          members.forEach((i, j) => (out[i] = values.slice(j * size, (j + 1) * size)));
        }),
      );
      return out;
    };
    return { step: this.steps, m: await read(this.m), v: await read(this.v) };
  }

  /**
   * Replaces the state with `state` (as {@link Adam.state} returns it: moments in the variables' shapes, one per
   * variable, or none for zeros). Moments are checked against the variables' sizes before anything changes.
   *
   * @throws {@link ConfigError} when the moments do not match the variables or the step is not an integer ≥ 0.
   */
  setState(state: AdamState): void {
    const n = this.variables.length;
    const none = state.m.length === 0 && state.v.length === 0;
    if (!none && (state.m.length !== n || state.v.length !== n))
      throw new ConfigError(`Adam.setState: moments for ${state.m.length}/${state.v.length} of ${n} variables`);
    if (!(Number.isInteger(state.step) && state.step >= 0))
      throw new ConfigError(`Adam.setState: step must be an integer >= 0, got ${state.step}`);
    this.variables.forEach((w, i) => {
      for (const x of none ? [] : [state.m[i], state.v[i]]) {
        if (x.length !== w.size)
          throw new ConfigError(`Adam.setState: moment ${i} has ${x.length} values, variable ${w.name} has ${w.size}`);
      }
    });
    this.disposeMoments();
    this.steps = state.step;
    if (none) return;
    const stacked = (moments: readonly Float32Array[]): tf.Variable[] =>
      this.groups.map(({ members, shape }) => {
        const values = new Float32Array(members.length * tf.util.sizeFromShape([...shape]));
        members.forEach((i, j) => values.set(moments[i], j * moments[i].length));
        return tf.tidy(() => tf.variable(tf.tensor(values, stackedShape(members, shape)), false));
      });
    this.m = stacked(state.m);
    this.v = stacked(state.v);
  }

  /** Releases the moments (the variables belong to the caller). */
  dispose(): void {
    this.disposeMoments();
  }

  private moments(): { m: tf.Variable[]; v: tf.Variable[] } {
    const zeros = (): tf.Variable[] =>
      this.groups.map(({ members, shape }) => tf.tidy(() => tf.variable(tf.zeros(stackedShape(members, shape)), false)));
    this.m ??= zeros();
    this.v ??= zeros();
    return { m: this.m, v: this.v };
  }

  private disposeMoments(): void {
    tf.dispose([...(this.m ?? []), ...(this.v ?? [])]);
    this.m = null;
    this.v = null;
  }
}

/** Variables of one shape and dtype, by their index in {@link Adam.variables}. */
interface ShapeGroup {
  readonly members: readonly number[];
  readonly shape: readonly number[];
}

/** The scalars of one Adam step (see {@link Adam}). */
interface StepScalars {
  readonly beta1: tf.Scalar;
  readonly beta2: tf.Scalar;
  readonly gain1: tf.Scalar;
  readonly gain2: tf.Scalar;
  readonly epsilon: tf.Scalar;
  readonly rate: tf.Scalar;
}

/** The variables grouped by shape and dtype, in order of first appearance. */
function groupByShape(variables: readonly tf.Variable[]): ShapeGroup[] {
  const groups = new Map<string, { members: number[]; shape: readonly number[] }>();
  variables.forEach((w, i) => {
    const key = `${w.dtype}:${w.shape.join('x')}`;
    const group = groups.get(key) ?? { members: [], shape: w.shape };
    group.members.push(i);
    groups.set(key, group);
  });
  return [...groups.values()];
}

/** A group's stacked shape: `[n, ...shape]`, or the shape itself for a lone variable. */
function stackedShape(members: readonly number[], shape: readonly number[]): number[] {
  return members.length === 1 ? [...shape] : [members.length, ...shape];
}

/** Adam's new first moment, second moment and weight from the current ones (eleven elementwise kernels). */
function adamUpdate(w: tf.Tensor, g: tf.Tensor, square: tf.Tensor, m: tf.Tensor, v: tf.Tensor, s: StepScalars): tf.Tensor[] {
  const m1 = tf.add(tf.mul(m, s.beta1), tf.mul(g, s.gain1));
  const v1 = tf.add(tf.mul(v, s.beta2), tf.mul(square, s.gain2));
  const w1 = tf.sub(w, tf.mul(tf.div(m1, tf.add(tf.sqrt(v1), s.epsilon)), s.rate));
  return [m1, v1, w1];
}

/** `targets[i].assign(values[i])` for each. */
function assignAll(targets: readonly tf.Variable[], values: readonly tf.Tensor[]): void {
  targets.forEach((x, i) => x.assign(values[i]));
}
