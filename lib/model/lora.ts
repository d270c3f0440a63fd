/**
 * LoRA adapters (Hu et al., 2021) for the Llama-family decoder, in PEFT's layout: each targeted linear layer
 * `y = x·Wᵀ` of the frozen base becomes `y = x·Wᵀ + (α/r)·x·Aᵀ·Bᵀ` with `A [r, in]` and `B [out, r]`. Only `A`
 * and `B` are trainable; any number of adapters can share one base model in memory
 * ({@link PolicyModel.withAdapter}).
 *
 * Adapters are read and written as PEFT directories (`adapter_config.json` + `adapter_model.safetensors`, tensor
 * names `base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight`), so `peft.PeftModel.from_pretrained`
 * and vLLM's `--lora-modules` load what rxrl trains, and rxrl loads what PEFT trains.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';
import { createHash } from 'node:crypto';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';

import type { NamedWeights, WeightArray } from './types.js';
import { ConfigError, ShapeError } from '../core/errors.js';
import { createRng } from '../core/random.js';
import { readCopy } from './backend.js';
import { WEIGHTS_HEADER_SLACK_BYTES, readJsonObject } from './files.js';
import { encodeSafetensors, loadSafetensors, writeFileAtomic } from './safetensors.js';
import { LORA_TARGETS, type LoraPair, type LoraTarget, type ModelAdapter } from './adapter.js';
import { validatePolicyConfig, type PolicyConfig, type ResolvedPolicyConfig } from './config.js';
import type { Defined } from '../core/types.js';

export { LORA_TARGETS } from './adapter.js';
export type { LoraPair, LoraTarget, ModelAdapter } from './adapter.js';

/** File names of a PEFT adapter directory. */
export const PEFT_FILES = { config: 'adapter_config.json', weights: 'adapter_model.safetensors' } as const;

/** An adapter's hyper-parameters (PEFT's `LoraConfig` fields of the same meaning). */
export interface LoraConfig {
  /** Rank `r` of `A [r, in]` and `B [out, r]`. */
  readonly rank: number;
  /** `lora_alpha`: the update is scaled by `alpha / rank` (or `alpha / √rank` with {@link LoraConfig.rsLora}). */
  readonly alpha: number;
  /** The linear layers adapted in every block. */
  readonly targetModules: readonly LoraTarget[];
  /** Dropout on the adapter's input; only 0 is supported (training and sampling must see the same function). */
  readonly dropout?: number;
  /** rsLoRA scaling `alpha / √rank` (PEFT `use_rslora`). Default false. */
  readonly rsLora?: boolean;
}

/** A validated {@link LoraConfig} with its scale. */
export interface ResolvedLoraConfig extends Defined<LoraConfig> {
  /** `alpha / rank`, or `alpha / √rank` with rsLoRA. */
  readonly scale: number;
}

/** A policy's adapter when its recipe leaves keys unset: rank 8, alpha 16, every target module. */
export const DEFAULT_POLICY_LORA: LoraConfig = { rank: 8, alpha: 16, targetModules: [...LORA_TARGETS] };

/** Name, PEFT shape and role of one adapter tensor. */
interface LoraParamSpec {
  readonly name: string;
  readonly layer: number;
  readonly target: LoraTarget;
  readonly kind: 'A' | 'B';
  /** PEFT's shape: `[r, in]` for A, `[out, r]` for B. */
  readonly shape: readonly [number, number];
}

/** The module path of a target inside block `layer` (as in the base model's weight names). */
function modulePath(layer: number, target: LoraTarget): string {
  const group = target === 'gate_proj' || target === 'up_proj' || target === 'down_proj' ? 'mlp' : 'self_attn';
  return `model.layers.${layer}.${group}.${target}`;
}

/** `[in, out]` of a target's linear layer. */
function targetDims(config: ResolvedPolicyConfig, target: LoraTarget): [number, number] {
  const { dModel: d, nHeads: H, nKvHeads: Hkv, headDim: dh, dFF } = config;
  switch (target) {
    case 'q_proj':
      return [d, H * dh];
    case 'k_proj':
    case 'v_proj':
      return [d, Hkv * dh];
    case 'o_proj':
      return [H * dh, d];
    case 'gate_proj':
    case 'up_proj':
      return [d, dFF];
    case 'down_proj':
      return [dFF, d];
  }
}

/**
 * Validates an adapter configuration against the model it adapts.
 *
 * @param key - The configuration path named in errors (e.g. `policies.coder.lora`).
 * @throws {@link ConfigError} naming the key: a rank that is not a positive integer, a non-positive alpha, a
 *   dropout other than 0, an empty, repeated or unknown target module.
 */
export function validateLoraConfig(lora: LoraConfig, key = 'lora'): ResolvedLoraConfig {
  const fail = (field: string, message: string, value: unknown): never => {
    throw new ConfigError(`${key}.${field} ${message}, got ${JSON.stringify(value)}`, { context: { key: `${key}.${field}`, value } });
  };
  if (!Number.isInteger(lora.rank) || lora.rank <= 0) fail('rank', 'must be a positive integer', lora.rank);
  if (!(typeof lora.alpha === 'number' && Number.isFinite(lora.alpha) && lora.alpha > 0))
    fail('alpha', 'must be a positive number', lora.alpha);
  const dropout = lora.dropout ?? 0;
  if (dropout !== 0) fail('dropout', 'must be 0 (sampling and training must compute the same function)', dropout);
  if (!Array.isArray(lora.targetModules) || lora.targetModules.length === 0)
    fail('targetModules', 'must be a non-empty list', lora.targetModules);
  lora.targetModules.forEach((t, i) => {
    if (!LORA_TARGETS.includes(t))
      fail(`targetModules[${i}]`, `must be one of ${LORA_TARGETS.join(', ')} (the model has no other linear layer in a block)`, t);
    if (lora.targetModules.indexOf(t) !== i) fail(`targetModules[${i}]`, 'is listed twice', t);
  });
  const rsLora = lora.rsLora ?? false;
  return {
    rank: lora.rank,
    alpha: lora.alpha,
    targetModules: LORA_TARGETS.filter((t) => lora.targetModules.includes(t)),
    dropout,
    rsLora,
    scale: rsLora ? lora.alpha / Math.sqrt(lora.rank) : lora.alpha / lora.rank,
  };
}

function loraParamSpecs(config: ResolvedPolicyConfig, lora: ResolvedLoraConfig): LoraParamSpec[] {
  const specs: LoraParamSpec[] = [];
  for (let layer = 0; layer < config.nLayers; layer++) {
    for (const target of lora.targetModules) {
      const [inDim, outDim] = targetDims(config, target);
      const path = `base_model.model.${modulePath(layer, target)}`;
      specs.push({ name: `${path}.lora_A.weight`, layer, target, kind: 'A', shape: [lora.rank, inDim] });
      specs.push({ name: `${path}.lora_B.weight`, layer, target, kind: 'B', shape: [outDim, lora.rank] });
    }
  }
  return specs;
}

/** Throws a {@link ShapeError} naming every missing, unknown or misshapen tensor (and each one's data length). */
function checkLoraWeights(specs: readonly LoraParamSpec[], lora: ResolvedLoraConfig, weights: NamedWeights): void {
  const problems: string[] = [];
  const known = new Set(specs.map((s) => s.name));
  for (const spec of specs) {
    const w = weights.get(spec.name);
    if (w === undefined) problems.push(`missing ${spec.name}`);
    else if (w.shape.length !== 2 || w.shape[0] !== spec.shape[0] || w.shape[1] !== spec.shape[1]) {
      problems.push(`${spec.name} has shape [${w.shape.join(', ')}], expected [${spec.shape.join(', ')}]`);
    } else if (w.data.length !== spec.shape[0] * spec.shape[1]) {
      problems.push(`${spec.name} has ${w.data.length} values for shape [${spec.shape.join(', ')}]`);
    }
  }
  for (const name of weights.keys()) if (!known.has(name)) problems.push(`unknown tensor ${name}`);
  if (problems.length > 0) {
    const more = problems.length > 5 ? `; and ${problems.length - 5} more` : '';
    throw new ShapeError(
      `LoRA weights do not match the adapter (rank ${lora.rank}, ${lora.targetModules.join(', ')}): ${problems.slice(0, 5).join('; ')}${more}`,
      {
        context: { problems: problems.length },
      },
    );
  }
}

/**
 * The trainable weights of one LoRA adapter for a given model architecture. Owns its variables; call
 * {@link LoraAdapter.dispose} when done. Attach it to a base model with {@link PolicyModel.withAdapter}.
 */
export class LoraAdapter implements ModelAdapter {
  /** The validated adapter configuration. */
  readonly lora: ResolvedLoraConfig;
  /** The architecture it adapts. */
  readonly config: ResolvedPolicyConfig;
  private readonly specs: readonly LoraParamSpec[];
  private readonly vars: ReadonlyMap<string, tf.Variable>;
  private disposed = false;

  private constructor(config: ResolvedPolicyConfig, lora: ResolvedLoraConfig, data: (spec: LoraParamSpec) => Float32Array) {
    this.config = config;
    this.lora = lora;
    this.specs = loraParamSpecs(config, lora);
    const vars = new Map<string, tf.Variable>();
    try {
      for (const spec of this.specs) {
        const value = tf.tidy(() => tf.transpose(tf.tensor2d(data(spec), [...spec.shape]))); // PEFT → [in, r] / [r, out]
        vars.set(spec.name, tf.variable(value, true));
        value.dispose();
      }
    } catch (error) {
      for (const v of vars.values()) v.dispose();
      throw error;
    }
    this.vars = vars;
  }

  /**
   * A fresh adapter as PEFT initializes one: `A` uniform in `±1/√in` (Kaiming-uniform with `a = √5`), seeded
   * per tensor name, and `B = 0`, so the adapted model starts equal to its base.
   */
  static create(config: PolicyConfig, lora: LoraConfig, seed: number): LoraAdapter {
    const resolved = validateLoraConfig(lora);
    return new LoraAdapter(validatePolicyConfig(config), resolved, (spec) => {
      const size = spec.shape[0] * spec.shape[1];
      if (spec.kind === 'B') return new Float32Array(size);
      const bound = 1 / Math.sqrt(spec.shape[1]);
      const rng = createRng(seed, spec.name);
      return Float32Array.from({ length: size }, () => (2 * rng.next() - 1) * bound);
    });
  }

  /**
   * An adapter holding the given tensors (PEFT names and shapes, as {@link LoraAdapter.getWeights}).
   *
   * @throws {@link ShapeError} naming every missing, unknown or misshapen tensor.
   */
  static fromWeights(config: PolicyConfig, lora: LoraConfig, weights: NamedWeights): LoraAdapter {
    const valid = validatePolicyConfig(config);
    const resolved = validateLoraConfig(lora);
    checkLoraWeights(loraParamSpecs(valid, resolved), resolved, weights);
    return new LoraAdapter(valid, resolved, (spec) => (weights.get(spec.name) as WeightArray).data);
  }

  /** Tensor names (PEFT's), in a stable order: per block, per target, A then B. */
  weightNames(): string[] {
    return this.specs.map((s) => s.name);
  }

  /** The trainable variables in {@link LoraAdapter.weightNames} order (`A` as `[in, r]`, `B` as `[r, out]`). */
  variables(): tf.Variable[] {
    return [...this.vars.values()];
  }

  /** Number of trainable scalars. */
  numParameters(): number {
    return this.specs.reduce((n, s) => n + s.shape[0] * s.shape[1], 0);
  }

  /** The `A`/`B` pair of a block's target, or null when the adapter leaves that layer alone. */
  pair(layer: number, target: LoraTarget): LoraPair | null {
    const path = `base_model.model.${modulePath(layer, target)}`;
    const a = this.vars.get(`${path}.lora_A.weight`);
    const b = this.vars.get(`${path}.lora_B.weight`);
    return a && b ? { a, b } : null;
  }

  /** Copies of the tensors in PEFT's names and shapes. */
  getWeights(): NamedWeights {
    const out = new Map<string, WeightArray>();
    for (const spec of this.specs) {
      out.set(spec.name, { shape: [...spec.shape], data: readCopy(tf.transpose(this.vars.get(spec.name) as tf.Variable)) });
    }
    return out;
  }

  /**
   * Replaces every tensor (PEFT names and shapes).
   *
   * @throws {@link ShapeError} as {@link LoraAdapter.fromWeights}.
   */
  setWeights(weights: NamedWeights): void {
    checkLoraWeights(this.specs, this.lora, weights);
    for (const spec of this.specs) {
      const w = weights.get(spec.name) as WeightArray;
      const v = this.vars.get(spec.name) as tf.Variable;
      tf.tidy(() => v.assign(tf.transpose(tf.tensor2d(w.data, [...spec.shape]))));
    }
  }

  /** Disposes every variable. Idempotent. */
  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    for (const v of this.vars.values()) v.dispose();
  }
}

/** PEFT's `adapter_config.json` for an adapter (LoRA on a causal LM, no bias, no DoRA, every block). */
export function peftAdapterConfig(lora: ResolvedLoraConfig, baseModel: string | null = null): Record<string, unknown> {
  return {
    peft_type: 'LORA',
    task_type: 'CAUSAL_LM',
    base_model_name_or_path: baseModel,
    r: lora.rank,
    lora_alpha: lora.alpha,
    lora_dropout: lora.dropout,
    target_modules: [...lora.targetModules],
    bias: 'none',
    fan_in_fan_out: false,
    use_rslora: lora.rsLora,
    use_dora: false,
    init_lora_weights: true,
    inference_mode: true,
    modules_to_save: null,
    layers_to_transform: null,
    rank_pattern: {},
    alpha_pattern: {},
  };
}

/**
 * Writes an adapter as a PEFT directory: `adapter_config.json` and `adapter_model.safetensors` (F32).
 *
 * @param baseModel - Recorded as `base_model_name_or_path` (a model id or directory), or null.
 */
export async function savePeftAdapter(dir: string, adapter: LoraAdapter, baseModel: string | null = null): Promise<void> {
  await savePeftWeights(dir, adapter.lora, adapter.getWeights(), baseModel);
}

/**
 * Writes adapter weights (PEFT's tensor names, as {@link LoraAdapter.getWeights} gives them) as a PEFT directory,
 * without building an adapter: what weight sync publishes for a LoRA policy.
 *
 * @param metadata - Extra string metadata of the safetensors header.
 * @returns the size and SHA-256 of `adapter_model.safetensors`.
 */
export async function savePeftWeights(
  dir: string,
  lora: ResolvedLoraConfig,
  weights: NamedWeights,
  baseModel: string | null = null,
  metadata: Readonly<Record<string, string>> = {},
): Promise<{ readonly bytes: number; readonly sha256: string }> {
  await mkdir(dir, { recursive: true });
  const bytes = encodeSafetensors(weights, { format: 'pt', ...metadata });
  await writeFileAtomic(join(dir, PEFT_FILES.weights), bytes);
  await writeFileAtomic(join(dir, PEFT_FILES.config), `${JSON.stringify(peftAdapterConfig(lora, baseModel), null, 2)}\n`);
  return { bytes: bytes.length, sha256: createHash('sha256').update(bytes).digest('hex') };
}

/**
 * Reads a PEFT LoRA directory's configuration, checking that rxrl computes exactly what PEFT would.
 *
 * @throws {@link DecodeError} for a missing or malformed `adapter_config.json`; {@link ConfigError} naming the
 *   field for what rxrl does not implement (another `peft_type`, DoRA, biases, per-layer ranks or layer subsets,
 *   `modules_to_save`, `fan_in_fan_out`, a regular-expression `target_modules`, a target the model lacks).
 */
export async function readPeftAdapterConfig(dir: string, root?: string): Promise<{ lora: ResolvedLoraConfig; baseModel: string | null }> {
  const path = join(dir, PEFT_FILES.config);
  const c = await readJsonObject(path, root);
  const unsupported = (field: string, why: string): never => {
    throw new ConfigError(`${path}: ${field} ${why}, got ${JSON.stringify(c[field])}`, { context: { path, key: field } });
  };
  if (c.peft_type !== 'LORA') unsupported('peft_type', "must be 'LORA'");
  if (c.use_dora === true) unsupported('use_dora', 'is not supported');
  if (c.bias !== undefined && c.bias !== 'none') unsupported('bias', "must be 'none'");
  if (c.fan_in_fan_out === true) unsupported('fan_in_fan_out', 'is not supported');
  if (c.modules_to_save !== undefined && c.modules_to_save !== null) unsupported('modules_to_save', 'is not supported');
  if (c.layers_to_transform !== undefined && c.layers_to_transform !== null)
    unsupported('layers_to_transform', 'is not supported (every block is adapted)');
  for (const field of ['rank_pattern', 'alpha_pattern']) {
    const v = c[field];
    if (v !== undefined && v !== null && (typeof v !== 'object' || Object.keys(v).length > 0))
      unsupported(field, 'is not supported (one rank and alpha for every layer)');
  }
  if (!Array.isArray(c.target_modules))
    unsupported('target_modules', 'must be a list of module names (a regular expression is not supported)');
  (c.target_modules as unknown[]).forEach((t, i) => {
    if (!LORA_TARGETS.includes(t as LoraTarget)) {
      throw new ConfigError(`${path}: target_modules[${i}] must be one of ${LORA_TARGETS.join(', ')}, got ${JSON.stringify(t)}`, {
        context: { path, key: `target_modules[${i}]` },
      });
    }
  });
  const lora = validateLoraConfig(
    {
      rank: c.r as number,
      alpha: c.lora_alpha as number,
      targetModules: c.target_modules as LoraTarget[],
      dropout: (c.lora_dropout as number | undefined) ?? 0,
      rsLora: c.use_rslora === true,
    },
    path,
  );
  return { lora, baseModel: typeof c.base_model_name_or_path === 'string' ? c.base_model_name_or_path : null };
}

/** Where a PEFT directory may be read from, and how large its weights may be. */
export interface PeftReadOptions {
  /** Largest weights file accepted; never more than the declared adapter in float32 plus header room. */
  readonly maxWeightBytes?: number;
  /** A directory the files must lie in once links are followed ({@link ForbiddenPathError} otherwise). */
  readonly root?: string;
}

/**
 * Loads a PEFT LoRA directory for a model architecture. PEFT's tensor names may carry the adapter name
 * (`….lora_A.default.weight`); it is dropped. Both files are read by rxrl's one file reader: regular files only
 * (a FIFO or a device is refused unopened), inside `options.root` when given, the weights no larger than the
 * adapter its configuration declares in float32 (and `options.maxWeightBytes`).
 *
 * @throws as {@link readPeftAdapterConfig}, {@link DecodeError} for a weights file that is not a regular file,
 *   too large or malformed, {@link ForbiddenPathError} outside the root, and {@link ShapeError} when the tensors
 *   do not match.
 */
export async function loadPeftAdapter(
  dir: string,
  config: PolicyConfig,
  options: PeftReadOptions = {},
): Promise<{ adapter: LoraAdapter; baseModel: string | null }> {
  const { lora, baseModel } = await readPeftAdapterConfig(dir, options.root);
  const weights = await readPeftWeights(dir, config, lora, options);
  return { adapter: LoraAdapter.fromWeights(config, lora, weights), baseModel };
}

/**
 * The tensors of a PEFT directory's `adapter_model.safetensors`, under rxrl's names, read within the bound its
 * configuration implies (see {@link loadPeftAdapter}).
 */
export async function readPeftWeights(
  dir: string,
  config: PolicyConfig,
  lora: ResolvedLoraConfig,
  options: PeftReadOptions = {},
): Promise<NamedWeights> {
  const maxBytes = Math.min(options.maxWeightBytes ?? Infinity, loraWeightBytes(config, lora));
  const { weights } = await loadSafetensors(join(dir, PEFT_FILES.weights), {
    maxBytes,
    ...(options.root === undefined ? {} : { root: options.root }),
  });
  return renamePeftWeights(weights);
}

/** The largest `adapter_model.safetensors` an adapter of this shape can have: its weights in float32, plus header room. */
export function loraWeightBytes(config: PolicyConfig, lora: ResolvedLoraConfig): number {
  const declared = loraParamSpecs(validatePolicyConfig(config), lora).reduce((n, s) => n + s.shape[0] * s.shape[1], 0);
  return declared * 4 + WEIGHTS_HEADER_SLACK_BYTES;
}

/** PEFT tensor names as rxrl keeps them: the adapter name PEFT may insert (`….lora_A.default.weight`) dropped. */
export function renamePeftWeights(weights: NamedWeights): NamedWeights {
  const renamed = new Map<string, WeightArray>();
  for (const [name, w] of weights) renamed.set(name.replace(/\.lora_([AB])\.[^.]+\.weight$/, '.lora_$1.weight'), w);
  return renamed;
}
