/**
 * Adam (Kingma & Ba 2015, Algorithm 1 with the efficient ordering of §2) over a fixed list of variables: on the
 * native backend in TensorFlow's fused in-place kernel, elsewhere in a few TF.js ops over the variables of one shape
 * stacked (see `adamKernels.ts`). The bias corrections are two numbers a step, and the global-norm clip a factor.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import { adamKernel, type AdamKernel, type GradientNorm } from './adamKernels.js';

export { gradientSquares, type GradientNorm } from './adamKernels.js';

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
  /** Each gradient's elementwise square (as {@link Adam.gradientNorm} returns them), or computed. */
  readonly squares?: readonly (tf.Tensor | undefined)[];
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
  private readonly kernel: AdamKernel;
  private readonly beta1: number;
  private readonly beta2: number;
  private readonly epsilon: number;

  /**
   * @param variables - the variables it updates, in the order gradients are given (on the active backend).
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
    this.kernel = adamKernel(variables);
  }

  /** Updates taken so far. */
  get step(): number {
    return this.steps;
  }

  /** How updates are computed: `fused` (TensorFlow's in-place kernel, native backend) or `ops` (TF.js ops). */
  get kernelName(): 'fused' | 'ops' {
    return this.kernel.name;
  }

  /**
   * One update.
   *
   * @param grads - the gradient of each variable (same order and shapes as {@link Adam.variables}), or
   *   `undefined` for a variable to leave alone. Not disposed.
   * @param options - `scale`: factor on every gradient (a global-norm clip), default 1; `squares`: each
   *   gradient's elementwise square, when the caller has them ({@link Adam.gradientNorm}), which the `ops` kernel
   *   uses for a variable of a shape no other has. Not disposed.
   */
  apply(grads: readonly (tf.Tensor | undefined)[], options: AdamApplyOptions = {}): void {
    const n = this.variables.length;
    const { scale = 1, squares } = options;
    if (grads.length !== n || (squares !== undefined && squares.length !== n)) {
      throw new ConfigError(`Adam.apply: ${grads.length} gradients (${squares?.length ?? 'no'} squares) for ${n} variables`);
    }
    const t = this.steps + 1;
    const root2 = Math.sqrt(1 - this.beta2 ** t);
    this.kernel.update(grads, squares, {
      beta1: this.beta1,
      beta2: this.beta2,
      scale,
      epsilon: this.epsilon * root2,
      rate: (this.options.learningRate * root2) / (1 - this.beta1 ** t),
    });
    this.steps = t;
  }

  /**
   * The global L2 norm `√(Σ g²)` of `grads` (`undefined` gradients count 0; NaN or ∞ when one is not finite), as
   * a clip takes it, with each gradient's elementwise square where this optimizer's kernel reuses them in
   * {@link Adam.apply} (the `ops` kernel; the fused kernel reads each gradient once, in one reduction).
   *
   * @param grads - gradients (not disposed).
   * @returns the norm and the squares (`undefined` where not made; the caller disposes them).
   */
  gradientNorm(grads: readonly (tf.Tensor | undefined)[]): GradientNorm {
    return this.kernel.norm(grads);
  }

  /** A copy of the state (with no moments before the first update or a {@link Adam.setState} with none). */
  async state(): Promise<AdamState> {
    const moments = await this.kernel.read();
    return { step: this.steps, m: moments?.m ?? [], v: moments?.v ?? [] };
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
    this.kernel.write(none ? null : { m: state.m, v: state.v });
    this.steps = state.step;
  }

  /** Releases the moments (the variables belong to the caller). */
  dispose(): void {
    this.kernel.dispose();
  }
}
