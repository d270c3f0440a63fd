/**
 * Kernels of the wasm backend written in JS over its heap: one it lacks (`UnsortedSegmentSum`, so the gradient of
 * `tf.gather` works there) and two it has but runs element by element (`GatherV2` and `Tile`: its C++ kernels
 * compute every element's source index, ~100× slower than copying whole rows). These are pure data movement, so
 * their results equal the stock kernels' bit for bit; a KV cache keeping the rows still decoding, prompt caches
 * shared by a group, RoPE tables and embedding lookups all go through them.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

/** The slice of the wasm backend these kernels touch (it is not exported as a type for Node). */
interface WasmBackendLike {
  makeOutput(shape: number[], dtype: tf.DataType): tf.TensorInfo;
  typedArrayFromHeap(info: tf.TensorInfo): tf.backend_util.TypedArray;
}

/**
 * Views of inputs and output on the wasm heap, taken after the output is allocated: an allocation may grow the
 * heap and detach views taken before it.
 */
function heapViews(backend: unknown, inputs: readonly tf.TensorInfo[], shape: number[], dtype: tf.DataType) {
  const wasm = backend as unknown as WasmBackendLike;
  const out = wasm.makeOutput(shape, dtype);
  return { out, dst: wasm.typedArrayFromHeap(out), src: inputs.map((t) => wasm.typedArrayFromHeap(t)) };
}

/** Copies `n` elements from `src[from…]` to `dst[to…]`: a loop for short runs, a block copy for long ones. */
function copyRun(src: tf.backend_util.TypedArray, from: number, dst: tf.backend_util.TypedArray, to: number, n: number): void {
  if (n < 16) {
    for (let j = 0; j < n; j++) dst[to + j] = src[from + j];
  } else {
    dst.set(src.subarray(from, from + n), to);
  }
}

/**
 * `UnsortedSegmentSum`: `out[s, ...] = Σ_{i: ids[i] = s} x[i, ...]` for `x [...S, ...inner]`, `segmentIds [...S]`
 * int32, `out [numSegments, ...inner]`; ids outside `[0, numSegments)` are dropped, as in TensorFlow.
 */
function unsortedSegmentSum({ inputs, attrs, backend }: Parameters<tf.KernelFunc>[0]): tf.TensorInfo {
  const x = inputs['x'] as tf.TensorInfo;
  const segmentIds = inputs['segmentIds'] as tf.TensorInfo;
  const numSegments = attrs?.['numSegments'] as number;
  const inner = x.shape.slice(segmentIds.shape.length);
  const innerSize = tf.util.sizeFromShape(inner);
  const { out, dst, src } = heapViews(backend, [x, segmentIds], [numSegments, ...inner], x.dtype);
  const [xValues, ids] = src;
  dst.fill(0);
  for (let i = 0; i < ids.length; i++) {
    const s = ids[i];
    if (s < 0 || s >= numSegments) continue;
    for (let j = 0; j < innerSize; j++) dst[s * innerSize + j] += xValues[i * innerSize + j];
  }
  return out;
}

/**
 * `GatherV2` with any axis and `batchDims`: `x` seen as `[batch, outer, dim, slice]`, `indices` as
 * `[batch, n]`, `out [batch, outer, n, slice]` shaped as TensorFlow shapes it. An index outside `[0, dim)` is an
 * error, as in the stock kernel.
 */
function gatherV2({ inputs, attrs, backend }: Parameters<tf.KernelFunc>[0]): tf.TensorInfo {
  const x = inputs['x'] as tf.TensorInfo;
  const indices = inputs['indices'] as tf.TensorInfo;
  const axis = tf.util.parseAxisParam(attrs?.['axis'] as number, x.shape)[0];
  const info = tf.backend_util.segment_util.collectGatherOpShapeInfo(
    x as tf.Tensor,
    indices as tf.Tensor,
    axis,
    (attrs?.['batchDims'] as number | undefined) ?? 0,
  );
  const { batchSize, outerSize, dimSize, sliceSize } = info;
  const indexValues = (backend as WasmBackendLike).typedArrayFromHeap(indices); // checked before anything is allocated
  for (const index of indexValues) {
    if (!(index >= 0 && index < dimSize)) throw new Error(`GatherV2: the index value ${index} is not in [0, ${dimSize - 1}]`);
  }
  const { out, dst, src } = heapViews(backend, [x, indices], info.outputShape, x.dtype);
  const [xValues, ids] = src;
  const n = ids.length / batchSize;
  if (tf.util.sizeFromShape(x.shape) === 0) return out;
  let to = 0;
  for (let b = 0; b < batchSize; b++) {
    for (let o = 0; o < outerSize; o++) {
      const base = (b * outerSize + o) * dimSize;
      for (let k = 0; k < n; k++, to += sliceSize) copyRun(xValues, (base + ids[b * n + k]) * sliceSize, dst, to, sliceSize);
    }
  }
  return out;
}

/** `Tile`: `out[i₀, …] = x[i₀ mod s₀, …]`, copying each source row of the last axis `reps[last]` times. */
function tile({ inputs, attrs, backend }: Parameters<tf.KernelFunc>[0]): tf.TensorInfo {
  const x = inputs['x'] as tf.TensorInfo;
  const reps = attrs?.['reps'] as number[];
  const shape = x.shape.map((d, i) => d * reps[i]);
  const { out, dst, src } = heapViews(backend, [x], shape, x.dtype);
  const [xValues] = src;
  if (tf.util.sizeFromShape(shape) === 0) return out;
  const rank = shape.length;
  const width = rank === 0 ? 1 : x.shape[rank - 1];
  const rowReps = rank === 0 ? 1 : reps[rank - 1];
  const strides = tf.util.computeStrides(x.shape); // element offsets of the leading axes
  const at = new Array<number>(Math.max(rank - 1, 0)).fill(0); // the output row's index over the leading axes
  const rows = tf.util.sizeFromShape(shape.slice(0, -1));
  for (let row = 0, to = 0; row < rows; row++) {
    let from = 0;
    for (let d = 0; d < at.length; d++) from += (at[d] % x.shape[d]) * strides[d];
    if (width === 1) {
      // A column spread across the last axis (a reduction's gradient): one native fill per row.
      dst.fill(xValues[from], to, (to += rowReps));
    } else {
      for (let r = 0; r < rowReps; r++, to += width) copyRun(xValues, from, dst, to, width);
    }
    for (let d = at.length - 1; d >= 0 && ++at[d] === shape[d]; d--) at[d] = 0;
  }
  return out;
}

/** This module's kernels; `replaces`: the wasm package has its own, which is replaced once it is registered. */
const KERNELS: readonly (tf.KernelConfig & { readonly replaces: boolean })[] = [
  { kernelName: tf.UnsortedSegmentSum, backendName: 'wasm', kernelFunc: unsortedSegmentSum, replaces: false },
  { kernelName: tf.GatherV2, backendName: 'wasm', kernelFunc: gatherV2, replaces: true },
  { kernelName: tf.Tile, backendName: 'wasm', kernelFunc: tile, replaces: true },
];

/**
 * Registers this module's wasm kernels. Idempotent; the ones replacing stock kernels are registered only once the
 * wasm package has registered its own (its import would otherwise overwrite them), so call it again after that.
 */
export function installWasmKernels(): void {
  for (const { replaces, ...config } of KERNELS) {
    const current = tf.getKernel(config.kernelName, 'wasm');
    if (current?.kernelFunc === config.kernelFunc || (replaces && current === undefined)) continue;
    if (current !== undefined) tf.unregisterKernel(config.kernelName, 'wasm');
    tf.registerKernel(config);
  }
}
