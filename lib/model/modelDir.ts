/**
 * Hugging Face model directories in and out: `config.json`, `model.safetensors` (or shards listed in
 * `model.safetensors.index.json`), `generation_config.json` and the tokenizer's files. This is the one
 * checkpoint format of rxrl: run checkpoints, weight files on Kafka and `update_weights_from_disk` all use it,
 * and what rxrl writes loads in `transformers.AutoModelForCausalLM.from_pretrained` unchanged.
 *
 * `config.json` is read in both layouts transformers has used: `rope_theta` / `rope_scaling` / `torch_dtype`
 * and transformers 5's `rope_parameters` / `dtype`. rxrl writes the first, which every version reads.
 *
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { link, mkdir, readdir, realpath, rename, rm, stat } from 'node:fs/promises';
import { basename, join } from 'node:path';

import type { NamedWeights, Tokenizer, WeightArray } from './types.js';
import { ConfigError, DecodeError, ShapeError } from '../core/errors.js';
import { checkModelFits, modelFootprint, type ModelFitOptions } from './capacity.js';
import { WEIGHTS_HEADER_SLACK_BYTES, entryExists, readJsonObject, resolveInside } from './files.js';
import { encodeSafetensors, loadSafetensors, writeFileAtomic, type SafetensorsDtype, type SafetensorsMetadata } from './safetensors.js';
import { validatePolicyConfig, type ModelType, type PolicyConfig, type ResolvedPolicyConfig, type RopeScaling } from './config.js';
import { PolicyModel } from './transformer.js';

/** File names of a model directory. */
export const MODEL_FILES = {
  config: 'config.json',
  weights: 'model.safetensors',
  index: 'model.safetensors.index.json',
  generation: 'generation_config.json',
} as const;

/** Metadata key of the policy version in rxrl's safetensors files. */
export const POLICY_VERSION_METADATA_KEY = 'rxrl.policyVersion';

/** Special token ids a `config.json` / `generation_config.json` carries. */
export interface SpecialTokenIds {
  readonly bosTokenId?: number | undefined;
  /** One id or several (generation stops at any). */
  readonly eosTokenId?: number | readonly number[];
  readonly padTokenId?: number | undefined;
}

/** What {@link readModelDir} finds in a directory. */
export interface ModelDirContents {
  /** The directory. */
  readonly dir: string;
  /** The architecture, defaults resolved. */
  readonly config: ResolvedPolicyConfig;
  /** Weights under Hugging Face names and layout, widened to float32. */
  readonly weights: NamedWeights;
  /** Special ids from `config.json`, overridden by `generation_config.json`. */
  readonly special: SpecialTokenIds;
  /** Metadata of the (first) safetensors file. */
  readonly metadata: SafetensorsMetadata;
  /** The raw `config.json`. */
  readonly rawConfig: Readonly<Record<string, unknown>>;
  /** The context length the caller may use: `max_position_embeddings`, capped by `maxModelLen`. */
  readonly contextLength: number;
}

/** The special token ids a model directory records for a tokenizer: its BOS (if any), every stop id, and pad. */
export function specialIdsOf(tokenizer: Tokenizer): SpecialTokenIds {
  const stops = tokenizer.stopIds;
  return {
    ...(tokenizer.bosId === undefined ? {} : { bosTokenId: tokenizer.bosId }),
    eosTokenId: stops.length === 1 ? stops[0] : stops,
    padTokenId: tokenizer.padId,
  };
}

/** Options of {@link saveModelDir}. */
export interface SaveModelDirOptions {
  /** Tokenizer files to write beside the weights (file name → text), e.g. `tokenizer.files()`. */
  readonly tokenizerFiles?: Readonly<Record<string, string>>;
  /** Special token ids for `config.json` and `generation_config.json`. */
  readonly special?: SpecialTokenIds;
  /** Extra string metadata for the safetensors header (e.g. {@link POLICY_VERSION_METADATA_KEY}). */
  readonly metadata?: SafetensorsMetadata;
  /** Element type of the saved weights (`config.json`'s `torch_dtype`). Default `float32`. */
  readonly dtype?: SavedDtype | undefined;
  /**
   * Largest shard in bytes: bigger weights are split into `model-0000K-of-0000N.safetensors` with
   * `model.safetensors.index.json`, as `save_pretrained` does. Default {@link DEFAULT_MAX_SHARD_BYTES}.
   */
  readonly maxShardBytes?: number | undefined;
  /**
   * A local model directory holding exactly these weights (the one the model was loaded from, untrained since, as a
   * LoRA run's frozen base): its weight files are hard-linked into `dir` instead of written, so the copy costs no
   * disk, and `config.json` names their `torch_dtype`. Where no link can be made (another file system, no weights
   * there) the weights are written as without it.
   */
  readonly sameWeightsAs?: string | undefined;
}

/** The element types a model directory is saved in. */
export type SavedDtype = 'float32' | 'bfloat16' | 'float16';

/** Default shard bound: transformers 5's `max_shard_size` ("50GB"; the `checkpoint.maxShardSize` key takes such sizes). */
export const DEFAULT_MAX_SHARD_BYTES = 50e9;

const SAFETENSORS_DTYPES: Readonly<Record<SavedDtype, SafetensorsDtype>> = { float32: 'F32', bfloat16: 'BF16', float16: 'F16' };
const DTYPE_BYTES: Readonly<Record<SavedDtype, number>> = { float32: 4, bfloat16: 2, float16: 2 };

const ARCHITECTURES: Readonly<Record<ModelType, string>> = {
  llama: 'LlamaForCausalLM',
  qwen2: 'Qwen2ForCausalLM',
  qwen3: 'Qwen3ForCausalLM',
};

/** Weights some checkpoints carry that the model recomputes (rotary tables). */
const IGNORED_WEIGHT = /\.rotary_emb\.inv_freq$/;

type Json = Record<string, unknown>;

/**
 * Translates a Hugging Face `config.json` object into a {@link PolicyConfig}.
 *
 * @param raw - The parsed JSON.
 * @param source - Named in errors (the file's path).
 * @param fit - The context cap and memory the configuration is checked against ({@link checkModelFits}).
 * @throws {@link ConfigError} naming the key: an unknown `model_type`, a feature the decoder does not implement
 *   (sliding-window attention, mixture of experts, an activation other than SiLU, MLP biases, partial rotary
 *   embeddings, a rope type other than default, linear or llama3), a missing or invalid size, or sizes whose
 *   weights and one full-length sequence's cache do not fit in the backend's memory ({@link checkModelFits}).
 */
export function policyConfigFromHf(
  raw: unknown,
  source: string = MODEL_FILES.config,
  fit: Omit<ModelFitOptions, 'keyOf' | 'source'> = {},
): ResolvedPolicyConfig {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) {
    throw new ConfigError(`${source}: not a JSON object`, { context: { source } });
  }
  const c = raw as Json;
  const fail = (key: string, message: string): never => {
    throw new ConfigError(`${source}: ${key} ${message}`, { context: { source, key, value: c[key] } });
  };
  const modelType = c.model_type;
  if (typeof modelType !== 'string' || !(modelType in ARCHITECTURES)) {
    fail('model_type', `${JSON.stringify(modelType)} is not supported (supported: ${Object.keys(ARCHITECTURES).join(', ')})`);
  }
  const type = modelType as ModelType;
  if (c.use_sliding_window === true) fail('use_sliding_window', 'is true: sliding-window attention is not supported');
  for (const key of ['num_experts', 'num_local_experts', 'n_routed_experts']) {
    if (typeof c[key] === 'number' && (c[key] as number) > 0) fail(key, 'is set: mixture-of-experts models are not supported');
  }
  if (c.hidden_act !== undefined && c.hidden_act !== 'silu')
    fail('hidden_act', `${JSON.stringify(c.hidden_act)} is not supported (only silu)`);
  if (c.mlp_bias === true) fail('mlp_bias', 'is true: MLP biases are not supported');
  const rope = readRope(c, fail);
  const int = (key: string): number => {
    const v = c[key];
    if (typeof v !== 'number' || !Number.isInteger(v) || v <= 0) fail(key, `must be a positive integer, got ${JSON.stringify(v)}`);
    return v as number;
  };
  const optionalInt = (key: string): number | undefined => (c[key] === undefined || c[key] === null ? undefined : int(key));
  const attentionBias = c.attention_bias === true;
  const config: PolicyConfig = {
    modelType: type,
    vocabSize: int('vocab_size'),
    dModel: int('hidden_size'),
    nLayers: int('num_hidden_layers'),
    nHeads: int('num_attention_heads'),
    nKvHeads: optionalInt('num_key_value_heads'),
    headDim: optionalInt('head_dim'),
    dFF: int('intermediate_size'),
    maxSeqLen: int('max_position_embeddings'),
    ropeTheta: rope.theta,
    ropeScaling: rope.scaling,
    rmsNormEps: typeof c.rms_norm_eps === 'number' ? c.rms_norm_eps : undefined,
    qkvBias: type === 'qwen2' ? true : attentionBias,
    oBias: type === 'qwen2' ? false : attentionBias,
    qkNorm: type === 'qwen3',
    tieWordEmbeddings: c.tie_word_embeddings === true,
  };
  let resolved: ResolvedPolicyConfig;
  try {
    resolved = validatePolicyConfig(config);
  } catch (cause) {
    throw new ConfigError(`${source}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, context: { source } });
  }
  checkModelFits(resolved, { capHint: 'maxModelLen, or --max-model-len', ...fit, keyOf: hfKey, source });
  return resolved;
}

function readRope(c: Json, fail: (key: string, message: string) => never): { theta?: number | undefined; scaling: RopeScaling | null } {
  const params = c.rope_parameters;
  const newLayout = typeof params === 'object' && params !== null && !Array.isArray(params);
  const p = (newLayout ? params : (c.rope_scaling ?? {})) as Json;
  const key = newLayout ? 'rope_parameters' : 'rope_scaling';
  const theta = newLayout ? p.rope_theta : c.rope_theta;
  if (theta !== undefined && typeof theta !== 'number') fail(newLayout ? 'rope_parameters' : 'rope_theta', 'rope_theta must be a number');
  const partial = c.partial_rotary_factor ?? p.partial_rotary_factor;
  if (partial !== undefined && partial !== 1) fail('partial_rotary_factor', 'other than 1 is not supported');
  const ropeType = p.rope_type ?? p.type ?? 'default';
  const num = (name: string): number => {
    const v = p[name];
    if (typeof v !== 'number' || !Number.isFinite(v)) fail(key, `${name} must be a number for rope type ${String(ropeType)}`);
    return v as number;
  };
  switch (ropeType) {
    case 'default':
      return { theta: theta as number | undefined, scaling: null };
    case 'linear':
      return { theta: theta as number | undefined, scaling: { type: 'linear', factor: num('factor') } };
    case 'llama3':
      return {
        theta: theta as number | undefined,
        scaling: {
          type: 'llama3',
          factor: num('factor'),
          lowFreqFactor: num('low_freq_factor'),
          highFreqFactor: num('high_freq_factor'),
          originalMaxPositionEmbeddings: num('original_max_position_embeddings'),
        },
      };
    default:
      return fail(key, `rope type ${JSON.stringify(ropeType)} is not supported (supported: default, linear, llama3)`);
  }
}

/**
 * The `config.json` object of a configuration, in the layout every transformers version reads
 * (`rope_theta`, `rope_scaling`, `torch_dtype`).
 */
export function policyConfigToHf(config: PolicyConfig, special: SpecialTokenIds = {}): Record<string, unknown> {
  const c = validatePolicyConfig(config);
  const s = c.ropeScaling;
  const ropeScaling =
    s === null
      ? null
      : s.type === 'linear'
        ? { rope_type: 'linear', factor: s.factor }
        : {
            rope_type: 'llama3',
            factor: s.factor,
            low_freq_factor: s.lowFreqFactor,
            high_freq_factor: s.highFreqFactor,
            original_max_position_embeddings: s.originalMaxPositionEmbeddings,
          };
  return {
    architectures: [ARCHITECTURES[c.modelType]],
    model_type: c.modelType,
    vocab_size: c.vocabSize,
    hidden_size: c.dModel,
    intermediate_size: c.dFF,
    num_hidden_layers: c.nLayers,
    num_attention_heads: c.nHeads,
    num_key_value_heads: c.nKvHeads,
    head_dim: c.headDim,
    max_position_embeddings: c.maxSeqLen,
    rms_norm_eps: c.rmsNormEps,
    rope_theta: c.ropeTheta,
    rope_scaling: ropeScaling,
    hidden_act: 'silu',
    ...(c.modelType === 'qwen2' ? { use_sliding_window: false } : { attention_bias: c.oBias }),
    ...(c.modelType === 'llama' ? { mlp_bias: false } : {}),
    ...(c.modelType === 'qwen3' ? { use_sliding_window: false } : {}),
    attention_dropout: 0,
    initializer_range: 0.02,
    tie_word_embeddings: c.tieWordEmbeddings,
    use_cache: true,
    torch_dtype: 'float32',
    ...specialJson(special),
  };
}

function specialJson(special: SpecialTokenIds): Json {
  return {
    ...(special.bosTokenId !== undefined ? { bos_token_id: special.bosTokenId } : {}),
    ...(special.eosTokenId !== undefined
      ? { eos_token_id: typeof special.eosTokenId === 'number' ? special.eosTokenId : [...special.eosTokenId] }
      : {}),
    ...(special.padTokenId !== undefined ? { pad_token_id: special.padTokenId } : {}),
  };
}

function readSpecial(raw: Json): SpecialTokenIds {
  const id = (v: unknown): number | undefined => (typeof v === 'number' && Number.isInteger(v) ? v : undefined);
  const eos = raw.eos_token_id;
  const eosTokenId = Array.isArray(eos) ? eos.filter((e): e is number => id(e) !== undefined) : id(eos);
  return {
    ...(id(raw.bos_token_id) !== undefined ? { bosTokenId: id(raw.bos_token_id) } : {}),
    ...(eosTokenId !== undefined ? { eosTokenId } : {}),
    ...(id(raw.pad_token_id) !== undefined ? { padTokenId: id(raw.pad_token_id) } : {}),
  };
}

/** Options of {@link readModelDir}. */
export interface ReadModelDirOptions {
  /**
   * Largest total size of the weights files, in bytes. Default: what the configuration's parameters take in
   * float32 (the widest dtype read), plus room for the headers, so a file is bounded by the architecture that
   * `config.json` declares before it is opened.
   */
  readonly maxWeightBytes?: number;
  /**
   * A directory every file must lie in once links are followed (a server's `--weights-root`, a Kafka worker's
   * `kafka.weightsRoot`); anything else is a {@link ForbiddenPathError}. Default: no confinement.
   */
  readonly root?: string;
  /** Longest context the caller will use (`--max-model-len`): bounds the cache checked against memory. */
  readonly maxModelLen?: number;
}

/** Hugging Face `config.json` keys of the configuration fields that size a model, for errors. */
const HF_KEYS: Readonly<Partial<Record<keyof ResolvedPolicyConfig, string>>> = {
  vocabSize: 'vocab_size',
  dModel: 'hidden_size',
  nLayers: 'num_hidden_layers',
  nHeads: 'num_attention_heads',
  nKvHeads: 'num_key_value_heads',
  headDim: 'head_dim',
  dFF: 'intermediate_size',
  maxSeqLen: 'max_position_embeddings',
};

/** Tells whether `dir` looks like a model directory (it has a `config.json`). */
export async function isModelDir(dir: string): Promise<boolean> {
  return entryExists(join(dir, MODEL_FILES.config));
}

/**
 * Reads a Hugging Face model directory: the configuration, every weight (single file or shards; F32, F16 or
 * BF16, widened to float32) and the special token ids. A tied model's redundant `lm_head.weight` and stored
 * rotary tables are dropped.
 *
 * @throws {@link ConfigError} for an unsupported or invalid configuration (naming the key).
 * @throws {@link DecodeError} for a missing or malformed file (naming it).
 */
export async function readModelDir(dir: string, options: ReadModelDirOptions = {}): Promise<ModelDirContents> {
  const { root } = options;
  if (root !== undefined) await resolveInside(dir, root);
  const configPath = join(dir, MODEL_FILES.config);
  const rawConfig = await readJsonObject(configPath, root);
  const config = policyConfigFromHf(rawConfig, configPath, options);
  const contextLength = Math.min(config.maxSeqLen, options.maxModelLen ?? config.maxSeqLen);
  let budget = options.maxWeightBytes ?? maxWeightBytesOf(config);
  const weights = new Map<string, WeightArray>();
  let metadata: SafetensorsMetadata = {};
  const indexPath = join(dir, MODEL_FILES.index);
  let files: string[];
  if (await entryExists(indexPath)) {
    const map = (await readJsonObject(indexPath, root)).weight_map;
    if (typeof map !== 'object' || map === null || !Object.values(map).every((f) => typeof f === 'string')) {
      throw new DecodeError(`${indexPath}: weight_map must map tensor names to file names`, { context: { path: indexPath } });
    }
    files = [...new Set(Object.values(map as Record<string, string>))];
  } else {
    files = [MODEL_FILES.weights];
  }
  for (const [i, file] of files.entries()) {
    const path = join(dir, basename(file));
    if (!(await entryExists(path))) {
      throw new DecodeError(`${path}: weights file is missing`, { context: { path } });
    }
    const contents = await loadSafetensors(path, { maxBytes: budget, ...(root === undefined ? {} : { root }) });
    budget -= contents.bytes;
    if (i === 0) metadata = contents.metadata;
    for (const [name, w] of contents.weights) {
      if (IGNORED_WEIGHT.test(name) || (config.tieWordEmbeddings && name === 'lm_head.weight')) continue;
      weights.set(name, w);
    }
  }
  let special = readSpecial(rawConfig);
  const generationPath = join(dir, MODEL_FILES.generation);
  if (await entryExists(generationPath)) {
    special = { ...special, ...readSpecial(await readJsonObject(generationPath, root)) };
  }
  return { dir, config, contextLength, weights, special, metadata, rawConfig };
}

/** The largest weights a configuration can have on disk: its parameters in float32, plus header room. */
export function maxWeightBytesOf(config: ResolvedPolicyConfig): number {
  return modelFootprint(config).parameterBytes + WEIGHTS_HEADER_SLACK_BYTES;
}

function hfKey(field: keyof ResolvedPolicyConfig): string {
  return HF_KEYS[field] ?? field;
}

/**
 * Loads a model directory into a {@link PolicyModel}.
 *
 * @param options - As {@link readModelDir}: a root, a weights bound, a context cap.
 * @returns The model (owned by the caller) and what the directory holds besides (weights are not kept).
 * @throws As {@link readModelDir}; `ShapeError` when the weights do not fit the configuration.
 */
export async function loadModelDir(
  dir: string,
  options: ReadModelDirOptions = {},
): Promise<{ model: PolicyModel; contents: Omit<ModelDirContents, 'weights'> }> {
  const { weights, ...contents } = await readModelDir(dir, options);
  return { model: PolicyModel.fromWeights(contents.config, weights), contents };
}

/**
 * Writes a complete model directory (created if needed): `config.json`, `model.safetensors` (F32, Hugging Face
 * names and layout, `format: pt` metadata), `generation_config.json` and the tokenizer files. Each file is
 * written to a temporary name and renamed, `config.json` last, so a reader never sees half a file.
 *
 * @param dir - Destination directory.
 * @param source - A model, or a configuration with its weights (as {@link PolicyModel.getWeights}).
 * @param options - Tokenizer files, special ids, safetensors metadata.
 * @returns The size and SHA-256 (hex) of the weights file, for integrity checks by readers.
 */
export async function saveModelDir(
  dir: string,
  source: PolicyModel | { readonly config: PolicyConfig; readonly weights: NamedWeights },
  options: SaveModelDirOptions = {},
): Promise<{ readonly bytes: number; readonly sha256: string }> {
  if (source instanceof PolicyModel && source.adapter !== null) {
    throw new ShapeError(
      'saveModelDir: this model is a LoRA adapter view; save the adapter with savePeftAdapter, or the merged model from mergedWeights()',
    );
  }
  const config = source.config;
  const weights = source instanceof PolicyModel ? source.getWeights() : source.weights;
  const special = options.special ?? {};
  await mkdir(dir, { recursive: true });
  const linked = options.sameWeightsAs === undefined ? null : await linkWeights(options.sameWeightsAs, dir);
  const dtype = linked?.dtype ?? options.dtype ?? 'float32';
  const saved =
    linked ??
    (await writeWeights(dir, weights, { format: 'pt', ...options.metadata }, dtype, options.maxShardBytes ?? DEFAULT_MAX_SHARD_BYTES));
  for (const [name, text] of Object.entries(options.tokenizerFiles ?? {})) {
    await writeFileAtomic(join(dir, basename(name)), text);
  }
  const generation = { _from_model_config: true, ...specialJson(special) };
  await writeFileAtomic(join(dir, MODEL_FILES.generation), JSON.stringify(generation, null, 2) + '\n');
  // As transformers' own checkpoints: config.json names the primary eos, generation_config.json every stop id.
  const eos = special.eosTokenId;
  const primary = Array.isArray(eos) ? { ...special, eosTokenId: eos[0] } : special;
  const hf = { ...policyConfigToHf(config, primary), torch_dtype: dtype };
  await writeFileAtomic(join(dir, MODEL_FILES.config), JSON.stringify(hf, null, 2) + '\n');
  return saved;
}

/**
 * Hard-links `source`'s weight files (`model.safetensors`, or the index and the shards it names) into `dir`, each
 * through a temporary name and a rename, and removes the other layout's files there. Returns what
 * {@link writeWeights} returns and the source's `torch_dtype`, or null (nothing changed in `dir`) when `source` has
 * no weights or a link cannot be made.
 */
async function linkWeights(
  source: string,
  dir: string,
): Promise<{ readonly bytes: number; readonly sha256: string; readonly dtype: SavedDtype | undefined } | null> {
  // The layout readModelDir reads: the index and its shards when there is an index, else model.safetensors.
  let files: string[];
  if (await entryExists(join(source, MODEL_FILES.index))) {
    const map = (await readJsonObject(join(source, MODEL_FILES.index))).weight_map;
    if (typeof map !== 'object' || map === null) return null;
    files = [MODEL_FILES.index, ...new Set(Object.values(map as Record<string, unknown>).map(String))];
  } else if (await entryExists(join(source, MODEL_FILES.weights))) files = [MODEL_FILES.weights];
  else return null;
  const targets: [from: string, to: string][] = [];
  try {
    for (const file of files) {
      const from = await realpath(join(source, basename(file)));
      const to = join(dir, basename(file));
      if ((await realpath(to).catch(() => null)) === from) continue;
      await rm(`${to}.link`, { force: true });
      await link(from, `${to}.link`);
      targets.push([from, to]);
    }
  } catch {
    for (const [, to] of targets) await rm(`${to}.link`, { force: true });
    return null;
  }
  for (const [, to] of targets) await rename(`${to}.link`, to);
  const keep = new Set(files.map((file) => basename(file)));
  const stale = (await readdir(dir)).filter(
    (name) =>
      !keep.has(name) && (name === MODEL_FILES.weights || name === MODEL_FILES.index || /^model-\d{5}-of-\d{5}\.safetensors$/.test(name)),
  );
  for (const name of stale) await rm(join(dir, name), { force: true });
  let bytes = 0;
  for (const file of keep) if (file !== MODEL_FILES.index) bytes += (await stat(join(dir, file))).size;
  const hash = createHash('sha256');
  for await (const chunk of createReadStream(join(dir, files[0]))) hash.update(chunk as Buffer);
  const config = await readJsonObject(join(source, MODEL_FILES.config)).catch(() => ({}) as Record<string, unknown>);
  return { bytes, sha256: hash.digest('hex'), dtype: savedDtypeOf(config) };
}

/**
 * The element type a `config.json` says its weights are saved in (`torch_dtype`, or transformers 5's `dtype`), when
 * it is one rxrl writes; `undefined` otherwise.
 *
 * @param config - a parsed `config.json`.
 */
export function savedDtypeOf(config: Readonly<Record<string, unknown>>): SavedDtype | undefined {
  const named = config.torch_dtype ?? config.dtype;
  return typeof named === 'string' && named in SAFETENSORS_DTYPES ? (named as SavedDtype) : undefined;
}

/**
 * The weights as `model.safetensors`, or as shards of at most `maxShardBytes` with their index (tensors in order, a
 * new shard when the next one does not fit, as `save_pretrained` splits); the other layout's files are removed.
 * Returns the bytes written and the sha256 of `model.safetensors`, or of the index for shards.
 */
async function writeWeights(
  dir: string,
  weights: NamedWeights,
  metadata: SafetensorsMetadata,
  dtype: SavedDtype,
  maxShardBytes: number,
): Promise<{ readonly bytes: number; readonly sha256: string }> {
  const width = DTYPE_BYTES[dtype];
  type Entry = [string, WeightArray];
  const shards: Entry[][] = [[]];
  let size = 0;
  let total = 0;
  for (const [name, tensor] of weights) {
    const bytes = tensor.data.length * width;
    if (size > 0 && size + bytes > maxShardBytes) {
      shards.push([]);
      size = 0;
    }
    shards[shards.length - 1].push([name, tensor]);
    size += bytes;
    total += bytes;
  }
  const stale = (await readdir(dir)).filter((name) => /^model-\d{5}-of-\d{5}\.safetensors$/.test(name));
  for (const name of stale) await rm(join(dir, name), { force: true });
  if (shards.length === 1) {
    await rm(join(dir, MODEL_FILES.index), { force: true });
    const bytes = encodeSafetensors(weights, metadata, SAFETENSORS_DTYPES[dtype]);
    await writeFileAtomic(join(dir, MODEL_FILES.weights), bytes);
    return { bytes: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') };
  }
  await rm(join(dir, MODEL_FILES.weights), { force: true });
  const weightMap: Record<string, string> = {};
  let written = 0;
  for (const [i, shard] of shards.entries()) {
    const file = `model-${String(i + 1).padStart(5, '0')}-of-${String(shards.length).padStart(5, '0')}.safetensors`;
    const bytes = encodeSafetensors(new Map(shard) as NamedWeights, metadata, SAFETENSORS_DTYPES[dtype]);
    await writeFileAtomic(join(dir, file), bytes);
    written += bytes.length;
    for (const [name] of shard) weightMap[name] = file;
  }
  const parameters = [...weights.values()].reduce((sum, tensor) => sum + tensor.data.length, 0);
  const index = `${JSON.stringify({ metadata: { total_parameters: parameters, total_size: total }, weight_map: weightMap }, null, 2)}\n`;
  await writeFileAtomic(join(dir, MODEL_FILES.index), index);
  return { bytes: written, sha256: createHash('sha256').update(index).digest('hex') };
}
