/**
 * A dataset row as a {@link Task}, whichever layout it comes in: rxrl's own (`id`, `prompt`, `answer`, `metadata`),
 * TRL's (`prompt` a string or a list of chat messages, the other columns handed to the reward function by name), or
 * verl's (`prompt` as chat messages, `reward_model.ground_truth`, `data_source`, `extra_info`).
 *
 * @packageDocumentation
 */
import { DecodeError } from '../core/errors.js';
import type { Task } from '../core/types.js';
import { CHAT_ROLES, type ChatRole } from '../chat/types.js';

/** Where a row was read: its file and 1-based line (JSONL) or row (parquet). */
export interface RowPlace {
  readonly file: string;
  readonly line: number;
}

/** The columns a row's task is made of; every other column goes to `metadata` under its own name. */
const TASK_COLUMNS = new Set(['id', 'prompt', 'answer', 'response', 'messages', 'metadata', 'epoch']);

/** Parses and validates one JSONL line as a {@link Task}; throws {@link DecodeError} naming file and line. */
export function parseTaskLine(line: string, where: RowPlace): Task {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (cause) {
    throw new DecodeError(`${where.file}:${where.line}: not valid JSON`, { cause, context: { ...where } });
  }
  return validateTask(value, where);
}

/**
 * Checks that a row has the shape of a {@link Task} and makes it one; throws {@link DecodeError} otherwise.
 *
 * - `prompt`: a string, or a list of chat messages ending in a user turn (kept as `metadata.messages`, rendered with
 *   the model's chat template; the prompt text is the last user turn).
 * - `id`: a string or a number; absent, the row's place (`<file>#<line>`), so a dataset without ids keeps stable ones.
 * - The answer the evaluator checks: `answer`, else `ground_truth`, else verl's `reward_model.ground_truth` (a number
 *   is written as text).
 * - A reference output for supervised fine-tuning: `response`, or a chat conversation `messages` ending in the
 *   assistant's turn, which becomes the response (the turns before it are `metadata.messages`; `prompt`, when absent,
 *   is the last user turn).
 * - Every other column (`data_source`, `extra_info`, `reward_model`, a TRL dataset's own) reaches the evaluator as
 *   `task.metadata.<column>`, beside the row's own `metadata` object.
 *
 * @param value - the row.
 * @param where - its file and line, for messages and for a default id.
 */
export function validateTask(value: unknown, where: Partial<RowPlace> & { readonly path?: string } = {}): Task {
  const at = where.file === undefined ? (where.path === undefined ? '' : `${where.path}: `) : `${where.file}:${String(where.line)}: `;
  const fail = (message: string): never => {
    throw new DecodeError(`${at}${message}`, { context: { ...where } });
  };
  if (typeof value !== 'object' || value === null || Array.isArray(value)) fail('a task must be a JSON object');
  const record = value as Record<string, unknown>;
  const id = record.id ?? (where.file === undefined || where.line === undefined ? undefined : `${baseName(where.file)}#${where.line}`);
  if (!(typeof id === 'string' && id.length > 0) && typeof id !== 'number') fail("task field 'id' must be a non-empty string or a number");
  if (record.response !== undefined && typeof record.response !== 'string') fail("task field 'response' must be a string when present");
  const answer = answerOf(record, fail);
  const metadata = record.metadata;
  if (metadata !== undefined && (typeof metadata !== 'object' || metadata === null || Array.isArray(metadata))) {
    fail("task field 'metadata' must be an object when present");
  }
  const chat = record.messages === undefined ? undefined : conversation(record.messages, fail);
  if (chat && record.response !== undefined) fail("a task gives its reference output as 'response' or as 'messages', not both");
  const asked = Array.isArray(record.prompt) ? promptMessages(record.prompt, fail) : undefined;
  if (asked && chat) fail("a task gives its conversation as chat messages in 'prompt' or in 'messages', not both");
  const prompt = asked?.lastUser ?? record.prompt ?? chat?.lastUser;
  if (typeof prompt !== 'string') fail("task field 'prompt' must be a string or a list of chat messages");
  const response = (record.response as string | undefined) ?? chat?.response;
  const columns = Object.fromEntries(Object.entries(record).filter(([key]) => !TASK_COLUMNS.has(key)));
  const messages = asked?.messages ?? chat?.context;
  const meta = { ...columns, ...(metadata as Record<string, unknown> | undefined), ...(messages ? { messages } : {}) };
  return {
    id: String(id),
    prompt: prompt as string,
    ...(answer === undefined ? {} : { answer }),
    ...(response === undefined ? {} : { response }),
    ...(Object.keys(meta).length === 0 ? {} : { metadata: meta }),
  };
}

/** `answer`, else `ground_truth`, else `reward_model.ground_truth`, as text. */
function answerOf(record: Record<string, unknown>, fail: (message: string) => never): string | undefined {
  const model = record.reward_model;
  const nested = typeof model === 'object' && model !== null ? (model as Record<string, unknown>).ground_truth : undefined;
  const [key, value] = (
    [
      ['answer', record.answer],
      ['ground_truth', record.ground_truth],
      ['reward_model.ground_truth', nested],
    ] as const
  ).find(([, v]) => v !== undefined && v !== null) ?? ['answer', undefined];
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'string') return value;
  if (typeof value === 'number' || typeof value === 'bigint') return String(value);
  return fail(`task field '${key}' must be a string or a number when present`);
}

/** Chat messages: each `{ role, content }` with a known role and string content. */
function chatMessages(value: unknown, field: string, fail: (message: string) => never): { role: string; content: string }[] {
  if (!Array.isArray(value) || value.length === 0) return fail(`task field '${field}' must be a non-empty array when present`);
  return value.map((m: unknown, i) => {
    const message = m as Record<string, unknown> | null;
    if (
      typeof message !== 'object' ||
      message === null ||
      !CHAT_ROLES.includes(message.role as ChatRole) ||
      typeof message.content !== 'string'
    ) {
      return fail(`${field}[${i}] must be an object with a role (${CHAT_ROLES.join(', ')}) and a string content`);
    }
    return { role: message.role as string, content: message.content };
  });
}

/** A prompt given as chat messages (TRL's conversational format, verl's layout): it ends with the user's turn. */
function promptMessages(
  value: unknown,
  fail: (message: string) => never,
): { messages: { role: string; content: string }[]; lastUser: string } {
  const messages = chatMessages(value, 'prompt', fail);
  const last = messages[messages.length - 1];
  if (last.role !== 'user') fail(`the last of the prompt's messages must be the user's turn, got '${last.role}'`);
  return { messages, lastUser: last.content };
}

/** A row's `messages`: the turns before the last, the last (the assistant's) as the response, the last user turn. */
function conversation(
  value: unknown,
  fail: (message: string) => never,
): { context: { role: string; content: string }[]; response: string; lastUser: string | undefined } {
  const messages = chatMessages(value, 'messages', fail);
  const last = messages[messages.length - 1];
  if (last.role !== 'assistant') fail(`the last of 'messages' must be the assistant's turn (the reference output), got '${last.role}'`);
  const context = messages.slice(0, -1);
  return { context, response: last.content, lastUser: context.filter((m) => m.role === 'user').pop()?.content };
}

function baseName(file: string): string {
  return file.slice(Math.max(file.lastIndexOf('/'), file.lastIndexOf('\\')) + 1);
}
