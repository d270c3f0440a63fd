/**
 * Request validation and error bodies of `rxrl serve`, in the OpenAI API's shapes.
 *
 * Every invalid request becomes a {@link RequestError}, answered as
 * `{ "error": { "message", "type", "param", "code" } }` with a 4xx status.
 *
 * @packageDocumentation
 */
import { RxrlError, type RxrlErrorOptions } from '../core/errors.js';
import { ITEMS_PER_TURN, yieldToEventLoop } from '../core/turns.js';

/** The `error` object of an OpenAI-style error response. */
export interface OpenAIErrorBody {
  readonly error: {
    readonly message: string;
    readonly type: string;
    readonly param: string | null;
    readonly code: string | null;
  };
}

/** A request `rxrl serve` refuses: carries the HTTP status and the OpenAI error fields. Never retriable. */
export class RequestError extends RxrlError {
  override readonly name = 'RequestError';

  /**
   * @param status - HTTP status (4xx).
   * @param message - Human-readable reason.
   * @param details - `param` (the offending field), `code`, `type` (default `invalid_request_error`).
   */
  constructor(
    readonly status: number,
    message: string,
    readonly details: { readonly param?: string; readonly code?: string; readonly type?: string } = {},
    options: RxrlErrorOptions = {},
  ) {
    super(message, { ...options, retriable: false, context: { ...options.context, status, param: details.param } });
  }

  /** The response body. */
  toBody(): OpenAIErrorBody {
    return errorBody(this.message, this.details.type ?? 'invalid_request_error', this.details.param ?? null, this.details.code ?? null);
  }
}

/** An OpenAI-style error body. */
export function errorBody(message: string, type: string, param: string | null = null, code: string | null = null): OpenAIErrorBody {
  return { error: { message, type, param, code } };
}

/** Most characters of a client-supplied value that an error message quotes. */
export const MAX_QUOTED_CHARS = 64;

/** Most characters of an error message (messages of lower layers are cut to it). */
export const MAX_ERROR_MESSAGE_CHARS = 512;

/**
 * `text`, cut to `max` characters (never inside a surrogate pair), with its length said when cut: error messages
 * name what a client sent without echoing a whole body back.
 *
 * @example
 * ```ts
 * excerpt('a'.repeat(100), 4); // 'aaaa… (100 chars)'
 * ```
 */
export function excerpt(text: string, max: number = MAX_QUOTED_CHARS): string {
  return text.length <= max ? text : `${cut(text, max)} (${text.length} chars)`;
}

/**
 * A client-supplied JSON value as short JSON-like text for an error message: long strings are cut, containers are
 * shown two levels deep and only their first items, the whole is at most about `max` characters. It never throws
 * (`JSON.stringify` overflows the stack on deeply nested input).
 *
 * @example
 * ```ts
 * quote([[[[1]]]]); // '[[[…]]]'
 * quote({ a: 'x'.repeat(1000) }, 10); // '{"a":"xxxx…'
 * ```
 */
export function quote(value: unknown, max: number = MAX_QUOTED_CHARS): string {
  const text = sketch(value, 2, max);
  return text.length <= max ? text : cut(text, max);
}

/** The first `max` characters of `text` and `…` (a surrogate pair is kept whole or dropped). */
function cut(text: string, max: number): string {
  const code = text.charCodeAt(max - 1);
  return `${text.slice(0, code >= 0xd800 && code <= 0xdbff ? max - 1 : max)}…`;
}

/** JSON-like text of `value` down to `depth` container levels, stopping once about `budget` characters are out. */
function sketch(value: unknown, depth: number, budget: number): string {
  if (typeof value === 'string') return JSON.stringify(value.length > budget ? `${value.slice(0, budget)}…` : value);
  if (typeof value !== 'object' || value === null) return String(JSON.stringify(value));
  const isArray = Array.isArray(value);
  const [open, close] = isArray ? ['[', ']'] : ['{', '}'];
  const entries: Iterable<unknown> = isArray ? value : Object.entries(value);
  const parts: string[] = [];
  let used = 0;
  for (const entry of entries) {
    if (depth === 0 || used > budget) {
      parts.push('…');
      break;
    }
    const text = isArray
      ? sketch(entry, depth - 1, budget)
      : `${JSON.stringify(excerpt((entry as [string, unknown])[0]))}:${sketch((entry as [string, unknown])[1], depth - 1, budget)}`;
    parts.push(text);
    used += text.length + 1;
  }
  return `${open}${parts.join(',')}${close}`;
}

/** A JSON object request body. */
export type JsonObject = Readonly<Record<string, unknown>>;

/** 400 naming `param`. */
export function invalid(param: string, message: string, code = 'invalid_value'): RequestError {
  return new RequestError(400, message, { param, code });
}

/** Parses a request body: a JSON object. */
export function parseJsonObject(text: string): JsonObject {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (cause) {
    const why = excerpt(cause instanceof Error ? cause.message : String(cause), MAX_ERROR_MESSAGE_CHARS);
    throw new RequestError(400, `request body is not valid JSON: ${why}`, { code: 'invalid_json' });
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new RequestError(400, 'request body must be a JSON object', { code: 'invalid_json' });
  }
  return value as JsonObject;
}

/** Whether a field is absent (missing or `null`). */
export function absent(body: JsonObject, name: string): boolean {
  return body[name] === undefined || body[name] === null;
}

/** An integer field in `[min, max]`, or `fallback` when absent. */
export function readInteger(body: JsonObject, name: string, min: number, max: number, fallback: number): number;
export function readInteger(body: JsonObject, name: string, min: number, max: number, fallback?: undefined): number | undefined;
export function readInteger(body: JsonObject, name: string, min: number, max: number, fallback?: number): number | undefined {
  if (absent(body, name)) return fallback;
  const value = body[name];
  if (typeof value !== 'number' || !Number.isInteger(value) || value < min || value > max) {
    throw invalid(name, `'${name}' must be an integer in [${min}, ${max}], got ${quote(value)}`);
  }
  return value;
}

/** A finite number field in `[min, max]` (or `(min, max]` when `exclusiveMin`), or `fallback` when absent. */
export function readNumber(body: JsonObject, name: string, min: number, max: number, fallback: number, exclusiveMin = false): number {
  if (absent(body, name)) return fallback;
  const value = body[name];
  if (typeof value !== 'number' || !Number.isFinite(value) || value > max || (exclusiveMin ? value <= min : value < min)) {
    throw invalid(name, `'${name}' must be a number in ${exclusiveMin ? '(' : '['}${min}, ${max}], got ${quote(value)}`);
  }
  return value;
}

/** A boolean field, or `fallback` when absent. */
export function readBoolean(body: JsonObject, name: string, fallback: boolean): boolean {
  if (absent(body, name)) return fallback;
  const value = body[name];
  if (typeof value !== 'boolean') throw invalid(name, `'${name}' must be a boolean, got ${quote(value)}`);
  return value;
}

/** A required non-empty string field. */
export function readString(body: JsonObject, name: string): string {
  const value = body[name];
  if (typeof value !== 'string' || value === '') {
    throw invalid(name, `'${name}' must be a non-empty string`, absent(body, name) ? 'missing_required_parameter' : 'invalid_type');
  }
  return value;
}

/** `stop`: a string or up to 4 non-empty strings; `[]` when absent. */
export function readStop(body: JsonObject): string[] {
  if (absent(body, 'stop')) return [];
  const value = body.stop;
  const list = typeof value === 'string' ? [value] : value;
  if (!Array.isArray(list) || list.length > 4 || !list.every((s) => typeof s === 'string' && s !== '')) {
    throw invalid('stop', "'stop' must be a non-empty string or an array of at most 4 non-empty strings");
  }
  return list as string[];
}

/** An array of token ids below `vocabSize`, or `[]` when absent. */
export function readTokenIds(body: JsonObject, name: string, vocabSize: number): number[] {
  if (absent(body, name)) return [];
  const value = body[name];
  if (!Array.isArray(value) || !value.every((t) => Number.isInteger(t) && t >= 0 && t < vocabSize)) {
    throw invalid(name, `'${name}' must be an array of token ids in [0, ${vocabSize})`);
  }
  return value as number[];
}

/** Refuses a field that asks for a feature this server does not have (unless it holds its neutral value). */
export function refuse(body: JsonObject, name: string, neutral: (value: unknown) => boolean, what: string): void {
  if (!absent(body, name) && !neutral(body[name])) {
    throw new RequestError(400, `'${name}' is not supported by rxrl serve (${what})`, { param: name, code: 'unsupported_parameter' });
  }
}

/**
 * `JSON.stringify(body)` as UTF-8 chunks, yielding to the event loop between slices of a long top-level array of a
 * plain object (the thousands of choices of one completion): encoding megabytes in one go, or turning them into
 * bytes in one go when they are sent, would hold every other request, `/health` included.
 *
 * @param body - A plain JSON value (no `toJSON`, no functions).
 * @returns Chunks whose concatenation is the UTF-8 of `JSON.stringify(body)`, {@link ITEMS_PER_TURN} array items
 *   at most in one chunk.
 */
export async function encodeJson(body: unknown): Promise<Buffer[]> {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return [Buffer.from(JSON.stringify(body))];
  const chunks: Buffer[] = [];
  let text = '{';
  for (const [key, value] of Object.entries(body)) {
    if (value === undefined) continue;
    text += `${text === '{' ? '' : ','}${JSON.stringify(key)}:`;
    if (!Array.isArray(value) || value.length <= ITEMS_PER_TURN) {
      text += JSON.stringify(value);
      continue;
    }
    text += '[';
    for (let first = 0; first < value.length; first += ITEMS_PER_TURN) {
      const slice = value.slice(first, first + ITEMS_PER_TURN).map((item: unknown) => JSON.stringify(item) ?? 'null');
      chunks.push(Buffer.from(`${text}${first === 0 ? '' : ','}${slice.join(',')}`));
      text = '';
      await yieldToEventLoop();
    }
    text = ']';
  }
  chunks.push(Buffer.from(`${text}}`));
  return chunks;
}
