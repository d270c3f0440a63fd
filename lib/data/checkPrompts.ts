/**
 * Load-time check of the prompts of a data set: every prompt must encode with the policy's tokenizer and leave
 * room for the response inside the model's context. A bad task is refused before training starts, naming its
 * file and line, instead of failing every sample of its group at rollout time.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../model/types.js';
import { ConfigError, DecodeError } from '../core/errors.js';
import type { Task } from '../core/types.js';
import { readLocatedTasks, taskFileOf, type LocatedTask, type TaskSource } from './loader.js';

/** Options of {@link checkPrompts}. */
export interface CheckPromptsOptions {
  /** The policy's tokenizer (the one the rollout engine encodes with). */
  readonly tokenizer: Tokenizer;
  /** The model's context length (`model.maxSeqLen`, or `max_position_embeddings` of a model directory). */
  readonly maxSeqLen: number;
  /** Response budget of a rollout (`rollout.maxTokens`): a prompt may use `maxSeqLen − maxTokens` tokens. */
  readonly maxTokens: number;
  /**
   * How the rollout turns a task into prompt token ids. Default: the default worker's
   * `tokenizer.encode(task.prompt, { addBos: true })`. Pass a chat template's rendering when the rollout uses one.
   */
  readonly encode?: (task: Task) => readonly number[];
  /** Name of an array source in messages (`<source>[<index>]`). Default `tasks`. */
  readonly source?: string;
  /** Stops the check (throws the signal's reason). */
  readonly signal?: AbortSignal;
}

/** What {@link checkPrompts} found when every prompt passed. */
export interface PromptsChecked {
  /** Number of tasks checked. */
  readonly tasks: number;
  /** Longest prompt, in tokens (0 when there are no tasks). */
  readonly longestPrompt: number;
}

/**
 * Checks that every prompt of a data set encodes and fits: `prompt tokens ≤ maxSeqLen − maxTokens`, and at
 * least one token. A task file (JSONL, Parquet) is streamed, so a bad task is named by file and line or row; an array names it by
 * `source` and index.
 *
 * @example
 * ```ts
 * import { checkPrompts, CharTokenizer } from 'rxrl';
 * const { tasks, longestPrompt } = await checkPrompts({ jsonl: 'data/train.jsonl' }, {
 *   tokenizer: new CharTokenizer('abc'),
 *   maxSeqLen: 64,
 *   maxTokens: 16,
 * });
 * ```
 * @param source - a task file (`{ file: path }`: JSONL, Parquet, a directory of Parquet shards) or an array of tasks.
 * @param options - tokenizer, context length, response budget and how prompts are encoded.
 * @returns the number of tasks and the longest prompt in tokens.
 * @throws {@link DecodeError} naming the place, the task id and the reason, for the first prompt that cannot be
 *   encoded (`context.char` holds a character outside a character tokenizer's alphabet), encodes to no tokens, or
 *   is longer than `maxSeqLen − maxTokens` (`context.tokens`, `context.limit`); also for a malformed or unreadable
 *   file.
 * @throws {@link ConfigError} when `maxSeqLen − maxTokens` leaves no room for a prompt.
 */
export async function checkPrompts(
  source: readonly Task[] | { readonly file: string } | { readonly jsonl: string },
  options: CheckPromptsOptions,
): Promise<PromptsChecked> {
  const { tokenizer, maxSeqLen, maxTokens, signal } = options;
  const encode = options.encode ?? ((task: Task) => tokenizer.encode(task.prompt, { addBos: true }));
  const limit = maxSeqLen - maxTokens;
  if (!(limit >= 1)) {
    throw new ConfigError(`model.maxSeqLen (${maxSeqLen}) − rollout.maxTokens (${maxTokens}) leaves no room for a prompt`, {
      context: { key: 'rollout.maxTokens', maxSeqLen, maxTokens },
    });
  }
  let tasks = 0;
  let longestPrompt = 0;
  const visit = (task: Task, where: string, place: Readonly<Record<string, unknown>>): void => {
    const length = promptLength(task, where, place, encode, { maxSeqLen, maxTokens, limit });
    tasks++;
    longestPrompt = Math.max(longestPrompt, length);
  };
  const file = Array.isArray(source) ? undefined : taskFileOf(source as TaskSource);
  if (file !== undefined) {
    for await (const located of readLocatedTasks(file, signal))
      visit(located.task, at(located), { file: located.file, line: located.line });
  } else {
    const name = options.source ?? 'tasks';
    (source as readonly Task[]).forEach((task, index) => {
      signal?.throwIfAborted();
      visit(task, `${name}[${index}]`, { source: name, index });
    });
  }
  return { tasks, longestPrompt };
}

/** Token count of one task's prompt, or a {@link DecodeError} saying where and why it is refused. */
function promptLength(
  task: Task,
  where: string,
  place: Readonly<Record<string, unknown>>,
  encode: (task: Task) => readonly number[],
  budget: { readonly maxSeqLen: number; readonly maxTokens: number; readonly limit: number },
): number {
  const context = { ...place, taskId: task.id };
  let ids: readonly number[];
  try {
    ids = encode(task);
  } catch (cause) {
    if (!(cause instanceof DecodeError)) throw cause;
    const { char, index } = cause.context;
    const reason =
      typeof char === 'string'
        ? `character ${JSON.stringify(char)} (${codePoint(char)})${typeof index === 'number' ? ` at index ${index}` : ''} is not in the tokenizer's vocabulary`
        : cause.message;
    throw new DecodeError(`${where}: task ${task.id}: prompt cannot be tokenized: ${reason}`, {
      cause,
      context: { ...context, ...cause.context },
    });
  }
  if (ids.length === 0) {
    throw new DecodeError(`${where}: task ${task.id}: prompt encodes to no tokens`, { context: { ...context, tokens: 0 } });
  }
  if (ids.length > budget.limit) {
    throw new DecodeError(
      `${where}: task ${task.id}: prompt is ${ids.length} tokens, longer than model.maxSeqLen − rollout.maxTokens = ` +
        `${budget.maxSeqLen} − ${budget.maxTokens} = ${budget.limit}`,
      { context: { ...context, tokens: ids.length, limit: budget.limit } },
    );
  }
  return ids.length;
}

function at(located: LocatedTask): string {
  return `${located.file}:${located.line}`;
}

/** `U+00E9` for `é`. */
function codePoint(char: string): string {
  return `U+${(char.codePointAt(0) ?? 0).toString(16).toUpperCase().padStart(4, '0')}`;
}
