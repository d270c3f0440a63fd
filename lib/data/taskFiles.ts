/**
 * Task files: JSONL (one row per line), Apache Parquet (one row per row, read a row group at a time with hyparquet),
 * or a directory of Parquet shards (`*.parquet`, in name order, as `datasets` and verl write them). Each row becomes
 * a task through {@link validateTask}; a bad row, a bad file or a missing `prompt` column is a `DecodeError` naming
 * the file and the line or row.
 *
 * @packageDocumentation
 */
import { createReadStream } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';

import { DecodeError } from '../core/errors.js';
import type { Task } from '../core/types.js';
import { parseTaskLine, validateTask } from './rows.js';

/** A task with the place in its file it was read from. */
export interface LocatedTask {
  /** The task. */
  readonly task: Task;
  /** The file, as it was given (a shard's path for a directory). */
  readonly file: string;
  /** 1-based line (JSONL) or row (Parquet) in the file. */
  readonly line: number;
}

/**
 * Streams a task file with the place of each task (blank JSONL lines skipped, still counted), for checks that must
 * name where a bad task is. Nothing is read before it is asked for; breaking out closes the file.
 *
 * @example
 * ```ts
 * import { readLocatedTasks } from 'rxrl';
 * for await (const { task, file, line } of readLocatedTasks('data/train.parquet')) console.log(`${file}:${line}`, task.id);
 * ```
 * @param path - a `.jsonl` file, a `.parquet` file, or a directory of `.parquet` shards.
 * @param signal - stops the reading (throws the signal's reason).
 * @returns the tasks in file order, each with its file and line or row.
 * @throws {@link DecodeError} naming file and line for a malformed row, a file that cannot be read, a missing column.
 */
export async function* readLocatedTasks(path: string, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
  const info = await stat(path).catch((error: unknown) => {
    throw new DecodeError(`cannot read ${path}: ${(error as Error).message}`, { cause: error, context: { file: path } });
  });
  if (info.isDirectory()) {
    const shards = (await readdir(path)).filter((name) => name.endsWith('.parquet')).sort();
    if (shards.length === 0)
      throw new DecodeError(`${path}: a directory of tasks must hold .parquet shards, it has none`, { context: { file: path } });
    for (const shard of shards) yield* readParquet(join(path, shard), signal);
  } else if (path.endsWith('.parquet')) yield* readParquet(path, signal);
  else yield* readJsonl(path, signal);
}

/** Reads a whole task file (see {@link readLocatedTasks}). */
export async function readTaskFile(path: string): Promise<Task[]> {
  const tasks: Task[] = [];
  for await (const { task } of readLocatedTasks(path)) tasks.push(task);
  return tasks;
}

async function* readJsonl(file: string, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
  const stream = createReadStream(file, { encoding: 'utf8' });
  const lines = createInterface({ input: stream, crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of lines) {
      line++;
      signal?.throwIfAborted();
      if (text.trim() === '') continue;
      yield { task: parseTaskLine(text, { file, line }), file, line };
    }
  } catch (error) {
    throw isFileSystemError(error) ? new DecodeError(`cannot read ${file}: ${error.message}`, { cause: error, context: { file } }) : error;
  } finally {
    lines.close();
    stream.destroy();
  }
}

/** The rows of a Parquet file, one row group in memory at a time. */
async function* readParquet(file: string, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
  const { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, parquetSchema } = await import('hyparquet');
  const { compressors } = await import('hyparquet-compressors');
  const fail = (why: string, cause?: unknown): DecodeError => new DecodeError(`${file}: ${why}`, { cause, context: { file } });
  let buffer: Awaited<ReturnType<typeof asyncBufferFromFile>>;
  let metadata: Awaited<ReturnType<typeof parquetMetadataAsync>>;
  try {
    buffer = await asyncBufferFromFile(file);
    metadata = await parquetMetadataAsync(buffer);
  } catch (cause) {
    throw fail(`not a readable Parquet file (${String(cause)})`, cause);
  }
  const columns = parquetSchema(metadata).children.map((child) => child.element.name);
  if (!columns.includes('prompt') && !columns.includes('messages')) {
    throw fail(`no 'prompt' column (nor 'messages'): it has ${columns.map((c) => `'${c}'`).join(', ')}`);
  }
  let rowStart = 0;
  for (const group of metadata.row_groups) {
    signal?.throwIfAborted();
    const rowEnd = rowStart + Number(group.num_rows);
    let rows: Record<string, unknown>[];
    try {
      rows = await parquetReadObjects({ file: buffer, metadata, rowStart, rowEnd, compressors });
    } catch (cause) {
      throw fail(`rows ${rowStart + 1}–${rowEnd} cannot be decoded (${String(cause)})`, cause);
    }
    for (const [i, row] of rows.entries()) {
      const line = rowStart + i + 1;
      yield { task: validateTask(plain(row), { file, line }), file, line };
    }
    rowStart = rowEnd;
  }
}

/** A Parquet value as JSON has it: 64-bit integers as numbers (as text beyond 2^53), nulls of absent fields dropped. */
function plain(value: unknown): unknown {
  if (typeof value === 'bigint') return Number.isSafeInteger(Number(value)) ? Number(value) : value.toString();
  if (Array.isArray(value)) return value.map(plain);
  if (value instanceof Date) return value.toISOString();
  if (value !== null && typeof value === 'object' && !ArrayBuffer.isView(value)) {
    return Object.fromEntries(Object.entries(value).flatMap(([key, v]) => (v === null || v === undefined ? [] : [[key, plain(v)]])));
  }
  return value;
}

/** An error of the file system (`ENOENT`, `EISDIR`, `EACCES`…): it has a string `code`. */
function isFileSystemError(error: unknown): error is Error & { readonly code: string } {
  return error instanceof Error && typeof (error as { code?: unknown }).code === 'string';
}
