/**
 * Checkpoints in `<run-dir>/global_step_<N>/`: the policy as a complete Hugging Face model directory
 * (`config.json`, `model.safetensors`, `generation_config.json`, tokenizer files — `from_pretrained` loads the
 * checkpoint directory itself; a LoRA policy as a PEFT adapter; a policy trained on a Tinker-API service as
 * `tinker.json`, which names its state on the service), the optimizer state (`optimizer.safetensors`, Adam moments by weight name in
 * the model's internal `[in, out]` layout) and `state.json` (step, version, seed, loader position, tasks
 * admitted but not yet trained, and the size and sha256 of every other file). A checkpoint is
 * written to a temporary directory, every file and directory flushed to the disk, and renamed into place, so a
 * process or machine that dies mid-save never leaves a half-written `global_step_*` behind. Resume verifies what
 * `state.json` records and falls back to the previous checkpoint when the newest is damaged
 * ({@link resumeCheckpoint}).
 *
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { mkdir, readFile, readdir, rename, rm, stat } from 'node:fs/promises';
import { join, relative, sep } from 'node:path';
import type { LoaderPosition } from '../data/loader.js';
import { validateTask } from '../data/loader.js';
import type { NamedWeights } from '../model/types.js';
import { DecodeError, asStorageError } from '../core/errors.js';
import { entryExists, readJsonObject } from '../model/files.js';
import { PEFT_FILES, readPeftAdapterConfig, savePeftWeights, type ResolvedLoraConfig } from '../model/lora.js';
import {
  MODEL_FILES,
  POLICY_VERSION_METADATA_KEY,
  policyConfigFromHf,
  readModelDir,
  saveModelDir,
  savedDtypeOf,
  type SavedDtype,
  type SpecialTokenIds,
} from '../model/modelDir.js';
import { loadSafetensors, saveSafetensors, syncDirectory, writeFileAtomic } from '../model/safetensors.js';
import type { PolicyConfig, ResolvedPolicyConfig } from '../model/config.js';
import type { PolicyVersion, Task } from '../core/types.js';
import type { RolloutSample } from '../engine/worker.js';

/** Version of the `state.json` layout. */
export const CHECKPOINT_FORMAT = 2;

/** What a checkpoint records besides tensors. */
export interface CheckpointState {
  /** Layout version ({@link CHECKPOINT_FORMAT}). */
  readonly format: number;
  /** Train steps taken. */
  readonly step: number;
  /** Policy version of the saved weights (equals `step`). */
  readonly version: PolicyVersion;
  /** Run seed: every random stream derives from it and from ids, so it is the whole RNG state. */
  readonly seed: number;
  /** Loader position after the last task admitted before the checkpoint. */
  readonly loader: LoaderPosition;
  /** Tasks admitted but not yet trained, in admission order; a resumed run admits them first. */
  readonly pendingTasks: readonly Task[];
  /** Samples of those tasks already generated (in `buffered.jsonl`); a resumed run uses them instead of sampling. */
  readonly bufferedSamples?: number;
  /** When it was saved (ISO 8601). */
  readonly savedAt: string;
  /** Size and sha256 of every other file, by path relative to the checkpoint (absent in older checkpoints). */
  readonly files?: CheckpointFiles;
}

/** What `state.json` records of each file of a checkpoint, by path relative to it (`/`-separated). */
export type CheckpointFiles = Readonly<Record<string, { readonly size: number; readonly sha256: string }>>;

/** A sample generated before the checkpoint for a task not yet trained, keyed by its trajectory id. */
export interface BufferedSample {
  readonly id: string;
  readonly groupId: string;
  readonly sample: RolloutSample;
}

/** Everything a checkpoint holds. */
export interface Checkpoint {
  readonly path: string;
  readonly state: CheckpointState;
  readonly buffered: readonly BufferedSample[];
  /** The policy's architecture (the checkpoint's `config.json`); absent when it holds a LoRA adapter. */
  readonly config?: ResolvedPolicyConfig;
  /** The adapter of a LoRA policy (the checkpoint's `adapter_config.json`); `weights` are then the adapter's. */
  readonly lora?: ResolvedLoraConfig;
  /** A Tinker-trained policy's state on the service (the checkpoint's `tinker.json`); `weights` are then empty. */
  readonly tinker?: TinkerStateRef;
  readonly weights: NamedWeights;
  readonly optimizer: NamedWeights;
  readonly metadata: Readonly<Record<string, string>>;
  /**
   * Set when the policy's weights were saved in a narrower type (`checkpoint.dtype`) and the float32 master weights
   * (`master.safetensors`) are missing: `weights` are then the narrow ones, widened, and training goes on from
   * weights rounded to this type. The caller warns.
   */
  readonly narrowDtype?: Exclude<SavedDtype, 'float32'>;
}

/** Where a Tinker-API service keeps a run's state (`save_state`), recorded in the checkpoint's `tinker.json`. */
export interface TinkerStateRef {
  /** The state's `tinker://` path (adapter and optimizer state). */
  readonly path: string;
  /** The service's base model. */
  readonly baseModel: string;
  /** The adapter's LoRA rank. */
  readonly rank: number;
}

/** A policy trained on a Tinker-API service: the checkpoint records where its state is; the service holds it. */
export interface CheckpointTinker {
  readonly tinker: TinkerStateRef;
}

/** File of a checkpoint that records a Tinker-API service's state. */
export const TINKER_STATE_FILE = 'tinker.json';

/** The policy a checkpoint holds, written as a Hugging Face model directory. */
export interface CheckpointModel {
  readonly config: PolicyConfig;
  readonly weights: NamedWeights;
  /** Tokenizer files written beside the weights (`tokenizer.files()`). */
  readonly tokenizerFiles?: Readonly<Record<string, string>>;
  readonly special?: SpecialTokenIds;
  /**
   * Element type of the model directory's weights (`checkpoint.dtype`). Default `float32`; another one also writes
   * the float32 weights to `master.safetensors`, which a resume reads, so training goes on from the exact weights.
   */
  readonly dtype?: SavedDtype | undefined;
  /** Largest weights shard in bytes (`checkpoint.maxShardSize`). Default transformers' 50 GB. */
  readonly maxShardBytes?: number | undefined;
}

/** The float32 weights of a checkpoint saved in a narrower type. */
export const MASTER_WEIGHTS_FILE = 'master.safetensors';

/** A LoRA policy a checkpoint holds, written as a PEFT adapter directory. */
export interface CheckpointAdapter {
  readonly lora: ResolvedLoraConfig;
  /** The adapter's weights. */
  readonly weights: NamedWeights;
  /** The directory of the frozen base, recorded as `base_model_name_or_path`. */
  readonly baseDir: string | null;
}

const NAME = /^global_step_(\d+)$/;

/** Directory name of the checkpoint after `step` steps. */
export function checkpointName(step: number): string {
  return `global_step_${step}`;
}

/**
 * Writes a checkpoint atomically into `<runDir>/global_step_<state.step>/` (replacing one of the same step): the
 * policy as a Hugging Face model directory, or a LoRA policy as a PEFT adapter directory, with the optimizer state,
 * the buffered samples and `state.json`.
 *
 * @returns its path.
 */
export async function saveCheckpoint(
  runDir: string,
  contents: {
    state: Omit<CheckpointState, 'format' | 'savedAt' | 'bufferedSamples' | 'files'>;
    model: CheckpointModel | CheckpointAdapter | CheckpointTinker;
    /** The optimizer's state (a Tinker policy's is on the service: none here). */
    optimizer?: NamedWeights;
    buffered?: readonly BufferedSample[];
    metadata?: Record<string, string>;
  },
): Promise<string> {
  return writeCheckpointDir(runDir, contents.state.step, async (tmp) => {
    const metadata = { ...contents.metadata, [POLICY_VERSION_METADATA_KEY]: String(contents.state.version) };
    const model = contents.model;
    if ('tinker' in model)
      await writeFileAtomic(join(tmp, TINKER_STATE_FILE), `${JSON.stringify({ ...model.tinker, metadata }, null, 2)}\n`);
    else if ('lora' in model) await savePeftWeights(tmp, model.lora, model.weights, model.baseDir, metadata);
    else {
      const { config, weights, tokenizerFiles, special, dtype, maxShardBytes } = model;
      await saveModelDir(
        tmp,
        { config, weights },
        { ...(tokenizerFiles ? { tokenizerFiles } : {}), ...(special ? { special } : {}), metadata, dtype, maxShardBytes },
      );
      if (dtype !== undefined && dtype !== 'float32') await saveSafetensors(join(tmp, MASTER_WEIGHTS_FILE), weights, metadata);
    }
    if (contents.optimizer !== undefined) await saveSafetensors(join(tmp, 'optimizer.safetensors'), contents.optimizer);
    const buffered = contents.buffered ?? [];
    await writeFileAtomic(join(tmp, 'buffered.jsonl'), buffered.map((b) => `${JSON.stringify(b)}\n`).join(''));
    const state: CheckpointState = {
      format: CHECKPOINT_FORMAT,
      savedAt: new Date().toISOString(),
      ...contents.state,
      bufferedSamples: buffered.length,
    };
    return state;
  });
}

/** Prefix of the temporary directory a checkpoint is written into before it is renamed into place. */
const TMP_PREFIX = '.tmp-';

/**
 * Writes `<runDir>/global_step_<step>/` atomically: `fill` writes the contents into a temporary directory and
 * returns the state, which goes to `state.json` last (what marks a checkpoint complete) with the size and sha256
 * of every file; every directory of it is flushed to the disk, then it is renamed into place, replacing one of
 * the same step, and the rename is flushed too. On failure the temporary directory is removed and the checkpoints
 * in place are untouched.
 *
 * @internal
 * @returns its path.
 * @throws {@link StorageError} naming the checkpoint when the device is full or the quota spent.
 */
export async function writeCheckpointDir(runDir: string, step: number, fill: (tmp: string) => Promise<object>): Promise<string> {
  const final = join(runDir, checkpointName(step));
  const tmp = join(runDir, `${TMP_PREFIX}${checkpointName(step)}-${process.pid}`);
  try {
    await rm(tmp, { recursive: true, force: true });
    await mkdir(tmp, { recursive: true });
    const state = await fill(tmp);
    const files = await checksumsOf(tmp);
    await writeFileAtomic(join(tmp, 'state.json'), `${JSON.stringify({ ...state, files }, null, 2)}\n`);
    for (const dir of await directoriesUnder(tmp)) await syncDirectory(dir);
    await rm(final, { recursive: true, force: true });
    await rename(tmp, final);
    await syncDirectory(runDir);
  } catch (error) {
    await rm(tmp, { recursive: true, force: true });
    throw asStorageError(error, final);
  }
  return final;
}

/**
 * Removes the temporary directories of checkpoint writes that never finished (a killed or failed process's
 * `.tmp-global_step_*`). Call it only while holding the run directory's lock.
 *
 * @returns the paths removed.
 */
export async function removeUnfinishedCheckpoints(runDir: string): Promise<string[]> {
  const names = await readdir(runDir).catch(() => [] as string[]);
  const removed = names.filter((name) => name.startsWith(`${TMP_PREFIX}global_step_`)).map((name) => join(runDir, name));
  for (const path of removed) await rm(path, { recursive: true, force: true });
  return removed;
}

/**
 * Checks a checkpoint directory against the size and sha256 of each file its `state.json` records. A checkpoint
 * written before they were recorded passes when its `state.json` parses (loading it checks the rest: every
 * safetensors header and the data it describes).
 *
 * @throws {@link DecodeError} naming the checkpoint, the file and what is wrong with it.
 */
export async function verifyCheckpoint(path: string): Promise<void> {
  const { files } = (await readCheckpointState(path)) as { files?: unknown };
  if (files === undefined) return;
  const damaged = (reason: string, file?: string): DecodeError =>
    new DecodeError(`checkpoint ${path}: ${file === undefined ? '' : `${file} `}${reason}`, {
      context: { path, ...(file === undefined ? {} : { file }), reason },
    });
  if (typeof files !== 'object' || files === null) throw damaged('state.json: files is not an object');
  for (const [file, expected] of Object.entries(files as Record<string, { size?: unknown; sha256?: unknown }>)) {
    const actual = await sizeAndHash(join(path, file)).catch(() => undefined);
    if (actual === undefined) throw damaged('is missing', file);
    if (actual.size !== expected?.size) throw damaged(`has ${actual.size} bytes, state.json records ${String(expected?.size)}`, file);
    if (actual.sha256 !== expected.sha256) throw damaged('does not match its sha256 in state.json', file);
  }
}

/**
 * The checkpoint a run resumes from, loaded with `load` (single- or multi-policy):
 * - `auto`: the newest of `runDir` that verifies ({@link verifyCheckpoint}) and loads; a damaged one (a
 *   {@link DecodeError}) is reported to `onDamaged` and the previous one is tried, and so on.
 * - `from_path`: the checkpoint named, verified; damaged, it is an error: no fallback away from what the user named.
 * - `disable`: none.
 *
 * @param resume - the mode and, for `from_path`, the checkpoint's resolved path.
 * @returns undefined when there is nothing to resume from.
 * @throws {@link DecodeError} when `runDir` has checkpoints but none is intact (starting over would discard them),
 *   or the checkpoint named by `from_path` is damaged.
 */
export async function resumeCheckpoint<T>(
  resume: { readonly mode: 'disable' | 'auto' | 'from_path'; readonly path: string | null },
  runDir: string | undefined,
  load: (path: string) => Promise<T>,
  onDamaged: (path: string, error: DecodeError) => void,
): Promise<T | undefined> {
  const verified = async (path: string): Promise<T> => {
    await verifyCheckpoint(path);
    return load(path);
  };
  if (resume.mode === 'disable') return undefined;
  if (resume.mode === 'from_path') return verified(resume.path as string);
  const steps = runDir === undefined ? [] : await listCheckpoints(runDir);
  for (const step of steps.reverse()) {
    const path = join(runDir as string, checkpointName(step));
    try {
      return await verified(path);
    } catch (error) {
      if (!(error instanceof DecodeError)) throw error;
      onDamaged(path, error);
    }
  }
  if (steps.length === 0) return undefined;
  throw new DecodeError(`${runDir}: none of its ${steps.length} checkpoints is intact; set resume.mode to 'disable' to start over`, {
    context: { path: runDir },
  });
}

/** Size and sha256 of every file under `dir`, by path relative to it. */
async function checksumsOf(dir: string): Promise<CheckpointFiles> {
  const files: Record<string, { size: number; sha256: string }> = {};
  for (const file of await filesUnder(dir)) files[relative(dir, file).split(sep).join('/')] = await sizeAndHash(file);
  return files;
}

async function sizeAndHash(file: string): Promise<{ size: number; sha256: string }> {
  const hash = createHash('sha256');
  let size = 0;
  for await (const chunk of createReadStream(file)) {
    hash.update(chunk as Buffer);
    size += (chunk as Buffer).length;
  }
  return { size, sha256: hash.digest('hex') };
}

/** Every file under `dir`, recursively. */
async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries.filter((e) => e.isFile()).map((e) => join(e.parentPath ?? e.path, e.name));
}

/** `dir` and every directory under it, deepest first (so each is flushed after its entries). */
async function directoriesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  const dirs = entries.filter((e) => e.isDirectory()).map((e) => join(e.parentPath ?? e.path, e.name));
  return [...dirs.sort((a, b) => b.length - a.length), dir];
}

/** Steps of the complete checkpoints in `runDir`, ascending (none when the directory does not exist). */
export async function listCheckpoints(runDir: string): Promise<number[]> {
  let names: string[];
  try {
    names = await readdir(runDir);
  } catch {
    return [];
  }
  const steps: number[] = [];
  for (const name of names) {
    const match = NAME.exec(name);
    if (!match) continue;
    try {
      await stat(join(runDir, name, 'state.json'));
      steps.push(Number(match[1]));
    } catch {
      // incomplete: ignored
    }
  }
  return steps.sort((a, b) => a - b);
}

/** Path of the newest complete checkpoint in `runDir`, or undefined. */
export async function latestCheckpoint(runDir: string): Promise<string | undefined> {
  const steps = await listCheckpoints(runDir);
  return steps.length === 0 ? undefined : join(runDir, checkpointName(steps[steps.length - 1]));
}

/**
 * The parsed `state.json` of a checkpoint directory (single- or multi-policy), unchecked.
 *
 * @throws {@link DecodeError} when it cannot be read or is not JSON.
 */
export async function readCheckpointState(path: string): Promise<unknown> {
  try {
    return JSON.parse(await readFile(join(path, 'state.json'), 'utf8')) as unknown;
  } catch (cause) {
    throw new DecodeError(`checkpoint ${path}: unreadable state.json`, { cause, context: { path } });
  }
}

/** Reads a checkpoint directory; malformed contents raise {@link DecodeError}. */
export async function loadCheckpoint(path: string): Promise<Checkpoint> {
  const state = (await readCheckpointState(path)) as CheckpointState;
  const ok =
    typeof state === 'object' &&
    state !== null &&
    state.format === CHECKPOINT_FORMAT &&
    Number.isInteger(state.step) &&
    Number.isInteger(state.version) &&
    typeof state.loader === 'object' &&
    Number.isInteger(state.loader?.epoch) &&
    Number.isInteger(state.loader?.index) &&
    Array.isArray(state.pendingTasks);
  if (!ok) throw new DecodeError(`checkpoint ${path}: state.json does not match format ${CHECKPOINT_FORMAT}`, { context: { path } });
  const pendingTasks = state.pendingTasks.map((t) => ({
    ...validateTask(t, { path }),
    ...(t.epoch === undefined ? {} : { epoch: t.epoch }),
  }));
  if (await entryExists(join(path, TINKER_STATE_FILE))) {
    const buffered = await readBuffered(join(path, 'buffered.jsonl'));
    return {
      path,
      state: { ...state, pendingTasks },
      buffered,
      tinker: await readTinkerState(path),
      weights: new Map(),
      optimizer: new Map(),
      metadata: {},
    };
  }
  const optimizer = await loadSafetensors(join(path, 'optimizer.safetensors'));
  const buffered = await readBuffered(join(path, 'buffered.jsonl'));
  const common = { path, state: { ...state, pendingTasks }, buffered, optimizer: optimizer.weights };
  if (await entryExists(join(path, PEFT_FILES.config))) {
    const { lora } = await readPeftAdapterConfig(path);
    const adapter = await loadSafetensors(join(path, PEFT_FILES.weights));
    return { ...common, lora, weights: adapter.weights, metadata: adapter.metadata };
  }
  // A checkpoint saved in bfloat16 or float16 resumes from its float32 master weights alone (the narrow ones are not read).
  if (await entryExists(join(path, MASTER_WEIGHTS_FILE))) {
    const configPath = join(path, MODEL_FILES.config);
    const config = policyConfigFromHf(await readJsonObject(configPath), configPath);
    const master = await loadSafetensors(join(path, MASTER_WEIGHTS_FILE));
    return { ...common, config, weights: master.weights, metadata: master.metadata };
  }
  const model = await readModelDir(path);
  const dtype = savedDtypeOf(model.rawConfig);
  const narrow = dtype === undefined || dtype === 'float32' ? {} : { narrowDtype: dtype };
  return { ...common, config: model.config, weights: model.weights, metadata: model.metadata, ...narrow };
}

async function readTinkerState(path: string): Promise<TinkerStateRef> {
  const file = join(path, TINKER_STATE_FILE);
  let raw: unknown;
  try {
    raw = JSON.parse(await readFile(file, 'utf8'));
  } catch (cause) {
    throw new DecodeError(`${file}: unreadable or not JSON`, { cause, context: { path: file } });
  }
  const r = raw as Partial<TinkerStateRef> | null;
  if (typeof r?.path !== 'string' || typeof r.baseModel !== 'string' || !Number.isInteger(r.rank)) {
    throw new DecodeError(`${file}: needs path, baseModel and rank`, { context: { path: file } });
  }
  return { path: r.path, baseModel: r.baseModel, rank: r.rank as number };
}

async function readBuffered(file: string): Promise<BufferedSample[]> {
  let text: string;
  try {
    text = await readFile(file, 'utf8');
  } catch {
    return []; // checkpoints written before buffered samples were kept
  }
  const out: BufferedSample[] = [];
  text.split('\n').forEach((line, i) => {
    if (line.trim() === '') return;
    let value: BufferedSample;
    try {
      value = JSON.parse(line) as BufferedSample;
    } catch (cause) {
      throw new DecodeError(`${file}:${i + 1}: not valid JSON`, { cause, context: { file, line: i + 1 } });
    }
    const s = value?.sample;
    const ok =
      typeof value?.id === 'string' &&
      typeof value.groupId === 'string' &&
      Array.isArray(s?.promptTokens) &&
      Array.isArray(s.responseTokens) &&
      Array.isArray(s.logprobs) &&
      Array.isArray(s.lossMask) &&
      s.responseTokens.length === s.logprobs.length &&
      s.responseTokens.length === s.lossMask.length &&
      typeof s.response === 'string' &&
      Number.isInteger(s.policyVersion);
    if (!ok) throw new DecodeError(`${file}:${i + 1}: not a buffered sample`, { context: { file, line: i + 1 } });
    out.push(value);
  });
  return out;
}

/** Deletes all but the newest `keepLast` checkpoints (`keepLast` 0 keeps all). */
export async function pruneCheckpoints(runDir: string, keepLast: number): Promise<void> {
  if (keepLast <= 0) return;
  const steps = await listCheckpoints(runDir);
  for (const step of steps.slice(0, Math.max(0, steps.length - keepLast))) {
    await rm(join(runDir, checkpointName(step)), { recursive: true, force: true });
  }
}
