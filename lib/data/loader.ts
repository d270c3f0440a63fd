/**
 * The task loader: a pull-based IxJS `AsyncIterable<Task>`. Nothing is read before it is asked for, so the
 * admission gate decides when data enters the pipeline, and the position is checkpointable.
 *
 * @packageDocumentation
 */
import { createReadStream } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { createInterface } from 'node:readline';
import { AsyncIterableX } from 'ix/asynciterable';
import { ConfigError, DecodeError } from '../core/errors.js';
import { createRng, shuffledIndices } from '../core/random.js';
import type { Task } from '../core/types.js';
import { CHAT_ROLES, type ChatRole } from '../chat/types.js';

/** Where tasks come from: an array, any (async) iterable such as a generator, or a JSONL file. */
export type TaskSource = readonly Task[] | Iterable<Task> | AsyncIterable<Task> | { readonly jsonl: string };

/** Position of a loader in its stream: the next task it yields is `index` of epoch `epoch`. */
export interface LoaderPosition {
  readonly epoch: number;
  readonly index: number;
}

/** Options of {@link loadTasks}. */
export interface LoadTasksOptions {
  /** Passes over the data; `Infinity` repeats forever. Default 1. Sources that are one-shot iterables allow 1. */
  readonly epochs?: number;
  /** Shuffle each epoch (needs the whole epoch in memory; arrays and files only). Default false. */
  readonly shuffle?: boolean;
  /** Seed of the shuffle; epoch `e` uses a stream derived from `(seed, e)`. Default 0. */
  readonly seed?: number;
  /** Resume from this position (tasks before it are skipped without being yielded). */
  readonly start?: LoaderPosition;
}

/**
 * A loader of tasks that knows its position. Each task it yields carries its `epoch`. An epoch in which the
 * source holds no task ends the loader, whatever `epochs` says.
 */
export class TaskLoader extends AsyncIterableX<Task> {
  private pos: LoaderPosition;
  private readonly epochs: number;
  private readonly shuffle: boolean;
  private readonly seed: number;

  constructor(
    private readonly source: TaskSource,
    options: LoadTasksOptions = {},
  ) {
    super();
    this.epochs = options.epochs ?? 1;
    this.shuffle = options.shuffle ?? false;
    this.seed = options.seed ?? 0;
    this.pos = options.start ?? { epoch: 0, index: 0 };
    if (!(this.epochs >= 1)) {
      throw new ConfigError(`loader epochs must be >= 1, got ${this.epochs}`, { context: { key: 'epochs' } });
    }
    const oneShot = !Array.isArray(source) && !isJsonl(source);
    if (oneShot && (this.epochs !== 1 || this.shuffle)) {
      throw new ConfigError('epochs > 1 and shuffle need an array or a JSONL file as the task source', {
        context: { key: this.shuffle ? 'shuffle' : 'epochs' },
      });
    }
  }

  /** The position of the next task to be yielded (for checkpoints). */
  get position(): LoaderPosition {
    return this.pos;
  }

  async *[Symbol.asyncIterator](signal?: AbortSignal): AsyncIterator<Task> {
    for (let epoch = this.pos.epoch; epoch < this.epochs; epoch++) {
      const skip = epoch === this.pos.epoch ? this.pos.index : 0;
      let index = 0;
      for await (const task of this.epochTasks(epoch, signal)) {
        if (index >= skip) {
          this.pos = { epoch, index: index + 1 };
          yield { ...task, epoch };
        }
        index++;
      }
      // An empty source stays empty: repeating it (epochs: Infinity) would spin forever without yielding.
      if (index === 0) return;
      this.pos = { epoch: epoch + 1, index: 0 };
    }
  }

  private async *epochTasks(epoch: number, signal?: AbortSignal): AsyncIterable<Task> {
    const source = this.source;
    if (!this.shuffle) {
      if (isJsonl(source)) {
        yield* readJsonl(source.jsonl, signal);
      } else {
        yield* source as Iterable<Task> | AsyncIterable<Task>;
      }
      return;
    }
    const all = isJsonl(source) ? await readTaskFile(source.jsonl) : (source as readonly Task[]);
    for (const i of shuffledIndices(all.length, createRng(this.seed, 'epoch', String(epoch)))) {
      signal?.throwIfAborted();
      yield all[i];
    }
  }
}

/**
 * Creates a pull-based task loader.
 *
 * @example
 * ```ts
 * import { loadTasks } from 'rxrl';
 * const loader = loadTasks({ jsonl: 'data/train.jsonl' }, { epochs: 2, shuffle: true, seed: 7 });
 * for await (const task of loader) console.log(task.id, task.epoch);
 * ```
 * @param source - an array, a (async) iterable or `{ jsonl: path }`.
 * @param options - epochs, seeded shuffle and resume position.
 * @returns a {@link TaskLoader}: an IxJS `AsyncIterableX<Task>` with a `position`.
 */
export function loadTasks(source: TaskSource, options?: LoadTasksOptions): TaskLoader {
  return new TaskLoader(source, options);
}

/**
 * A task source as the pipelines read it: an async iterable (a {@link TaskLoader}, or a generator whose tasks carry
 * their own epochs, such as a resumed run's pending tasks followed by its loader) is used as it is; anything else
 * is loaded with `options`.
 *
 * @param source - tasks, or a stream of them.
 * @param options - loader options for sources that are not streams yet.
 * @returns the stream of tasks.
 */
export function taskStream(source: TaskSource, options?: LoadTasksOptions): AsyncIterable<Task> {
  const stream = typeof (source as AsyncIterable<Task>)[Symbol.asyncIterator] === 'function' && !Array.isArray(source);
  return stream ? (source as AsyncIterable<Task>) : loadTasks(source, options);
}

function isJsonl(source: TaskSource): source is { readonly jsonl: string } {
  return typeof source === 'object' && source !== null && 'jsonl' in source;
}

/** Parses and validates one JSONL line as a {@link Task}; throws {@link DecodeError} naming file and line. */
export function parseTaskLine(line: string, where: { file: string; line: number }): Task {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (cause) {
    throw new DecodeError(`${where.file}:${where.line}: not valid JSON`, { cause, context: where });
  }
  return validateTask(value, where);
}

/**
 * Checks that a value has the shape of a {@link Task}; throws {@link DecodeError} otherwise. Besides `prompt`, a row
 * may carry its reference output for supervised fine-tuning: `response`, or a chat conversation `messages` (roles
 * and contents) ending in the assistant's turn, which becomes the response; the turns before it are kept as
 * `metadata.messages` (rendered with the model's chat template), and `prompt`, when absent, is the last user turn.
 */
export function validateTask(value: unknown, where: Record<string, unknown> = {}): Task {
  const at = 'file' in where ? `${String(where.file)}:${String(where.line)}: ` : '';
  const fail = (message: string): never => {
    throw new DecodeError(`${at}${message}`, { context: where });
  };
  if (typeof value !== 'object' || value === null || Array.isArray(value)) fail('a task must be a JSON object');
  const record = value as Record<string, unknown>;
  const id = record.id;
  if (!(typeof id === 'string' && id.length > 0) && typeof id !== 'number') fail("task field 'id' must be a non-empty string or a number");
  for (const key of ['answer', 'response'] as const) {
    if (record[key] !== undefined && typeof record[key] !== 'string') fail(`task field '${key}' must be a string when present`);
  }
  const metadata = record.metadata;
  if (metadata !== undefined && (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata))) {
    fail("task field 'metadata' must be an object when present");
  }
  const chat = record.messages === undefined ? undefined : conversation(record.messages, fail);
  if (chat && record.response !== undefined) fail("a task gives its reference output as 'response' or as 'messages', not both");
  const prompt = record.prompt ?? chat?.lastUser;
  if (typeof prompt !== 'string') fail("task field 'prompt' must be a string");
  const response = (record.response as string | undefined) ?? chat?.response;
  const meta = chat ? { ...(metadata as Record<string, unknown> | undefined), messages: chat.context } : metadata;
  return {
    id: String(id),
    prompt: prompt as string,
    ...(record.answer === undefined ? {} : { answer: record.answer as string }),
    ...(response === undefined ? {} : { response }),
    ...(meta === undefined ? {} : { metadata: meta as Record<string, unknown> }),
  };
}

/** A row's `messages`: the turns before the last, the last (the assistant's) as the response, the last user turn. */
function conversation(
  value: unknown,
  fail: (message: string) => never,
): { context: { role: string; content: string }[]; response: string; lastUser: string | undefined } {
  if (!Array.isArray(value) || value.length === 0) return fail("task field 'messages' must be a non-empty array when present");
  const messages = value.map((m: unknown, i) => {
    const message = m as Record<string, unknown> | null;
    if (
      typeof message !== 'object' ||
      message === null ||
      !CHAT_ROLES.includes(message.role as ChatRole) ||
      typeof message.content !== 'string'
    ) {
      return fail(`messages[${i}] must be an object with a role (${CHAT_ROLES.join(', ')}) and a string content`);
    }
    return { role: message.role as string, content: message.content };
  });
  const last = messages[messages.length - 1];
  if (last.role !== 'assistant') fail(`the last of 'messages' must be the assistant's turn (the reference output), got '${last.role}'`);
  const context = messages.slice(0, -1);
  return { context, response: last.content, lastUser: context.filter((m) => m.role === 'user').pop()?.content };
}

async function* readJsonl(file: string, signal?: AbortSignal): AsyncIterable<Task> {
  for await (const { task } of readLocatedTasks(file, signal)) yield task;
}

/** A task with the place in its JSONL file it was read from. */
export interface LocatedTask {
  /** The task. */
  readonly task: Task;
  /** The file, as it was given. */
  readonly file: string;
  /** 1-based line number in the file. */
  readonly line: number;
}

/**
 * Streams a JSONL task file with the line of each task (blank lines skipped, still counted), for checks that
 * must name where a bad task is. Nothing is read before it is asked for; breaking out closes the file.
 *
 * @example
 * ```ts
 * import { readLocatedTasks } from 'rxrl';
 * for await (const { task, file, line } of readLocatedTasks('data/train.jsonl')) console.log(`${file}:${line}`, task.id);
 * ```
 * @param file - path of the JSONL file.
 * @param signal - stops the reading (throws the signal's reason).
 * @returns the tasks in file order, each with its file and line.
 * @throws {@link DecodeError} naming file and line for a malformed line.
 */
export async function* readLocatedTasks(file: string, signal?: AbortSignal): AsyncGenerator<LocatedTask> {
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

/** Reads a whole JSONL task file (blank lines skipped); a malformed line is a {@link DecodeError} naming file and line. */
export async function readTaskFile(file: string): Promise<Task[]> {
  const text = await readFile(file, 'utf8');
  const tasks: Task[] = [];
  text.split('\n').forEach((row, i) => {
    if (row.trim() !== '') tasks.push(parseTaskLine(row, { file, line: i + 1 }));
  });
  return tasks;
}

/** An error of the file system (`ENOENT`, `EISDIR`, `EACCES`…): it has a string `code`. */
function isFileSystemError(error: unknown): error is Error & { readonly code: string } {
  return error instanceof Error && typeof (error as { code?: unknown }).code === 'string';
}
