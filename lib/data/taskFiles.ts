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
import { boundedCompressors, checkRowSize, DEFAULT_READ_BOUNDS, rowBytes, type ReadBounds } from './readBounds.js';
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
 * @param bounds - what a row, a Parquet page and a row group may cost (default {@link DEFAULT_READ_BOUNDS}).
 * @returns the tasks in file order, each with its file and line or row.
 * @throws {@link DecodeError} naming file and line for a malformed row, a file that cannot be read, a missing column,
 *   a row or a Parquet page past its bound (before it is decompressed or parsed); naming the path for something that
 *   is neither a regular file nor a directory (a FIFO or a device, which could block the read forever).
 */
export async function* readLocatedTasks(
  path: string,
  signal?: AbortSignal,
  bounds: ReadBounds = DEFAULT_READ_BOUNDS,
): AsyncGenerator<LocatedTask> {
  if ((await taskPathKind(path)) === 'directory') {
    const shards = (await readdir(path)).filter((name) => name.endsWith('.parquet')).sort();
    if (shards.length === 0)
      throw new DecodeError(`${path}: a directory of tasks must hold .parquet shards, it has none`, { context: { file: path } });
    for (const shard of shards) {
      const file = join(path, shard);
      await taskPathKind(file, 'file');
      yield* readParquet(file, bounds, signal);
    }
  } else if (path.endsWith('.parquet')) yield* readParquet(path, bounds, signal);
  else yield* readJsonl(path, bounds, signal);
}

/**
 * Whether `path` is a regular file or a directory of task files (`only: 'file'`: a regular file), without opening it.
 *
 * @param path - the task file or directory.
 * @param only - `'file'` refuses a directory too.
 * @returns `'file'` or `'directory'`.
 * @throws {@link DecodeError} naming the path when it cannot be read, or is a FIFO, a socket or a device: opening
 *   one blocks until a writer comes, reading it may never end.
 */
export async function taskPathKind(path: string, only?: 'file'): Promise<'file' | 'directory'> {
  const info = await stat(path).catch((error: unknown) => {
    throw new DecodeError(`cannot read ${path}: ${(error as Error).message}`, { cause: error, context: { file: path } });
  });
  if (info.isFile()) return 'file';
  if (info.isDirectory() && only === undefined) return 'directory';
  const kind = info.isFIFO() ? 'a FIFO' : info.isSocket() ? 'a socket' : info.isDirectory() ? 'a directory' : 'a device';
  throw new DecodeError(`${path}: is ${kind}, not a regular file of tasks`, { context: { file: path, kind } });
}

/** Reads a whole task file (see {@link readLocatedTasks}). */
export async function readTaskFile(path: string): Promise<Task[]> {
  const tasks: Task[] = [];
  for await (const { task } of readLocatedTasks(path)) tasks.push(task);
  return tasks;
}

async function* readJsonl(file: string, bounds: ReadBounds, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
  const stream = createReadStream(file, { encoding: 'utf8' });
  const lines = createInterface({ input: stream, crlfDelay: Infinity });
  let line = 0;
  try {
    for await (const text of lines) {
      line++;
      signal?.throwIfAborted();
      if (text.trim() === '') continue;
      checkRowSize(Buffer.byteLength(text), { file, line }, bounds);
      yield { task: parseTaskLine(text, { file, line }), file, line };
    }
  } catch (error) {
    throw isFileSystemError(error) ? new DecodeError(`cannot read ${file}: ${error.message}`, { cause: error, context: { file } }) : error;
  } finally {
    lines.close();
    stream.destroy();
  }
}

/** The rows of a Parquet file, one row group in memory at a time, every page's claimed size bounded before it is read. */
async function* readParquet(file: string, bounds: ReadBounds, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
  const { asyncBufferFromFile, parquetMetadataAsync, parquetReadObjects, parquetSchema } = await import('hyparquet');
  const { compressors, startRowGroup } = boundedCompressors(await import('hyparquet-compressors'), bounds);
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
    startRowGroup({ file, first: rowStart + 1, last: rowEnd });
    try {
      rows = await parquetReadObjects({ file: buffer, metadata, rowStart, rowEnd, compressors });
    } catch (cause) {
      if (cause instanceof DecodeError) throw cause;
      throw fail(`rows ${rowStart + 1}–${rowEnd} cannot be decoded (${String(cause)})`, cause);
    }
    for (const [i, row] of rows.entries()) {
      const line = rowStart + i + 1;
      const value = plain(row);
      checkRowSize(rowBytes(value), { file, line }, bounds);
      yield { task: validateTask(value, { file, line }), file, line };
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
