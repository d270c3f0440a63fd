/**
 * Gradient functions for the tfjs-core kernels a language-model policy and its losses use.
 *
 * Why this exists: in Node, `@tensorflow/tfjs-core` alone registers no gradients at all (the `@tensorflow/tfjs`
 * umbrella package does, and it is not a dependency here), so `tf.grad` / `tf.variableGrads` fail with
 * "gradient function not found". {@link registerCoreGradients} registers our own implementation of each
 * gradient below for every kernel that has none yet, so it never replaces one installed by tfjs-node or the
 * umbrella package. Every product here is a flag-free `matMul` (see `backend.ts` for `BatchMatMul`).
 *
 * Conventions: `dy` is the gradient of the kernel's output; each entry returns the gradient of one named input,
 * float32 and shaped like that input; broadcast binary ops sum the gradient back to each input's shape;
 * piecewise-constant kernels (comparisons, rounding, arg-max, one-hot) have zero gradients so they may sit on
 * a differentiated path (for example inside `tf.where`).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

/** The gradient of one input, computed lazily. */
type InputGrad = () => tf.Tensor;

/** `2 / √π`, the derivative scale of `erf`. */
const TWO_OVER_SQRT_PI = 2 / Math.sqrt(Math.PI);

/** Sums `dy` over the axes broadcasting expanded, and reshapes it to `shape`. */
export function sumToShape(dy: tf.Tensor, shape: readonly number[]): tf.Tensor {
  if (dy.shape.length === shape.length && dy.shape.every((d, i) => d === shape[i])) {
    return dy;
  }
  const offset = dy.rank - shape.length;
  const axes: number[] = [];
  for (let i = 0; i < dy.rank; i++) {
    if (i < offset || (shape[i - offset] === 1 && dy.shape[i] !== 1)) {
      axes.push(i);
    }
  }
  const summed = axes.length > 0 ? tf.sum(dy, axes) : dy;
  return tf.reshape(summed, [...shape]);
}

function f32(x: tf.Tensor): tf.Tensor {
  return x.dtype === 'float32' ? x : tf.cast(x, 'float32');
}

function zerosOf(x: tf.Tensor): InputGrad {
  return () => tf.fill(x.shape, 0, 'float32');
}

function single(dy: tf.Tensor | tf.Tensor[]): tf.Tensor {
  return Array.isArray(dy) ? dy[0] : dy;
}

/** Shape of a reduction's output with the reduced axes kept as 1. */
function keptShape(shape: readonly number[], axisAttr: unknown): number[] {
  const rank = shape.length;
  const raw =
    axisAttr === undefined || axisAttr === null ? [...Array(rank).keys()] : ([] as number[]).concat(axisAttr as number | number[]);
  const axes = new Set(raw.map((a) => (a < 0 ? a + rank : a)));
  return shape.map((d, i) => (axes.has(i) ? 1 : d));
}

/** A unary kernel whose gradient is `dy · f(x, y)` (`y` the output when `useOutput`). */
function unary(kernelName: string, local: (x: tf.Tensor, y: tf.Tensor) => tf.Tensor, useOutput = false): tf.GradConfig {
  return {
    kernelName,
    inputsToSave: ['x'],
    ...(useOutput ? { outputsToSave: [true] } : {}),
    gradFunc: (dy, saved) => ({ x: () => tf.mul(single(dy), local(saved[0], useOutput ? saved[1] : saved[0])) }),
  };
}

/** A kernel whose inputs all get zero gradients. */
function zeroGrad(kernelName: string, inputs: readonly string[]): tf.GradConfig {
  return {
    kernelName,
    inputsToSave: [...inputs],
    gradFunc: (_dy, saved) => Object.fromEntries(inputs.map((name, i) => [name, zerosOf(saved[i])])),
  };
}

/** A broadcasting binary kernel with inputs `a`, `b`. */
function binary(
  kernelName: string,
  da: (dy: tf.Tensor, a: tf.Tensor, b: tf.Tensor) => tf.Tensor,
  db: (dy: tf.Tensor, a: tf.Tensor, b: tf.Tensor) => tf.Tensor,
): tf.GradConfig {
  return {
    kernelName,
    inputsToSave: ['a', 'b'],
    gradFunc: (dy, saved) => {
      const [a, b] = saved;
      const g = single(dy);
      return {
        a: () => sumToShape(da(g, f32(a), f32(b)), a.shape),
        b: () => sumToShape(db(g, f32(a), f32(b)), b.shape),
      };
    },
  };
}

/** The gradient of a reduction: `dy` divided by `divisor` (1 for a sum, the reduced count for a mean), spread over the reduced axes. */
function reductionGrad(kernelName: string, divisor: (x: tf.Tensor, kept: number[]) => number): tf.GradConfig {
  return {
    kernelName,
    inputsToSave: ['x'],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved;
      return {
        x: () => {
          const kept = keptShape(x.shape, attrs['axis']);
          // Divided, then copied out to x's shape on the device (tfjs-core's own gradient multiplies by a tensor of
          // ones built in JavaScript, a host array of x's size uploaded on every backward pass); the same values.
          const n = divisor(x, kept);
          const g = tf.reshape(single(dy), kept);
          return tf.broadcastTo(n === 1 ? g : tf.div(g, n), x.shape);
        },
      };
    },
  };
}

function extremumGrad(kernelName: string): tf.GradConfig {
  return {
    kernelName,
    inputsToSave: ['x'],
    outputsToSave: [true],
    gradFunc: (dy, saved, attrs) => {
      const [x, y] = saved;
      return {
        x: () => {
          const kept = keptShape(x.shape, attrs['reductionIndices'] ?? attrs['axis']);
          const hit = tf.cast(tf.equal(x, tf.reshape(y, kept)), 'float32'); // x.shape
          return tf.mul(tf.reshape(single(dy), kept), hit);
        },
      };
    },
  };
}

function axisOf(attr: unknown, rank: number): number {
  const a = Array.isArray(attr) ? (attr[0] as number) : (attr as number);
  return a < 0 ? a + rank : a;
}

const GRADIENTS: readonly tf.GradConfig[] = [
  // ── element-wise binary (broadcasting) ──
  binary(
    tf.Add,
    (dy) => dy,
    (dy) => dy,
  ),
  binary(
    tf.Sub,
    (dy) => dy,
    (dy) => tf.neg(dy),
  ),
  binary(
    tf.Multiply,
    (dy, _a, b) => tf.mul(dy, b),
    (dy, a) => tf.mul(dy, a),
  ),
  binary(
    tf.RealDiv,
    (dy, _a, b) => tf.div(dy, b),
    (dy, a, b) => tf.neg(tf.div(tf.mul(dy, a), tf.square(b))),
  ),
  binary(
    tf.Maximum,
    (dy, a, b) => tf.mul(dy, tf.cast(tf.greaterEqual(a, b), 'float32')),
    (dy, a, b) => tf.mul(dy, tf.cast(tf.less(a, b), 'float32')),
  ),
  binary(
    tf.Minimum,
    (dy, a, b) => tf.mul(dy, tf.cast(tf.lessEqual(a, b), 'float32')),
    (dy, a, b) => tf.mul(dy, tf.cast(tf.greater(a, b), 'float32')),
  ),
  binary(
    tf.SquaredDifference,
    (dy, a, b) => tf.mul(dy, tf.mul(tf.sub(a, b), 2)),
    (dy, a, b) => tf.mul(dy, tf.mul(tf.sub(b, a), 2)),
  ),
  binary(
    tf.Pow,
    (dy, a, b) => tf.mul(dy, tf.mul(b, tf.pow(a, tf.sub(b, 1)))),
    (dy, a, b) => {
      const positive = tf.greater(a, 0);
      const logA = tf.where(positive, tf.log(a), tf.zerosLike(a));
      return tf.mul(dy, tf.mul(tf.pow(a, b), logA));
    },
  ),
  {
    kernelName: tf.AddN,
    saveAllInputs: true,
    gradFunc: (dy, saved) => Object.fromEntries(saved.map((_, i) => [String(i), () => tf.clone(single(dy))])),
  },

  // ── element-wise unary ──
  unary(tf.Neg, () => tf.scalar(-1)),
  unary(tf.Abs, (x) => tf.sign(f32(x))),
  unary(tf.Exp, (_x, y) => y, true),
  unary(tf.Expm1, (x) => tf.exp(x)),
  unary(tf.Log, (x) => tf.reciprocal(f32(x))),
  unary(tf.Log1p, (x) => tf.reciprocal(tf.add(f32(x), 1))),
  unary(tf.Sqrt, (_x, y) => tf.div(0.5, y), true),
  unary(tf.Rsqrt, (x, y) => tf.mul(tf.div(y, f32(x)), -0.5), true),
  unary(tf.Square, (x) => tf.mul(f32(x), 2)),
  unary(tf.Reciprocal, (_x, y) => tf.neg(tf.square(y)), true),
  unary(tf.Tanh, (_x, y) => tf.sub(1, tf.square(y)), true),
  unary(tf.Sigmoid, (_x, y) => tf.mul(y, tf.sub(1, y)), true),
  unary(tf.Softplus, (x) => tf.sigmoid(x)),
  unary(tf.Relu, (x) => tf.cast(tf.greater(x, 0), 'float32')),
  unary(tf.Sin, (x) => tf.cos(x)),
  unary(tf.Cos, (x) => tf.neg(tf.sin(x))),
  unary(tf.Erf, (x) => tf.mul(tf.exp(tf.neg(tf.square(x))), TWO_OVER_SQRT_PI)),
  { kernelName: tf.Identity, gradFunc: (dy) => ({ x: () => f32(single(dy)) }) },
  { kernelName: tf.Cast, gradFunc: (dy) => ({ x: () => f32(single(dy)) }) },
  {
    kernelName: tf.ClipByValue,
    inputsToSave: ['x'],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved;
      const lo = attrs['clipValueMin'] as number;
      const hi = attrs['clipValueMax'] as number;
      const inside = tf.logicalAnd(tf.greaterEqual(x, lo), tf.lessEqual(x, hi));
      return { x: () => tf.mul(single(dy), tf.cast(inside, 'float32')) };
    },
  },
  {
    kernelName: tf.Select,
    inputsToSave: ['condition'],
    gradFunc: (dy, saved) => {
      const [condition] = saved;
      const g = single(dy);
      return {
        condition: zerosOf(condition),
        t: () => tf.mul(g, tf.cast(condition, 'float32')),
        e: () => tf.mul(g, tf.cast(tf.logicalNot(condition), 'float32')),
      };
    },
  },

  // ── piecewise constant: zero gradients ──
  ...[
    tf.Sign,
    tf.Floor,
    tf.Ceil,
    tf.Round,
    tf.Step,
    tf.IsNan,
    tf.IsInf,
    tf.IsFinite,
    tf.OnesLike,
    tf.ZerosLike,
    tf.LogicalNot,
    tf.ArgMax,
    tf.ArgMin,
  ].map((k) => zeroGrad(k, ['x'])),
  ...[tf.Greater, tf.GreaterEqual, tf.Less, tf.LessEqual, tf.Equal, tf.NotEqual, tf.LogicalAnd, tf.LogicalOr, tf.FloorDiv].map((k) =>
    zeroGrad(k, ['a', 'b']),
  ),
  zeroGrad(tf.OneHot, ['indices']),

  // ── reductions (Sum and Mean: REPLACED_GRADIENTS) ──
  extremumGrad(tf.Max),
  extremumGrad(tf.Min),

  // ── shape and layout ──
  {
    kernelName: tf.Reshape,
    inputsToSave: ['x'],
    gradFunc: (dy, saved) => ({ x: () => tf.reshape(single(dy), saved[0].shape) }),
  },
  {
    kernelName: tf.ExpandDims,
    inputsToSave: ['input'],
    gradFunc: (dy, saved) => ({ input: () => tf.reshape(single(dy), saved[0].shape) }),
  },
  {
    kernelName: tf.Transpose,
    gradFunc: (dy, _saved, attrs) => {
      const perm = attrs['perm'] as number[];
      const inverse = new Array<number>(perm.length);
      perm.forEach((p, i) => {
        inverse[p] = i;
      });
      return { x: () => tf.transpose(single(dy), inverse) };
    },
  },
  {
    kernelName: tf.Slice,
    inputsToSave: ['x'],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved;
      const [begin, size] = tf.slice_util.parseSliceParams(x, attrs['begin'] as number[], attrs['size'] as number[]);
      const paddings = x.shape.map((d, i) => [begin[i], d - begin[i] - size[i]] as [number, number]);
      return { x: () => tf.pad(single(dy), paddings) };
    },
  },
  {
    kernelName: tf.PadV2,
    inputsToSave: ['x'],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved;
      const paddings = attrs['paddings'] as [number, number][];
      return {
        x: () =>
          tf.slice(
            single(dy),
            paddings.map((p) => p[0]),
            x.shape,
          ),
      };
    },
  },
  {
    kernelName: tf.Concat,
    saveAllInputs: true,
    gradFunc: (dy, saved, attrs) => {
      const axis = axisOf(attrs['axis'], saved[0].rank);
      const sizes = saved.map((t) => t.shape[axis]);
      return Object.fromEntries(saved.map((_, i) => [String(i), () => tf.split(single(dy), sizes, axis)[i]]));
    },
  },
  {
    kernelName: tf.SplitV,
    gradFunc: (dy, _saved, attrs) => ({
      x: () => tf.concat(dy as tf.Tensor[], axisOf(attrs['axis'], (dy as tf.Tensor[])[0].rank)),
    }),
  },
  {
    kernelName: tf.Pack,
    saveAllInputs: true,
    gradFunc: (dy, saved, attrs) => {
      const axis = axisOf(attrs['axis'], saved[0].rank + 1);
      return Object.fromEntries(saved.map((t, i) => [String(i), () => tf.reshape(tf.unstack(single(dy), axis)[i], t.shape)]));
    },
  },
  {
    kernelName: tf.Unpack,
    gradFunc: (dy, _saved, attrs) => {
      const parts = dy as tf.Tensor[];
      return { value: () => tf.stack(parts, axisOf(attrs['axis'], parts[0].rank + 1)) };
    },
  },
  {
    kernelName: tf.Tile,
    inputsToSave: ['x'],
    gradFunc: (dy, saved, attrs) => {
      const [x] = saved;
      const reps = attrs['reps'] as number[];
      return {
        x: () => {
          // View dy [r0·d0, r1·d1, …] as [r0, d0, r1, d1, …] and sum the repetition axes.
          const split = x.shape.flatMap((d, i) => [reps[i], d]);
          const repAxes = x.shape.map((_, i) => 2 * i);
          return tf.reshape(tf.sum(tf.reshape(single(dy), split), repAxes), x.shape);
        },
      };
    },
  },
  {
    kernelName: tf.BroadcastTo,
    inputsToSave: ['x'],
    gradFunc: (dy, saved) => ({ x: () => sumToShape(single(dy), saved[0].shape) }),
  },
  {
    kernelName: tf.GatherV2,
    inputsToSave: ['x', 'indices'],
    gradFunc: (dy, saved, attrs) => {
      const [x, indices] = saved;
      if (((attrs['batchDims'] as number | undefined) ?? 0) !== 0) {
        throw new Error('gradient of gather with batchDims != 0 is not supported');
      }
      const axis = axisOf(attrs['axis'], x.rank);
      return {
        x: () => {
          // Move the gathered axis first, sum rows per index, and move it back.
          const outer = x.shape.slice(0, axis);
          const inner = x.shape.slice(axis + 1);
          const values = tf.reshape(single(dy), [...outer, indices.size, ...inner]);
          const perm = [outer.length, ...outer.map((_, i) => i), ...inner.map((_, i) => outer.length + 1 + i)];
          const moved = tf.transpose(values, perm); // [n, ...outer, ...inner]
          const summed = tf.unsortedSegmentSum(moved, tf.reshape(indices, [-1]) as tf.Tensor1D, x.shape[axis]);
          const back = new Array<number>(perm.length);
          perm.forEach((p, i) => {
            back[p] = i;
          });
          return tf.transpose(summed, back);
        },
        indices: zerosOf(indices),
      };
    },
  },

  // ── activations over an axis ──
  {
    kernelName: tf.Softmax,
    outputsToSave: [true],
    gradFunc: (dy, saved, attrs) => {
      const [y] = saved;
      const dim = axisOf(attrs['dim'], y.rank);
      const g = single(dy);
      return { logits: () => tf.mul(y, tf.sub(g, tf.sum(tf.mul(g, y), dim, true))) };
    },
  },
  {
    kernelName: tf.LogSoftmax,
    outputsToSave: [true],
    gradFunc: (dy, saved, attrs) => {
      const [y] = saved;
      const axis = axisOf(attrs['axis'], y.rank);
      const g = single(dy);
      return { logits: () => tf.sub(g, tf.mul(tf.exp(y), tf.sum(g, axis, true))) };
    },
  },
];

/**
 * Gradients that replace tfjs-core's own wherever they are found (`installBackendFixes` re-applies them after a
 * backend's package registers the stock ones): `Sum` and `Mean`, whose stock gradients build a tensor of ones of
 * the input's size in JavaScript and upload it (for the log-prob pick over the vocabulary, `[rows·tokens, V]`: 151 MB
 * at 16 × 48 tokens of SmolLM2, about 0.2 s of every backward pass on a GPU). Ours broadcast `dy` on the device, with
 * the same values.
 */
export const REPLACED_GRADIENTS: readonly tf.GradConfig[] = [
  reductionGrad(tf.Sum, () => 1),
  reductionGrad(tf.Mean, (x, kept) => x.size / Math.max(tf.util.sizeFromShape(kept), 1)),
];

/**
 * Registers the gradients above for every kernel that has no gradient yet. Idempotent.
 *
 * @returns The kernel names registered by this call.
 */
export function registerCoreGradients(): string[] {
  const added: string[] = [];
  for (const config of GRADIENTS) {
    if (tf.getGradient(config.kernelName) === undefined) {
      tf.registerGradient(config);
      added.push(config.kernelName);
    }
  }
  return added;
}
