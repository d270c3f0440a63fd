/**
 * Checkpoints of multi-policy runs: `<runDir>/global_step_<n>/` holds, per policy, its weights (a Hugging Face
 * model directory, or a PEFT adapter directory of the adapter alone) and its optimizer state, plus the loader
 * position shared by every policy. Written when every policy has taken `n` steps and nothing is admitted beyond
 * them, so a resumed run continues exactly. Complete once `state.json` exists (written last, with the size and
 * sha256 of every file, then the directory is flushed and renamed into place), like single-policy checkpoints, so
 * `listCheckpoints`, `resumeCheckpoint` (verify, fall back past a damaged one) and `pruneCheckpoints` serve both.
 *
 * @packageDocumentation
 */
import { join } from 'node:path';
import type { LoaderPosition } from '../data/loader.js';
import type { NamedWeights } from '../model/types.js';
import { DecodeError } from '../core/errors.js';
import { PEFT_FILES, readPeftAdapterConfig, savePeftWeights, type ResolvedLoraConfig } from '../model/lora.js';
import { POLICY_VERSION_METADATA_KEY, readModelDir, saveModelDir, type SpecialTokenIds } from '../model/modelDir.js';
import { loadSafetensors, saveSafetensors } from '../model/safetensors.js';
import type { PolicyConfig } from '../model/config.js';
import { readCheckpointState, writeCheckpointDir, type CheckpointFiles } from './checkpoint.js';

/** Layout version of multi-policy checkpoints. */
export const POLICIES_CHECKPOINT_FORMAT = 1;

/** One policy as a checkpoint holds it: a full model (weights and `config`), or an adapter (its weights and `lora`). */
export type PolicyCheckpoint = {
  readonly name: string;
  readonly weights: NamedWeights;
  readonly optimizer: NamedWeights;
} & ({ readonly config: PolicyConfig; readonly lora?: undefined } | { readonly lora: ResolvedLoraConfig; readonly config?: undefined });

/** What `state.json` of a multi-policy checkpoint records. */
export interface PoliciesCheckpointState {
  readonly format: number;
  readonly kind: 'policies';
  /** Steps every policy has taken. */
  readonly step: number;
  readonly seed: number;
  /** Loader position after the last task admitted before the checkpoint (every one of them is trained). */
  readonly loader: LoaderPosition;
  /** The policies, in the run's order. */
  readonly policies: readonly { readonly name: string; readonly adapter: boolean }[];
  readonly savedAt: string;
  /** Size and sha256 of every other file (absent in older checkpoints). */
  readonly files?: CheckpointFiles;
}

/** A multi-policy checkpoint read back. */
export interface PoliciesCheckpoint {
  readonly path: string;
  readonly state: PoliciesCheckpointState;
  /** Weights and optimizer state by policy name. */
  readonly policies: ReadonlyMap<string, { readonly weights: NamedWeights; readonly optimizer: NamedWeights }>;
}

/**
 * Writes a multi-policy checkpoint atomically into `<runDir>/global_step_<step>/` (replacing one of the same step).
 *
 * @param contents - the step, seed and loader position; each policy's weights and optimizer state; for LoRA
 *   policies the directory of their base (recorded as `base_model_name_or_path`); tokenizer files for full models.
 * @returns its path.
 */
export async function savePoliciesCheckpoint(
  runDir: string,
  contents: {
    readonly step: number;
    readonly seed: number;
    readonly loader: LoaderPosition;
    readonly policies: readonly PolicyCheckpoint[];
    readonly baseDir?: string;
    readonly tokenizerFiles?: Readonly<Record<string, string>>;
    readonly special?: SpecialTokenIds;
  },
): Promise<string> {
  return writeCheckpointDir(runDir, contents.step, async (tmp) => {
    const metadata = { [POLICY_VERSION_METADATA_KEY]: String(contents.step) };
    for (const policy of contents.policies) {
      const dir = join(tmp, 'policies', policy.name);
      if (policy.lora) await savePeftWeights(dir, policy.lora, policy.weights, contents.baseDir ?? null, metadata);
      else {
        await saveModelDir(
          dir,
          { config: policy.config, weights: policy.weights },
          {
            ...(contents.tokenizerFiles ? { tokenizerFiles: contents.tokenizerFiles } : {}),
            ...(contents.special ? { special: contents.special } : {}),
            metadata,
          },
        );
      }
      await saveSafetensors(join(dir, 'optimizer.safetensors'), policy.optimizer);
    }
    const state: PoliciesCheckpointState = {
      format: POLICIES_CHECKPOINT_FORMAT,
      kind: 'policies',
      step: contents.step,
      seed: contents.seed,
      loader: contents.loader,
      policies: contents.policies.map((p) => ({ name: p.name, adapter: p.lora !== undefined })),
      savedAt: new Date().toISOString(),
    };
    return state;
  });
}

/**
 * Reads a multi-policy checkpoint.
 *
 * @throws {@link DecodeError} when `state.json` is unreadable or not a multi-policy checkpoint (a single-policy
 *   run's, for instance), or a policy's files are malformed.
 */
export async function loadPoliciesCheckpoint(path: string): Promise<PoliciesCheckpoint> {
  const state = (await readCheckpointState(path)) as PoliciesCheckpointState;
  const ok =
    typeof state === 'object' &&
    state !== null &&
    state.format === POLICIES_CHECKPOINT_FORMAT &&
    state.kind === 'policies' &&
    Number.isInteger(state.step) &&
    Number.isInteger(state.loader?.epoch) &&
    Number.isInteger(state.loader?.index) &&
    Array.isArray(state.policies) &&
    state.policies.every((p) => typeof p?.name === 'string' && typeof p.adapter === 'boolean');
  if (!ok)
    throw new DecodeError(`checkpoint ${path}: state.json is not a multi-policy checkpoint of format ${POLICIES_CHECKPOINT_FORMAT}`, {
      context: { path },
    });
  const policies = new Map<string, { weights: NamedWeights; optimizer: NamedWeights }>();
  for (const { name, adapter } of state.policies) {
    const dir = join(path, 'policies', name);
    let weights: NamedWeights;
    if (adapter) {
      await readPeftAdapterConfig(dir);
      weights = (await loadSafetensors(join(dir, PEFT_FILES.weights))).weights;
    } else {
      weights = (await readModelDir(dir)).weights;
    }
    policies.set(name, { weights, optimizer: (await loadSafetensors(join(dir, 'optimizer.safetensors'))).weights });
  }
  return { path, state, policies };
}
