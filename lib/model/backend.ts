/**
 * Picks and initializes the TensorFlow.js backend, and installs the fixes the policy model relies on.
 *
 * `auto` prefers the native `tensorflow` backend (`@tensorflow/tfjs-node-gpu`, then `@tensorflow/tfjs-node`)
 * when one of them is installed, else `wasm` (bundled: `@tensorflow/tfjs-backend-wasm`), else `cpu`.
 * The native packages are optional: they are imported through a variable specifier at run time, so neither
 * TypeScript nor the install needs them. Nothing is downloaded at run time.
 *
 * Fixes (installed idempotently by {@link installBackendFixes}, called from {@link initBackend}):
 * - gradients for the common kernels ({@link registerCoreGradients}): tfjs-core alone registers none in Node;
 * - the gradient of `BatchMatMul` is replaced by one that transposes explicitly and then multiplies without
 *   the `transposeA`/`transposeB` flags (on wasm the flagged kernel is many times slower than a transpose
 *   followed by a plain product), and that reduces over broadcast batch dimensions;
 * - an `UnsortedSegmentSum` kernel is registered for wasm (the wasm backend has none, so the gradient of
 *   `tf.gather` fails there). The policy model itself never gathers.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';

import { BackendUnavailableError, ConfigError } from '../errors.js';
import { registerCoreGradients } from './gradients.js';

/** Backend choice: `auto`, or one backend forced by name. */
export type BackendKind = 'auto' | 'tensorflow' | 'wasm' | 'cpu';

/** Name of a backend {@link initBackend} can select. */
export type BackendName = Exclude<BackendKind, 'auto'>;

/** The valid {@link BackendKind} values, in `auto` preference order after `auto` itself. */
export const BACKEND_KINDS: readonly BackendKind[] = ['auto', 'tensorflow', 'wasm', 'cpu'];

/** Optional native packages that provide the `tensorflow` backend, in preference order. */
export const NATIVE_BACKEND_PACKAGES: readonly string[] = ['@tensorflow/tfjs-node-gpu', '@tensorflow/tfjs-node'];

/** Package that provides the `wasm` backend. */
export const WASM_BACKEND_PACKAGE = '@tensorflow/tfjs-backend-wasm';

/** A minimal logger; a pino logger fits. */
export interface BackendLogger {
  info(obj: Record<string, unknown>, msg: string): void;
}

/** Options of {@link initBackend}. */
export interface InitBackendOptions {
  /** Where to report the choice. Default: one line on stderr. */
  readonly logger?: BackendLogger;
}

const stderrLogger: BackendLogger = {
  info(obj, msg) {
    process.stderr.write(`rxrl: ${msg} ${JSON.stringify(obj)}\n`);
  },
};

/**
 * Selects and initializes a TF.js backend and installs {@link installBackendFixes}.
 *
 * @param kind - `auto` tries `tensorflow` (tfjs-node-gpu, then tfjs-node), then `wasm`, then `cpu`;
 *   any other value forces that backend.
 * @param options - `logger` receives one `info` record naming the chosen backend.
 * @returns The name of the active backend.
 * @throws {@link BackendUnavailableError} when a forced backend is not installed or fails to initialize;
 *   the message names the package to install.
 * @throws {@link ConfigError} for an unknown `kind`.
 *
 * @example
 * ```ts
 * import { initBackend } from 'rxrl/lib/model/backend.js';
 * const name = await initBackend('auto'); // 'tensorflow' | 'wasm' | 'cpu'
 * ```
 */
export async function initBackend(kind: BackendKind, options: InitBackendOptions = {}): Promise<BackendName> {
  const logger = options.logger ?? stderrLogger;
  installBackendFixes();
  let chosen: BackendName;
  const tried: Record<string, string> = {};
  switch (kind) {
    case 'tensorflow':
    case 'wasm':
    case 'cpu':
      await activate(kind);
      chosen = kind;
      break;
    case 'auto': {
      chosen = 'cpu';
      for (const candidate of ['tensorflow', 'wasm'] as const) {
        try {
          await activate(candidate);
          chosen = candidate;
          break;
        } catch (error) {
          tried[candidate] = error instanceof Error ? error.message : String(error);
        }
      }
      if (chosen === 'cpu') {
        await activate('cpu');
      }
      break;
    }
    default:
      throw new ConfigError(`unknown backend '${String(kind)}'; valid: ${BACKEND_KINDS.join(', ')}`, {
        context: { kind },
      });
  }
  logger.info({ module: 'backend', requested: kind, backend: chosen, ...(kind === 'auto' ? { tried } : {}) },
    `tfjs backend: ${chosen}`);
  return chosen;
}

async function activate(name: BackendName): Promise<void> {
  if (tf.getBackend() === name && tf.findBackend(name) !== null) {
    return;
  }
  switch (name) {
    case 'tensorflow':
      await loadNative();
      break;
    case 'wasm':
      await loadPackage(WASM_BACKEND_PACKAGE, 'wasm');
      break;
    case 'cpu':
      break;
    default: {
      const never: never = name;
      throw new ConfigError(`unknown backend '${String(never)}'`);
    }
  }
  let ok: boolean;
  try {
    ok = await tf.setBackend(name);
  } catch (cause) {
    throw unavailable(name, cause);
  }
  if (!ok) {
    throw unavailable(name, undefined);
  }
  await tf.ready();
}

function unavailable(name: BackendName, cause: unknown): BackendUnavailableError {
  const pkg = name === 'tensorflow' ? NATIVE_BACKEND_PACKAGES.join(' or ') : name === 'wasm' ? WASM_BACKEND_PACKAGE
    : '@tensorflow/tfjs-backend-cpu';
  return new BackendUnavailableError(`tfjs backend '${name}' failed to initialize (package: ${pkg})`, {
    cause,
    context: { backend: name, package: pkg },
  });
}

async function loadNative(): Promise<void> {
  const failures: unknown[] = [];
  for (const pkg of NATIVE_BACKEND_PACKAGES) {
    try {
      await importOptional(pkg);
    } catch (error) {
      failures.push(error);
      continue;
    }
    if (tf.findBackendFactory('tensorflow') === null) {
      throw new BackendUnavailableError(
        `${pkg} loaded but registered no 'tensorflow' backend with this copy of @tensorflow/tfjs-core; ` +
          'install versions that share one tfjs-core',
        { context: { backend: 'tensorflow', package: pkg } },
      );
    }
    return;
  }
  throw new BackendUnavailableError(
    `tfjs backend 'tensorflow' is not installed: npm install ${NATIVE_BACKEND_PACKAGES[1]} ` +
      `(or ${NATIVE_BACKEND_PACKAGES[0]} with CUDA)`,
    { cause: failures[failures.length - 1], context: { backend: 'tensorflow', packages: NATIVE_BACKEND_PACKAGES } },
  );
}

async function loadPackage(pkg: string, name: BackendName): Promise<void> {
  if (tf.findBackendFactory(name) !== null) {
    return;
  }
  try {
    await importOptional(pkg);
  } catch (cause) {
    throw new BackendUnavailableError(`tfjs backend '${name}' is not installed: npm install ${pkg}`, {
      cause,
      context: { backend: name, package: pkg },
    });
  }
}

/** Imports a module whose name TypeScript must not resolve at compile time. */
async function importOptional(specifier: string): Promise<unknown> {
  const name: string = specifier;
  return import(name);
}

// ── fixes ─────────────────────────────────────────────────────────────────────

let fixesInstalled = false;

/**
 * Installs the gradient and kernel fixes described in the module comment. Idempotent; safe to call before
 * any backend is chosen. Call it (or {@link initBackend}) before any `tf.grad` / `tf.variableGrads`. The
 * `BatchMatMul` gradient is global (all backends) and numerically equal to the stock one.
 */
export function installBackendFixes(): void {
  if (fixesInstalled) {
    return;
  }
  fixesInstalled = true;
  registerCoreGradients();
  tf.registerGradient(batchMatMulGradConfig);
  if (tf.getKernel(tf.UnsortedSegmentSum, 'wasm') === undefined) {
    tf.registerKernel(wasmUnsortedSegmentSumConfig);
  }
}

/** Swaps the last two axes of a tensor of rank ≥ 2 with an explicit transpose. */
export function swapLastAxes(x: tf.Tensor): tf.Tensor {
  const rank = x.rank;
  const perm = [...Array(rank).keys()];
  perm[rank - 2] = rank - 1;
  perm[rank - 1] = rank - 2;
  return tf.transpose(x, perm);
}

/**
 * `a @ b` for `a [..., m, k]`, `b [..., k, n]` (batch dimensions broadcast) without transpose flags. When `b`
 * is a matrix and `a` has batch dimensions, `a` is flattened to `[N, k]` first, which is one plain product.
 */
export function plainMatMul(a: tf.Tensor, b: tf.Tensor): tf.Tensor {
  if (b.rank === 2 && a.rank > 2) {
    const outer = a.shape.slice(0, -1);
    const k = a.shape[a.rank - 1];
    const flat = tf.matMul(tf.reshape(a, [-1, k]), b as tf.Tensor2D); // [N, n]
    return tf.reshape(flat, [...outer, b.shape[1] as number]);
  }
  return tf.matMul(a, b);
}

/** Sums `grad` over the leading axes that broadcasting added or expanded, back to `shape`. */
function reduceToShape(grad: tf.Tensor, shape: readonly number[]): tf.Tensor {
  if (grad.shape.length === shape.length && grad.shape.every((d, i) => d === shape[i])) {
    return grad;
  }
  const offset = grad.rank - shape.length;
  const axes: number[] = [];
  for (let i = 0; i < grad.rank - 2; i++) {
    const inShape = i - offset >= 0 ? shape[i - offset] : 1;
    if (i < offset || (inShape === 1 && grad.shape[i] !== 1)) {
      axes.push(i);
    }
  }
  const summed = axes.length > 0 ? tf.sum(grad, axes) : grad;
  return tf.reshape(summed, [...shape]);
}

/** `dA` of `C = A @ B` for a matrix `B [k, n]` and `dy [..., m, n]`, as one flat product. */
function gradOfLeft(dy: tf.Tensor, bOperand: tf.Tensor, aShape: readonly number[]): tf.Tensor {
  return reduceToShape(plainMatMul(dy, swapLastAxes(bOperand)), aShape);
}

/**
 * `dB` of `C = A @ B`. When `B` is a matrix, `A` is flattened to `[N, k]` and the product is `Aᵀ · dy`, or
 * `(dyᵀ · A)ᵀ` when `dy [N, n]` is the narrower one to transpose (transposes of `[N, ·]` activations dominate
 * the cost; the extra `[n, k]` transpose is small).
 */
function gradOfRight(dy: tf.Tensor, aOperand: tf.Tensor, bShape: readonly number[]): tf.Tensor {
  if (bShape.length === 2) {
    const k = aOperand.shape[aOperand.rank - 1];
    const n = dy.shape[dy.rank - 1];
    const a2 = aOperand.rank === 2 ? aOperand : tf.reshape(aOperand, [-1, k]); // [N, k]
    const dy2 = dy.rank === 2 ? dy : tf.reshape(dy, [-1, n]); // [N, n]
    if (n < k) {
      return tf.transpose(tf.matMul(tf.transpose(dy2), a2)); // [n, k] → [k, n]
    }
    return tf.matMul(tf.transpose(a2), dy2); // [k, n]
  }
  return reduceToShape(tf.matMul(swapLastAxes(aOperand), dy), bShape);
}

/** `BatchMatMul` gradient using explicit transposes and plain products only. */
const batchMatMulGradConfig: tf.GradConfig = {
  kernelName: tf.BatchMatMul,
  inputsToSave: ['a', 'b'],
  gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[], attrs: tf.NamedAttrMap) => {
    const dyT = Array.isArray(dy) ? dy[0] : dy;
    const [a, b] = saved;
    const transposeA = attrs['transposeA'] === true;
    const transposeB = attrs['transposeB'] === true;
    return {
      a: () => {
        const bOp = transposeB ? swapLastAxes(b) : b; // [..., k, n]
        const aOpShape = transposeA ? swapShape(a.shape) : a.shape;
        const dA = gradOfLeft(dyT, bOp, aOpShape); // [..., m, k]
        return transposeA ? swapLastAxes(dA) : dA;
      },
      b: () => {
        const aOp = transposeA ? swapLastAxes(a) : a; // [..., m, k]
        const bOpShape = transposeB ? swapShape(b.shape) : b.shape;
        const dB = gradOfRight(dyT, aOp, bOpShape); // [..., k, n]
        return transposeB ? swapLastAxes(dB) : dB;
      },
    };
  },
};

function swapShape(shape: readonly number[]): number[] {
  const out = [...shape];
  const r = out.length;
  [out[r - 2], out[r - 1]] = [out[r - 1], out[r - 2]];
  return out;
}

/** The slice of the wasm backend this module touches (it is not exported as a type for Node). */
interface WasmBackendLike {
  readSync(dataId: tf.DataId): tf.backend_util.BackendValues;
  makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
  typedArrayFromHeap(info: tf.TensorInfo): tf.backend_util.TypedArray;
}

/**
 * `UnsortedSegmentSum` for wasm, computed in JS: `out[s, ...] = Σ_{i: ids[i] = s} x[i, ...]` for
 * `x [...S, ...inner]`, `segmentIds [...S]` int32, `out [numSegments, ...inner]`; ids outside
 * `[0, numSegments)` are dropped, as in TensorFlow.
 */
const wasmUnsortedSegmentSumConfig: tf.KernelConfig = {
  kernelName: tf.UnsortedSegmentSum,
  backendName: 'wasm',
  kernelFunc: ({ inputs, attrs, backend }) => {
    const wasm = backend as unknown as WasmBackendLike;
    const x = inputs['x'] as tf.TensorInfo;
    const segmentIds = inputs['segmentIds'] as tf.TensorInfo;
    const numSegments = attrs?.['numSegments'] as number;
    const inner = x.shape.slice(segmentIds.shape.length);
    const innerSize = inner.reduce((p, d) => p * d, 1);
    const xValues = wasm.readSync(x.dataId) as tf.backend_util.TypedArray;
    const ids = wasm.readSync(segmentIds.dataId) as tf.backend_util.TypedArray;
    const out = wasm.makeOutput([numSegments, ...inner], x.dtype);
    const outValues = wasm.typedArrayFromHeap(out);
    outValues.fill(0);
    for (let i = 0; i < ids.length; i++) {
      const s = ids[i];
      if (s < 0 || s >= numSegments) {
        continue;
      }
      const src = i * innerSize;
      const dst = s * innerSize;
      for (let j = 0; j < innerSize; j++) {
        outValues[dst + j] += xValues[src + j];
      }
    }
    return out;
  },
};
