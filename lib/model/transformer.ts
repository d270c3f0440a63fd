/**
 * The policy model: one decoder for the Llama family (Llama 3, Qwen2, Qwen3, SmolLM2) on tfjs-core ops, with
 * KV-cache sampling. The configuration switches the family's variations; there is no class per family.
 *
 * One block, top to bottom (as `modeling_llama.py`; `H` query heads, `Hkv` key/value heads, `dh` head width):
 * ```
 * x = embed_tokens[id]                                          gather; no position embedding
 * repeat nLayers:
 *   h = RMSNorm(x) · input_layernorm
 *   q = h·Wq (+bq)  k = h·Wk (+bk)  v = h·Wv (+bv)               biases: Qwen2 (q/k/v), attention_bias (q/k/v/o)
 *   q, k = RMSNorm per head · q_norm / k_norm                    Qwen3 only
 *   q, k = RoPE(q, k, positionIds)                               rope_theta; llama3 / linear rope scaling
 *   x += (softmax(q·kᵀ/√dh + mask) · v) · Wo (+bo)               grouped-query: H/Hkv query heads per kv head
 *   h = RMSNorm(x) · post_attention_layernorm
 *   x += (SiLU(h·Wgate) ⊙ (h·Wup)) · Wdown                       SwiGLU
 * logits = RMSNorm(x) · norm · lm_head                           lm_head tied to embed_tokens or separate
 * ```
 * Positions come from explicit `positionIds` (counted from each row's first real token), so a left-padded row
 * computes exactly what it would unpadded. Weights keep Hugging Face's names and, at the boundary
 * ({@link PolicyModel.getWeights}, {@link PolicyModel.setWeights}), Hugging Face's `[out, in]` layout; inside,
 * linear weights are held as `[in, out]` so every product is a plain 2-D `matMul` (fast on wasm).
 *
 * Training and the reference paths read the variables (gradients flow to them). Generation reads, where it fits,
 * a fused copy of each block with any LoRA adapter merged in (one `[q | k | v]` and one `[gate | up]` product per
 * block, one RoPE pass; `samplingWeights.ts`), built at the first generation after a change and dropped by
 * {@link PolicyModel.weightsChanged}, which {@link PolicyModel.setWeights} and the trainers call.
 *
 * Grouped-query attention never repeats keys: the `H/Hkv` query heads that share a key/value head are folded
 * into its query rows (`[b, H, T, dh] → [b, Hkv, (H/Hkv)·T, dh]`, a free reshape), all rank-4.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, GenerateResponse, NamedWeights, WeightArray } from './types.js';
import { ShapeError, assertNever } from '../core/errors.js';
import { installBackendFixes, readCopy } from './backend.js';
import { disposeEach } from '../core/release.js';
import { yieldToEventLoop } from '../core/turns.js';
import {
  distinctPromptRows,
  pickRows,
  promptRows,
  runGeneration,
  splitSharedPrefix,
  type GenerateOptions,
  type PromptBatch,
  type SharedPrefix,
  type StepDecoder,
} from './generate.js';
import type { LoraTarget, ModelAdapter } from './adapter.js';
import { SamplingWeightsCache, samplingWeightsFit, type BlockLinear, type BlockWeights, type SamplingLease } from './samplingWeights.js';
import {
  MASK_BIAS,
  VOCAB_MAJOR_HEAD,
  configMismatches,
  validatePolicyConfig,
  type PolicyConfig,
  type ResolvedPolicyConfig,
} from './config.js';
import { DecodeGraph, decodeFeeds, type DecodeFeeds, type DecodePass, type DecodeWeights, type LayerCache } from './decodeGraph.js';
import { graphSessionsAvailable } from './tfGraph.js';
import { createRng, normalArray } from '../core/random.js';

export { MASK_BIAS, MODEL_TYPES, RMS_NORM_EPS, ROPE_THETA, configMismatches, validatePolicyConfig } from './config.js';
export type { ModelType, PolicyConfig, ResolvedPolicyConfig, RopeScaling } from './config.js';

/** Log-probabilities of the observed next tokens and the entropies of the predicted distributions. */
export interface TokenLogprobs {
  /** `logprobs[b, t] = log p(x[b, t+1] | x[b, ≤t])`, `[B, T-1]`. */
  readonly logprobs: tf.Tensor2D;
  /** Entropy (nats) of `p(· | x[b, ≤t])`, `[B, T-1]`. */
  readonly entropy: tf.Tensor2D;
}

/** Standard deviation of the normal initialization of embeddings and projections (`initializer_range`). */
export const INIT_STD = 0.02;

/** How a weight is initialized: `N(0, 0.02²)`, `N(0, (0.02/√(2·nLayers))²)`, all ones or all zeros. */
export type PolicyInitKind = 'normal' | 'residual-out' | 'ones' | 'zeros';

/** Hugging Face name, Hugging Face shape (`[out, in]` for linear weights) and initializer of one weight. */
export interface PolicyParamSpec {
  readonly name: string;
  readonly shape: readonly number[];
  readonly init: PolicyInitKind;
  /** A linear weight: held transposed (`[in, out]`) inside the model. */
  readonly linear: boolean;
}

/**
 * Rotary inverse frequencies `θ^(−2i/dh)` for `i < dh/2`, with the configured scaling applied (Llama 3.1's
 * `llama3` smooth interpolation between long and short wavelengths, or `linear` division by the factor).
 */
export function ropeInverseFrequencies(config: ResolvedPolicyConfig): Float32Array {
  const half = config.headDim / 2;
  const out = new Float32Array(half);
  for (let i = 0; i < half; i++) {
    const base = Math.fround(Math.pow(config.ropeTheta, (2 * i) / config.headDim));
    let freq = 1 / base;
    const s = config.ropeScaling;
    if (s !== null) {
      switch (s.type) {
        case 'linear':
          freq /= s.factor;
          break;
        case 'llama3': {
          const wavelen = (2 * Math.PI) / freq;
          const lowWavelen = s.originalMaxPositionEmbeddings / s.lowFreqFactor;
          const highWavelen = s.originalMaxPositionEmbeddings / s.highFreqFactor;
          if (wavelen > lowWavelen) {
            freq /= s.factor;
          } else if (wavelen >= highWavelen) {
            const smooth = (s.originalMaxPositionEmbeddings / wavelen - s.lowFreqFactor) / (s.highFreqFactor - s.lowFreqFactor);
            freq = (1 - smooth) * (freq / s.factor) + smooth * freq;
          }
          break;
        }
        default:
          assertNever(s, 'rope scaling');
      }
    }
    out[i] = freq;
  }
  return out;
}

/** Hugging Face names, shapes and initializers of every weight of a configuration, in a stable order. */
export function policyParamSpecs(config: PolicyConfig): PolicyParamSpec[] {
  const c = validatePolicyConfig(config);
  const { vocabSize: V, dModel: d, dFF: f, headDim: dh } = c;
  const qDim = c.nHeads * dh;
  const kvDim = c.nKvHeads * dh;
  const lin = (name: string, out: number, inp: number, init: PolicyInitKind = 'normal'): PolicyParamSpec => ({
    name,
    shape: [out, inp],
    init,
    linear: true,
  });
  const vec = (name: string, n: number, init: PolicyInitKind): PolicyParamSpec => ({ name, shape: [n], init, linear: false });
  const specs: PolicyParamSpec[] = [{ name: 'model.embed_tokens.weight', shape: [V, d], init: 'normal', linear: false }];
  for (let i = 0; i < c.nLayers; i++) {
    const p = `model.layers.${i}`;
    specs.push(vec(`${p}.input_layernorm.weight`, d, 'ones'));
    specs.push(
      lin(`${p}.self_attn.q_proj.weight`, qDim, d),
      lin(`${p}.self_attn.k_proj.weight`, kvDim, d),
      lin(`${p}.self_attn.v_proj.weight`, kvDim, d),
    );
    if (c.qkvBias) {
      specs.push(
        vec(`${p}.self_attn.q_proj.bias`, qDim, 'zeros'),
        vec(`${p}.self_attn.k_proj.bias`, kvDim, 'zeros'),
        vec(`${p}.self_attn.v_proj.bias`, kvDim, 'zeros'),
      );
    }
    if (c.qkNorm) specs.push(vec(`${p}.self_attn.q_norm.weight`, dh, 'ones'), vec(`${p}.self_attn.k_norm.weight`, dh, 'ones'));
    specs.push(lin(`${p}.self_attn.o_proj.weight`, d, qDim, 'residual-out'));
    if (c.oBias) specs.push(vec(`${p}.self_attn.o_proj.bias`, d, 'zeros'));
    specs.push(vec(`${p}.post_attention_layernorm.weight`, d, 'ones'));
    specs.push(
      lin(`${p}.mlp.gate_proj.weight`, f, d),
      lin(`${p}.mlp.up_proj.weight`, f, d),
      lin(`${p}.mlp.down_proj.weight`, d, f, 'residual-out'),
    );
  }
  specs.push(vec('model.norm.weight', d, 'ones'));
  if (!c.tieWordEmbeddings) specs.push(lin('lm_head.weight', V, d));
  return specs;
}

/** Rotary tables for `N` tokens: `cos [N, 1, dh]`, `sin [N, 1, dh]`. */
/** Attention of a block: queries, keys and values `[N, ·]` after RoPE in, merged heads `[N, H·dh]` out. */
type Attention = (q: tf.Tensor2D, k: tf.Tensor2D, v: tf.Tensor2D) => tf.Tensor2D;

interface Rotary {
  /**
   * Tables for the query row, `[N, H·dh]`: the cosines and sines of every head, times the attention scale `1/√dh`
   * (so scores need no scaling pass). Made on first use, as are the others.
   */
  readonly q: () => RotaryTables;
  /** Tables for the key row, `[N, Hkv·dh]`. */
  readonly k: () => RotaryTables;
  /**
   * Tables for a fused `[q | k | v]` row, `[N, (H + 2·Hkv)·dh]`: the query tables over the query heads, the key
   * tables over the key heads, 1 and 0 over the value heads (which RoPE leaves as they are, exactly).
   */
  readonly qkv: () => RotaryTables;
}

/** The cosines and sines RoPE multiplies a row of heads by, `[N, heads·dh]`. */
interface RotaryTables {
  readonly cos: tf.Tensor2D;
  readonly sin: tf.Tensor2D;
}

/**
 * A Llama-family decoder. Owns its `tf.Variable`s; call {@link PolicyModel.dispose} when done.
 *
 * @example
 * ```ts
 * import { PolicyModel } from 'rxrl';
 * const model = PolicyModel.create({ vocabSize: 51, dModel: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 192, maxSeqLen: 64 }, 1);
 * const [out] = await model.generate([{ promptTokens: [1, 30, 41, 31, 40], maxTokens: 8, seed: 7 }]);
 * model.dispose();
 * ```
 */
export class PolicyModel {
  /** The validated architecture, defaults filled in. */
  readonly config: ResolvedPolicyConfig;
  private readonly params: ReadonlyMap<string, tf.Variable>;
  private readonly linear: ReadonlySet<string>;
  private readonly embedTokens: tf.Variable;
  /** Each block's variables (with the adapter's pairs): what training and the reference paths read. */
  private readonly blocks: readonly BlockWeights[];
  /** Fused, adapter-merged copies of the blocks for sampling, shared by a base and its views. */
  private readonly sampling: SamplingWeightsCache;
  /** Whether generation reads the fused copy (see {@link PolicyModel.setSamplingWeights}); unset: where it fits. */
  private fusedSampling: boolean | undefined;
  private readonly finalNorm: tf.Variable;
  private readonly lmHead: tf.Variable | null;
  /** `[1, dh/2]` rotary inverse frequencies. */
  private readonly invFreq: tf.Tensor2D;
  /** `[dh, dh]`: `x · rotateHalf = concat(−x₂, x₁)`. */
  private readonly rotateHalf: tf.Tensor2D;
  /** The LoRA adapter of a view made by {@link PolicyModel.withAdapter}; its base's variables are not owned. */
  readonly adapter: ModelAdapter | null;
  /** Whether decoding steps run as one graph (see {@link PolicyModel.setGraphDecoding}); unset: where the backend can. */
  private graphDecoding: boolean | undefined;
  /**
   * Compiled prefills and decoding steps by pass and the structure of the weights they read (the fused copy's and the
   * variables', at most a few a model; a graph holds no weights).
   */
  private readonly decodeGraphs = new Map<string, DecodeGraph>();
  private disposed = false;

  private constructor(
    config: ResolvedPolicyConfig,
    params: ReadonlyMap<string, tf.Variable>,
    linear: ReadonlySet<string>,
    adapter: ModelAdapter | null = null,
    sampling = new SamplingWeightsCache(),
  ) {
    this.config = config;
    this.params = params;
    this.linear = linear;
    this.adapter = adapter;
    this.sampling = sampling;
    const get = (name: string): tf.Variable => params.get(name) as tf.Variable;
    const opt = (name: string): tf.Variable | null => params.get(name) ?? null;
    this.embedTokens = get('model.embed_tokens.weight');
    this.blocks = Array.from({ length: config.nLayers }, (_, i) => {
      const p = `model.layers.${i}`;
      const layer = (group: string, target: LoraTarget, bias = false): BlockLinear => {
        const pair = adapter?.pair(i, target) ?? null;
        return {
          w: get(`${p}.${group}.${target}.weight`) as tf.Tensor as tf.Tensor2D,
          outMajor: false,
          bias: bias ? opt(`${p}.${group}.${target}.bias`) : null,
          lora:
            pair === null || adapter === null
              ? null
              : { a: pair.a as tf.Tensor as tf.Tensor2D, b: pair.b as tf.Tensor as tf.Tensor2D, scale: adapter.lora.scale },
        };
      };
      return {
        inputNorm: get(`${p}.input_layernorm.weight`),
        qkv: [layer('self_attn', 'q_proj', true), layer('self_attn', 'k_proj', true), layer('self_attn', 'v_proj', true)],
        qNorm: opt(`${p}.self_attn.q_norm.weight`),
        kNorm: opt(`${p}.self_attn.k_norm.weight`),
        o: layer('self_attn', 'o_proj', true),
        postNorm: get(`${p}.post_attention_layernorm.weight`),
        gateUp: [layer('mlp', 'gate_proj'), layer('mlp', 'up_proj')],
        down: layer('mlp', 'down_proj'),
      };
    });
    this.finalNorm = get('model.norm.weight');
    this.lmHead = opt('lm_head.weight');
    const dh = config.headDim;
    this.invFreq = tf.tensor2d(ropeInverseFrequencies(config), [1, dh / 2]);
    const rot = new Float32Array(dh * dh);
    for (let j = 0; j < dh / 2; j++) {
      rot[(j + dh / 2) * dh + j] = -1; // out[j] = −x[j + dh/2]
      rot[j * dh + j + dh / 2] = 1; // out[j + dh/2] = x[j]
    }
    this.rotateHalf = tf.tensor2d(rot, [dh, dh]);
  }

  /**
   * Creates a model with seeded weights: the same `config` and `seed` give bit-identical weights on every
   * backend (drawn on the CPU, one independent stream per weight name). Embeddings and input projections are
   * `N(0, 0.02²)`; residual output projections (`o_proj`, `down_proj`) `N(0, (0.02 / √(2·nLayers))²)`; norm
   * scales 1; biases 0.
   *
   * @param config - Architecture.
   * @param seed - Integer seed.
   * @throws {@link ConfigError} for an invalid configuration.
   */
  static create(config: PolicyConfig, seed: number): PolicyModel {
    const valid = validatePolicyConfig(config);
    const residualStd = INIT_STD / Math.sqrt(2 * valid.nLayers);
    return PolicyModel.build(valid, (spec, size) => {
      switch (spec.init) {
        case 'ones':
          return new Float32Array(size).fill(1);
        case 'zeros':
          return new Float32Array(size);
        case 'normal':
          return normalArray(size, INIT_STD, createRng(seed, spec.name));
        case 'residual-out':
          return normalArray(size, residualStd, createRng(seed, spec.name));
        default:
          return assertNever(spec.init, 'initializer');
      }
    });
  }

  /**
   * Creates a model holding the given weights (Hugging Face names and layout, as {@link PolicyModel.getWeights}).
   *
   * @throws {@link ShapeError} when names or shapes do not match `config`.
   */
  static fromWeights(config: PolicyConfig, weights: NamedWeights): PolicyModel {
    const valid = validatePolicyConfig(config);
    checkWeights(policyParamSpecs(valid), weights);
    return PolicyModel.build(valid, (spec) => (weights.get(spec.name) as WeightArray).data);
  }

  private static build(config: ResolvedPolicyConfig, data: (spec: PolicyParamSpec, size: number) => Float32Array): PolicyModel {
    installBackendFixes();
    const params = new Map<string, tf.Variable>();
    const linear = new Set<string>();
    try {
      for (const spec of policyParamSpecs(config)) {
        const size = spec.shape.reduce((p, d) => p * d, 1);
        const value = tf.tidy(() => {
          const t = tf.tensor(data(spec, size), [...spec.shape], 'float32');
          return spec.linear ? tf.transpose(t) : t; // HF [out, in] → [in, out]
        });
        params.set(spec.name, tf.variable(value, true));
        value.dispose();
        if (spec.linear) linear.add(spec.name);
      }
    } catch (error) {
      for (const v of params.values()) v.dispose();
      throw error;
    }
    return new PolicyModel(config, params, linear);
  }

  /**
   * A view of `base` with a LoRA adapter attached: it computes `base + adapter`, shares the base's variables
   * (any number of views share one base in memory) and trains, reads and writes only the adapter's
   * ({@link PolicyModel.trainableVariables}, {@link PolicyModel.getWeights}, {@link PolicyModel.setWeights}).
   * Disposing the view disposes neither the base nor the adapter.
   *
   * @throws {@link ShapeError} when the adapter was made for another architecture, or `base` is a view itself.
   */
  static withAdapter(base: PolicyModel, adapter: ModelAdapter): PolicyModel {
    if (base.adapter !== null) throw new ShapeError('withAdapter: the base model is already an adapter view');
    const mismatched = configMismatches(base.config, adapter.config);
    if (mismatched.length > 0) {
      throw new ShapeError(`withAdapter: the adapter was made for another architecture (${mismatched.join(', ')} differ)`, {
        context: { mismatched },
      });
    }
    return new PolicyModel(base.config, base.params, base.linear, adapter, base.sampling);
  }

  /** Weight names in their stable order: the base's (Hugging Face's), or the adapter's (PEFT's) on a view. */
  weightNames(): string[] {
    return this.adapter?.weightNames() ?? [...this.params.keys()];
  }

  /**
   * The trainable variables, in {@link PolicyModel.weightNames} order (linear weights `[in, out]`): every base
   * weight, or on an adapter view only the adapter's.
   */
  trainableVariables(): tf.Variable[] {
    return this.adapter?.variables() ?? [...this.params.values()];
  }

  /** Total number of weights (scalars): the base's plus, on a view, the adapter's. */
  numParameters(): number {
    let n = this.adapter?.numParameters() ?? 0;
    for (const v of this.params.values()) {
      n += v.size;
    }
    return n;
  }

  /**
   * Disposes every variable (on an adapter view, only its own constants). Idempotent. Every tensor is disposed even
   * when one fails (a backend that crashed fails them all); the first failure is thrown after, the others attached
   * to it as `suppressed`. A caller that disposes after an error keeps that error (see `releaseAfter`).
   */
  dispose(): void {
    if (this.disposed) {
      return;
    }
    this.disposed = true;
    const own = this.adapter === null ? [...this.params.values()] : [];
    disposeEach([
      () => this.sampling.invalidate(this.adapter === null ? undefined : this.adapter),
      ...[...this.decodeGraphs.values()].map((graph) => () => graph.dispose()),
      ...[...own, this.invFreq, this.rotateHalf].map((tensor) => () => tensor.dispose()),
    ]);
  }

  /**
   * The base weights with the adapter merged in (`W + (α/r)·B·A`), Hugging Face names and layout: a plain model
   * that computes what the view computes, for runtimes without LoRA. Without an adapter, {@link PolicyModel.getWeights}.
   */
  mergedWeights(): NamedWeights {
    return this.baseWeights(this.adapter);
  }

  /** Copies of the base weights in Hugging Face names and layout, with `adapter` merged in where it has a pair. */
  private baseWeights(adapter: ModelAdapter | null): NamedWeights {
    const out = new Map<string, WeightArray>();
    for (const [name, v] of this.params) {
      const match = adapter === null ? null : /^model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+_proj)\.weight$/.exec(name);
      const pair = adapter !== null && match !== null ? adapter.pair(Number(match[1]), match[2] as LoraTarget) : null;
      const hf = tf.tidy(() => {
        let w: tf.Tensor = v; // [in, out] for linear weights
        if (pair !== null && adapter !== null) w = tf.add(w, tf.mul(tf.matMul(pair.a, pair.b), adapter.lora.scale));
        return this.linear.has(name) ? tf.transpose(w) : tf.clone(w);
      });
      // Read outside tidy: tidy walks what its function returns, index by index (22 s for a 49152×576 array).
      const data = readCopy(hf);
      const shape = this.linear.has(name) ? [...v.shape].reverse() : [...v.shape];
      out.set(name, { shape, data });
    }
    return out;
  }

  /**
   * Next-token logits at every position.
   *
   * @param inputIds - Token ids `[B, T]`, int32.
   * @param attentionMask - 1 for real tokens, 0 for padding, `[B, T]` (padding keys are never attended).
   * @param positionIds - Position of each token from its row's first real token, `[B, T]` int32 (0 on padding).
   * @returns Logits `[B, T, V]`.
   */
  logits(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D): tf.Tensor3D {
    return tf.tidy(() => {
      const [B, T] = inputIds.shape;
      const h = this.trunk(inputIds, attentionMask, positionIds, null); // [B*T, d]
      return tf.reshape(this.head(h), [B, T, this.config.vocabSize]) as tf.Tensor3D;
    });
  }

  /**
   * Log-probabilities of each next token and the predictive entropies, differentiable with respect to
   * {@link PolicyModel.trainableVariables} (call it inside `tf.variableGrads`). The target token is picked by
   * a one-hot multiply-and-sum, which differentiates on every backend.
   *
   * @param inputIds - Token ids `[B, T]`, int32 (`T ≥ 2`).
   * @param attentionMask - `[B, T]`, 1 for real tokens.
   * @param positionIds - `[B, T]` int32.
   * @param from - First position scored (default 0). The trainer passes the prompt's last position, so the head,
   *   the softmax and the one-hot over the vocabulary run on the response's positions only.
   * @returns `logprobs [B, T-1-from]` with `logprobs[b, t] = log p(x[b, from+t+1] | x[b, ≤from+t])`, and `entropy`
   *   of the same shape.
   */
  tokenLogprobs(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D, from = 0): TokenLogprobs {
    return tf.tidy(() => {
      const [B, T] = inputIds.shape;
      if (T < 2) {
        throw new ShapeError(`tokenLogprobs needs T >= 2, got [${B}, ${T}]`, { context: { shape: [B, T] } });
      }
      if (!(Number.isInteger(from) && from >= 0 && from <= T - 2)) {
        throw new ShapeError(`tokenLogprobs: from must be an integer in 0..${T - 2}, got ${from}`, { context: { shape: [B, T] } });
      }
      const d = this.config.dModel;
      const n = T - 1 - from;
      const h = this.trunk(inputIds, attentionMask, positionIds, null); // [B*T, d]
      const hPrev = tf.slice(tf.reshape(h, [B, T, d]), [0, from, 0], [B, n, d]); // [B, n, d]
      return this.nextTokenLogprobs(hPrev, tf.slice(inputIds, [0, from + 1], [B, n]));
    });
  }

  /**
   * What {@link PolicyModel.tokenLogprobs} gives from the prompt's last position (`from = P − 1`), for rows laid
   * out `[prompt | response]`, with each distinct prompt run through the model once: the rows of a GRPO group
   * share their prompt, so its keys and values are computed once and every row's response attends to them (the
   * gradient of a shared prompt sums over its rows). Differentiable like `tokenLogprobs`.
   *
   * @param inputIds - Token ids `[B, P + R]`, int32: the left-padded prompt, then the response.
   * @param attentionMask - `[B, P + R]`, 1 for real tokens.
   * @param positionIds - `[B, P + R]` int32.
   * @param promptLength - `P` (`1 ≤ P < P + R`).
   * @returns `logprobs [B, R]` of each response token and the predictive `entropy` of the same shape.
   */
  responseLogprobs(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D, promptLength: number): TokenLogprobs {
    const [B, T] = inputIds.shape;
    const P = promptLength;
    const R = T - P;
    if (!(Number.isInteger(P) && P >= 1 && R >= 1)) {
      throw new ShapeError(`responseLogprobs: promptLength must be an integer in 1..${T - 1}, got ${P}`, { context: { shape: [B, T] } });
    }
    const prompts = distinctPromptRows(promptBatchOf(inputIds, attentionMask, positionIds, P));
    if (prompts === null) return this.tokenLogprobs(inputIds, attentionMask, positionIds, P - 1);
    return tf.tidy(() => {
      const d = this.config.dModel;
      const { distinct } = prompts;
      const group = tf.tensor1d(prompts.index, 'int32'); // [B]: each row's prompt
      const u = distinct.rows;
      const response = (t: tf.Tensor2D): tf.Tensor2D => tf.slice(t, [0, P], [B, R]);
      const promptMask = tf.tensor2d(distinct.attentionMask, [u, P]);
      // One stream of the prompts' u·P positions, then the responses' B·R: every position-wise product runs once
      // on both; only attention tells them apart.
      const ids = tf.concat([tf.reshape(tf.tensor2d(distinct.inputIds, [u, P], 'int32'), [-1]), tf.reshape(response(inputIds), [-1])]);
      const positions = tf.concat([
        tf.reshape(tf.tensor2d(distinct.positionIds, [u, P], 'int32'), [-1]),
        tf.reshape(response(positionIds), [-1]),
      ]);
      const rot = this.rotary(positions);
      const biasP = this.groupBias(attentionBias(promptMask, P)); // [u, 1, g·P, P]
      const keyMask = tf.concat([tf.gather(promptMask, group), tf.cast(response(attentionMask), 'float32')], 1); // [B, P+R]
      const biasR = this.groupBias(attentionBias(keyMask, R, P)); // [B, 1, g·R, P+R]
      // One split, not two slices: its gradient is one concatenation, where two slices' are two zero-padded
      // copies of the whole stream and their sum.
      const split = (t: tf.Tensor2D): [tf.Tensor2D, tf.Tensor2D] => tf.split(t, [u * P, B * R], 0) as [tf.Tensor2D, tf.Tensor2D];
      let x = this.embed(ids); // [u·P + B·R, d]
      for (const block of this.blocks) {
        let prompt: LayerCache | undefined;
        const promptAttention = this.attention({ b: u, t: P }, biasP, (k, v) => (prompt = { k, v }));
        const responseAttention = this.attention({ b: B, t: R }, biasR, (k, v) => ({
          k: tf.concat([tf.gather(prompt!.k, group), k], 2), // [B, Hkv, P+R, dh]
          v: tf.concat([tf.gather(prompt!.v, group), v], 2),
        }));
        x = this.block(x, block, rot, (q, k, v) => {
          const [[qp, qr], [kp, kr], [vp, vr]] = [split(q), split(k), split(v)];
          return tf.concat([promptAttention(qp, kp, vp), responseAttention(qr, kr, vr)], 0);
        });
      }
      const [xp, xr] = split(x);
      const eps = this.config.rmsNormEps;
      const last = tf.slice(tf.reshape(xp, [u, P, d]), [0, P - 1, 0], [u, 1, d]); // [u, 1, d]
      const first = rmsNorm(tf.reshape(tf.gather(last, group), [B, d]), this.finalNorm, eps); // [B, d]
      const rest = R > 1 ? [tf.slice(tf.reshape(rmsNorm(xr, this.finalNorm, eps), [B, R, d]), [0, 0, 0], [B, R - 1, d])] : [];
      const hPrev = tf.concat([tf.reshape(first, [B, 1, d]), ...rest], 1); // [B, R, d]
      return this.nextTokenLogprobs(hPrev, response(inputIds));
    });
  }

  /** Log-probs of `targets [B, n]` and the entropies under the head applied to `hPrev [B, n, d]`. */
  private nextTokenLogprobs(hPrev: tf.Tensor, targets: tf.Tensor2D): { logprobs: tf.Tensor2D; entropy: tf.Tensor2D } {
    const [B, n] = targets.shape;
    const V = this.config.vocabSize;
    const logp = tf.logSoftmax(this.head(tf.reshape(hPrev, [B * n, this.config.dModel]))); // [B*n, V]
    const oneHot = tf.cast(tf.oneHot(tf.cast(tf.reshape(targets, [B * n]), 'int32'), V), 'float32'); // [B*n, V]
    const logprobs = tf.reshape(tf.sum(tf.mul(logp, oneHot), -1), [B, n]) as tf.Tensor2D;
    const entropy = tf.reshape(tf.neg(tf.sum(tf.mul(tf.exp(logp), logp), -1)), [B, n]) as tf.Tensor2D;
    return { logprobs, entropy };
  }

  /**
   * Copies of every weight in plain memory under Hugging Face's names and layout (linear weights `[out, in]`):
   * `model.embed_tokens.weight`, `model.layers.{i}.self_attn.q_proj.weight`, …, `model.norm.weight`,
   * `lm_head.weight` (absent when tied).
   */
  getWeights(): NamedWeights {
    return this.adapter?.getWeights() ?? this.baseWeights(null);
  }

  /**
   * Copies of tensors shaped like trainable variables (gradients, for example), keyed by weight name, in the names
   * and layout of {@link PolicyModel.getWeights}: linear weights `[out, in]` as Hugging Face holds them, an adapter's
   * `A` and `B` in PEFT's shapes (a {@link LoraPair} holds both transposed). The tensors are left to the caller.
   *
   * @param values - Tensors by name (names of {@link PolicyModel.weightNames}), each shaped like its variable.
   */
  namedWeightsOf(values: ReadonlyMap<string, tf.Tensor>): NamedWeights {
    const out = new Map<string, WeightArray>();
    for (const [name, value] of values) {
      const held = this.adapter !== null || this.linear.has(name) ? tf.transpose(value) : tf.clone(value);
      out.set(name, { shape: [...held.shape], data: readCopy(held) });
    }
    return out;
  }

  /**
   * Replaces every weight (on an adapter view, the adapter's).
   *
   * @param weights - Exactly the names of {@link PolicyModel.getWeights}, with equal (Hugging Face) shapes.
   * @throws {@link ShapeError} (before changing anything) when a name is missing or unknown, or a shape or
   *   data length differs.
   */
  setWeights(weights: NamedWeights): void {
    if (this.adapter !== null) {
      try {
        this.adapter.setWeights(weights);
      } finally {
        this.weightsChanged();
      }
      return;
    }
    checkWeights(policyParamSpecs(this.config), weights);
    try {
      for (const [name, v] of this.params) {
        const w = weights.get(name) as WeightArray;
        tf.tidy(() => {
          const t = tf.tensor(w.data, [...w.shape], 'float32');
          v.assign(this.linear.has(name) ? tf.transpose(t) : t);
        });
      }
    } finally {
      this.weightsChanged();
    }
  }

  /**
   * Says that this model's trainable variables ({@link PolicyModel.trainableVariables}) were changed in place (an
   * optimizer step, a `tf.Variable.assign`): the fused sampling copies made from them are dropped and rebuilt at the
   * next generation. On a base model this drops the copies of every adapter view of it too; on a view, those of its
   * adapter (in every view of that adapter). {@link PolicyModel.setWeights} calls it itself; a trainer that updates
   * the variables must call it after each update, or generation would go on sampling the old weights.
   */
  weightsChanged(): void {
    this.sampling.invalidate(this.adapter === null ? undefined : this.adapter);
  }

  /**
   * Chooses whether generation reads fused, adapter-merged copies of the blocks (one q/k/v and one gate/up product
   * per block; one extra float32 copy of the fused matrices, about 425 MB for SmolLM2-135M with an adapter on every
   * projection) or the variables themselves. Default: the copy where the weights and it fit in
   * {@link rxrl!SAMPLING_WEIGHTS_MEMORY_SHARE} of the backend's memory, except where decoding steps run as a graph
   * ({@link PolicyModel.setGraphDecoding}): a graph reads the variables as fast as the copy (adapter pairs included),
   * so the copy's build after each weight change would be lost time. Both compute the same logits to float32 rounding.
   */
  setSamplingWeights(fused: boolean): void {
    this.fusedSampling = fused;
    if (!fused) this.sampling.invalidate(this.adapter);
  }

  /**
   * Chooses whether the prompts' forward pass and each decoding step run as one TensorFlow graph each (one session
   * call instead of about 45 eager ops a block) or op by op. Default: as a graph on the native `tensorflow` backend, which alone can run one. Both compute
   * the same logits to float32 rounding.
   */
  setGraphDecoding(enabled: boolean): void {
    this.graphDecoding = enabled;
  }

  /** Whether the prefill and decoding steps run as graphs. */
  private graphSteps(): boolean {
    return (this.graphDecoding ?? true) && graphSessionsAvailable();
  }

  /** The compiled pass for `blocks`, built at the first pass of its kind and their structure; null: eager. */
  private passGraph(pass: DecodePass, blocks: readonly BlockWeights[]): { graph: DecodeGraph; weights: DecodeFeeds } | null {
    if (!this.graphSteps()) return null;
    const { embedTokens, finalNorm, lmHead, rotateHalf } = this;
    const weights: DecodeWeights = { embedTokens, finalNorm, lmHead, rotateHalf, blocks };
    const feeds = decodeFeeds(weights);
    const key = `${pass}:${feeds.structure}`;
    let graph = this.decodeGraphs.get(key);
    if (graph === undefined) {
      graph = new DecodeGraph(this.config, weights, ropeInverseFrequencies(this.config), pass);
      this.decodeGraphs.set(key, graph);
    }
    return { graph, weights: feeds };
  }

  /** The blocks a generation reads, until it releases them: the fused copy, or the variables. */
  /** @internal */
  samplingLeaseInternal(): SamplingLease {
    const fused = this.fusedSampling ?? (!this.graphSteps() && samplingWeightsFit(this.config, this.adapter));
    if (!fused) return { blocks: this.blocks, release: () => undefined };
    return this.sampling.acquire(this.adapter, this.blocks);
  }

  /**
   * Samples one response per request with a KV cache: the left-padded prompts are run once (prefill: each distinct
   * prompt once, and a beginning they all share, such as a chat template's system prompt, once before their rests),
   * then each step feeds one new token per row and attends to the cached keys and values. Rows that finish leave
   * the batch (their cache rows are dropped).
   *
   * Sampling happens on the CPU from logits read back each step, with one seeded stream per request: equal
   * `seed`s under equal weights give equal tokens, whatever else is in the batch. The reported log-probs are
   * those of the sampled tokens under the model's un-tempered (temperature 1, no top-p) distribution.
   *
   * @param requests - Prompts and sampling parameters; `promptTokens.length + maxTokens ≤ maxSeqLen`.
   * @param options - `signal` (checked between steps: unfinished rows end with `'abort'` and keep their tokens;
   *   already fired → rejects with `AbortError`), `version` (reported), `stopIds` (stop tokens of requests without `stopTokens`; default none).
   * @returns One response per request, in order.
   *
   * The variables are read at every step and the call yields to the event loop between steps: callers that
   * replace weights ({@link PolicyModel.setWeights}) should not do so while a generation is in flight (the
   * cache would mix keys from two policies).
   */
  generate(requests: readonly GenerateRequest[], options: GenerateOptions = {}): Promise<GenerateResponse[]> {
    return runGeneration(new KvCacheDecoder(this), requests, options, this.config);
  }

  /**
   * Like {@link PolicyModel.generate} with the same sampling, but recomputing the whole sequence at every
   * step (no cache). For equivalence tests and benchmarks.
   */
  generateRecompute(requests: readonly GenerateRequest[], options: GenerateOptions = {}): Promise<GenerateResponse[]> {
    return runGeneration(new RecomputeDecoder(this), requests, options, this.config);
  }

  // ── internals (used by the decoders below) ────────────────────────────────────

  /** Token embeddings of `ids` (int32, any shape with `N` elements): `[N, d]`. */
  private embed(ids: tf.Tensor): tf.Tensor2D {
    return tf.gather(this.embedTokens, tf.reshape(tf.cast(ids, 'int32'), [-1])) as tf.Tensor2D; // [N, d]
  }

  /** `[N, d] → [N, V]` through the untied head or the embedding read transposed (no copy of the `[V, d]` matrix). */
  private head(h: tf.Tensor2D): tf.Tensor2D {
    if (this.lmHead) return tf.matMul(h, this.lmHead); // [N, V]
    // A tied head's product with the embedding [V, d]: with a large vocabulary, vocabulary-major, (E·hᵀ)ᵀ. TensorFlow's
    // CPU product streams E as the left operand far faster than as a transposed right one (SmolLM2-135M's
    // 49,152 × 576: 4 rows 200 → 20 ms, 16 rows 39 → 21 ms, 256 rows 570 → 240 ms, and its gradient 880 → 610 ms);
    // wasm's is about even. A small vocabulary (the tiny models) keeps the one product.
    if (this.config.vocabSize < VOCAB_MAJOR_HEAD) return tf.matMul(h, this.embedTokens, false, true);
    return tf.transpose(tf.matMul(this.embedTokens, h, false, true)) as tf.Tensor2D; // [V, N] → [N, V]
  }

  /**
   * Cosines and sines of `positions · invFreq`, duplicated over the two halves of a head and repeated for every
   * head of a row (see {@link Rotary}); the queries' copies also carry the attention scale `1/√dh` (RoPE is linear,
   * so scaling the tables scales the queries, once per forward instead of once per layer). Whole rows of tables
   * keep RoPE's products two-dimensional: a layer then reshapes its queries and keys twice, not four times (each a
   * TensorFlow op on the native backend, forward and backward).
   */
  private rotary(positions: tf.Tensor): Rotary {
    const N = positions.size;
    const dh = this.config.headDim;
    const angles = tf.matMul(tf.reshape(tf.cast(positions, 'float32'), [N, 1]), this.invFreq); // [N, dh/2]
    const full: tf.Tensor3D = tf.reshape(tf.concat([angles, angles], 1), [N, 1, dh]); // [N, 1, dh]
    const cos = tf.cos(full);
    const sin = tf.sin(full);
    const scale = 1 / Math.sqrt(dh);
    const qCos: tf.Tensor3D = tf.mul(cos, scale);
    const qSin: tf.Tensor3D = tf.mul(sin, scale);
    const { nHeads: H, nKvHeads: Hkv } = this.config;
    // [N, 1, dh] tables (and a constant for the value heads) side by side as one row of heads, [N, heads·dh].
    const row = (parts: readonly (readonly [tf.Tensor3D | number, number])[]): tf.Tensor2D => {
      const tiles = parts.map(([t, heads]) => (typeof t === 'number' ? tf.fill([N, heads, dh], t) : tf.tile(t, [1, heads, 1])));
      const width = parts.reduce((w, [, heads]) => w + heads * dh, 0);
      return tf.reshape(tiles.length === 1 ? tiles[0] : tf.concat(tiles, 1), [N, width]);
    };
    const once = (make: () => RotaryTables): (() => RotaryTables) => {
      let tables: RotaryTables | undefined;
      return () => (tables ??= make());
    };
    return {
      q: once(() => ({ cos: row([[qCos, H]]), sin: row([[qSin, H]]) })),
      k: once(() => ({ cos: row([[cos, Hkv]]), sin: row([[sin, Hkv]]) })),
      qkv: once(() => ({
        cos: row([
          [qCos, H],
          [cos, Hkv],
          [1, Hkv],
        ]),
        sin: row([
          [qSin, H],
          [sin, Hkv],
          [0, Hkv],
        ]),
      })),
    };
  }

  /** RoPE of `x [N, heads·dh]`: `x·cos + rotateHalf(x)·sin` per head, `[N, heads·dh]`, with tables of its width. */
  private rope(x: tf.Tensor2D, heads: number, { cos, sin }: RotaryTables): tf.Tensor2D {
    const N = x.shape[0];
    const dh = this.config.headDim;
    const turned = tf.matMul(tf.reshape(x, [N * heads, dh]), this.rotateHalf); // [N·heads, dh]
    return tf.add(tf.mul(x, cos), tf.mul(tf.reshape(turned, [N, heads * dh]), sin));
  }

  /** Queries (scaled by `1/√dh`), keys and values of the normed stream `h [N, d]` after biases, q/k norms and RoPE. */
  private projectQkv(h: tf.Tensor2D, block: BlockWeights, rot: Rotary): [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D] {
    const { nHeads: H, nKvHeads: Hkv, headDim: dh, rmsNormEps: eps } = this.config;
    const N = h.shape[0];
    const parts = block.qkv.map((layer) => this.project(h, layer)); // q [N, H·dh], k, v [N, Hkv·dh], or the three fused
    const widths = [H * dh, Hkv * dh, Hkv * dh];
    if (parts.length === 1 && block.qNorm === null) {
      // Fused and no q/k norm: one RoPE pass over the whole [q | k | v] row.
      return tf.split(this.rope(parts[0], H + 2 * Hkv, rot.qkv()), widths, 1) as [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D];
    }
    const [q0, k0, v] = parts.length === 3 ? parts : (tf.split(parts[0], widths, 1) as tf.Tensor2D[]);
    let q = q0;
    let k = k0;
    if (block.qNorm !== null && block.kNorm !== null) {
      q = tf.reshape(rmsNorm(tf.reshape(q, [N * H, dh]), block.qNorm, eps), [N, H * dh]);
      k = tf.reshape(rmsNorm(tf.reshape(k, [N * Hkv, dh]), block.kNorm, eps), [N, Hkv * dh]);
    }
    return [this.rope(q, H, rot.q()), this.rope(k, Hkv, rot.k()), v];
  }

  /** `[b*T, heads·dh] → [b, heads, T, dh]` (a free reshape for one position, as in a decode step). */
  private splitHeads(x: tf.Tensor2D, b: number, t: number, heads: number): tf.Tensor4D {
    const dh = this.config.headDim;
    return t === 1 ? tf.reshape(x, [b, heads, 1, dh]) : tf.transpose(tf.reshape(x, [b, t, heads, dh]), [0, 2, 1, 3]);
  }

  /**
   * Scaled dot-product attention with grouped queries: the `g = H/Hkv` query heads of each key/value head
   * are stacked along the query axis, so no key or value is repeated.
   *
   * @param q - Queries `[b, H, Tq, dh]`, already scaled by `1/√dh`.
   * @param k - Keys `[b, Hkv, Tk, dh]`.
   * @param v - Values `[b, Hkv, Tk, dh]`.
   * @param bias - Additive mask repeated for the `g` heads of a group, `[b, 1, g·Tq, Tk]` (0 or {@link MASK_BIAS};
   *   {@link PolicyModel.groupBias}).
   * @returns Merged heads `[b*Tq, H·dh]`.
   */
  private attend(q: tf.Tensor4D, k: tf.Tensor4D, v: tf.Tensor4D, bias: tf.Tensor4D): tf.Tensor2D {
    const [b, H, Tq, dh] = q.shape;
    const Hkv = k.shape[1];
    const g = H / Hkv;
    const qg: tf.Tensor4D = tf.reshape(q, [b, Hkv, g * Tq, dh]); // [b, Hkv, g·Tq, dh]
    const probs = tf.softmax(tf.add(tf.matMul(qg, k, false, true), bias)); // [b, Hkv, g·Tq, Tk]
    const o = tf.matMul(probs, v); // [b, Hkv, g·Tq, dh]
    // One position: [b, Hkv, g, dh] is already head-major, [b, H·dh].
    if (Tq === 1) return tf.reshape(o, [b, H * dh]);
    return tf.reshape(tf.transpose(tf.reshape(o, [b, H, Tq, dh]), [0, 2, 1, 3]), [b * Tq, H * dh]);
  }

  /** An additive mask `[b, 1, Tq, Tk]` repeated for the `g = H/Hkv` query heads of a group: `[b, 1, g·Tq, Tk]` (once per forward). */
  private groupBias(bias: tf.Tensor4D): tf.Tensor4D {
    const g = this.config.nHeads / this.config.nKvHeads;
    return g === 1 ? bias : tf.tile(bias, [1, 1, g, 1]);
  }

  /** `(SiLU(h·Wgate) ⊙ (h·Wup)) · Wdown` after the block's post-attention RMSNorm: `[N, d] → [N, d]`. */
  private mlp(x: tf.Tensor2D, block: BlockWeights): tf.Tensor2D {
    const h = rmsNorm(x, block.postNorm, this.config.rmsNormEps); // [N, d]
    const parts = block.gateUp.map((layer) => this.project(h, layer)); // gate, up [N, dFF], or the two fused
    const [gate, up] = parts.length === 2 ? parts : (tf.split(parts[0], 2, 1) as tf.Tensor2D[]);
    return this.project(tf.mul(silu(gate), up), block.down); // [N, d]
  }

  /** `x·W (+ bias)` of one of a block's linear layers, plus the adapter's `(α/r)·(x·A)·B` where it has one. */
  private project(x: tf.Tensor2D, layer: BlockLinear): tf.Tensor2D {
    const y = linear(x, layer);
    if (layer.lora === null) return y;
    const low = tf.mul(tf.matMul(x, layer.lora.a), layer.lora.scale); // [N, r]
    return tf.add(y, tf.matMul(low, layer.lora.b));
  }

  /**
   * Attention over a stream of `b` rows of `t` positions each, as {@link PolicyModel.block} calls it: queries,
   * keys and values `[b*t, heads·dh]` in, merged heads `[b*t, H·dh]` out; `kv` turns the new keys and values
   * `[b, Hkv, t, dh]` into the attended ones (a cache's, a shared prompt's, or themselves).
   *
   * @param bias - Additive mask of the query groups, `[b, 1, g·t, Tk]` ({@link PolicyModel.groupBias}).
   */
  private attention(shape: { b: number; t: number }, bias: tf.Tensor4D, kv: (k: tf.Tensor4D, v: tf.Tensor4D) => LayerCache): Attention {
    const { b, t } = shape;
    const { nHeads: H, nKvHeads: Hkv } = this.config;
    return (q, k, v) => {
      const attended = kv(this.splitHeads(k, b, t, Hkv), this.splitHeads(v, b, t, Hkv));
      return this.attend(this.splitHeads(q, b, t, H), attended.k, attended.v, bias);
    };
  }

  /** One block on the stream `x [N, d]`, its positions attending through `attention`. */
  private block(x: tf.Tensor2D, block: BlockWeights, rot: Rotary, attention: Attention): tf.Tensor2D {
    const [q, k, v] = this.projectQkv(rmsNorm(x, block.inputNorm, this.config.rmsNormEps), block, rot);
    const attended = this.project(attention(q, k, v), block.o); // [N, d]
    const mid: tf.Tensor2D = tf.add(x, attended); // [N, d]
    return tf.add(mid, this.mlp(mid, block)) as tf.Tensor2D; // [N, d]
  }

  /**
   * The residual stream after the final norm, for a full sequence.
   *
   * @param collect - When given, receives each block's keys and values (kept out of any enclosing tidy by
   *   the caller returning them).
   * @param blocks - The blocks' weights: the variables (default), or a fused sampling copy.
   * @returns `[B*T, d]`.
   */
  private trunk(
    inputIds: tf.Tensor2D,
    attentionMask: tf.Tensor2D,
    positionIds: tf.Tensor2D,
    collect: LayerCache[] | null,
    blocks: readonly BlockWeights[] = this.blocks,
  ): tf.Tensor2D {
    const [B, T] = inputIds.shape;
    let x = this.embed(inputIds); // [B*T, d]
    const rot = this.rotary(positionIds);
    const bias = this.groupBias(attentionBias(tf.cast(attentionMask, 'float32'), T)); // [B, 1, g·T, T]
    for (const block of blocks) {
      const attention = this.attention({ b: B, t: T }, bias, (k, v) => {
        collect?.push({ k, v });
        return { k, v };
      });
      x = this.block(x, block, rot, attention);
    }
    return rmsNorm(x, this.finalNorm, this.config.rmsNormEps);
  }

  /**
   * Prefill: runs the prompt batch and returns the next-token logits of the last column and every block's
   * cache.
   */
  /** @internal */
  prefillInternal(batch: PromptBatch, blocks: readonly BlockWeights[] = this.blocks): { logits: tf.Tensor2D; caches: LayerCache[] } {
    const graph = this.passGraph('prefill', blocks);
    if (graph !== null) {
      const { rows, inputIds: tokens, positionIds: positions, attentionMask: keyMask } = batch;
      return tf.tidy(() => graph.graph.run(graph.weights, { rows, tokens, positions, keyMask, caches: null }));
    }
    return tf.tidy(() => {
      const { rows: b, width: P } = batch;
      const ids = tf.tensor2d(batch.inputIds, [b, P], 'int32');
      const mask = tf.tensor2d(batch.attentionMask, [b, P], 'float32');
      const pos = tf.tensor2d(batch.positionIds, [b, P], 'int32');
      const caches: LayerCache[] = [];
      const h = this.trunk(ids, mask, pos, caches, blocks); // [b*P, d]
      const last = tf.reshape(tf.slice(tf.reshape(h, [b, P, -1]), [0, P - 1, 0], [b, 1, -1]), [b, -1]); // [b, d]
      return { logits: this.head(last as tf.Tensor2D), caches };
    });
  }

  /**
   * Extends cached rows by `t` positions each (`t` is 1 for a decoding step): `tokens [b·t]` at `positions [b·t]`
   * (row-major), keys masked by `keyMask [b, L+t]` (the cached keys' mask, then the new positions'). Returns the
   * logits `[b, V]` of each row's last new position and the extended caches (the old ones are left to the caller).
   */
  /** @internal */
  decodeInternal(
    tokens: Int32Array,
    positions: Int32Array,
    keyMask: Float32Array,
    caches: readonly LayerCache[],
    blocks: readonly BlockWeights[] = this.blocks,
  ): { logits: tf.Tensor2D; caches: LayerCache[] } {
    const b = caches[0].k.shape[0];
    const t = tokens.length / b;
    const graph = this.passGraph(t === 1 ? 'step' : 'extend', blocks);
    if (graph !== null) return tf.tidy(() => graph.graph.run(graph.weights, { rows: b, tokens, positions, keyMask, caches }));
    return tf.tidy(() => {
      const K = keyMask.length / b;
      let x = this.embed(tf.tensor1d(tokens, 'int32')); // [b·t, d]
      const rot = this.rotary(tf.tensor1d(positions, 'int32'));
      const bias = this.groupBias(attentionBias(tf.tensor2d(keyMask, [b, K], 'float32'), t, K - t)); // [b, 1, g·t, L+t]
      const next: LayerCache[] = [];
      blocks.forEach((block, i) => {
        const attention = this.attention({ b, t }, bias, (k, v) => {
          const cache = { k: tf.concat([caches[i].k, k], 2), v: tf.concat([caches[i].v, v], 2) }; // [b, Hkv, L+t, dh]
          next.push(cache);
          return cache;
        });
        x = this.block(x, block, rot, attention);
      });
      const last = t === 1 ? x : (tf.reshape(tf.slice(tf.reshape(x, [b, t, -1]), [0, t - 1, 0], [b, 1, -1]), [b, -1]) as tf.Tensor2D);
      const logits = this.head(rmsNorm(last, this.finalNorm, this.config.rmsNormEps)); // [b, V]
      return { logits, caches: next };
    });
  }

  /** Next-token logits of the last column of a full sequence `[b, L]` (no cache): `[b, V]`. */
  /** @internal */
  lastLogitsInternal(ids: Int32Array, mask: Float32Array, positions: Int32Array, b: number): tf.Tensor2D {
    return tf.tidy(() => {
      const L = ids.length / b;
      const h = this.trunk(
        tf.tensor2d(ids, [b, L], 'int32'),
        tf.tensor2d(mask, [b, L], 'float32'),
        tf.tensor2d(positions, [b, L], 'int32'),
        null,
      ); // [b*L, d]
      const last = tf.reshape(tf.slice(tf.reshape(h, [b, L, -1]), [0, L - 1, 0], [b, 1, -1]), [b, -1]); // [b, d]
      return this.head(last as tf.Tensor2D);
    });
  }
}

/** Checks names and Hugging Face shapes of `weights` against `specs`, naming every mismatch. */
function checkWeights(specs: readonly PolicyParamSpec[], weights: NamedWeights): void {
  const expected = new Map(specs.map((s) => [s.name, s]));
  const missing = specs.map((s) => s.name).filter((n) => !weights.has(n));
  const unknown = [...weights.keys()].filter((n) => !expected.has(n));
  if (missing.length > 0 || unknown.length > 0) {
    throw new ShapeError(`weights do not match the model: missing [${missing.join(', ')}], unknown [${unknown.join(', ')}]`, {
      context: { missing, unknown },
    });
  }
  for (const spec of specs) {
    const w = weights.get(spec.name) as WeightArray;
    const size = w.shape.reduce((p, d) => p * d, 1);
    if (w.shape.length !== spec.shape.length || w.shape.some((d, i) => d !== spec.shape[i]) || w.data.length !== size) {
      throw new ShapeError(
        `weight '${spec.name}' has shape [${w.shape.join(', ')}] (${w.data.length} values), expected [${spec.shape.join(', ')}]`,
        { context: { name: spec.name, shape: [...w.shape], expected: [...spec.shape] } },
      );
    }
  }
}

/** `x · w (+ bias)` for `x [N, in]`, `w [in, out]` (or `x · wᵀ` for `w [out, in]`), `bias [out]`: `[N, out]`. */
function linear(x: tf.Tensor2D, { w, outMajor, bias }: BlockLinear): tf.Tensor2D {
  const y: tf.Tensor2D = tf.matMul(x, w, false, outMajor); // [N, out]
  return bias === null ? y : (tf.add(y, bias) as tf.Tensor2D);
}

/**
 * RMSNorm (Zhang & Sennrich, 2019) over the last axis: `y = x · r · g` with `r = 1 / √(mean(x²) + ε)`,
 * `x [N, d]`, `g [d]`, `y [N, d]`. Hand-written gradient (fewer kernels than autodiff): with `u = dy · g` and
 * `x̂ = x · r`, `dx = r · (u − x̂ · mean(u · x̂))` and `dg = Σ_N dy · x̂`. One function per ε (they are few).
 */
function rmsNorm(x: tf.Tensor2D, scale: tf.Tensor, eps: number): tf.Tensor2D {
  let fn = rmsNormByEps.get(eps);
  if (fn === undefined) {
    fn = makeRmsNorm(eps);
    rmsNormByEps.set(eps, fn);
  }
  return fn(x, scale);
}

const rmsNormByEps = new Map<number, (x: tf.Tensor2D, scale: tf.Tensor) => tf.Tensor2D>();

function makeRmsNorm(eps: number): (x: tf.Tensor2D, scale: tf.Tensor) => tf.Tensor2D {
  return tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
    const x = args[0] as tf.Tensor;
    const g = args[1] as tf.Tensor;
    const save = args[2] as tf.GradSaveFunc;
    const r = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), eps)); // [N, 1]
    const xHat = tf.mul(x, r); // [N, d]
    save([xHat, r, g]);
    return {
      value: tf.mul(xHat, g),
      gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
        const [xh, rs, gs] = saved;
        const dyT = dy as tf.Tensor;
        const u = tf.mul(dyT, gs); // [N, d]
        const dx = tf.mul(tf.sub(u, tf.mul(xh, tf.mean(tf.mul(u, xh), -1, true))), rs); // [N, d]
        const dg = tf.sum(tf.mul(dyT, xh), 0); // [d]
        return [dx, dg];
      },
    };
  }) as (x: tf.Tensor2D, scale: tf.Tensor) => tf.Tensor2D;
}

/** SiLU `x · σ(x)` with a hand-written gradient `σ(x) · (1 + x · (1 − σ(x)))`. */
const silu = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
  const x = args[0] as tf.Tensor;
  const save = args[1] as tf.GradSaveFunc;
  const s = tf.sigmoid(x);
  save([x, s]);
  return {
    value: tf.mul(x, s),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
      const [xs, ss] = saved;
      const slope = tf.mul(ss, tf.add(1, tf.mul(xs, tf.sub(1, ss))));
      return [tf.mul(dy as tf.Tensor, slope)];
    },
  };
}) as (x: tf.Tensor2D) => tf.Tensor2D;

/**
 * Additive attention bias: 0 where query `i` may see key `j` (`j ≤ offset + i` and key `j` is real),
 * {@link MASK_BIAS} elsewhere. A full sequence has `offset` 0 and `Tq` = the keys' width; a response after its
 * prompt has `offset` = the prompt's width.
 *
 * @param mask - Keys' mask `[B, K]` float, 1 for real tokens.
 * @param Tq - Queries per row.
 * @param offset - Key index of the first query.
 * @returns `[B, 1, Tq, K]`.
 */
function attentionBias(mask: tf.Tensor, Tq: number, offset = 0): tf.Tensor4D {
  const [B, K] = mask.shape;
  const causal = new Float32Array(Tq * K);
  for (let i = 0; i < Tq; i++) {
    causal.fill(1, i * K, i * K + offset + i + 1);
  }
  const allowed = tf.mul(tf.tensor4d(causal, [1, 1, Tq, K]), tf.reshape(mask, [B, 1, 1, K])); // [B, 1, Tq, K]
  return tf.mul(tf.sub(allowed, 1), -MASK_BIAS) as tf.Tensor4D;
}

/** The prompt columns `[0, P)` of a batch's tensors as a {@link PromptBatch} in plain memory. */
function promptBatchOf(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D, P: number): PromptBatch {
  const [B, T] = inputIds.shape;
  const cut = <A extends Int32Array | Float32Array>(all: A, make: (n: number) => A): A => {
    const out = make(B * P);
    for (let r = 0; r < B; r++) out.set(all.subarray(r * T, r * T + P), r * P);
    return out;
  };
  return {
    rows: B,
    width: P,
    // `cut` copies the prompt columns out of what the backend reads back: no second copy of the whole rows.
    inputIds: cut(inputIds.dataSync() as Int32Array, (n) => new Int32Array(n)),
    attentionMask: cut(attentionMask.dataSync() as Float32Array, (n) => new Float32Array(n)),
    positionIds: cut(positionIds.dataSync() as Int32Array, (n) => new Int32Array(n)),
  };
}

/**
 * Rows of one prefill forward pass: a larger batch is prefilled in slices of this many rows, one slice per turn of
 * the event loop, so that a server answers meanwhile (a slice's rows are computed as they would be in one pass).
 */
export const PREFILL_ROWS = 64;

/** KV-cache decoder: one prefill (in slices of {@link PREFILL_ROWS} rows), then one position per step. */
class KvCacheDecoder implements StepDecoder {
  private caches: LayerCache[] = [];
  /** Key mask of the current rows, row-major `[b, L]`. */
  private keyMask = new Float32Array(0);
  private rows = 0;
  /** The blocks every step reads (a fused sampling copy, or the variables), held until {@link KvCacheDecoder.dispose}. */
  private lease: SamplingLease | null = null;

  constructor(private readonly model: PolicyModel) {}

  /**
   * Prefills each distinct prompt once (a group's rows share theirs) and gives every row its copy; a beginning every
   * distinct prompt shares ({@link splitSharedPrefix}) is run once, and the rest of each prompt after it.
   */
  async start(batch: PromptBatch): Promise<tf.Tensor2D> {
    this.lease = this.model.samplingLeaseInternal();
    const { blocks } = this.lease;
    const rows = distinctPromptRows(batch);
    const prompts = rows?.distinct ?? batch;
    const shared = splitSharedPrefix(prompts);
    let prefilled = shared === null ? await this.prefill(prompts, blocks) : await this.prefillShared(shared, blocks);
    // The keys' mask as the prefill laid the rows out (a shared prefix puts each row's padding after it).
    let keyMask = shared === null ? prompts.attentionMask : shared.keyMask;
    if (rows !== null) {
      const distinct = prefilled;
      prefilled = tf.tidy(() => {
        const index = tf.tensor1d(rows.index, 'int32');
        return {
          logits: tf.gather(distinct.logits, index, 0),
          caches: distinct.caches.map((c) => ({ k: tf.gather(c.k, index, 0), v: tf.gather(c.v, index, 0) })),
        };
      });
      disposeParts([distinct]);
      keyMask = pickRows(keyMask, keyMask.length / prompts.rows, rows.index);
    }
    this.caches = prefilled.caches;
    this.keyMask = keyMask.slice();
    this.rows = batch.rows;
    return prefilled.logits;
  }

  /** The prompts' logits and caches, in slices of {@link PREFILL_ROWS} rows. */
  private prefill(batch: PromptBatch, blocks: readonly BlockWeights[]): Promise<PrefillPart> {
    return inSlices(batch.rows, (first, count) => this.model.prefillInternal(promptRows(batch, first, count), blocks));
  }

  /** The shared prefix's pass, then the rest of the prompts after its keys and values, in slices of {@link PREFILL_ROWS} rows. */
  private async prefillShared(shared: SharedPrefix, blocks: readonly BlockWeights[]): Promise<PrefillPart> {
    const prefix = this.model.prefillInternal(shared.prefix, blocks);
    try {
      const { rest, keyMask } = shared;
      const width = keyMask.length / rest.rows;
      return await inSlices(rest.rows, (first, count) => {
        const slice = promptRows(rest, first, count);
        const caches = tf.tidy(() => prefix.caches.map((c) => ({ k: tf.tile(c.k, [count, 1, 1, 1]), v: tf.tile(c.v, [count, 1, 1, 1]) })));
        try {
          const mask = keyMask.subarray(first * width, (first + count) * width);
          return this.model.decodeInternal(slice.inputIds, slice.positionIds, mask, caches, blocks);
        } finally {
          for (const c of caches) tf.dispose([c.k, c.v]);
        }
      });
    } finally {
      disposeParts([prefix]);
    }
  }

  step(tokens: Int32Array, positions: Int32Array): tf.Tensor2D {
    const b = this.rows;
    const L = this.keyMask.length / b;
    const mask = new Float32Array(b * (L + 1));
    for (let r = 0; r < b; r++) {
      mask.set(this.keyMask.subarray(r * L, (r + 1) * L), r * (L + 1));
      mask[r * (L + 1) + L] = 1;
    }
    const { logits, caches } = this.model.decodeInternal(tokens, positions, mask, this.caches, this.lease?.blocks);
    this.disposeCaches();
    this.caches = caches;
    this.keyMask = mask;
    return logits;
  }

  keepRows(rows: readonly number[]): void {
    const L = this.keyMask.length / this.rows;
    const next = tf.tidy(() => {
      const index = tf.tensor1d(Int32Array.from(rows), 'int32');
      return this.caches.map((c) => ({ k: tf.gather(c.k, index, 0), v: tf.gather(c.v, index, 0) }));
    });
    this.disposeCaches();
    this.caches = next;
    this.keyMask = pickRows(this.keyMask, L, rows);
    this.rows = rows.length;
  }

  dispose(): void {
    this.disposeCaches();
    this.lease?.release();
    this.lease = null;
  }

  private disposeCaches(): void {
    for (const c of this.caches) {
      c.k.dispose();
      c.v.dispose();
    }
    this.caches = [];
  }
}

function disposeParts(parts: readonly { logits: tf.Tensor2D; caches: readonly LayerCache[] }[]): void {
  for (const part of parts) {
    part.logits.dispose();
    for (const c of part.caches) {
      c.k.dispose();
      c.v.dispose();
    }
  }
}

/** A prefill's next-token logits and caches. */
type PrefillPart = { logits: tf.Tensor2D; caches: LayerCache[] };

/**
 * `pass` over rows `[0, rows)` in slices of {@link PREFILL_ROWS}, with a turn of the event loop between, joined into
 * one part (the parts are disposed).
 */
async function inSlices(rows: number, pass: (first: number, count: number) => PrefillPart): Promise<PrefillPart> {
  const parts: PrefillPart[] = [];
  try {
    for (let first = 0; first < rows; first += PREFILL_ROWS) {
      if (first > 0) await yieldToEventLoop();
      parts.push(pass(first, Math.min(PREFILL_ROWS, rows - first)));
    }
    if (parts.length === 1) return parts[0];
    const joined = tf.tidy(() => ({
      logits: tf.concat(
        parts.map((p) => p.logits),
        0,
      ),
      caches: parts[0].caches.map((_, i) => ({
        k: tf.concat(
          parts.map((p) => p.caches[i].k),
          0,
        ),
        v: tf.concat(
          parts.map((p) => p.caches[i].v),
          0,
        ),
      })),
    }));
    disposeParts(parts);
    return joined;
  } catch (error) {
    disposeParts(parts);
    throw error;
  }
}

/** Recompute decoder: the whole sequence every step (reference for the cache). */
class RecomputeDecoder implements StepDecoder {
  private ids = new Int32Array(0);
  private mask = new Float32Array(0);
  private positions = new Int32Array(0);
  private rows = 0;

  constructor(private readonly model: PolicyModel) {}

  async start(batch: PromptBatch): Promise<tf.Tensor2D> {
    this.ids = batch.inputIds.slice();
    this.mask = batch.attentionMask.slice();
    this.positions = batch.positionIds.slice();
    this.rows = batch.rows;
    return this.model.lastLogitsInternal(this.ids, this.mask, this.positions, this.rows);
  }

  step(tokens: Int32Array, positions: Int32Array): tf.Tensor2D {
    const b = this.rows;
    const L = this.ids.length / b;
    const ids = new Int32Array(b * (L + 1));
    const mask = new Float32Array(b * (L + 1));
    const pos = new Int32Array(b * (L + 1));
    for (let r = 0; r < b; r++) {
      ids.set(this.ids.subarray(r * L, (r + 1) * L), r * (L + 1));
      mask.set(this.mask.subarray(r * L, (r + 1) * L), r * (L + 1));
      pos.set(this.positions.subarray(r * L, (r + 1) * L), r * (L + 1));
      ids[r * (L + 1) + L] = tokens[r];
      mask[r * (L + 1) + L] = 1;
      pos[r * (L + 1) + L] = positions[r];
    }
    this.ids = ids;
    this.mask = mask;
    this.positions = pos;
    return this.model.lastLogitsInternal(ids, mask, pos, b);
  }

  keepRows(rows: readonly number[]): void {
    const L = this.ids.length / this.rows;
    const pick = <A extends Int32Array | Float32Array>(src: A, dst: A): A => {
      rows.forEach((r, i) => dst.set(src.subarray(r * L, (r + 1) * L), i * L));
      return dst;
    };
    this.ids = pick(this.ids, new Int32Array(rows.length * L));
    this.mask = pick(this.mask, new Float32Array(rows.length * L));
    this.positions = pick(this.positions, new Int32Array(rows.length * L));
    this.rows = rows.length;
  }

  dispose(): void {
    // Plain memory only.
  }
}
