/**
 * The policy model: a small decoder-only transformer on tfjs-core ops, with KV-cache sampling.
 *
 * Architecture (per token, `d = dModel`, `H = nHeads`, `dh = d / H`):
 * ```
 * x = tokEmbedding[id] + posEmbedding[position]              one-hot products, no gather
 * repeat nLayers:  x += Wo · attn(RMSNorm(x) · Wq, ·Wk, ·Wv)  causal, padding keys masked
 *                  x += Wout · GELU(Win · RMSNorm(x))         tanh approximation of GELU
 * logits = RMSNorm(x) · lmHead                               separate (untied) head
 * ```
 * Positions are learned absolute embeddings indexed by explicit `positionIds` (the position counted from each
 * row's first real token), so a left-padded row computes exactly what it would unpadded. Dense layers have
 * no biases. Every weight product is a plain 2-D `matMul` without transpose flags, and nothing gathers, which
 * keeps the model fast and differentiable on wasm.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, GenerateResponse, NamedWeights, WeightArray } from '../engine/types.js';
import { ConfigError, ShapeError, assertNever } from '../errors.js';
import { installBackendFixes } from './backend.js';
import { runGeneration, type GenerateOptions, type PromptBatch, type StepDecoder } from './generate.js';
import { createRng, normalArray } from '../random.js';

/** Architecture of a {@link PolicyModel}. */
export interface PolicyConfig {
  /** Vocabulary size `V`. */
  readonly vocabSize: number;
  /** Residual width `d`; a multiple of `nHeads`. */
  readonly dModel: number;
  /** Number of transformer blocks. */
  readonly nLayers: number;
  /** Attention heads per block. */
  readonly nHeads: number;
  /** Hidden width of the MLP. */
  readonly dFF: number;
  /** Number of learned positions: every position id must be below it. */
  readonly maxSeqLen: number;
}

/** Log-probabilities of the observed next tokens and the entropies of the predicted distributions. */
export interface TokenLogprobs {
  /** `logprobs[b, t] = log p(x[b, t+1] | x[b, ≤t])`, `[B, T-1]`. */
  readonly logprobs: tf.Tensor2D;
  /** Entropy (nats) of `p(· | x[b, ≤t])`, `[B, T-1]`. */
  readonly entropy: tf.Tensor2D;
}

/** Epsilon added to the mean square in RMSNorm. */
export const RMS_NORM_EPS = 1e-5;
/** Additive attention bias of masked (future or padding) keys; finite so fully masked rows stay finite. */
export const MASK_BIAS = -1e9;
/** Standard deviation of the normal initialization of embeddings and projections (GPT-2). */
export const INIT_STD = 0.02;
/** `sqrt(2 / π)`, of the tanh approximation of GELU. */
const GELU_SQRT_2_OVER_PI = Math.sqrt(2 / Math.PI);
/** Cubic coefficient of the tanh approximation of GELU. */
const GELU_CUBIC = 0.044715;

/** Per-block variables. */
interface Block {
  readonly attnNorm: tf.Variable;
  readonly wq: tf.Variable;
  readonly wk: tf.Variable;
  readonly wv: tf.Variable;
  readonly wo: tf.Variable;
  readonly mlpNorm: tf.Variable;
  readonly wIn: tf.Variable;
  readonly wOut: tf.Variable;
}

/** Keys and values of one block for a batch: `k [b, H, L, dh]`, `v [b, H, L, dh]`. */
type LayerCache = {
  readonly k: tf.Tensor4D;
  readonly v: tf.Tensor4D;
};

/** How a weight is initialized: `N(0, 0.02²)`, `N(0, (0.02/√(2·nLayers))²)` or all ones. */
export type PolicyInitKind = 'normal' | 'residual-out' | 'ones';

/** Name, shape and initializer of one weight. */
export interface PolicyParamSpec {
  readonly name: string;
  readonly shape: readonly number[];
  readonly init: PolicyInitKind;
}

/**
 * Validates a configuration.
 *
 * @throws {@link ConfigError} when a size is not a positive integer or `dModel` is not a multiple of `nHeads`.
 */
export function validatePolicyConfig(config: PolicyConfig): PolicyConfig {
  for (const key of ['vocabSize', 'dModel', 'nLayers', 'nHeads', 'dFF', 'maxSeqLen'] as const) {
    const value = config[key];
    if (!Number.isInteger(value) || value <= 0) {
      throw new ConfigError(`policy config ${key} must be a positive integer, got ${String(value)}`, {
        context: { key, value },
      });
    }
  }
  if (config.dModel % config.nHeads !== 0) {
    throw new ConfigError(`policy config dModel (${config.dModel}) must be a multiple of nHeads (${config.nHeads})`, {
      context: { dModel: config.dModel, nHeads: config.nHeads },
    });
  }
  return {
    vocabSize: config.vocabSize,
    dModel: config.dModel,
    nLayers: config.nLayers,
    nHeads: config.nHeads,
    dFF: config.dFF,
    maxSeqLen: config.maxSeqLen,
  };
}

/** Names, shapes and initializers of every weight of a configuration, in a stable order. */
export function policyParamSpecs(config: PolicyConfig): PolicyParamSpec[] {
  const { vocabSize: V, dModel: d, dFF: f, maxSeqLen: S } = config;
  const specs: PolicyParamSpec[] = [
    { name: 'tokEmbedding', shape: [V, d], init: 'normal' },
    { name: 'posEmbedding', shape: [S, d], init: 'normal' },
  ];
  for (let i = 0; i < config.nLayers; i++) {
    const p = `blocks.${i}`;
    specs.push(
      { name: `${p}.attnNorm.scale`, shape: [d], init: 'ones' },
      { name: `${p}.attn.wq`, shape: [d, d], init: 'normal' },
      { name: `${p}.attn.wk`, shape: [d, d], init: 'normal' },
      { name: `${p}.attn.wv`, shape: [d, d], init: 'normal' },
      { name: `${p}.attn.wo`, shape: [d, d], init: 'residual-out' },
      { name: `${p}.mlpNorm.scale`, shape: [d], init: 'ones' },
      { name: `${p}.mlp.wIn`, shape: [d, f], init: 'normal' },
      { name: `${p}.mlp.wOut`, shape: [f, d], init: 'residual-out' },
    );
  }
  specs.push({ name: 'finalNorm.scale', shape: [d], init: 'ones' }, { name: 'lmHead', shape: [d, V], init: 'normal' });
  return specs;
}

/**
 * A decoder-only transformer policy. Owns its `tf.Variable`s; call {@link PolicyModel.dispose} when done.
 *
 * @example
 * ```ts
 * import { PolicyModel } from 'rxrl/lib/model/transformer.js';
 * const model = PolicyModel.create({ vocabSize: 51, dModel: 64, nLayers: 2, nHeads: 4, dFF: 256, maxSeqLen: 64 }, 1);
 * const [out] = await model.generate([{ promptTokens: [1, 30, 41, 31, 40], maxTokens: 8, seed: 7 }]);
 * model.dispose();
 * ```
 */
export class PolicyModel {
  /** The validated architecture. */
  readonly config: PolicyConfig;
  private readonly params: ReadonlyMap<string, tf.Variable>;
  private readonly tokEmbedding: tf.Variable;
  private readonly posEmbedding: tf.Variable;
  private readonly blocks: readonly Block[];
  private readonly finalNorm: tf.Variable;
  private readonly lmHead: tf.Variable;
  private disposed = false;

  private constructor(config: PolicyConfig, params: ReadonlyMap<string, tf.Variable>) {
    this.config = config;
    this.params = params;
    const get = (name: string): tf.Variable => params.get(name) as tf.Variable;
    this.tokEmbedding = get('tokEmbedding');
    this.posEmbedding = get('posEmbedding');
    this.blocks = Array.from({ length: config.nLayers }, (_, i) => ({
      attnNorm: get(`blocks.${i}.attnNorm.scale`),
      wq: get(`blocks.${i}.attn.wq`),
      wk: get(`blocks.${i}.attn.wk`),
      wv: get(`blocks.${i}.attn.wv`),
      wo: get(`blocks.${i}.attn.wo`),
      mlpNorm: get(`blocks.${i}.mlpNorm.scale`),
      wIn: get(`blocks.${i}.mlp.wIn`),
      wOut: get(`blocks.${i}.mlp.wOut`),
    }));
    this.finalNorm = get('finalNorm.scale');
    this.lmHead = get('lmHead');
  }

  /**
   * Creates a model with seeded weights: the same `config` and `seed` give bit-identical weights on every
   * backend (they are drawn on the CPU, one independent stream per weight name). Embeddings and input
   * projections are `N(0, 0.02²)`; residual output projections `N(0, (0.02 / √(2·nLayers))²)`; norm scales 1.
   *
   * @param config - Architecture.
   * @param seed - Integer seed.
   * @throws {@link ConfigError} for an invalid configuration.
   */
  static create(config: PolicyConfig, seed: number): PolicyModel {
    const valid = validatePolicyConfig(config);
    installBackendFixes();
    const residualStd = INIT_STD / Math.sqrt(2 * valid.nLayers);
    const params = new Map<string, tf.Variable>();
    for (const spec of policyParamSpecs(valid)) {
      const size = spec.shape.reduce((p, d) => p * d, 1);
      let data: Float32Array;
      switch (spec.init) {
        case 'ones':
          data = new Float32Array(size).fill(1);
          break;
        case 'normal':
          data = normalArray(size, INIT_STD, createRng(seed, spec.name));
          break;
        case 'residual-out':
          data = normalArray(size, residualStd, createRng(seed, spec.name));
          break;
        default:
          return assertNever(spec.init, 'initializer');
      }
      const value = tf.tensor(data, [...spec.shape], 'float32');
      params.set(spec.name, tf.variable(value, true));
      value.dispose();
    }
    return new PolicyModel(valid, params);
  }

  /**
   * Creates a model holding the given weights.
   *
   * @throws {@link ShapeError} when names or shapes do not match `config`.
   */
  static fromWeights(config: PolicyConfig, weights: NamedWeights): PolicyModel {
    const model = PolicyModel.create(config, 0);
    try {
      model.setWeights(weights);
    } catch (error) {
      model.dispose();
      throw error;
    }
    return model;
  }

  /** Weight names in their stable order. */
  weightNames(): string[] {
    return [...this.params.keys()];
  }

  /** The trainable variables, in {@link PolicyModel.weightNames} order. */
  trainableVariables(): tf.Variable[] {
    return [...this.params.values()];
  }

  /** Total number of weights (scalars). */
  numParameters(): number {
    let n = 0;
    for (const v of this.params.values()) {
      n += v.size;
    }
    return n;
  }

  /** Disposes every variable. Idempotent. */
  dispose(): void {
    if (this.disposed) {
      return;
    }
    this.disposed = true;
    for (const v of this.params.values()) {
      v.dispose();
    }
  }

  /**
   * Next-token logits at every position.
   *
   * @param inputIds - Token ids `[B, T]`, int32.
   * @param attentionMask - 1 for real tokens, 0 for padding, `[B, T]` (padding keys are never attended).
   * @param positionIds - Position of each token from its row's first real token, `[B, T]` int32, each below
   *   `maxSeqLen` (0 on padding).
   * @returns Logits `[B, T, V]`.
   */
  logits(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D): tf.Tensor3D {
    return tf.tidy(() => {
      const [B, T] = inputIds.shape;
      const h = this.trunk(inputIds, attentionMask, positionIds, null); // [B*T, d]
      return tf.reshape(tf.matMul(h, this.lmHead), [B, T, this.config.vocabSize]) as tf.Tensor3D;
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
   * @returns `logprobs [B, T-1]` with `logprobs[b, t] = log p(x[b, t+1] | x[b, ≤t])`, and `entropy [B, T-1]`.
   */
  tokenLogprobs(inputIds: tf.Tensor2D, attentionMask: tf.Tensor2D, positionIds: tf.Tensor2D): TokenLogprobs {
    return tf.tidy(() => {
      const [B, T] = inputIds.shape;
      if (T < 2) {
        throw new ShapeError(`tokenLogprobs needs T >= 2, got [${B}, ${T}]`, { context: { shape: [B, T] } });
      }
      const V = this.config.vocabSize;
      const d = this.config.dModel;
      const h = this.trunk(inputIds, attentionMask, positionIds, null); // [B*T, d]
      const hPrev = tf.slice(tf.reshape(h, [B, T, d]), [0, 0, 0], [B, T - 1, d]); // [B, T-1, d]
      const logits = tf.matMul(tf.reshape(hPrev, [B * (T - 1), d]), this.lmHead); // [B*(T-1), V]
      const logp = tf.logSoftmax(logits); // [B*(T-1), V]
      const targets = tf.reshape(tf.slice(inputIds, [0, 1], [B, T - 1]), [B * (T - 1)]); // [B*(T-1)]
      const oneHot = tf.cast(tf.oneHot(tf.cast(targets, 'int32'), V), 'float32'); // [B*(T-1), V]
      const logprobs = tf.reshape(tf.sum(tf.mul(logp, oneHot), -1), [B, T - 1]) as tf.Tensor2D;
      const entropy = tf.reshape(tf.neg(tf.sum(tf.mul(tf.exp(logp), logp), -1)), [B, T - 1]) as tf.Tensor2D;
      return { logprobs, entropy };
    });
  }

  /**
   * Copies of every weight in plain memory, keyed by stable names (`tokEmbedding`, `posEmbedding`,
   * `blocks.{i}.attnNorm.scale`, `blocks.{i}.attn.{wq,wk,wv,wo}`, `blocks.{i}.mlpNorm.scale`,
   * `blocks.{i}.mlp.{wIn,wOut}`, `finalNorm.scale`, `lmHead`). Matrices are `[in, out]`.
   */
  getWeights(): NamedWeights {
    const out = new Map<string, WeightArray>();
    for (const [name, v] of this.params) {
      out.set(name, { shape: [...v.shape], data: Float32Array.from(v.dataSync() as Float32Array) });
    }
    return out;
  }

  /**
   * Replaces every weight.
   *
   * @param weights - Exactly the names of {@link PolicyModel.getWeights}, with equal shapes.
   * @throws {@link ShapeError} (before changing anything) when a name is missing or unknown, or a shape or
   *   data length differs.
   */
  setWeights(weights: NamedWeights): void {
    const missing = [...this.params.keys()].filter((n) => !weights.has(n));
    const unknown = [...weights.keys()].filter((n) => !this.params.has(n));
    if (missing.length > 0 || unknown.length > 0) {
      throw new ShapeError(`weights do not match the model: missing [${missing.join(', ')}], unknown [${unknown.join(', ')}]`, {
        context: { missing, unknown },
      });
    }
    for (const [name, v] of this.params) {
      const w = weights.get(name) as WeightArray;
      const size = w.shape.reduce((p, d) => p * d, 1);
      if (w.shape.length !== v.shape.length || w.shape.some((d, i) => d !== v.shape[i]) || w.data.length !== size) {
        throw new ShapeError(
          `weight '${name}' has shape [${w.shape.join(', ')}] (${w.data.length} values), expected [${v.shape.join(', ')}]`,
          { context: { name, shape: [...w.shape], expected: [...v.shape] } },
        );
      }
    }
    for (const [name, v] of this.params) {
      const w = weights.get(name) as WeightArray;
      tf.tidy(() => v.assign(tf.tensor(w.data, [...w.shape], 'float32')));
    }
  }

  /**
   * Samples one response per request with a KV cache: the left-padded prompts are run once (prefill), then
   * each step feeds one new token per row and attends to the cached keys and values. Rows that finish leave
   * the batch (their cache rows are dropped).
   *
   * Sampling happens on the CPU from logits read back each step, with one seeded stream per request: equal
   * `seed`s under equal weights give equal tokens, whatever else is in the batch. The reported log-probs are
   * those of the sampled tokens under the model's un-tempered (temperature 1, no top-p) distribution.
   *
   * @param requests - Prompts and sampling parameters; `promptTokens.length + maxTokens ≤ maxSeqLen`.
   * @param options - `signal` (checked between steps: unfinished rows end with `'abort'` and keep their tokens;
   *   already fired → rejects with `AbortError`), `version` (reported), `eosId` (default stop token, 2).
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

  /**
   * Embedding of `ids` at `positions` (both int32, equal size `N`), as one-hot products: `[N, d]`.
   */
  private embed(ids: tf.Tensor, positions: tf.Tensor): tf.Tensor2D {
    const idsFlat = tf.reshape(tf.cast(ids, 'int32'), [-1]); // [N]
    const posFlat = tf.reshape(tf.cast(positions, 'int32'), [-1]); // [N]
    const tok = tf.cast(tf.oneHot(idsFlat, this.config.vocabSize), 'float32'); // [N, V]
    const pos = tf.cast(tf.oneHot(posFlat, this.config.maxSeqLen), 'float32'); // [N, S]
    return tf.add(tf.matMul(tok, this.tokEmbedding), tf.matMul(pos, this.posEmbedding)); // [N, d]
  }

  /**
   * The residual stream after the final norm, for a full sequence.
   *
   * @param collect - When given, receives each block's keys and values (kept out of any enclosing tidy by
   *   the caller returning them).
   * @returns `[B*T, d]`.
   */
  private trunk(
    inputIds: tf.Tensor2D,
    attentionMask: tf.Tensor2D,
    positionIds: tf.Tensor2D,
    collect: LayerCache[] | null,
  ): tf.Tensor2D {
    const [B, T] = inputIds.shape;
    let x = this.embed(inputIds, positionIds); // [B*T, d]
    const bias = attentionBias(tf.cast(attentionMask, 'float32'), T); // [B, 1, T, T]
    for (const block of this.blocks) {
      const [qx, kx, vx] = this.projectQkv(rmsNorm(x, block.attnNorm), block); // 3 × [B*T, d]
      const q = this.splitHeads(qx, B, T); // [B, H, T, dh]
      const k = this.splitHeads(kx, B, T); // [B, H, T, dh]
      const v = this.splitHeads(vx, B, T); // [B, H, T, dh]
      collect?.push({ k, v });
      const o = this.attend(q, k, v, bias); // [B*T, d]
      x = tf.add(x, tf.matMul(o, block.wo)); // [B*T, d]
      x = tf.add(x, this.mlp(x, block)); // [B*T, d]
    }
    return rmsNorm(x, this.finalNorm);
  }

  /**
   * Queries, keys and values of `h [N, d]`: `3 × [N, d]`. Three products measured faster on wasm than one
   * product with the concatenated `[d, 3d]` weight (the concat and split cost more than they save).
   */
  private projectQkv(h: tf.Tensor2D, block: Block): tf.Tensor2D[] {
    return [tf.matMul(h, block.wq), tf.matMul(h, block.wk), tf.matMul(h, block.wv)];
  }

  /** `[b*T, d] → [b, H, T, dh]`. */
  private splitHeads(x: tf.Tensor2D, b: number, t: number): tf.Tensor4D {
    const H = this.config.nHeads;
    const dh = this.config.dModel / H;
    return tf.transpose(tf.reshape(x, [b, t, H, dh]), [0, 2, 1, 3]);
  }

  /**
   * Scaled dot-product attention. The score product `q · kᵀ` uses the `transposeB` flag: batched products
   * take the same (generic) wasm kernel with or without flags, so an explicit transpose would only add work.
   *
   * @param q - Queries `[b, H, Tq, dh]`.
   * @param k - Keys `[b, H, Tk, dh]`.
   * @param v - Values `[b, H, Tk, dh]`.
   * @param bias - Additive mask `[b, 1, Tq, Tk]` (0 or {@link MASK_BIAS}).
   * @returns Merged heads `[b*Tq, d]`.
   */
  private attend(q: tf.Tensor4D, k: tf.Tensor4D, v: tf.Tensor4D, bias: tf.Tensor4D): tf.Tensor2D {
    const [b, H, Tq, dh] = q.shape;
    const scores = tf.add(tf.matMul(tf.mul(q, 1 / Math.sqrt(dh)), k, false, true), bias); // [b, H, Tq, Tk]
    const probs = tf.softmax(scores); // [b, H, Tq, Tk]
    const o = tf.matMul(probs, v); // [b, H, Tq, dh]
    return tf.reshape(tf.transpose(o, [0, 2, 1, 3]), [b * Tq, H * dh]);
  }

  /** `GELU(x · wIn) · wOut` after the block's RMSNorm: `[N, d] → [N, d]`. */
  private mlp(x: tf.Tensor2D, block: Block): tf.Tensor2D {
    const h: tf.Tensor2D = tf.matMul(rmsNorm(x, block.mlpNorm), block.wIn); // [N, dFF]
    return tf.matMul(gelu(h), block.wOut); // [N, d]
  }

  /**
   * Prefill: runs the prompt batch and returns the next-token logits of the last column and every block's
   * cache.
   */
  /** @internal */
  prefillInternal(batch: PromptBatch): { logits: tf.Tensor2D; caches: LayerCache[] } {
    return tf.tidy(() => {
      const { rows: b, width: P } = batch;
      const ids = tf.tensor2d(batch.inputIds, [b, P], 'int32');
      const mask = tf.tensor2d(batch.attentionMask, [b, P], 'float32');
      const pos = tf.tensor2d(batch.positionIds, [b, P], 'int32');
      const caches: LayerCache[] = [];
      const h = this.trunk(ids, mask, pos, caches); // [b*P, d]
      const last = tf.reshape(tf.slice(tf.reshape(h, [b, P, -1]), [0, P - 1, 0], [b, 1, -1]), [b, -1]); // [b, d]
      return { logits: tf.matMul(last, this.lmHead) as tf.Tensor2D, caches };
    });
  }

  /**
   * One decoding step with the cache: `tokens [b]` at `positions [b]`, keys masked by `keyMask [b, L+1]`
   * (which includes the new token). Returns the logits `[b, V]` and the extended caches (the old ones are
   * left to the caller).
   */
  /** @internal */
  decodeInternal(
    tokens: Int32Array,
    positions: Int32Array,
    keyMask: Float32Array,
    caches: readonly LayerCache[],
  ): { logits: tf.Tensor2D; caches: LayerCache[] } {
    return tf.tidy(() => {
      const b = tokens.length;
      const L1 = keyMask.length / b;
      let x = this.embed(tf.tensor1d(tokens, 'int32'), tf.tensor1d(positions, 'int32')); // [b, d]
      const bias = tf.reshape(
        tf.mul(tf.sub(tf.tensor2d(keyMask, [b, L1], 'float32'), 1), -MASK_BIAS), // [b, L+1]
        [b, 1, 1, L1],
      ) as tf.Tensor4D;
      const next: LayerCache[] = [];
      this.blocks.forEach((block, i) => {
        const [qx, kx, vx] = this.projectQkv(rmsNorm(x, block.attnNorm), block); // 3 × [b, d]
        const q = this.splitHeads(qx, b, 1); // [b, H, 1, dh]
        const k = tf.concat([caches[i].k, this.splitHeads(kx, b, 1)], 2); // [b, H, L+1, dh]
        const v = tf.concat([caches[i].v, this.splitHeads(vx, b, 1)], 2); // [b, H, L+1, dh]
        next.push({ k, v });
        const o = this.attend(q, k, v, bias); // [b, d]
        x = tf.add(x, tf.matMul(o, block.wo));
        x = tf.add(x, this.mlp(x, block));
      });
      const logits = tf.matMul(rmsNorm(x, this.finalNorm), this.lmHead) as tf.Tensor2D; // [b, V]
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
      return tf.matMul(last, this.lmHead) as tf.Tensor2D;
    });
  }
}

/**
 * RMSNorm (Zhang & Sennrich, 2019) over the last axis: `y = x · r · g` with `r = 1 / √(mean(x²) + ε)`,
 * `x [N, d]`, `g [d]`, `y [N, d]`. Hand-written gradient (fewer kernels than autodiff): with `u = dy · g` and
 * `x̂ = x · r`, `dx = r · (u − x̂ · mean(u · x̂))` and `dg = Σ_N dy · x̂`.
 */
const rmsNorm = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
  const x = args[0] as tf.Tensor;
  const g = args[1] as tf.Tensor;
  const save = args[2] as tf.GradSaveFunc;
  const r = tf.rsqrt(tf.add(tf.mean(tf.square(x), -1, true), RMS_NORM_EPS)); // [N, 1]
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

/** Scale of `z` in `GELU(x) = x · σ(z)`: `2·√(2/π)`, since `(1 + tanh(u)) / 2 = σ(2u)`. */
const GELU_Z_SCALE = 2 * GELU_SQRT_2_OVER_PI;

/**
 * GELU, tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, computed as the identical
 * `x · σ(z)` with `z = 2√(2/π)·(x + 0.044715·x³)` (sigmoid is much faster than tanh on wasm), with a
 * hand-written gradient `σ(z) + x·σ(z)·(1 − σ(z))·z'`, `z' = 2√(2/π)·(1 + 3·0.044715·x²)`.
 */
const gelu = tf.customGrad((...args: (tf.Tensor | tf.GradSaveFunc)[]) => {
  const x = args[0] as tf.Tensor;
  const save = args[1] as tf.GradSaveFunc;
  const x2 = tf.square(x);
  const s = tf.sigmoid(tf.mul(x, tf.add(tf.mul(x2, GELU_Z_SCALE * GELU_CUBIC), GELU_Z_SCALE)));
  save([x, s]);
  return {
    value: tf.mul(x, s),
    gradFunc: (dy: tf.Tensor | tf.Tensor[], saved: tf.Tensor[]) => {
      const [xs, ss] = saved;
      const dz = tf.add(tf.mul(tf.square(xs), GELU_Z_SCALE * 3 * GELU_CUBIC), GELU_Z_SCALE); // z'
      const slope = tf.add(ss, tf.mul(tf.mul(xs, tf.mul(ss, tf.sub(1, ss))), dz));
      return [tf.mul(dy as tf.Tensor, slope)];
    },
  };
}) as (x: tf.Tensor2D) => tf.Tensor2D;

/**
 * Additive attention bias for a full sequence: 0 where query `i` may see key `j` (`j ≤ i` and key `j` is
 * real), {@link MASK_BIAS} elsewhere.
 *
 * @param mask - `[B, T]` float, 1 for real tokens.
 * @returns `[B, 1, T, T]`.
 */
function attentionBias(mask: tf.Tensor, T: number): tf.Tensor4D {
  const B = mask.shape[0];
  const causal = new Float32Array(T * T);
  for (let i = 0; i < T; i++) {
    causal.fill(1, i * T, i * T + i + 1);
  }
  const allowed = tf.mul(tf.tensor4d(causal, [1, 1, T, T]), tf.reshape(mask, [B, 1, 1, T])); // [B, 1, T, T]
  return tf.mul(tf.sub(allowed, 1), -MASK_BIAS) as tf.Tensor4D;
}

/** KV-cache decoder: one prefill, then one position per step. */
class KvCacheDecoder implements StepDecoder {
  private caches: LayerCache[] = [];
  /** Key mask of the current rows, row-major `[b, L]`. */
  private keyMask = new Float32Array(0);
  private rows = 0;

  constructor(private readonly model: PolicyModel) {}

  start(batch: PromptBatch): tf.Tensor2D {
    const { logits, caches } = this.model.prefillInternal(batch);
    this.caches = caches;
    this.keyMask = batch.attentionMask.slice();
    this.rows = batch.rows;
    return logits;
  }

  step(tokens: Int32Array, positions: Int32Array): tf.Tensor2D {
    const b = this.rows;
    const L = this.keyMask.length / b;
    const mask = new Float32Array(b * (L + 1));
    for (let r = 0; r < b; r++) {
      mask.set(this.keyMask.subarray(r * L, (r + 1) * L), r * (L + 1));
      mask[r * (L + 1) + L] = 1;
    }
    const { logits, caches } = this.model.decodeInternal(tokens, positions, mask, this.caches);
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
    const mask = new Float32Array(rows.length * L);
    rows.forEach((r, i) => mask.set(this.keyMask.subarray(r * L, (r + 1) * L), i * L));
    this.keyMask = mask;
    this.rows = rows.length;
  }

  dispose(): void {
    this.disposeCaches();
  }

  private disposeCaches(): void {
    for (const c of this.caches) {
      c.k.dispose();
      c.v.dispose();
    }
    this.caches = [];
  }
}

/** Recompute decoder: the whole sequence every step (reference for the cache). */
class RecomputeDecoder implements StepDecoder {
  private ids = new Int32Array(0);
  private mask = new Float32Array(0);
  private positions = new Int32Array(0);
  private rows = 0;

  constructor(private readonly model: PolicyModel) {}

  start(batch: PromptBatch): tf.Tensor2D {
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
