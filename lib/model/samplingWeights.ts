/**
 * The weights of a decoder block as the block function reads them, and the fused, adapter-merged copy of them
 * that sampling uses.
 *
 * Training reads a block's `tf.Variable`s directly (gradients flow to them): seven projections, each with its
 * LoRA pair where an adapter has one, `y = x·W (+ b) + s·(x·A)·B`. Sampling needs no gradients, so a block's
 * projections can be merged and fused once per weight change:
 * ```
 * W_qkv    = [Wq + s·Aq·Bq | Wk + s·Ak·Bk | Wv + s·Av·Bv]      [d, (H + 2·Hkv)·dh]   (+ [bq | bk | bv])
 * W_gateup = [Wgate + s·Ag·Bg | Wup + s·Au·Bu]                  [d, 2·dFF]
 * Wo' = Wo + s·Ao·Bo,  Wdown' = Wdown + s·Ad·Bd                 (the variables themselves without a pair)
 * ```
 * A block is then four matrix products instead of 7 base and 14 adapter products, 7 scale multiplies and 7 adds.
 * With TensorFlow's oneDNN kernels ({@link oneDnnKernels}) `W_gateup` is stored transposed, `[2·dFF, d]`, and
 * multiplied as `h·W_gateupᵀ`: oneDNN's product of a weight this wide (3,072 columns for SmolLM2-135M) runs up to
 * 1.8× faster that way at a prefill's 216 rows, and as fast or up to 1.5× faster at 16 rows (it varies with the
 * machine's load); the narrower ones run about even either way, and Eigen's (oneDNN off) and wasm's products are
 * slower with a transposed operand.
 * The fused copy costs one float32 copy of the block's fused and merged matrices (for SmolLM2-135M with an adapter
 * on all seven projections, 30 · 3.54 M values ≈ 425 MB; without an adapter, q/k/v and gate/up only ≈ 280 MB), so
 * it is built only where it fits ({@link samplingWeightsFit}) and freed as soon as the weights change.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { ModelAdapter } from './adapter.js';
import { oneDnnKernels } from './backend.js';
import { backendMemoryBytes, modelFootprint } from './capacity.js';
import type { ResolvedPolicyConfig } from './config.js';

/** One linear layer as a block computes it: `x·w (+ bias) (+ scale·(x·a)·b)`, or `x·wᵀ (+ bias)` when `outMajor`. */
export type BlockLinear = {
  /** `[in, out]`, or `[out, in]` when `outMajor`. */
  readonly w: tf.Tensor2D;
  /** `w` is stored `[out, in]` and the product takes it transposed (a fused sampling copy only; no adapter pair). */
  readonly outMajor: boolean;
  /** `[out]`, or null. */
  readonly bias: tf.Tensor | null;
  /** A LoRA pair `a [in, r]`, `b [r, out]` and its scale, or null (none, or merged into `w`). */
  readonly lora: { readonly a: tf.Tensor2D; readonly b: tf.Tensor2D; readonly scale: number } | null;
};

/**
 * The weights of one block: its variables (three q/k/v layers, two gate/up layers, adapter pairs apart), or the
 * fused sampling copy (one q/k/v layer whose output columns are `[q | k | v]`, one gate/up layer `[gate | up]`,
 * adapters merged).
 */
export interface BlockWeights {
  readonly inputNorm: tf.Tensor;
  /** q, k and v, or one fused layer. */
  readonly qkv: readonly BlockLinear[];
  /** Qwen3's per-head q/k RMSNorm scales `[dh]`, or null. */
  readonly qNorm: tf.Tensor | null;
  readonly kNorm: tf.Tensor | null;
  readonly o: BlockLinear;
  readonly postNorm: tf.Tensor;
  /** gate and up, or one fused layer. */
  readonly gateUp: readonly BlockLinear[];
  readonly down: BlockLinear;
}

/**
 * Share of the backend's memory ({@link backendMemoryBytes}) the weights and their fused sampling copy may take
 * together; above it sampling reads the variables (the rest is left to caches, activations and training state).
 */
export const SAMPLING_WEIGHTS_MEMORY_SHARE = 0.5;

/** Bytes of float32 values. */
const FLOAT32_BYTES = 4;

/**
 * Bytes of the fused sampling copy of a configuration's blocks: q/k/v and gate/up always (they are concatenated),
 * o and down only where `adapter` has a pair for them (else the variables are used as they are).
 */
export function samplingWeightBytes(config: ResolvedPolicyConfig, adapter: ModelAdapter | null): number {
  const { dModel: d, dFF: f, headDim: dh, nHeads: H, nKvHeads: Hkv } = config;
  const targets = new Set(adapter?.lora.targetModules ?? []);
  const qkv = d * (H + 2 * Hkv) * dh + (config.qkvBias ? (H + 2 * Hkv) * dh : 0);
  const perBlock = qkv + 2 * d * f + (targets.has('o_proj') ? H * dh * d : 0) + (targets.has('down_proj') ? f * d : 0);
  return config.nLayers * perBlock * FLOAT32_BYTES;
}

/**
 * Whether the weights and the fused sampling copy fit in {@link SAMPLING_WEIGHTS_MEMORY_SHARE} of the backend's
 * memory.
 *
 * @param memoryBytes - Bytes available; default {@link backendMemoryBytes}.
 */
export function samplingWeightsFit(
  config: ResolvedPolicyConfig,
  adapter: ModelAdapter | null,
  memoryBytes = backendMemoryBytes(),
): boolean {
  const adapterBytes = (adapter?.numParameters() ?? 0) * FLOAT32_BYTES;
  const bytes = modelFootprint(config).parameterBytes + adapterBytes + samplingWeightBytes(config, adapter);
  return bytes <= memoryBytes * SAMPLING_WEIGHTS_MEMORY_SHARE;
}

/**
 * `w + scale·a·b` (or `w` itself without a pair): `[in, out]`. The scale multiplies `a [in, r]` rather than the
 * product `[in, out]`: one pass over a rank-sized matrix instead of one over the layer's.
 */
function merged(layer: BlockLinear): tf.Tensor2D {
  return layer.lora === null ? layer.w : tf.add(layer.w, tf.matMul(tf.mul(layer.lora.a, layer.lora.scale), layer.lora.b));
}

/**
 * Several layers of one input as one: merged weights concatenated over output columns (`[in, Σ out]`), or over rows
 * when `outMajor` (`[Σ out, in]`), biases likewise.
 */
function fuse(layers: readonly BlockLinear[], outMajor = false): BlockLinear {
  if (layers.length === 1 && !outMajor) return { w: merged(layers[0]), outMajor, bias: layers[0].bias, lora: null };
  const joined = tf.concat(layers.map(merged), 1); // [in, Σ out]
  const w = outMajor ? tf.transpose(joined) : joined;
  const bias = layers.every((l) => l.bias === null)
    ? null
    : tf.concat(
        layers.map((l) => l.bias ?? tf.zeros([l.w.shape[1]])),
        0,
      ); // [Σ out]
  return { w, outMajor, bias, lora: null };
}

/** The fused sampling copy of a block, and the tensors it made (the norms and unmerged layers are the block's own). */
function fuseBlock(block: BlockWeights): { fused: BlockWeights; owned: tf.Tensor[] } {
  const own = new Set([...block.qkv, block.o, ...block.gateUp, block.down].flatMap((l) => [l.w, l.bias]));
  const owned: tf.Tensor[] = [];
  const kept = (layer: BlockLinear): BlockLinear => {
    for (const t of [layer.w, layer.bias]) if (t !== null && !own.has(t)) owned.push(tf.keep(t));
    return layer;
  };
  let fused: BlockWeights = block;
  try {
    tf.tidy(() => {
      fused = {
        ...block,
        qkv: [kept(fuse(block.qkv))],
        o: kept(fuse([block.o])),
        gateUp: [kept(fuse(block.gateUp, oneDnnKernels()))],
        down: kept(fuse([block.down])),
      };
    });
  } catch (error) {
    tf.dispose(owned);
    throw error;
  }
  return { fused, owned };
}

/** Fused blocks and the tensors they own. */
interface FusedWeights {
  readonly blocks: readonly BlockWeights[];
  readonly owned: readonly tf.Tensor[];
  /** Generations reading them. */
  users: number;
  /** Replaced: freed when the last user is done. */
  stale: boolean;
}

/** The blocks a generation reads until it calls `release` (once). */
export interface SamplingLease {
  readonly blocks: readonly BlockWeights[];
  release(): void;
}

/**
 * Most fused copies one base keeps, one per adapter view (or the base itself) that generated last: a server of many
 * LoRA adapters holds two copies, not one per adapter (a SmolLM2 copy is ~425 MB); the least recently used goes
 * (freed once its generations in flight end) and is rebuilt at its view's next generation.
 */
export const MAX_SAMPLING_COPIES = 2;

/**
 * The fused sampling copies of a base model and its adapter views, one per adapter (`null`: the base alone),
 * shared by the base and every view. Built at the first generation after a change; dropped by
 * {@link SamplingWeightsCache.invalidate}. A generation that holds a lease keeps reading the copy it started with
 * (one policy per generation); the copy is freed when the last lease is released.
 */
export class SamplingWeightsCache {
  private readonly byAdapter = new Map<ModelAdapter | null, FusedWeights>();

  /**
   * The fused copy of `blocks` for `adapter`, built now if there is none.
   *
   * @param blocks - The blocks as variables (with the adapter's pairs).
   */
  acquire(adapter: ModelAdapter | null, blocks: readonly BlockWeights[]): SamplingLease {
    let entry = this.byAdapter.get(adapter);
    if (entry !== undefined) {
      // Most recently used last: the first entry is the one to drop for a new copy.
      this.byAdapter.delete(adapter);
      this.byAdapter.set(adapter, entry);
    } else {
      while (this.byAdapter.size >= MAX_SAMPLING_COPIES) this.invalidate(this.byAdapter.keys().next().value as ModelAdapter | null);
      const owned: tf.Tensor[] = [];
      const fused: BlockWeights[] = [];
      try {
        for (const block of blocks) {
          const one = fuseBlock(block);
          fused.push(one.fused);
          owned.push(...one.owned);
        }
      } catch (error) {
        tf.dispose(owned);
        throw error;
      }
      entry = { blocks: fused, owned, users: 0, stale: false };
      this.byAdapter.set(adapter, entry);
    }
    const held = entry;
    held.users++;
    let released = false;
    return {
      blocks: held.blocks,
      release: () => {
        if (released) return;
        released = true;
        held.users--;
        if (held.stale && held.users === 0) tf.dispose([...held.owned]);
      },
    };
  }

  /** Drops the copy of `adapter` (default: every copy, as after a change of the base weights). */
  invalidate(adapter?: ModelAdapter | null): void {
    for (const [key, entry] of [...this.byAdapter]) {
      if (adapter !== undefined && key !== adapter) continue;
      this.byAdapter.delete(key);
      entry.stale = true;
      if (entry.users === 0) tf.dispose([...entry.owned]);
    }
  }

  /** Number of copies held (for tests: a change frees them). */
  get size(): number {
    return this.byAdapter.size;
  }
}
