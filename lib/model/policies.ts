/**
 * The models a run starts from and trains: the initial policy (a model directory, or a seeded tiny model of the
 * recipe's shape, checked against the backend's memory) and, per policy, the model or adapter view its trainer
 * updates and the copy its engine samples from. Plain settings in, models out: the run's configuration types stay
 * in `lib/config`, which builds on this.
 *
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';

import { checkModelFits } from './capacity.js';
import { readJsonObject } from './files.js';
import { expandHome } from './hubCache.js';
import { ConfigError } from '../core/errors.js';
import { DEFAULT_POLICY_LORA, LoraAdapter, readPeftAdapterConfig, readPeftWeights, validateLoraConfig, type LoraConfig } from './lora.js';
import type { NamedWeights } from './types.js';
import { MODEL_FILES, loadModelDir, policyConfigFromHf } from './modelDir.js';
import type { ModelType } from './config.js';
import { PolicyModel, validatePolicyConfig, type PolicyConfig } from './transformer.js';

/** The shape of a tiny Llama-family model (`model.*` keys of a recipe), and the context cap. */
export interface TinyModelSettings {
  readonly type: ModelType;
  readonly dModel: number;
  readonly nLayers: number;
  readonly nHeads: number;
  /** 0: as many as `nHeads`. */
  readonly nKvHeads: number;
  readonly dFF: number;
  readonly maxSeqLen: number;
  readonly ropeTheta: number;
  /** Caps the context of any model (`null`: no cap). */
  readonly maxModelLen: number | null;
}

/** What {@link policyModels} needs of a policy: how it is specialized, and a `lora` policy's adapter settings. */
export interface PolicySpec {
  /** `lora`: an adapter on the shared base; anything else: a full model of its own. */
  readonly specialization: string;
  /** `lora` only: the adapter (unset keys take {@link DEFAULT_POLICY_LORA}'s). */
  readonly lora?: LoraConfig | undefined;
  /** `lora` only: a PEFT adapter directory the adapter starts from (see {@link readStartingAdapter}). */
  readonly adapterPath?: string | undefined;
}

/** The models of one policy: what its trainer updates, what its engine samples from, and the adapters to free. */
export interface PolicyModels {
  /** The model the trainer updates (an adapter view for `lora`). */
  readonly train: PolicyModel;
  /** The engine's copy (or `train` itself). */
  readonly sample: PolicyModel;
  /** The training adapter of a `lora` policy. */
  readonly adapter: LoraAdapter | undefined;
  /** Every adapter to free: the training one and the engine's copy. */
  readonly adapters: readonly LoraAdapter[];
}

/**
 * The tiny Llama-family architecture (`model.type`, default Qwen2) of the `model.*` keys, used when `model.path` is
 * unset; the vocabulary comes from the tokenizer.
 */
export function tinyModelConfig(model: TinyModelSettings): Omit<PolicyConfig, 'vocabSize'> {
  return {
    modelType: model.type,
    dModel: model.dModel,
    nLayers: model.nLayers,
    nHeads: model.nHeads,
    nKvHeads: model.nKvHeads === 0 ? model.nHeads : model.nKvHeads,
    dFF: model.dFF,
    maxSeqLen: model.maxSeqLen,
    ropeTheta: model.ropeTheta,
  };
}

/**
 * The policy a run starts from: the recipe's model directory, or the seeded tiny model its `model` keys shape.
 * Either is checked against the backend's memory before anything is allocated (errors name `model.*` keys or
 * `config.json` keys), with the context capped by `model.maxModelLen`.
 *
 * @param vocabSize - The tokenizer's, for the tiny model.
 * @returns the model (owned by the caller) and the context length prompts and responses must fit.
 */
export async function initialModel(
  model: TinyModelSettings,
  modelDir: string | undefined,
  vocabSize: number,
  seed: number,
): Promise<{ model: PolicyModel; contextLength: number }> {
  const cap = model.maxModelLen === null ? {} : { maxModelLen: model.maxModelLen };
  if (modelDir !== undefined) {
    const { model: loaded, contents } = await loadModelDir(modelDir, cap);
    return { model: loaded, contextLength: contents.contextLength };
  }
  const config = validatePolicyConfig({ ...tinyModelConfig(model), vocabSize });
  const contextLength = checkModelFits(config, { ...cap, keyOf: (field) => `model.${field}`, capHint: 'model.maxModelLen' });
  return { model: PolicyModel.create(config, seed), contextLength };
}

/**
 * The context length of a policy that lives elsewhere (on a Tinker-API service): what the recipe's model directory
 * or `model` keys declare, capped by `model.maxModelLen`, without loading weights or checking this process's memory.
 */
export async function remoteContextLength(model: TinyModelSettings, modelDir: string | undefined, vocabSize: number): Promise<number> {
  const cap = model.maxModelLen ?? Infinity;
  if (modelDir !== undefined) {
    const path = join(modelDir, MODEL_FILES.config);
    return Math.min(policyConfigFromHf(await readJsonObject(path), path, { memoryBytes: Infinity }).maxSeqLen, cap);
  }
  return Math.min(validatePolicyConfig({ ...tinyModelConfig(model), vocabSize }).maxSeqLen, cap);
}

/**
 * The models of one policy over `base`: what its trainer updates and the copy its engine samples from. `full` and
 * `prompt` are copies of the base's weights; `lora` is an adapter (seeded) on `base`, sampled through a copy of the
 * adapter on `sampleBase` (the engines run beside training, so they read weights of their own).
 *
 * @param entry - the policy (`policies[index]`).
 * @param sampleBase - a copy of `base` the engines sample from; needed for `lora` only.
 * @param how - `copyTrain`: whether a full policy trains a copy of the base (false: `base` itself); `sampled`:
 *   whether the policy needs a copy to sample from (false: `sample` is `train`, for a LoRA policy too, and
 *   `sampleBase` is not needed). Both default true.
 */
export function policyModels(
  entry: PolicySpec,
  index: number,
  base: PolicyModel,
  sampleBase: PolicyModel | undefined,
  seed: number,
  how: { readonly copyTrain?: boolean; readonly sampled?: boolean; readonly adapterWeights?: NamedWeights | undefined } = {},
): PolicyModels {
  if (entry.specialization !== 'lora') {
    const train = how.copyTrain === false ? base : PolicyModel.fromWeights(base.config, base.getWeights());
    const sample = how.sampled === false ? train : PolicyModel.fromWeights(base.config, train.getWeights());
    return { train, sample, adapter: undefined, adapters: [] };
  }
  const lora = validateLoraConfig({ ...DEFAULT_POLICY_LORA, ...entry.lora }, `policies[${index}].lora`);
  const adapter =
    how.adapterWeights === undefined
      ? LoraAdapter.create(base.config, lora, seed + 1 + index)
      : LoraAdapter.fromWeights(base.config, lora, how.adapterWeights);
  if (how.sampled === false) {
    const train = PolicyModel.withAdapter(base, adapter);
    return { train, sample: train, adapter, adapters: [adapter] };
  }
  if (sampleBase === undefined) throw new Error('policyModels: a lora policy samples from a copy of its base');
  const copy = LoraAdapter.fromWeights(base.config, lora, adapter.getWeights());
  return {
    train: PolicyModel.withAdapter(base, adapter),
    sample: PolicyModel.withAdapter(sampleBase, copy),
    adapter,
    // Views do not free their adapters.
    adapters: [adapter, copy],
  };
}

/**
 * The weights a `lora` policy's adapter starts from when the policy names a PEFT directory (`adapterPath`: an SFT
 * run's checkpoint, an adapter trained elsewhere) instead of PEFT's fresh initialization. The directory's
 * `adapter_config.json` must describe the policy's own adapter (rank, alpha, rsLoRA, target modules), so the run's
 * checkpoints stay that adapter. A relative path is relative to `baseDir`; `~/` is the home directory. The KL
 * reference of a LoRA policy stays its frozen base, as in TRL with a starting `PeftModel`.
 *
 * @param entry - the policy (`policies[index]`).
 * @param config - the base model's architecture.
 * @param options - `key`: the setting, for messages (`policies[0].adapterPath`); `baseDir`: the recipe's directory.
 * @returns the adapter's tensors under rxrl's names, or undefined when the policy names none.
 * @throws {@link ConfigError} for an adapter path on a policy that is not `lora`, or an adapter that is not the
 *   policy's; as {@link readPeftAdapterConfig} and {@link readPeftWeights} for missing or malformed files.
 */
export async function readStartingAdapter(
  entry: PolicySpec,
  config: PolicyConfig,
  options: { readonly key: string; readonly baseDir?: string | undefined },
): Promise<NamedWeights | undefined> {
  if (entry.adapterPath === undefined) return undefined;
  const { key } = options;
  if (entry.specialization !== 'lora') throw new ConfigError(`${key}: only a 'lora' policy starts from an adapter`, { context: { key } });
  const dir = resolve(options.baseDir ?? process.cwd(), expandHome(entry.adapterPath));
  if (!existsSync(join(dir, 'adapter_config.json'))) {
    const what = existsSync(dir) ? ': it has no adapter_config.json' : '';
    throw new ConfigError(
      `${key}: no adapter at '${dir}'${what} (give a PEFT adapter directory, such as a LoRA run's checkpoint global_step_N)`,
      { context: { key, path: dir } },
    );
  }
  const own = validateLoraConfig({ ...DEFAULT_POLICY_LORA, ...entry.lora }, key.replace(/adapterPath$/, 'lora'));
  const { lora } = await readPeftAdapterConfig(dir);
  const describe = (l: typeof own): string =>
    `rank ${l.rank}, alpha ${l.alpha}${l.rsLora ? ', rsLoRA' : ''}, targets ${[...l.targetModules].sort().join(', ')}`;
  if (describe(lora) !== describe(own)) {
    throw new ConfigError(`${key}: the adapter in ${dir} has ${describe(lora)}; the policy's lora has ${describe(own)}`, {
      context: { key, path: dir },
    });
  }
  return readPeftWeights(dir, config, lora);
}
