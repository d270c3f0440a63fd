/**
 * Kernels that do no work when there is none to do: a `Reshape` to the tensor's own shape and a `Cast` to its own
 * dtype return the input's data under a new tensor (one more reference on it, as the cpu backend's kernels do).
 * Without them the native `tensorflow` backend dispatches a TensorFlow op for each (and for a reshape first
 * uploads its shape as a tensor of its own), and the wasm backend copies the tensor for such a cast. TF.js emits
 * them by the hundred in a backward pass: its `Add` and `Multiply` gradients reshape each input's gradient to the
 * input's shape and cast the other operand to float32, and the `BatchMatMul` gradient flattens operands that are
 * already flat. In one SmolLM2 training step on tensorflow that is a quarter to a third of the TensorFlow ops
 * (5,455 → 4,062 for full fine-tuning, 9,179 → 5,915 for LoRA), each a dispatch of ~50 µs on a GPU. Any other
 * reshape or cast goes to the backend's own kernel; the values are the same either way.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

/** The input itself under a new tensor: one more reference on its data, nothing computed. */
function shared(x: tf.TensorInfo, backend: unknown): tf.TensorInfo {
  (backend as tf.KernelBackend).incRef(x.dataId);
  return { dataId: x.dataId, shape: [...x.shape], dtype: x.dtype };
}

/** Whether a call of the kernel leaves its input `x` as it is. */
type IsIdentity = (x: tf.TensorInfo, attrs: tf.NamedAttrMap) => boolean;

const reshapeIsIdentity: IsIdentity = (x, attrs) => {
  const shape = attrs['shape'] as number[];
  if (shape.length !== x.shape.length) return false;
  // At most one -1, which stands for what the other dimensions leave: equal elsewhere, it is x's own (unless x is
  // empty, where it is undetermined; TensorFlow decides that).
  const implicit = shape.filter((d) => d === -1).length;
  if (implicit > 1 || (implicit === 1 && x.shape.includes(0))) return false;
  return shape.every((d, i) => d === -1 || d === x.shape[i]);
};

const castIsIdentity: IsIdentity = (x, attrs) => attrs['dtype'] === x.dtype;

/** The kernels wrapped, by backend (wasm's own `Reshape` already shares the data). */
const WRAPPED: readonly { kernelName: string; backendName: string; isIdentity: IsIdentity }[] = [
  { kernelName: tf.Reshape, backendName: 'tensorflow', isIdentity: reshapeIsIdentity },
  { kernelName: tf.Cast, backendName: 'tensorflow', isIdentity: castIsIdentity },
  { kernelName: tf.Cast, backendName: 'wasm', isIdentity: castIsIdentity },
];

/** rxrl's kernel function per `backend/kernel` (each delegates to the stock one it wrapped). */
const installed = new Map<string, tf.KernelFunc>();

/**
 * Wraps the kernels of the module comment. Idempotent; a backend's kernels are wrapped once its package has
 * registered them (importing it does), so call it again after that; a stock kernel registered again later is
 * wrapped again.
 */
export function installIdentityKernels(): void {
  for (const { kernelName, backendName, isIdentity } of WRAPPED) {
    const current = tf.getKernel(kernelName, backendName);
    if (current === undefined || current.kernelFunc === installed.get(`${backendName}/${kernelName}`)) continue;
    const stock = current.kernelFunc;
    const ours: tf.KernelFunc = (args) => {
      const x = args.inputs['x'] as tf.TensorInfo;
      return isIdentity(x, args.attrs ?? {}) ? shared(x, args.backend) : stock(args);
    };
    installed.set(`${backendName}/${kernelName}`, ours);
    tf.unregisterKernel(kernelName, backendName);
    tf.registerKernel({ ...current, kernelFunc: ours });
  }
}

/** Whether the kernels registered for `backendName` are the wrapped ones (for specs). */
export function identityKernelsInstalled(backendName: string): boolean {
  return WRAPPED.filter((k) => k.backendName === backendName).every(({ kernelName }) => {
    return tf.getKernel(kernelName, backendName)?.kernelFunc === installed.get(`${backendName}/${kernelName}`);
  });
}
