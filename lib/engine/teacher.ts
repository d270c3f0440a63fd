/**
 * Scorers of a batch's response tokens under another policy ({@link ReferencePolicy}): a model in this process
 * (the frozen reference of a KL penalty, or a local teacher), or an OpenAI-compatible server's `prompt_logprobs`
 * (vLLM, `rxrl serve`) — the teacher of on-policy distillation. A teacher must share the student's tokenizer:
 * {@link checkSameTokenizer} refuses one that does not, naming the difference.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';
import type OpenAI from 'openai';
import { ConfigError, DecodeError, EngineError } from '../core/errors.js';
import { retry } from '../core/retry.js';
import { openaiClient } from './openaiClient.js';
import type { Batch, ReferencePolicy } from '../core/types.js';
import type { PolicyModel } from '../model/transformer.js';
import type { Tokenizer } from '../model/types.js';

/**
 * A model of this process as a scorer: one forward pass over the batch's padded rows (0 on padding).
 *
 * @param model - The frozen policy (owned by the caller).
 * @returns Its scorer.
 */
export function modelScorer(model: PolicyModel): ReferencePolicy {
  return {
    responseLogprobs: async (batch) => {
      const T = batch.promptLength + batch.responseLength;
      const out = tf.tidy(
        () =>
          model.responseLogprobs(
            tf.tensor2d(batch.inputIds, [batch.size, T], 'int32'),
            tf.tensor2d(batch.attentionMask, [batch.size, T]),
            tf.tensor2d(batch.positionIds, [batch.size, T], 'int32'),
            batch.promptLength,
          ).logprobs, // [B, R]
      );
      const data = (await out.data()) as Float32Array;
      out.dispose();
      return data.map((x, i) => (batch.responseMask[i] === 1 ? x : 0));
    },
  };
}

/** Options of {@link openaiScorer}. */
export interface OpenAIScorerOptions {
  /** Base URL of the server's OpenAI API, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseUrl: string;
  /** Model the server serves (its id). */
  readonly model: string;
  /** API key. Default `EMPTY`. */
  readonly apiKey?: string | undefined;
  /** The student's tokenizer: the server must decode the batch's tokens as it does. */
  readonly tokenizer: Tokenizer;
  /**
   * A scoring call unanswered after this long fails: one attempt's deadline, and the whole call's (its retries are
   * made within it). Default 120 000 ms.
   */
  readonly timeoutMs?: number;
  /** Attempts after the first, for connection errors, timeouts, 429 and 5xx. Default 3. */
  readonly retries?: number;
  /** Largest answer read, in bytes (a longer one is a {@link DecodeError}). Default {@link TEACHER_MAX_RESPONSE_BYTES}. */
  readonly maxResponseBytes?: number;
}

/**
 * Default bound of a teacher's answer, in bytes: 512 MiB. The `openai` client reads an answer as one string, and
 * V8's strings end at 2^29 − 24 characters, so no answer the client could read is refused; a scoring answer takes
 * some 80 bytes per token (`{"<id>":{"logprob":…,"rank":…,"decoded_token":…}}`): about 6 M tokens per batch.
 */
export const TEACHER_MAX_RESPONSE_BYTES = 512 * 1024 * 1024;

/** One entry of `prompt_logprobs`: token id (a string key) → its log-prob and decoded text. */
type PromptLogprobs = (Record<string, { logprob: number; decoded_token?: string }> | null)[];

/**
 * A server's scores of the batch's response tokens: one `POST /completions` of every row's prompt and response as
 * token ids, with `prompt_logprobs: 0` and `max_tokens: 1`; each response token's log-prob is the server's for that
 * token given what precedes it. The first batch checks that the server decodes the tokens as the student's tokenizer
 * does (a {@link ConfigError} naming the first token that differs otherwise). Failures after the retries are
 * {@link EngineError}s; an answer without the log-probs is a {@link DecodeError}; a log-prob above 0 (past
 * {@link TEACHER_LOGPROB_TOLERANCE}) or beyond float32 is an {@link EngineError} naming the token and the value; an
 * answer longer than `maxResponseBytes` is a {@link DecodeError} (`context.limit`), not retried. Each attempt (its
 * answer's body included) and the call with its retries end at `timeoutMs`, and at once when `signal` fires.
 *
 * @param options - The server, its model and the student's tokenizer.
 * @returns The scorer.
 */
export function openaiScorer(options: OpenAIScorerOptions): ReferencePolicy {
  const timeoutMs = options.timeoutMs ?? 120_000;
  const client = openaiClient({
    baseURL: options.baseUrl,
    apiKey: options.apiKey ?? 'EMPTY',
    timeoutMs,
    maxResponseBytes: options.maxResponseBytes ?? TEACHER_MAX_RESPONSE_BYTES,
  });
  let checked = false;
  return {
    responseLogprobs: async (batch, signal) => {
      const rows = rowsOf(batch);
      if (rows.length === 0) return new Float32Array(0);
      const body = { model: options.model, prompt: rows.map((r) => r.ids), max_tokens: 1, temperature: 0, prompt_logprobs: 0 };
      const answer = await retry(
        async () => {
          try {
            return await client.completions.create(body as OpenAI.CompletionCreateParamsNonStreaming, {
              signal,
              timeout: timeoutMs,
            });
          } catch (cause) {
            if (cause instanceof DecodeError) throw cause;
            const status = (cause as { status?: number }).status;
            const retriable = status === undefined || status === 429 || status >= 500;
            throw new EngineError(`teacher ${options.model} at ${options.baseUrl}: ${(cause as Error).message}`, { cause, retriable });
          }
        },
        {
          retries: options.retries ?? 3,
          deadlineMs: timeoutMs,
          initialDelayMs: 200,
          isRetriable: (e) => e instanceof EngineError && e.retriable,
          signal,
        },
      );
      const choices = [...(answer.choices ?? [])].sort((a, b) => a.index - b.index);
      const R = batch.responseLength;
      const out = new Float32Array(batch.size * R);
      rows.forEach((row, b) => {
        const scored = (choices[b] as { prompt_logprobs?: PromptLogprobs } | undefined)?.prompt_logprobs;
        if (!Array.isArray(scored) || scored.length !== row.ids.length)
          throw new DecodeError(`teacher ${options.model}: answer ${b} has no prompt_logprobs for its ${row.ids.length} tokens`);
        if (!checked) checkDecoding(options.tokenizer, row.ids, scored, options.model);
        for (let i = 0; i < row.response; i++) {
          const position = row.ids.length - row.response + i;
          const entry = scored[position]?.[String(row.ids[position])];
          if (entry === undefined || typeof entry.logprob !== 'number')
            throw new DecodeError(`teacher ${options.model}: no log-prob for token ${position} of answer ${b}`);
          out[b * R + i] = checkedLogprob(entry.logprob, { model: options.model, answer: b, position });
        }
      });
      checked = true;
      return out;
    },
  };
}

/**
 * How far above 0 a teacher's log-prob may lie and still be read as 0: a server's float32 `log_softmax` can round
 * the log-prob of a near-certain token to a tiny positive number (a few ulps of 1, about 1e-7), which is not a
 * probability above 1. Anything larger is a broken or hostile answer.
 */
export const TEACHER_LOGPROB_TOLERANCE = 1e-6;

/** The largest finite float32 (the batch's log-probs are float32: anything beyond becomes ±Infinity). */
const FLOAT32_MAX = 3.4028234663852886e38;

/**
 * A teacher's log-prob as trained on: at most 0 (within {@link TEACHER_LOGPROB_TOLERANCE}, clamped to 0) and finite
 * in float32. Else an {@link EngineError} (not retriable) naming the answer, the token position and the value: a
 * positive log-prob would be trained on as a huge advantage, and one beyond float32 makes every update non-finite.
 */
function checkedLogprob(logprob: number, at: { model: string; answer: number; position: number }): number {
  if (logprob <= 0 && logprob >= -FLOAT32_MAX) return logprob;
  if (logprob > 0 && logprob <= TEACHER_LOGPROB_TOLERANCE) return 0;
  const why = Number.isNaN(logprob) || Math.abs(logprob) > FLOAT32_MAX ? 'is not a finite float32' : 'is above 0';
  throw new EngineError(`teacher ${at.model}: the log-prob of token ${at.position} of answer ${at.answer} is ${logprob}, which ${why}`, {
    retriable: false,
    context: { model: at.model, answer: at.answer, position: at.position, logprob },
  });
}

/** Each row's tokens without padding, and how many of them are the response. */
function rowsOf(batch: Batch): { ids: number[]; response: number }[] {
  const P = batch.promptLength;
  const R = batch.responseLength;
  const T = P + R;
  return Array.from({ length: batch.size }, (_, b) => {
    let first = 0;
    while (first < P && batch.attentionMask[b * T + first] === 0) first++;
    let response = 0;
    while (response < R && batch.responseMask[b * R + response] === 1) response++;
    return { ids: Array.from(batch.inputIds.subarray(b * T + first, b * T + P + response)), response };
  });
}

/** The server's decoding of the row's tokens must be the student's: the same token ids mean the same text. */
function checkDecoding(tokenizer: Tokenizer, ids: readonly number[], scored: PromptLogprobs, model: string): void {
  for (let i = 1; i < ids.length; i++) {
    const text = scored[i]?.[String(ids[i])]?.decoded_token;
    if (text === undefined || text.startsWith('token_id:')) continue;
    const own = tokenizer.decode([ids[i]], { skipSpecialTokens: false });
    if (text !== own)
      throw new ConfigError(
        `distill.teacher: ${model} does not share the student's tokenizer: token ${ids[i]} is ${JSON.stringify(text)} to it, ${JSON.stringify(own)} to the student`,
        { context: { key: 'distill.teacher' } },
      );
  }
}

/**
 * Refuses a teacher whose tokenizer is not the student's, naming the first difference: the vocabulary size, the
 * special ids, or a token id that decodes differently.
 *
 * @throws {@link ConfigError} with `key` `distill.teacher`.
 */
export function checkSameTokenizer(student: Tokenizer, teacher: Tokenizer, where: string): void {
  const fail = (what: string): never => {
    throw new ConfigError(`distill.teacher: ${where} does not share the student's tokenizer: ${what}`, {
      context: { key: 'distill.teacher' },
    });
  };
  if (student.vocabSize !== teacher.vocabSize) fail(`${teacher.vocabSize} token ids, the student's ${student.vocabSize}`);
  for (const key of ['bosId', 'eosId', 'padId'] as const) {
    if (student[key] !== teacher[key]) fail(`${key} ${String(teacher[key])}, the student's ${String(student[key])}`);
  }
  for (let id = 0; id < student.vocabSize; id++) {
    const a = student.decode([id], { skipSpecialTokens: false });
    const b = teacher.decode([id], { skipSpecialTokens: false });
    if (a !== b) fail(`token ${id} is ${JSON.stringify(b)}, the student's ${JSON.stringify(a)}`);
  }
}
