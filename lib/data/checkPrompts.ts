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
  /**
   * Check each task's reference output too (`trainer.algorithm: sft` on the dataset's outputs, which trains on
   * `task.response`, else `task.answer`, after the prompt and followed by a stop token): the whole sequence must fit
   * `maxSeqLen`, and the output must exist. Default false.
   */
  readonly references?: boolean;
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
 * least one token; with `references`, that `prompt + reference output + stop ≤ maxSeqLen`. A text that the
 * tokenizer's lower bound ({@link Tokenizer.minTokens}) already shows too long is refused before it is encoded, so a
 * prompt of megabytes costs no tokenizing. A task file (JSONL, Parquet) is streamed, so a bad task is named by file and line or row; an array names it by
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
 *   is longer than `maxSeqLen − maxTokens` (`context.tokens` or, refused before encoding, `context.atLeast`;
 *   `context.limit`); with `references`, for a task without a reference output or whose sequence is longer than
 *   `maxSeqLen`; also for a malformed or unreadable file, or a row past the reader's bounds.
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
    refuseUnencoded(task.prompt, tokenizer, limit, () => ({
      where: `${where}: task ${task.id}: prompt`,
      what: `longer than model.maxSeqLen − rollout.maxTokens = ${maxSeqLen} − ${maxTokens} = ${limit}`,
      context: { ...place, taskId: task.id },
    }));
    const length = promptLength(task, where, place, encode, { maxSeqLen, maxTokens, limit });
    if (options.references === true) checkReference(task, length, tokenizer, maxSeqLen, { where, place });
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

/** Where a refused text is, what its limit is, and the context of the error. */
interface Refusal {
  readonly where: string;
  readonly what: string;
  readonly context: Readonly<Record<string, unknown>>;
}

/**
 * A {@link DecodeError} when the tokenizer's lower bound on the tokens of `text` already passes `limit`: nothing is
 * encoded. `refusal` is built only then.
 */
function refuseUnencoded(text: string, tokenizer: Tokenizer, limit: number, refusal: () => Refusal): void {
  const atLeast = tokenizer.minTokens?.(text) ?? 0;
  if (atLeast <= limit) return;
  const { where, what, context } = refusal();
  throw new DecodeError(`${where} is at least ${atLeast} tokens (${text.length} characters), ${what}`, {
    context: { ...context, atLeast, limit },
  });
}

/**
 * Refuses a task whose reference output (`response`, else `answer`) is missing or makes a sequence longer than the
 * context: `promptTokens + output + 1 stop token ≤ maxSeqLen`, as the reference worker builds it. The output is
 * bounded by {@link Tokenizer.minTokens} before it is encoded.
 */
function checkReference(
  task: Task,
  promptTokens: number,
  tokenizer: Tokenizer,
  maxSeqLen: number,
  at: { readonly where: string; readonly place: Readonly<Record<string, unknown>> },
): void {
  const context = { ...at.place, taskId: task.id };
  const reference = task.response ?? task.answer;
  if (reference === undefined) {
    throw new DecodeError(`${at.where}: task ${task.id} has no reference output to train on (a 'response', or an 'answer')`, { context });
  }
  const room = maxSeqLen - promptTokens - 1;
  const what = `longer than the ${room} tokens that model.maxSeqLen = ${maxSeqLen} leaves after its ${promptTokens}-token prompt and a stop token`;
  const refusal = (): Refusal => ({ where: `${at.where}: task ${task.id}: reference output`, what, context: { ...context, maxSeqLen } });
  refuseUnencoded(reference, tokenizer, room, refusal);
  let tokens: number;
  try {
    tokens = tokenizer.encode(reference, { addBos: false }).length;
  } catch (cause) {
    if (!(cause instanceof DecodeError)) throw cause;
    throw new DecodeError(`${at.where}: task ${task.id}: reference output cannot be tokenized: ${cause.message}`, {
      cause,
      context: { ...context, ...cause.context },
    });
  }
  if (tokens > room) {
    throw new DecodeError(`${at.where}: task ${task.id}: reference output is ${tokens} tokens, ${what}`, {
      context: { ...context, tokens, limit: room, maxSeqLen },
    });
  }
}

function at(located: LocatedTask): string {
  return `${located.file}:${located.line}`;
}

/** `U+00E9` for `é`. */
function codePoint(char: string): string {
  return `U+${(char.codePointAt(0) ?? 0).toString(16).toUpperCase().padStart(4, '0')}`;
}
