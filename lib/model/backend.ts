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
 * - the gradient of `BatchMatMul` is replaced by one that, for products with a weight matrix, flattens to 2-D
 *   and transposes explicitly instead of using the `transposeA`/`transposeB` flags (on wasm a flagged 2-D
 *   product is many times slower than a transpose followed by a plain one), and that sums over broadcast
 *   batch dimensions;
 * - wasm kernels written in JS ({@link installWasmKernels}): `UnsortedSegmentSum`, which the wasm backend lacks
 *   (the gradient of `tf.gather` needs it), and `GatherV2` and `Tile`, which it computes element by element;
 * - kernels that do nothing when nothing changes ({@link installIdentityKernels}): a `Reshape` to the tensor's own
 *   shape and a `Cast` to its own dtype share the input's data, where tensorflow dispatches an op and wasm copies.
 *
 * @packageDocumentation
 */
import { createRequire } from 'node:module';

import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';

import { BackendUnavailableError, ConfigError, assertNever } from '../core/errors.js';
import { REPLACED_GRADIENTS, registerCoreGradients } from './gradients.js';
import { installIdentityKernels } from './identityKernels.js';
import { installWasmKernels } from './wasmKernels.js';

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
  /** Native packages to try for `tensorflow`, in order. Default {@link NATIVE_BACKEND_PACKAGES}. */
  readonly nativePackages?: readonly string[];
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
 * Calls run one after another, in call order: a backend switch awaits package loading, and two overlapping
 * switches (a trainer and a rollout worker started in one process) would otherwise leave tensors on a backend the
 * other call replaced.
 *
 * @example
 * ```ts
 * import { initBackend } from 'rxrl/lib/model/backend.js';
 * const name = await initBackend('auto'); // 'tensorflow' | 'wasm' | 'cpu'
 * ```
 */
export function initBackend(kind: BackendKind, options: InitBackendOptions = {}): Promise<BackendName> {
  const next = initializing.then(() => selectBackend(kind, options));
  initializing = next.catch(() => undefined);
  return next;
}

/** The latest `initBackend` call, which the next one waits for. */
let initializing: Promise<unknown> = Promise.resolve();

async function selectBackend(kind: BackendKind, options: InitBackendOptions): Promise<BackendName> {
  const logger = options.logger ?? stderrLogger;
  quietTfjs();
  installBackendFixes();
  let chosen: BackendName;
  const tried: Record<string, string> = {};
  switch (kind) {
    case 'tensorflow':
    case 'wasm':
    case 'cpu':
      await activate(kind, options.nativePackages);
      chosen = kind;
      break;
    case 'auto': {
      chosen = 'cpu';
      for (const candidate of ['tensorflow', 'wasm'] as const) {
        try {
          await activate(candidate, options.nativePackages);
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
  logger.info({ module: 'backend', requested: kind, backend: chosen, ...(kind === 'auto' ? { tried } : {}) }, `tfjs backend: ${chosen}`);
  return chosen;
}

async function activate(name: BackendName, nativePackages: readonly string[] = NATIVE_BACKEND_PACKAGES): Promise<void> {
  if (tf.getBackend() === name && tf.findBackend(name) !== null) {
    return;
  }
  switch (name) {
    case 'tensorflow':
      await loadNative(nativePackages);
      break;
    case 'wasm':
      await loadPackage(WASM_BACKEND_PACKAGE, 'wasm');
      break;
    case 'cpu':
      break;
    default:
      assertNever(name, 'backend');
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
  // The package just loaded may have replaced rxrl's gradients with the stock ones.
  installBackendFixes();
}

function unavailable(name: BackendName, cause: unknown): BackendUnavailableError {
  const pkg =
    name === 'tensorflow' ? NATIVE_BACKEND_PACKAGES.join(' or ') : name === 'wasm' ? WASM_BACKEND_PACKAGE : '@tensorflow/tfjs-backend-cpu';
  return new BackendUnavailableError(`tfjs backend '${name}' failed to initialize (package: ${pkg})`, {
    cause,
    context: { backend: name, package: pkg },
  });
}

/**
 * Whether the active backend is the native `tensorflow` one with TensorFlow's oneDNN CPU kernels (on by default, see
 * {@link initBackend}; `TF_ENABLE_ONEDNN_OPTS=0` turns them off). Their matrix product streams a wide weight faster as
 * the transposed right operand of `x·Wᵀ` (stored `[out, in]`) than as `[in, out]`, which layouts of sampling
 * weights follow (`samplingWeights.ts`).
 */
export function oneDnnKernels(): boolean {
  // libtensorflow reads the variable once, as it loads; this build's own default is off.
  return tf.getBackend() === 'tensorflow' && /^(1|true)$/i.test(process.env.TF_ENABLE_ONEDNN_OPTS ?? '');
}

async function loadNative(packages: readonly string[]): Promise<void> {
  const failures: unknown[] = [];
  // libtensorflow's informational log lines (its CPU-feature note at load) off, unless asked for.
  if (process.env.RXRL_TFJS_WARNINGS !== '1') process.env.TF_CPP_MIN_LOG_LEVEL ??= '1';
  // TensorFlow's oneDNN CPU kernels, which this libtensorflow build leaves off unless asked: a SmolLM2-135M training
  // micro-batch (8 rows, 240 positions) runs 6–18 % faster on two cores, mostly in the products with a transposed
  // operand that every backward pass has, where a forward pass alone (sampling) runs about 10 % slower.
  // TF_ENABLE_ONEDNN_OPTS=0 keeps them off.
  process.env.TF_ENABLE_ONEDNN_OPTS ??= '1';
  for (const pkg of packages) {
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
    `tfjs backend 'tensorflow' is not installed (tried ${packages.join(', ')}): run 'npm run native' ` +
      `('npm run native -- --gpu' with CUDA) in the rxrl checkout, or npm install ${NATIVE_BACKEND_PACKAGES[1]} ` +
      'where its installer can download libtensorflow',
    { cause: failures[failures.length - 1], context: { backend: 'tensorflow', packages } },
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

/**
 * Whether a native backend package (`@tensorflow/tfjs-node-gpu` or `@tensorflow/tfjs-node`, see `npm run native`)
 * resolves from this module, without loading it. Specs and benchmarks use it to add the `tensorflow` backend to the
 * ones they compare.
 */
export function nativeBackendInstalled(): boolean {
  const require = createRequire(import.meta.url);
  return NATIVE_BACKEND_PACKAGES.some((pkg) => {
    try {
      require.resolve(pkg);
      return true;
    } catch {
      return false;
    }
  });
}

// ── quiet ─────────────────────────────────────────────────────────────────────

/**
 * Silences TF.js's own console warnings — the "Hi, looks like you are running TensorFlow.js in Node.js" banner its
 * cpu backend prints on first use in Node, and its notes on kernels registered twice — by setting TF.js's `PROD`
 * flag, which gates them (and, in this TF.js version, nothing else). Runs when this module loads, and again from
 * {@link initBackend}, which also turns off libtensorflow's informational lines when it loads the `tensorflow` backend
 * (`TF_CPP_MIN_LOG_LEVEL=1` unless set). `RXRL_TFJS_WARNINGS=1` keeps all of them.
 */
export function quietTfjs(): void {
  if (process.env.RXRL_TFJS_WARNINGS === '1') return;
  tf.env().set('PROD', true);
}

quietTfjs();

// ── fixes ─────────────────────────────────────────────────────────────────────

let fixesInstalled = false;

/**
 * Installs the gradient and kernel fixes described in the module comment. Idempotent; safe to call before
 * any backend is chosen. Call it (or {@link initBackend}) before any `tf.grad` / `tf.variableGrads`. The
 * `BatchMatMul` gradient is global (all backends) and numerically equal to the stock one.
 */
export function installBackendFixes(): void {
  // Importing a full TF.js bundle (tfjs-node imports @tensorflow/tfjs) registers the stock gradients of every
  // kernel again, replacing ours: the BatchMatMul, Sum and Mean overrides are checked and re-applied on every call, and
  // initBackend calls this after loading a backend's package. Importing the wasm package likewise registers its own
  // kernels over rxrl's, and tfjs-node registers kernels rxrl wraps, so those are checked on every call too.
  for (const config of [batchMatMulGradConfig, ...REPLACED_GRADIENTS]) {
    if (tf.getGradient(config.kernelName) !== config) tf.registerGradient(config);
  }
  installWasmKernels();
  installIdentityKernels();
  if (fixesInstalled) {
    return;
  }
  fixesInstalled = true;
  registerCoreGradients();
}

/**
 * A copy of a tensor's values, read outside any `tf.tidy` (which would walk a returned array element by element),
 * and the tensor disposed.
 */
export function readCopy(t: tf.Tensor): Float32Array {
  try {
    return new Float32Array(t.dataSync() as Float32Array);
  } finally {
    t.dispose();
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

/** `x @ w` for `x [..., m, k]` and a matrix `w [k, n]`, as one flat `[N, k] @ [k, n]` product. */
function flatMatMul(x: tf.Tensor, w: tf.Tensor): tf.Tensor {
  if (x.rank === 2) {
    return tf.matMul(x as tf.Tensor2D, w as tf.Tensor2D);
  }
  const k = x.shape[x.rank - 1];
  const flat = tf.matMul(tf.reshape(x, [-1, k]) as tf.Tensor2D, w as tf.Tensor2D); // [N, n]
  return tf.reshape(flat, [...x.shape.slice(0, -1), w.shape[1] as number]);
}

/**
 * `xᵀ · y` summed over all leading rows, for `x [..., p]` and `y [..., q]` with equal leading shape:
 * `[p, q]`. Transposes whichever of the two `[N, ·]` operands is narrower (the extra transpose of a `[q, p]`
 * result is small next to an `[N, ·]` one).
 */
function outerProductSum(x: tf.Tensor, y: tf.Tensor): tf.Tensor {
  const p = x.shape[x.rank - 1];
  const q = y.shape[y.rank - 1];
  const x2 = x.rank === 2 ? x : tf.reshape(x, [-1, p]); // [N, p]
  const y2 = y.rank === 2 ? y : tf.reshape(y, [-1, q]); // [N, q]
  if (q < p) {
    return tf.transpose(tf.matMul(tf.transpose(y2), x2)); // [q, p] → [p, q]
  }
  return tf.matMul(tf.transpose(x2), y2); // [p, q]
}

function batchSize(x: tf.Tensor): number {
  return x.shape.slice(0, -2).reduce((p, d) => p * d, 1);
}

/**
 * `BatchMatMul` gradient for `C = op(A) · op(B)` (`op` transposes the last two axes when the flag is set):
 * - when `B` is a matrix (a weight) and `A` is not transposed, every product is flattened to a plain 2-D
 *   `matMul` with explicit transposes, the case XNNPACK runs fast on wasm;
 * - when both operands carry batch dimensions (attention), the products use transpose flags: the batched wasm
 *   kernel costs the same with or without them, so explicit transposes would only add work;
 * - otherwise (plain 2-D products and rare layouts) explicit transposes and plain products.
 * Gradients of broadcast batch dimensions are summed back to each input's shape. The explicit transposes are for
 * wasm only: the other backends take the flags at no cost ({@link flaggedGrads}), and on the native one a
 * transpose is a kernel and a copy of its own (a third of a SmolLM2 backward pass's kernels were transposes).
 */
const batchMatMulGradConfig: tf.GradConfig = {
  kernelName: tf.BatchMatMul,
  inputsToSave: ['a', 'b'],
  gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[], attrs: tf.NamedAttrMap) => {
    const g = Array.isArray(dy) ? dy[0] : dy; // [..., m, n]
    const [a, b] = saved;
    const tA = attrs['transposeA'] === true;
    const tB = attrs['transposeB'] === true;
    if (tf.getBackend() !== 'wasm') return flaggedGrads(g, a, b, tA, tB);
    if (b.rank === 2 && !tA) {
      return {
        // dA = dy · op(B)ᵀ; op(B)ᵀ is B itself when tB.
        a: () => flatMatMul(g, tB ? b : tf.transpose(b)), // [..., m, k]
        // d op(B) = Σ Aᵀ · dy, and dB = d op(B)ᵀ = Σ dyᵀ · A when tB.
        b: () => (tB ? outerProductSum(g, a) : outerProductSum(a, g)), // [k, n] or [n, k]
      };
    }
    if (a.rank > 2 && b.rank > 2 && batchSize(a) > 1 && batchSize(b) > 1) {
      return {
        a: () => reduceToShape(tA ? tf.matMul(b, g, tB, true) : tf.matMul(g, b, false, !tB), a.shape),
        b: () => reduceToShape(tB ? tf.matMul(g, a, true, tA) : tf.matMul(a, g, !tA, false), b.shape),
      };
    }
    return {
      a: () => {
        // d op(A) = dy · op(B)ᵀ; dA = d op(A)ᵀ = op(B) · dyᵀ when tA.
        const grad = tA ? tf.matMul(tB ? swapLastAxes(b) : b, swapLastAxes(g)) : tf.matMul(g, tB ? b : swapLastAxes(b));
        return reduceToShape(grad, a.shape);
      },
      b: () => {
        // d op(B) = op(A)ᵀ · dy; dB = d op(B)ᵀ = dyᵀ · op(A) when tB.
        const grad = tB ? tf.matMul(swapLastAxes(g), tA ? swapLastAxes(a) : a) : tf.matMul(tA ? a : swapLastAxes(a), g);
        return reduceToShape(grad, b.shape);
      },
    };
  },
};

/**
 * The products of a `BatchMatMul` gradient with transpose flags, no explicit transpose: for a weight matrix `B`
 * (rank 2, `A` not transposed) each is one flat 2-D product, `dA = dy · op(B)ᵀ` and `dB = Aᵀ · dy` summed over
 * every leading row; otherwise the batched products, summed back over broadcast batch dimensions.
 */
function flaggedGrads(g: tf.Tensor, a: tf.Tensor, b: tf.Tensor, tA: boolean, tB: boolean): { a: () => tf.Tensor; b: () => tf.Tensor } {
  if (b.rank === 2 && !tA) {
    const k = a.shape[a.rank - 1];
    const n = g.shape[g.rank - 1];
    const a2 = tf.reshape(a, [-1, k]) as tf.Tensor2D; // [N, k]
    const g2 = tf.reshape(g, [-1, n]) as tf.Tensor2D; // [N, n]
    return {
      a: () => tf.reshape(tf.matMul(g2, b as tf.Tensor2D, false, !tB), a.shape), // [..., m, k]
      b: () => (tB ? tf.matMul(g2, a2, true, false) : tf.matMul(a2, g2, true, false)), // [n, k] or [k, n]
    };
  }
  return {
    a: () => reduceToShape(tA ? tf.matMul(b, g, tB, true) : tf.matMul(g, b, false, !tB), a.shape),
    b: () => reduceToShape(tB ? tf.matMul(g, a, true, tA) : tf.matMul(a, g, !tA, false), b.shape),
  };
}
