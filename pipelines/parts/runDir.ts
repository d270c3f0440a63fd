/**
 * The run directory: warnings about it, resume, the JSONL files' truncation on resume, and each policy's final
 * weights.
 *
 * @packageDocumentation
 */
import { mkdir, readFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';

import { MASTER_WEIGHTS_FILE, type Checkpoint } from '../../lib/checkpoint/checkpoint.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import { asStorageError } from '../../lib/core/errors.js';
import { savePeftAdapter, type LoraAdapter } from '../../lib/model/lora.js';
import { saveModelDir, type SaveModelDirOptions } from '../../lib/model/modelDir.js';
import { writeFileAtomic } from '../../lib/model/safetensors.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import { moduleLogger, silentLogger, type Logger } from '../../lib/observe/logger.js';

/**
 * Where warnings about the run directory go (a stale lock taken over, a damaged checkpoint skipped): the
 * structured logger and the informational lines.
 *
 * @internal
 */
export function runDirWarnings(options: {
  readonly log?: (line: string) => void;
  readonly logger?: Logger;
}): (message: string, context: Readonly<Record<string, unknown>>) => void {
  const logger = moduleLogger(options.logger ?? silentLogger, 'checkpoint');
  return (message, context) => {
    logger.warn(context, message);
    options.log?.(`warning: ${message}`);
  };
}

/**
 * The `resume` section with its path resolved against `baseDir`.
 *
 * @internal
 */
export function resumeOf(config: Pick<RxrlConfig, 'resume'>, baseDir: string): { mode: RxrlConfig['resume']['mode']; path: string | null } {
  return { mode: config.resume.mode, path: config.resume.path === null ? null : resolve(baseDir, config.resume.path) };
}

/**
 * Reports a damaged checkpoint that resume skips, naming its path and what is wrong.
 *
 * @internal
 */
export function damagedCheckpointWarning(
  warn: (message: string, context: Readonly<Record<string, unknown>>) => void,
): (path: string, error: Error) => void {
  return (path, error) =>
    warn(`checkpoint ${path} is damaged, falling back to the previous one: ${error.message}`, { path, reason: error.message });
}

/**
 * Warns when a resumed checkpoint's policy goes on from narrow weights ({@link Checkpoint.narrowDtype}): its float32
 * master weights are missing, so what was trained since the previous checkpoint is kept only as rounded weights.
 *
 * @internal
 */
export function warnIfNarrow(
  checkpoint: Pick<Checkpoint, 'path' | 'narrowDtype'> | undefined,
  warn: (message: string, context: Readonly<Record<string, unknown>>) => void,
): void {
  if (checkpoint?.narrowDtype === undefined) return;
  const dtype = checkpoint.narrowDtype;
  warn(
    `checkpoint ${checkpoint.path} has no float32 master weights (${MASTER_WEIGHTS_FILE}): resuming from its ${dtype} weights, ` +
      `rounded to ${dtype} (precision lost); training goes on from the rounded weights`,
    { path: checkpoint.path, dtype, missing: MASTER_WEIGHTS_FILE },
  );
}

/**
 * Rewrites a JSONL file of step records without those whose `step` is `from` or later (a resumed run's validation
 * line after its checkpoint's last step has step `from − 1` and stays; `−Infinity` drops every record), and
 * without lines that do not parse (a line torn by a crash or a full disk), so the file ends with a complete line
 * and the next append starts a line of its own. A missing file is left missing.
 *
 * @throws {@link StorageError} naming the file when the device is full.
 */
export async function dropStepsFrom(path: string, from: number): Promise<void> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch {
    return;
  }
  const lines = text.split('\n').filter((line) => line.trim() !== '');
  const kept = lines.filter((line) => {
    try {
      const step = (JSON.parse(line) as { step?: unknown }).step;
      return !(typeof step === 'number' && step >= from);
    } catch {
      return false;
    }
  });
  if (kept.length === lines.length && (text === '' || text.endsWith('\n'))) return;
  await writeFileAtomic(path, kept.map((line) => `${line}\n`).join('')).catch((error: unknown) => {
    throw asStorageError(error, path);
  });
}

/** Saves each policy under `policies/<name>/`: a model directory, or a PEFT adapter over `loraBase`. */
export async function savePolicies(
  runDir: string,
  built: readonly { readonly entry: { readonly name: string }; readonly train: PolicyModel; readonly adapter: LoraAdapter | undefined }[],
  files: Pick<SaveModelDirOptions, 'tokenizerFiles' | 'special'>,
  loraBase: string | undefined,
): Promise<Map<string, string>> {
  const saved = new Map<string, string>();
  for (const b of built) {
    const dir = join(runDir, 'policies', b.entry.name);
    try {
      await mkdir(dir, { recursive: true });
      if (b.adapter) await savePeftAdapter(dir, b.adapter, loraBase ?? null);
      else await saveModelDir(dir, b.train, files);
    } catch (error) {
      throw asStorageError(error, dir);
    }
    saved.set(b.entry.name, dir);
  }
  return saved;
}
