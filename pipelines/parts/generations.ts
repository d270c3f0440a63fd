/**
 * The held-out samples of each validation, kept as text (`validation.generations`): one JSONL file per validated
 * version, `<run-dir>/validation/<version>.jsonl`, as verl's `validation_data_dir` keeps them — to read which
 * questions a policy misses, not only how many.
 *
 * @packageDocumentation
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { asStorageError } from '../../lib/core/errors.js';
import { isSampleFailure, type FinishReason, type RolloutOutput } from '../../lib/core/types.js';
import type { Tokenizer } from '../../lib/model/types.js';

/** One line of a generations file. */
export interface GenerationLine {
  readonly taskId: string;
  readonly answer?: string;
  /** The response's text (special tokens dropped); absent for a failed sample. */
  readonly response?: string;
  readonly reward?: number;
  readonly finishReason?: FinishReason;
  /** The evaluator's metrics of the response. */
  readonly metrics?: Readonly<Record<string, number>>;
  /** Why the sample failed. */
  readonly error?: string;
}

/** The line of one validation sample. */
export function generationLine(output: RolloutOutput, tokenizer: Pick<Tokenizer, 'decode'>): GenerationLine {
  if (isSampleFailure(output)) return { taskId: output.taskId, error: output.error.message };
  return {
    taskId: output.taskId,
    ...(output.task.answer === undefined ? {} : { answer: output.task.answer }),
    response: tokenizer.decode(output.responseTokens),
    reward: output.reward,
    finishReason: output.finishReason,
    metrics: output.metrics,
  };
}

/**
 * Writes one validation's lines, sorted by task id, to `<runDir>/validation/<version>.jsonl` (replacing a file of the
 * same version: a resumed run validating that version again).
 *
 * @throws {@link StorageError} when the disk is full or read-only; other write errors as they are.
 */
export async function writeGenerations(runDir: string, version: number, lines: readonly GenerationLine[]): Promise<void> {
  const dir = join(runDir, 'validation');
  const path = join(dir, `${version}.jsonl`);
  const sorted = [...lines].sort((a, b) => (a.taskId < b.taskId ? -1 : a.taskId > b.taskId ? 1 : 0));
  try {
    await mkdir(dir, { recursive: true });
    await writeFile(path, sorted.map((line) => JSON.stringify(line)).join('\n') + '\n');
  } catch (error) {
    throw asStorageError(error, path);
  }
}
