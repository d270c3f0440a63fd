/**
 * The decoder's configuration: the architectures it implements (Llama, Qwen2, Qwen3), their validation and
 * defaults. The decoder, the model-directory reader and LoRA all read it from here.
 *
 * @packageDocumentation
 */
import { ConfigError } from '../core/errors.js';
import type { Defined } from '../core/types.js';

/** Model families the decoder implements (Hugging Face `model_type`). */
export type ModelType = 'llama' | 'qwen2' | 'qwen3';

/** The valid {@link ModelType} values. */
export const MODEL_TYPES: readonly ModelType[] = ['llama', 'qwen2', 'qwen3'];

/** Rotary-embedding frequency scaling (Hugging Face `rope_scaling` / `rope_parameters`). */
export type RopeScaling =
  | { readonly type: 'linear'; readonly factor: number }
  | {
      readonly type: 'llama3';
      readonly factor: number;
      readonly lowFreqFactor: number;
      readonly highFreqFactor: number;
      readonly originalMaxPositionEmbeddings: number;
    };

/**
 * Architecture of a {@link PolicyModel}. The first six fields are required; the rest default to a plain Llama
 * block (`nKvHeads = nHeads`, `headDim = dModel / nHeads`, θ = 10000, no scaling, ε = 1e-6, no biases, no q/k
 * norm, untied head).
 */
export interface PolicyConfig {
  /** Vocabulary size `V` (`vocab_size`). */
  readonly vocabSize: number;
  /** Residual width `d` (`hidden_size`). */
  readonly dModel: number;
  /** Number of blocks (`num_hidden_layers`). */
  readonly nLayers: number;
  /** Query heads `H` (`num_attention_heads`). */
  readonly nHeads: number;
  /** SwiGLU hidden width (`intermediate_size`). */
  readonly dFF: number;
  /** Longest sequence: every position id must be below it (`max_position_embeddings`). */
  readonly maxSeqLen: number;
  /** Family written to `config.json`. Default `llama`. */
  readonly modelType?: ModelType;
  /** Key/value heads `Hkv`, dividing `nHeads` (`num_key_value_heads`). Default `nHeads`. */
  readonly nKvHeads?: number | undefined;
  /** Head width `dh`, even (`head_dim`). Default `dModel / nHeads`. */
  readonly headDim?: number | undefined;
  /** RoPE base θ (`rope_theta`). Default 10000. */
  readonly ropeTheta?: number | undefined;
  /** RoPE frequency scaling. Default none. */
  readonly ropeScaling?: RopeScaling | null;
  /** RMSNorm ε (`rms_norm_eps`). Default 1e-6. */
  readonly rmsNormEps?: number | undefined;
  /** Biases on the q, k and v projections (Qwen2; `attention_bias`). Default false. */
  readonly qkvBias?: boolean;
  /** Bias on the output projection (`attention_bias` of Llama and Qwen3). Default false. */
  readonly oBias?: boolean;
  /** Per-head RMSNorm of queries and keys before RoPE (Qwen3). Default false. */
  readonly qkNorm?: boolean;
  /** Logits use the token embedding matrix (`tie_word_embeddings`). Default false. */
  readonly tieWordEmbeddings?: boolean;
}

/** A {@link PolicyConfig} with every default filled in. */
export type ResolvedPolicyConfig = Defined<PolicyConfig>;

/** Default RMSNorm ε (Llama 3, Qwen2, Qwen3 checkpoints). */
export const RMS_NORM_EPS = 1e-6;
/** Default RoPE base θ. */
export const ROPE_THETA = 10_000;
/** Additive attention bias of masked (future or padding) keys; finite so fully masked rows stay finite. */
export const MASK_BIAS = -1e9;
/** Vocabulary size from which a tied output head is computed vocabulary-major, `(E·hᵀ)ᵀ` (see `PolicyModel.head`). */
export const VOCAB_MAJOR_HEAD = 1024;

/**
 * Validates a configuration and fills in its defaults.
 *
 * @throws {@link ConfigError} naming the field: a size that is not a positive integer, heads that do not
 *   divide, an odd head width, an unknown family or rope scaling, or a combination the family's Hugging Face
 *   class cannot express (Qwen2 always has q/k/v biases and no output bias; only Qwen3 has q/k norms).
 */
export function validatePolicyConfig(config: PolicyConfig): ResolvedPolicyConfig {
  const fail = (key: string, message: string, value: unknown): never => {
    throw new ConfigError(`policy config ${key} ${message}, got ${JSON.stringify(value)}`, { context: { key, value } });
  };
  const positive = (key: keyof PolicyConfig, value: unknown): number => {
    if (typeof value !== 'number' || !Number.isInteger(value) || value <= 0) fail(key, 'must be a positive integer', value);
    return value as number;
  };
  const vocabSize = positive('vocabSize', config.vocabSize);
  const dModel = positive('dModel', config.dModel);
  const nLayers = positive('nLayers', config.nLayers);
  const nHeads = positive('nHeads', config.nHeads);
  const dFF = positive('dFF', config.dFF);
  const maxSeqLen = positive('maxSeqLen', config.maxSeqLen);
  const modelType = config.modelType ?? 'llama';
  if (!MODEL_TYPES.includes(modelType)) fail('modelType', `must be one of ${MODEL_TYPES.join(', ')}`, modelType);
  const nKvHeads = positive('nKvHeads', config.nKvHeads ?? nHeads);
  if (nHeads % nKvHeads !== 0) fail('nKvHeads', `must divide nHeads (${nHeads})`, nKvHeads);
  if (config.headDim === undefined && dModel % nHeads !== 0) fail('dModel', `must be a multiple of nHeads (${nHeads})`, dModel);
  const headDim = positive('headDim', config.headDim ?? dModel / nHeads);
  if (headDim % 2 !== 0) fail('headDim', 'must be even (rotary embeddings rotate pairs)', headDim);
  const ropeTheta = config.ropeTheta ?? ROPE_THETA;
  if (!(ropeTheta > 0) || !Number.isFinite(ropeTheta)) fail('ropeTheta', 'must be a positive number', ropeTheta);
  const rmsNormEps = config.rmsNormEps ?? RMS_NORM_EPS;
  if (!(rmsNormEps > 0) || !Number.isFinite(rmsNormEps)) fail('rmsNormEps', 'must be a positive number', rmsNormEps);
  const ropeScaling = config.ropeScaling ?? null;
  if (ropeScaling !== null) validateRopeScaling(ropeScaling, fail);
  const qkvBias = config.qkvBias ?? modelType === 'qwen2';
  const oBias = config.oBias ?? false;
  const qkNorm = config.qkNorm ?? modelType === 'qwen3';
  const tieWordEmbeddings = config.tieWordEmbeddings ?? false;
  if (modelType === 'qwen2' && (!qkvBias || oBias)) fail('qkvBias', 'must be true and oBias false for qwen2', { qkvBias, oBias });
  if (modelType !== 'qwen2' && qkvBias !== oBias)
    fail('oBias', `must equal qkvBias for ${modelType} (one attention_bias)`, { qkvBias, oBias });
  if (qkNorm !== (modelType === 'qwen3')) fail('qkNorm', `is only (and always) used by qwen3, not ${modelType}`, qkNorm);
  return {
    modelType,
    vocabSize,
    dModel,
    nLayers,
    nHeads,
    nKvHeads,
    headDim,
    dFF,
    maxSeqLen,
    ropeTheta,
    ropeScaling,
    rmsNormEps,
    qkvBias,
    oBias,
    qkNorm,
    tieWordEmbeddings,
  };
}

function validateRopeScaling(scaling: RopeScaling, fail: (key: string, message: string, value: unknown) => never): void {
  const type = (scaling as { type?: unknown }).type;
  if (!(scaling.factor >= 1) || !Number.isFinite(scaling.factor)) fail('ropeScaling.factor', 'must be a number >= 1', scaling.factor);
  switch (scaling.type) {
    case 'linear':
      return;
    case 'llama3':
      if (!(scaling.highFreqFactor > scaling.lowFreqFactor && scaling.lowFreqFactor > 0)) {
        fail('ropeScaling.highFreqFactor', 'must exceed lowFreqFactor > 0', scaling);
      }
      if (!(scaling.originalMaxPositionEmbeddings > 0)) {
        fail('ropeScaling.originalMaxPositionEmbeddings', 'must be positive', scaling.originalMaxPositionEmbeddings);
      }
      return;
    default:
      fail('ropeScaling.type', 'must be linear or llama3', type);
  }
}

/** The fields in which two resolved architectures differ (empty when they are the same model shape). */
export function configMismatches(a: ResolvedPolicyConfig, b: ResolvedPolicyConfig): (keyof ResolvedPolicyConfig)[] {
  return (Object.keys(a) as (keyof ResolvedPolicyConfig)[]).filter((k) => JSON.stringify(a[k]) !== JSON.stringify(b[k]));
}
