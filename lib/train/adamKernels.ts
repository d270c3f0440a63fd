/**
 * The two ways {@link Adam} computes an update, behind one interface ({@link AdamKernel}):
 *
 * - {@link FusedAdamKernel}, on the native `tensorflow` backend: TensorFlow's own `ResourceApplyAdam`, one kernel a
 *   variable that updates the weight and both moments in place (PyTorch's optimizer works in place too). The
 *   weight and its moments live in TensorFlow resource variables, reached through the backend's raw-op entry points;
 *   the weight is handed over before each update and read back after, which shares the buffer rather than copying
 *   it (TensorFlow copies a buffer before writing into it while another tensor still reads it, so a tensor that
 *   held the old weight keeps it).
 * - {@link StackedOpsKernel}, everywhere else (wasm, cpu, webgl): a chain of TF.js elementwise ops, the variables of
 *   one shape stacked into one tensor (a model's 30 blocks share six shapes), about fifteen kernels a shape rather
 *   than twelve a variable.
 *
 * On SmolLM2-135M's 134.5 M parameters on two CPU cores a step with a clip takes about 0.7 s fused and 5 s in
 * stacked ops, where each op writes a full-size temporary.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

/** One step's numbers (see {@link Adam}): moment decays, the gradient scale and the corrected rate and ε. */
export interface AdamStep {
  /** β1. */
  readonly beta1: number;
  /** β2. */
  readonly beta2: number;
  /** Factor on every gradient (a global-norm clip's). */
  readonly scale: number;
  /** ε·√(1 − β2^t). */
  readonly epsilon: number;
  /** α·√(1 − β2^t) / (1 − β1^t). */
  readonly rate: number;
}

/** Each variable's moments in its shape, in the order of the variables. */
export interface AdamMoments {
  readonly m: readonly Float32Array[];
  readonly v: readonly Float32Array[];
}

/** A set of gradients' global L2 norm, and each one's elementwise square where they were made. */
export interface GradientNorm {
  /** `√(Σ g²)`: NaN or ∞ when a gradient is not finite. */
  readonly norm: number;
  /** One per gradient, `undefined` where none was made; the caller disposes them. */
  readonly squares: (tf.Tensor | undefined)[];
}

/**
 * The elementwise square of each gradient and their global L2 norm `√(Σ g²)` (`undefined` gradients count 0):
 * two kernels a gradient, and the squares serve {@link StackedOpsKernel.update} after a clip by that norm.
 *
 * @param grads - gradients (not disposed).
 */
export function gradientSquares(grads: readonly (tf.Tensor | undefined)[]): GradientNorm {
  const squares = grads.map((g) => (g === undefined ? undefined : tf.square(g)));
  const present = squares.filter((x): x is tf.Tensor => x !== undefined);
  return { squares, norm: Math.sqrt(readSum(present, (x) => tf.sum(x))) };
}

/** `Σ part(x)` over `xs`, each part a scalar, read back (0 for none). */
function readSum(xs: readonly tf.Tensor[], part: (x: tf.Tensor) => tf.Tensor): number {
  if (xs.length === 0) return 0;
  const total = tf.tidy(() => tf.addN(xs.map(part))); // []
  try {
    return total.dataSync()[0];
  } finally {
    total.dispose();
  }
}

/** What computes {@link Adam}'s updates and holds its moments. */
export interface AdamKernel {
  /** `fused` (TensorFlow's kernel, in place) or `ops` (TF.js ops over stacked shapes). */
  readonly name: 'fused' | 'ops';
  /**
   * Updates each variable that has a gradient (moments start at zero), leaving the others and their moments alone.
   *
   * @param grads - one per variable or `undefined`; not disposed.
   * @param squares - each gradient's elementwise square, where the caller has them (the ops kernel uses them).
   */
  update(grads: readonly (tf.Tensor | undefined)[], squares: readonly (tf.Tensor | undefined)[] | undefined, step: AdamStep): void;
  /** The gradients' global norm, with their squares where {@link AdamKernel.update} uses them. */
  norm(grads: readonly (tf.Tensor | undefined)[]): GradientNorm;
  /** A copy of the moments, or `null` before the first update. */
  read(): Promise<AdamMoments | null>;
  /** Replaces the moments (checked by the caller), or drops them (`null`: zeros at the next update). */
  write(moments: AdamMoments | null): void;
  /** Releases the moments. */
  dispose(): void;
}

/**
 * The kernel for `variables` on the active backend: {@link FusedAdamKernel} where the native backend runs
 * TensorFlow's kernel (checked once per backend on two numbers), else {@link StackedOpsKernel}.
 */
export function adamKernel(variables: readonly tf.Variable[]): AdamKernel {
  const ops = tensorflowOps();
  return ops !== null && fusedAdamWorks(ops) ? new FusedAdamKernel(ops, variables) : new StackedOpsKernel(variables);
}

/** An attribute of a TensorFlow op, as the native backend takes it. */
interface OpAttr {
  readonly name: string;
  readonly type: number;
  readonly value: string | number | boolean | number[];
}

/** The raw-op entry points of `@tensorflow/tfjs-node`'s backend that the fused kernel uses. */
interface TensorFlowOps {
  readonly binding: {
    readonly TF_ATTR_STRING: number;
    readonly TF_ATTR_TYPE: number;
    readonly TF_ATTR_SHAPE: number;
    readonly TF_ATTR_BOOL: number;
    readonly TF_FLOAT: number;
  };
  executeSingleOutput(name: string, attrs: OpAttr[], inputs: tf.TensorInfo[]): tf.Tensor;
  executeMultipleOutputs(name: string, attrs: OpAttr[], inputs: tf.TensorInfo[], outputs: number): tf.Tensor[];
}

/** The active backend's raw-op entry points, when it is the native `tensorflow` backend. */
function tensorflowOps(): TensorFlowOps | null {
  if (tf.getBackend() !== 'tensorflow') return null;
  const backend = tf.backend() as unknown as Partial<TensorFlowOps>;
  const ok =
    typeof backend.executeSingleOutput === 'function' &&
    typeof backend.executeMultipleOutputs === 'function' &&
    typeof backend.binding?.TF_FLOAT === 'number';
  return ok ? (backend as TensorFlowOps) : null;
}

const probed = new WeakMap<TensorFlowOps, boolean>();

/**
 * Whether `ResourceApplyAdam` runs through `ops` and gives what it should: with β1 = β2 = 0 one update of
 * w = [1, −2] with g = [0.5, 0.25] at rate 0.1 moves each weight by −0.1·sign(g). Any failure (a build or device
 * without the kernel, a binding that cannot hold a resource handle) means no.
 */
function fusedAdamWorks(ops: TensorFlowOps): boolean {
  let works = probed.get(ops);
  if (works !== undefined) return works;
  const w = tf.variable(tf.tensor1d([1, -2]), false);
  const kernel = new FusedAdamKernel(ops, [w]);
  try {
    kernel.update([tf.tensor1d([0.5, 0.25])], undefined, { beta1: 0, beta2: 0, scale: 1, epsilon: 0, rate: 0.1 });
    const [a, b] = w.dataSync();
    works = Math.abs(a - 0.9) < 1e-6 && Math.abs(b + 2.1) < 1e-6;
  } catch {
    works = false;
  } finally {
    kernel.dispose();
    w.dispose();
  }
  probed.set(ops, works);
  return works;
}

/** Distinguishes the resource variables of every {@link FusedAdamKernel} in the process. */
let fusedKernels = 0;

/** Adam in TensorFlow's `ResourceApplyAdam`: one in-place kernel a variable (see the module's comment). */
export class FusedAdamKernel implements AdamKernel {
  readonly name = 'fused';
  /** Per variable: resource handles of the weight, the first and the second moment. */
  private readonly handles: (readonly [tf.Tensor, tf.Tensor, tf.Tensor])[];
  private hasMoments = false;
  private readonly dtype: OpAttr;

  constructor(
    private readonly ops: TensorFlowOps,
    private readonly variables: readonly tf.Variable[],
  ) {
    const { binding } = ops;
    this.dtype = { name: 'dtype', type: binding.TF_ATTR_TYPE, value: binding.TF_FLOAT };
    const prefix = `rxrl-adam-${fusedKernels++}`;
    const handle = (name: string, shape: readonly number[]): tf.Tensor =>
      tf.keep(
        ops.executeSingleOutput(
          'VarHandleOp',
          [
            { name: 'container', type: binding.TF_ATTR_STRING, value: '' },
            { name: 'shared_name', type: binding.TF_ATTR_STRING, value: name },
            this.dtype,
            { name: 'shape', type: binding.TF_ATTR_SHAPE, value: [...shape] },
          ],
          [],
        ),
      );
    this.handles = variables.map((w, i) => [
      handle(`${prefix}/${i}/w`, w.shape),
      handle(`${prefix}/${i}/m`, w.shape),
      handle(`${prefix}/${i}/v`, w.shape),
    ]);
  }

  update(grads: readonly (tf.Tensor | undefined)[], _squares: unknown, step: AdamStep): void {
    const { binding } = this.ops;
    const attrs: OpAttr[] = [
      { name: 'T', type: binding.TF_ATTR_TYPE, value: binding.TF_FLOAT },
      { name: 'use_locking', type: binding.TF_ATTR_BOOL, value: false },
      { name: 'use_nesterov', type: binding.TF_ATTR_BOOL, value: false },
    ];
    if (!this.hasMoments) this.write(null, true);
    tf.tidy(() => {
      // β1^t = β2^t = 0: the kernel's bias corrections (taken in float32) become 1, and `rate` and `epsilon`
      // carry the corrections computed in float64. The kernel uses the betas only as 1 − β, in float32.
      const scalars = [0, 0, step.rate, complementExact(step.beta1), complementExact(step.beta2), step.epsilon].map((x) => tf.scalar(x));
      const scale = step.scale === 1 ? null : tf.scalar(step.scale);
      this.variables.forEach((w, i) =>
        tf.tidy(() => {
          const g = grads[i];
          if (g === undefined) return;
          const [hw, hm, hv] = this.handles[i];
          this.assign(hw, w);
          this.ops.executeMultipleOutputs('ResourceApplyAdam', attrs, [hw, hm, hv, ...scalars, scale ? tf.mul(g, scale) : g], 0);
          w.assign(this.readHandle(hw));
        }),
      );
    });
  }

  /** TensorFlow's `L2Loss` (`Σ g² / 2`) of each gradient: one read of it, no temporary. */
  norm(grads: readonly (tf.Tensor | undefined)[]): GradientNorm {
    const present = grads.filter((g): g is tf.Tensor => g !== undefined);
    const T = { name: 'T', type: this.ops.binding.TF_ATTR_TYPE, value: this.ops.binding.TF_FLOAT };
    const half = readSum(present, (g) => this.ops.executeSingleOutput('L2Loss', [T], [g]));
    return { norm: Math.sqrt(2 * half), squares: grads.map(() => undefined) };
  }

  async read(): Promise<AdamMoments | null> {
    if (!this.hasMoments) return null;
    const values = (k: 1 | 2): Promise<Float32Array[]> =>
      Promise.all(
        this.handles.map(async (h) => {
          const x = this.readHandle(h[k]);
          try {
            return (await x.data()) as Float32Array;
          } finally {
            x.dispose();
          }
        }),
      );
    return { m: await values(1), v: await values(2) };
  }

  /**
   * Sets the moments, or zeros when `zeros` (the first update), or drops them (`null`).
   *
   * @param moments - per variable, in its size; `null` for none.
   */
  write(moments: AdamMoments | null, zeros = false): void {
    this.dropMoments();
    if (moments === null && !zeros) return;
    tf.tidy(() =>
      this.variables.forEach((w, i) => {
        const [, hm, hv] = this.handles[i];
        this.assign(hm, moments ? tf.tensor(moments.m[i], w.shape) : tf.zeros(w.shape));
        this.assign(hv, moments ? tf.tensor(moments.v[i], w.shape) : tf.zeros(w.shape));
      }),
    );
    this.hasMoments = true;
  }

  dispose(): void {
    this.dropMoments();
    this.handles.forEach(([hw]) => this.destroy(hw));
    tf.dispose(this.handles.flat());
  }

  private assign(handle: tf.Tensor, value: tf.Tensor): void {
    this.ops.executeMultipleOutputs('AssignVariableOp', [this.dtype], [handle, value], 0);
  }

  private readHandle(handle: tf.Tensor): tf.Tensor {
    return this.ops.executeSingleOutput('ReadVariableOp', [this.dtype], [handle]);
  }

  private destroy(handle: tf.Tensor): void {
    const ignore = { name: 'ignore_lookup_error', type: this.ops.binding.TF_ATTR_BOOL, value: true };
    this.ops.executeMultipleOutputs('DestroyResourceOp', [ignore], [handle], 0);
  }

  private dropMoments(): void {
    if (!this.hasMoments) return;
    this.handles.forEach(([, hm, hv]) => [hm, hv].forEach((h) => this.destroy(h)));
    this.hasMoments = false;
  }
}

/**
 * The float32 number closest to β whose complement 1 − β, taken in float32, is closest to the true 1 − β: a
 * multiple of 2^−24 (exact in float32). For β = 0.999, float32(0.999) gives 1 − β = 1.0000467e-3 (4.7e-5 off);
 * this gives 0.9999880e-3 (1.2e-5 off, the nearest there is).
 */
function complementExact(beta: number): number {
  return 1 - Math.round((1 - beta) * 2 ** 24) / 2 ** 24;
}

/** Variables of one shape and dtype, by their index in the kernel's variables. */
interface ShapeGroup {
  readonly members: readonly number[];
  readonly shape: readonly number[];
}

/** One step's numbers as scalar tensors, for {@link StackedOpsKernel}. */
interface StepScalars {
  readonly beta1: tf.Scalar;
  readonly beta2: tf.Scalar;
  readonly gain1: tf.Scalar;
  readonly gain2: tf.Scalar;
  readonly epsilon: tf.Scalar;
  readonly rate: tf.Scalar;
}

/** Adam in TF.js ops, the variables of one shape updated as one stacked tensor (see the module's comment). */
export class StackedOpsKernel implements AdamKernel {
  readonly name = 'ops';
  /** The variables by shape, each group's moments stacked `[n, ...shape]` (a lone variable's in its own shape). */
  private readonly groups: readonly ShapeGroup[];
  private m: tf.Variable[] | null = null;
  private v: tf.Variable[] | null = null;

  constructor(private readonly variables: readonly tf.Variable[]) {
    this.groups = groupByShape(variables);
  }

  /** The arithmetic is elementwise, so stacking gives each weight the values it would get alone, bit for bit. */
  update(grads: readonly (tf.Tensor | undefined)[], squares: readonly (tf.Tensor | undefined)[] | undefined, step: AdamStep): void {
    const { m, v } = this.moments();
    tf.tidy(() => {
      const s: StepScalars = {
        beta1: tf.scalar(step.beta1),
        beta2: tf.scalar(step.beta2),
        gain1: tf.scalar((1 - step.beta1) * step.scale),
        gain2: tf.scalar((1 - step.beta2) * step.scale * step.scale),
        epsilon: tf.scalar(step.epsilon),
        rate: tf.scalar(step.rate),
      };
      // One tidy a group, so a group's intermediates are released before the next group's are made.
      this.groups.forEach(({ members }, k) =>
        tf.tidy(() => {
          const given = members.filter((i) => grads[i] !== undefined);
          if (given.length === 0) return;
          if (members.length === 1) {
            const [i] = members;
            const g = grads[i]!;
            const next = adamUpdate(this.variables[i], g, squares?.[i] ?? tf.square(g), m[k], v[k], s);
            assignAll([m[k], v[k], this.variables[i]], next);
          } else if (given.length === members.length) {
            const g = tf.stack(members.map((i) => grads[i]!));
            const next = adamUpdate(tf.stack(members.map((i) => this.variables[i])), g, tf.square(g), m[k], v[k], s);
            assignAll([m[k], v[k]], next);
            tf.unstack(next[2]).forEach((w, j) => this.variables[members[j]].assign(w));
          } else {
            this.updateSome(members, k, grads, s);
          }
        }),
      );
    });
  }

  norm(grads: readonly (tf.Tensor | undefined)[]): GradientNorm {
    return gradientSquares(grads);
  }

  async read(): Promise<AdamMoments | null> {
    if (this.m === null || this.v === null) return null;
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
    return { m: await read(this.m), v: await read(this.v) };
  }

  write(moments: AdamMoments | null): void {
    this.dispose();
    if (moments === null) return;
    const stacked = (values: readonly Float32Array[]): tf.Variable[] =>
      this.groups.map(({ members, shape }) => {
        const joined = new Float32Array(members.length * tf.util.sizeFromShape([...shape]));
        members.forEach((i, j) => joined.set(values[i], j * values[i].length));
        return tf.tidy(() => tf.variable(tf.tensor(joined, stackedShape(members, shape)), false));
      });
    this.m = stacked(moments.m);
    this.v = stacked(moments.v);
  }

  dispose(): void {
    tf.dispose([...(this.m ?? []), ...(this.v ?? [])]);
    this.m = null;
    this.v = null;
  }

  /** A stacked group of which only some variables have gradients: those are updated one by one, the rest kept. */
  private updateSome(members: readonly number[], k: number, grads: readonly (tf.Tensor | undefined)[], s: StepScalars): void {
    const { m, v } = this.moments();
    const [ms, vs] = [tf.unstack(m[k]), tf.unstack(v[k])];
    members.forEach((i, j) => {
      const g = grads[i];
      if (g === undefined) return;
      const [m1, v1, w1] = adamUpdate(this.variables[i], g, tf.square(g), ms[j], vs[j], s);
      [ms[j], vs[j]] = [m1, v1];
      this.variables[i].assign(w1);
    });
    assignAll([m[k], v[k]], [tf.stack(ms), tf.stack(vs)]);
  }

  private moments(): { m: tf.Variable[]; v: tf.Variable[] } {
    const zeros = (): tf.Variable[] =>
      this.groups.map(({ members, shape }) => tf.tidy(() => tf.variable(tf.zeros(stackedShape(members, shape)), false)));
    this.m ??= zeros();
    this.v ??= zeros();
    return { m: this.m, v: this.v };
  }
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
