/**
 * The task loader: a pull-based IxJS `AsyncIterable<Task>`. Nothing is read before it is asked for, so the
 * admission gate decides when data enters the pipeline, and the position is checkpointable.
 *
 * @packageDocumentation
 */
import { AsyncIterableX } from 'ix/asynciterable';
import { ConfigError } from '../core/errors.js';
import { createRng, shuffledIndices } from '../core/random.js';
import type { Task } from '../core/types.js';
import { readLocatedTasks, readTaskFile } from './taskFiles.js';

export { parseTaskLine, validateTask } from './rows.js';
export type { RowPlace } from './rows.js';
export { readLocatedTasks, readTaskFile } from './taskFiles.js';
export type { LocatedTask } from './taskFiles.js';

/**
 * Where tasks come from: an array, any (async) iterable such as a generator, or a task file — `{ file }`, a JSONL or
 * Parquet file or a directory of Parquet shards (`{ jsonl }` is the same).
 */
export type TaskSource = readonly Task[] | Iterable<Task> | AsyncIterable<Task> | { readonly file: string } | { readonly jsonl: string };

/** The path of a task-file source; `undefined` for any other source. */
export function taskFileOf(source: TaskSource): string | undefined {
  if (typeof source !== 'object' || source === null) return undefined;
  if ('file' in source && typeof source.file === 'string') return source.file;
  if ('jsonl' in source && typeof source.jsonl === 'string') return source.jsonl;
  return undefined;
}

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
    const oneShot = !Array.isArray(source) && taskFileOf(source) === undefined;
    if (oneShot && (this.epochs !== 1 || this.shuffle)) {
      throw new ConfigError('epochs > 1 and shuffle need an array or a task file as the task source', {
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
    const file = taskFileOf(source);
    if (!this.shuffle) {
      if (file !== undefined) {
        for await (const { task } of readLocatedTasks(file, signal)) yield task;
      } else {
        yield* source as Iterable<Task> | AsyncIterable<Task>;
      }
      return;
    }
    const all = file !== undefined ? await readTaskFile(file) : (source as readonly Task[]);
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
 * @param source - an array, a (async) iterable or a task file (`{ file: path }`).
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
