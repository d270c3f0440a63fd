/**
 * Sampling parameters and response pieces shared by the completion and chat endpoints of `rxrl serve`.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import type { GenerateRequest, GenerateResponse, Tokenizer } from '../model/types.js';
import { hashSeed } from '../core/random.js';
import type { PolicyVersion } from '../core/types.js';
import { ownModel, type ServeContext } from './context.js';
import { invalid, readBoolean, readInteger, readNumber, readStop, readString, readTokenIds, refuse, type JsonObject } from './protocol.js';
import type { PromptTokenLogprob, TopLogprob } from './servingModel.js';
import { modelContext } from './adapters.js';
import type { Session } from './sessions.js';

/** Sampling parameters common to both endpoints, validated. */
export interface Sampling {
  readonly n: number;
  readonly temperature: number;
  readonly topP: number;
  readonly seed: number | undefined;
  readonly stop: readonly string[];
  readonly stopTokens: readonly number[];
  readonly tokensAsIds: boolean;
  readonly returnTokenIds: boolean;
  readonly includeStop: boolean;
}

/** The context of the model the request names: the base model or a served LoRA adapter (404 otherwise). */
export function checkModel(ctx: ServeContext, body: JsonObject): ServeContext {
  return modelContext(ctx, readString(body, 'model'));
}

/**
 * Reads and validates `n`, `temperature`, `top_p`, `seed`, `stop` and the vLLM extensions; refuses penalties and
 * logit bias. Generation stops at the tokenizer's `stopIds` (unless `ignore_eos`, vLLM's: then it runs to `max_tokens`
 * past them), at one-token stop strings and at `stop_token_ids`.
 */
export function readSampling(ctx: ServeContext, body: JsonObject): Sampling {
  refuse(body, 'presence_penalty', (v) => v === 0, 'penalties');
  refuse(body, 'frequency_penalty', (v) => v === 0, 'penalties');
  refuse(body, 'logit_bias', (v) => typeof v === 'object' && v !== null && Object.keys(v).length === 0, 'logit bias');
  const n = readInteger(body, 'n', 1, ctx.maxN, 1);
  const stop = readStop(body);
  const V = ctx.tokenizer.vocabSize;
  // Stop strings of one token end generation early; longer ones are cut after generation.
  const single = stop.flatMap((s) => {
    try {
      const ids = ctx.tokenizer.encode(s);
      return ids.length === 1 ? ids : [];
    } catch {
      return [];
    }
  });
  const ignoreEos = readBoolean(body, 'ignore_eos', false);
  return {
    n,
    temperature: readNumber(body, 'temperature', 0, 2, 1),
    topP: readNumber(body, 'top_p', 0, 1, 1, true),
    seed: readInteger(body, 'seed', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
    stop,
    stopTokens: [...new Set([...(ignoreEos ? [] : ctx.tokenizer.stopIds), ...single, ...readTokenIds(body, 'stop_token_ids', V)])],
    tokensAsIds: readBoolean(body, 'return_tokens_as_token_ids', false),
    returnTokenIds: readBoolean(body, 'return_token_ids', false),
    includeStop: readBoolean(body, 'include_stop_str_in_output', false),
  };
}

/** Seed of choice `index` (prompt-major): the request's seed itself for the first, derived streams after. */
function choiceSeed(seed: number | undefined, index: number): number {
  if (seed === undefined) return Math.floor(Math.random() * 2 ** 32);
  return index === 0 ? seed : hashSeed(seed, 'choice', String(index));
}

/** 400 (`context_length_exceeded`) when prompt plus new tokens do not fit the model. */
export function checkContext(ctx: ServeContext, promptLength: number, maxTokens: number, param: string): void {
  if (promptLength === 0) throw invalid(param, 'the prompt is empty');
  if (promptLength + maxTokens > ctx.maxSeqLen) {
    throw invalid(
      param,
      `This model's maximum context length is ${ctx.maxSeqLen} tokens; the prompt has ${promptLength} tokens and ${maxTokens} new tokens were requested`,
      'context_length_exceeded',
    );
  }
}

/**
 * 400 (`context_length_exceeded`) when a text prompt certainly cannot fit the model with `maxTokens` new tokens,
 * by the tokenizer's lower bound on its length ({@link Tokenizer.minTokens}): checked before the text is encoded,
 * so a prompt of megabytes costs no tokenizing. A tokenizer without a bound lets every text through (to be
 * encoded and checked by {@link checkContext}).
 */
export function checkTextFits(ctx: ServeContext, text: string, maxTokens: number, param: string): void {
  const atLeast = ctx.tokenizer.minTokens?.(text) ?? 0;
  if (atLeast + maxTokens > ctx.maxSeqLen) {
    throw invalid(
      param,
      `This model's maximum context length is ${ctx.maxSeqLen} tokens; the prompt has at least ${atLeast} tokens (${text.length} characters)${maxTokens > 0 ? ` and ${maxTokens} new tokens were requested` : ''}`,
      'context_length_exceeded',
    );
  }
}

/**
 * The `max_tokens` of a session's call that gives none: `fallback`, cut to what the session's token limit leaves
 * each of its `samples` after `promptTokens` (at least 1, so that a spent session refuses the call rather than
 * answering it with nothing).
 */
export function sessionMaxTokens(session: Session, limit: number, promptTokens: number, samples: number, fallback: number): number {
  const left = Math.floor((session.room(limit) - promptTokens) / samples);
  return Math.min(fallback, Math.max(left, 1));
}

/** A finished sample after stop strings are applied. */
export interface Finished {
  readonly tokens: number[];
  readonly logprobs: number[];
  readonly top: TopLogprob[][] | undefined;
  readonly text: string;
  /** Character offset of each kept token in `text`. */
  readonly offsets: number[];
  readonly finishReason: 'stop' | 'length';
}

/**
 * The text each token adds to the decoded response (special tokens add ''). Pieces are decoded in a short window
 * of context, so a character spread over several byte-level tokens appears whole, with the token that completes
 * it; their concatenation is the response's text.
 *
 * @param tokenizer - Decodes the tokens.
 * @param tokens - Response token ids, `[R]`.
 * @returns One piece per token, `[R]`.
 * @throws {@link DecodeError} for an id outside the tokenizer's vocabulary.
 * @example
 * ```ts
 * textPieces(tokenizer, tokenizer.encode('🙂 ok')); // ['', '', '🙂', ' o', 'k'] with a byte-level BPE whose emoji spans 3 tokens
 * ```
 */
export function textPieces(tokenizer: Tokenizer, tokens: readonly number[]): string[] {
  const pieces = new TextPieces(tokenizer);
  return tokens.map((token, j) => pieces.push(token, j === tokens.length - 1));
}

/**
 * {@link textPieces} one token at a time, for streaming: the piece of a token pushed with `last` false is final
 * (equal to the whole response's); only the last token of a response may get a different piece once it is known
 * to be last (an incomplete character is then written out as it is).
 */
export class TextPieces {
  private readonly tokens: number[] = [];
  private start = 0; // first token of the context window
  private read = 0; // tokens before this have their pieces
  private readText = '';

  constructor(private readonly tokenizer: Tokenizer) {}

  /** The text `token` adds; `last` when no token follows it. */
  push(token: number, last: boolean): string {
    const j = this.tokens.length;
    this.tokens.push(token);
    const text = this.tokenizer.decode(this.tokens.slice(this.start, j + 1));
    const complete = !text.endsWith('\uFFFD') || last;
    if (text.length > this.readText.length && complete) {
      const piece = text.slice(this.readText.length);
      this.start = this.read;
      this.read = j + 1;
      this.readText = this.tokenizer.decode(this.tokens.slice(this.start, this.read));
      return piece;
    }
    return '';
  }
}

/**
 * How a token is spelled in log-probs: `token_id:<id>`, or its vocabulary string (`<eos>`, `Ġhello`,
 * `<|im_end|>`).
 */
export function tokenLabel(ctx: ServeContext, token: number, asId: boolean): string {
  return asId ? `token_id:${token}` : ctx.tokenizer.tokenLabel(token);
}

/** Applies stop strings: the text and the tokens end before the first stop string (or after it, if asked). */
export function finish(ctx: ServeContext, response: GenerateResponse, sampling: Sampling): Finished {
  const top = ctx.own?.serving.scores(response)?.top;
  const pieces = textPieces(ctx.tokenizer, response.tokens);
  let text = '';
  const offsets: number[] = [];
  for (let j = 0; j < response.tokens.length; j++) {
    offsets.push(text.length);
    text += pieces[j];
    let at = -1;
    let length = 0;
    for (const s of sampling.stop) {
      const found = text.indexOf(s);
      if (found >= 0 && (at < 0 || found < at)) {
        at = found;
        length = s.length;
      }
    }
    if (at >= 0) {
      const cut = sampling.includeStop ? at + length : at;
      const ends = offsets.map((o, i) => o + pieces[i].length);
      const keep = sampling.includeStop ? j + 1 : ends.filter((end) => end <= at).length;
      return {
        tokens: response.tokens.slice(0, keep),
        logprobs: response.logprobs.slice(0, keep),
        top: top?.slice(0, keep),
        text: text.slice(0, cut),
        offsets: offsets.slice(0, keep),
        finishReason: 'stop',
      };
    }
  }
  return {
    tokens: response.tokens,
    logprobs: response.logprobs,
    top,
    text,
    offsets,
    finishReason: response.finishReason === 'stop' ? 'stop' : 'length',
  };
}

/**
 * Samples `n` responses per prompt through the local engine (prompt-major order), asking for `topK`
 * alternatives per token and, when `promptTopK` is given, the prompt tokens' log-probs (scored once per prompt,
 * with its first choice); `onToken` hears each choice's tokens as they are sampled; resolves with the responses, the prompts' log-probs (or `undefined` each) and the
 * oldest policy version among them.
 */
export async function sample(
  ctx: ServeContext,
  prompts: readonly number[][],
  maxTokens: number,
  sampling: Sampling,
  topK: number,
  signal: AbortSignal,
  promptTopK?: number,
  onToken?: (choice: number, token: number, logprob: number) => void,
): Promise<{ responses: GenerateResponse[]; promptLogprobs: ((PromptTokenLogprob | null)[] | undefined)[]; version: PolicyVersion }> {
  const requests: GenerateRequest[] = [];
  // Each prompt is one request of `GET /metrics` (its n choices together, as vLLM counts them).
  const served = prompts.map(() => ctx.metrics.begin());
  prompts.forEach((promptTokens, p) => {
    for (let i = 0; i < sampling.n; i++) {
      const request: GenerateRequest = {
        promptTokens,
        maxTokens,
        temperature: sampling.temperature,
        topP: sampling.topP,
        stopTokens: sampling.stopTokens,
        seed: choiceSeed(sampling.seed, p * sampling.n + i),
        onToken: (token: number, logprob: number) => {
          served[p].token();
          onToken?.(p * sampling.n + i, token, logprob);
        },
      };
      if (topK > 0 || promptTopK !== undefined) {
        ownModel(ctx, 'top_logprobs and prompt_logprobs').serving.requestScores(request, {
          topLogprobs: topK,
          ...(i === 0 && promptTopK !== undefined ? { promptLogprobs: promptTopK } : {}),
        });
      }
      requests.push(request);
    }
  });
  let responses: GenerateResponse[];
  try {
    responses = await ctx.engine.generate(requests, signal);
  } catch (error) {
    served.forEach((request, p) => request.end(prompts[p].length, 0, 'abort'));
    throw error;
  }
  served.forEach((request, p) => {
    const choices = responses.slice(p * sampling.n, (p + 1) * sampling.n);
    request.end(
      prompts[p].length,
      choices.reduce((sum, r) => sum + r.tokens.length, 0),
      choices[0]?.finishReason ?? 'stop',
    );
  });
  const promptLogprobs = prompts.map((_, p) => ctx.own?.serving.scores(responses[p * sampling.n])?.prompt);
  const version = responses.reduce((oldest, r) => Math.min(oldest, r.policyVersion), Number.POSITIVE_INFINITY);
  return { responses, promptLogprobs, version };
}

/** The fields every completion response starts with, `policy_version` and `system_fingerprint` included. */
export function envelope(ctx: ServeContext, prefix: string, object: string, version: PolicyVersion): Record<string, unknown> {
  return {
    id: `${prefix}-${randomUUID().replaceAll('-', '')}`,
    object,
    created: Math.floor(Date.now() / 1000),
    model: ctx.modelName,
    system_fingerprint: `rxrl-v${version}`,
    policy_version: version,
  };
}
