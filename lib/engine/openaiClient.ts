/**
 * The one way rxrl builds an `openai` client for an OpenAI-compatible server (the rollout engine, the distillation
 * teacher, a served run's model lookup): no retries of its own (callers retry through the project's helper), a
 * deadline per request, and every answer's body bounded ({@link boundedFetch}), so a server that answers without
 * end, or declares a huge body, is a `DecodeError` with `context.limit` rather than memory spent.
 *
 * @packageDocumentation
 */
import OpenAI from 'openai';

import { boundedFetch } from '../core/http.js';

/**
 * Default bound of one answer's body (a completion, a chat turn, the model list), in bytes: 64 MiB, some hundred
 * times the largest completion a 32 k-token answer with its log-probs makes.
 */
export const DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024;

/** Options of {@link openaiClient}. */
export interface OpenAIClientOptions {
  /** Base URL of the OpenAI API, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseURL: string;
  /** API key (local servers ignore it). */
  readonly apiKey: string;
  /** Deadline of one request, in ms, its answer's body included (the SDK's `timeout`). */
  readonly timeoutMs: number;
  /** Largest answer body read, in bytes (a larger one is a `DecodeError`). Default {@link DEFAULT_MAX_RESPONSE_BYTES}. */
  readonly maxResponseBytes?: number | undefined;
}

/**
 * An `openai` client that never retries by itself, with a deadline per request and bounded answers.
 *
 * @example
 * ```ts
 * import { openaiClient } from 'rxrl';
 * const client = openaiClient({ baseURL: 'http://127.0.0.1:8000/v1', apiKey: 'EMPTY', timeoutMs: 120_000 });
 * const models = await client.models.list({ signal: AbortSignal.timeout(120_000) });
 * ```
 * @param options - the server, its key, the deadline and the bound.
 * @returns the client.
 */
export function openaiClient(options: OpenAIClientOptions): OpenAI {
  return new OpenAI({
    baseURL: options.baseURL,
    apiKey: options.apiKey,
    maxRetries: 0,
    timeout: options.timeoutMs,
    fetch: boundedFetch(options.maxResponseBytes ?? DEFAULT_MAX_RESPONSE_BYTES),
  });
}
