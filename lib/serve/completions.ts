/**
 * `POST /v1/completions` of `rxrl serve`.
 *
 * @packageDocumentation
 */
import { mapInTurns } from '../core/turns.js';
import { MAX_TOP_LOGPROBS, type ServeContext } from './context.js';
import type { PromptTokenLogprob, TopLogprob } from './servingModel.js';
import { absent, invalid, readInteger, refuse, type JsonObject } from './protocol.js';
import {
  checkContext,
  checkModel,
  checkTextFits,
  envelope,
  finish,
  readSampling,
  sample,
  sessionMaxTokens,
  tokenLabel,
  type Finished,
  type Sampling,
} from './sampling.js';
import type { Admission, Session } from './sessions.js';
import {
  EventStream,
  LiveChoice,
  drainChoice,
  readStream,
  worthSending,
  type EventSink,
  type StreamPiece,
  type StreamRequest,
} from './stream.js';

/** New tokens when a request gives no `max_tokens` (the OpenAI default), cut to what the context allows. */
const DEFAULT_MAX_TOKENS = 16;

/**
 * The prompts of a request: 400 unless they are valid and `prompts × n` is within `maxSamplesPerRequest`. A text
 * prompt that certainly cannot fit the context with `requested` new tokens is refused before it is encoded.
 */
function readPrompts(ctx: ServeContext, body: JsonObject, sampling: Sampling, requested: number): number[][] {
  const prompt = body.prompt;
  // A list of token-id lists or of strings is several prompts; count them before encoding anything.
  const count =
    Array.isArray(prompt) && prompt.length > 0 && prompt.every((p) => typeof p === 'string' || Array.isArray(p)) ? prompt.length : 1;
  if (count * sampling.n > ctx.maxSamplesPerRequest) {
    throw invalid(
      'prompt',
      `${count} prompts × n = ${sampling.n} asks for ${count * sampling.n} samples; at most ${ctx.maxSamplesPerRequest} per request`,
      'too_many_samples',
    );
  }
  const V = ctx.tokenizer.vocabSize;
  const isIds = (x: unknown): x is number[] => Array.isArray(x) && x.length > 0 && x.every((t) => Number.isInteger(t) && t >= 0 && t < V);
  const encode = (text: string, param: string): number[] => {
    checkTextFits(ctx, text, requested, param);
    try {
      return ctx.tokenizer.encode(text, { addBos: true });
    } catch (cause) {
      throw invalid(param, `${param}: ${cause instanceof Error ? cause.message : String(cause)}`);
    }
  };
  if (typeof prompt === 'string') return [encode(prompt, 'prompt')];
  if (isIds(prompt)) return [[...prompt]];
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === 'string')) {
      // Every text is checked against the context before the first is encoded.
      prompt.forEach((p, i) => checkTextFits(ctx, p as string, requested, `prompt[${i}]`));
      return prompt.map((p, i) => encode(p as string, `prompt[${i}]`));
    }
    if (prompt.every(isIds)) return prompt.map((p) => [...(p as number[])]);
  }
  throw invalid(
    'prompt',
    `'prompt' must be a string, a non-empty array of token ids in [0, ${V}), or a non-empty array of either`,
    absent(body, 'prompt') ? 'missing_required_parameter' : 'invalid_type',
  );
}

/** One entry of vLLM's `prompt_logprobs`: token id (as a string key) → `{ logprob, rank, decoded_token }`. */
type PromptLogprobEntry = Record<string, { logprob: number; rank: number; decoded_token: string }>;

/** vLLM's shape: `null` for the first prompt token, then the token itself and the top alternatives. */
function promptLogprobsJson(
  ctx: ServeContext,
  scored: readonly (PromptTokenLogprob | null)[],
  asIds: boolean,
): (PromptLogprobEntry | null)[] {
  const decoded = (t: number): string => (asIds ? `token_id:${t}` : ctx.tokenizer.decode([t], { skipSpecialTokens: false }));
  return scored.map((entry) => {
    if (entry === null) return null;
    const out: PromptLogprobEntry = { [entry.token]: { logprob: entry.logprob, rank: entry.rank, decoded_token: decoded(entry.token) } };
    entry.top.forEach((alt, j) => {
      if (alt.token !== entry.token) out[alt.token] = { logprob: alt.logprob, rank: j + 1, decoded_token: decoded(alt.token) };
    });
    return out;
  });
}

/** A validated completions request. */
interface CompletionsCall {
  /** The context of the model it names. */
  readonly ctx: ServeContext;
  readonly sampling: Sampling;
  readonly prompts: readonly number[][];
  readonly maxTokens: number;
  /** Alternatives per sampled token (`logprobs`), when asked. */
  readonly logprobs: number | undefined;
  /** Alternatives per prompt token (vLLM's `prompt_logprobs`), when asked. */
  readonly promptTopK: number | undefined;
  readonly stream: StreamRequest;
  /** Prompt tokens of every prompt. */
  readonly promptTokens: number;
  /** Tokens the call may record: its prompts and `n × max_tokens` per prompt. */
  readonly reserve: number;
}

/** Reads and validates a request (400s); nothing is encoded for a text that cannot fit the context. */
function readCall(server: ServeContext, body: JsonObject, session: Session | undefined): CompletionsCall {
  const ctx = checkModel(server, body); // the base model's context, or the named adapter's
  refuse(body, 'echo', (v) => v === false, 'echo');
  refuse(body, 'suffix', (v) => v === '', 'suffix');
  const sampling = readSampling(ctx, body);
  refuse(body, 'best_of', (v) => v === sampling.n, 'best_of other than n');
  const requested = readInteger(body, 'max_tokens', 0, ctx.maxSeqLen);
  const prompts = readPrompts(ctx, body, sampling, requested ?? 0);
  const promptTokens = prompts.reduce((sum, p) => sum + p.length, 0);
  const room = ctx.maxSeqLen - prompts.reduce((longest, p) => Math.max(longest, p.length), 0);
  let fallback = Math.max(0, Math.min(session?.defaults.maxTokens ?? DEFAULT_MAX_TOKENS, room));
  if (session !== undefined)
    fallback = sessionMaxTokens(session, ctx.sessions.maxTokens, promptTokens, prompts.length * sampling.n, fallback);
  const maxTokens = requested ?? fallback;
  prompts.forEach((p) => checkContext(ctx, p.length, maxTokens, 'max_tokens'));
  return {
    ctx,
    sampling,
    prompts,
    maxTokens,
    logprobs: readInteger(body, 'logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize)),
    promptTopK: readInteger(body, 'prompt_logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize)),
    stream: readStream(body),
    promptTokens,
    reserve: promptTokens + prompts.length * sampling.n * maxTokens,
  };
}

/**
 * Answers `POST /v1/completions`: one choice per prompt and `n`, prompt-major; `logprobs` gives the sampled token's
 * log-prob plus the top-k alternatives; `prompt_logprobs` (vLLM) gives every prompt token's log-prob given its
 * prefix (`null` for the first) plus the top-k alternatives; `return_token_ids` adds `token_ids` and
 * `prompt_token_ids` per choice. In session `sessionId` (`/sessions/{id}/v1/…`), a valid call opens the session,
 * reserves its tokens there and is recorded.
 */
export async function completions(server: ServeContext, request: JsonObject, signal: AbortSignal, sessionId?: string): Promise<unknown> {
  const session = sessionId === undefined ? undefined : server.sessions.find(sessionId);
  const call = readCall(server, session?.withDefaults(request) ?? request, session);
  const admission = session === undefined ? undefined : server.sessions.admit(session, call.reserve);
  if (call.stream.stream) return streamCompletions(call, signal, admission);
  try {
    return await answer(call, signal, admission);
  } finally {
    admission?.end();
  }
}

/** Records a session's call per prompt: what each choice's client was given. */
function record(call: CompletionsCall, admission: Admission | undefined, id: string, version: number, done: readonly Finished[]): void {
  const { prompts, sampling } = call;
  prompts.forEach((promptIds, p) =>
    admission?.session.record({
      id: prompts.length === 1 ? id : `${id}#${p}`,
      route: 'completions',
      promptIds,
      version,
      choices: done
        .slice(p * sampling.n, (p + 1) * sampling.n)
        .map((d) => ({ tokens: d.tokens, logprobs: d.logprobs, finishReason: d.finishReason, text: d.text })),
    }),
  );
}

function usage(call: CompletionsCall, completionTokens: number): Record<string, number> {
  return { prompt_tokens: call.promptTokens, completion_tokens: completionTokens, total_tokens: call.promptTokens + completionTokens };
}

/** The `logprobs` object of some tokens of a choice: labels, log-probs, top alternatives, text offsets. */
function logprobsJson(
  call: CompletionsCall,
  tokens: readonly number[],
  values: readonly number[],
  top: readonly (readonly TopLogprob[])[] | undefined,
  offsets: readonly number[],
) {
  const label = (t: number): string => tokenLabel(call.ctx, t, call.sampling.tokensAsIds);
  return {
    tokens: tokens.map(label),
    token_logprobs: values,
    top_logprobs: tokens.map((t, j) => {
      const entries: Record<string, number> = {};
      for (const alt of top?.[j] ?? []) entries[label(alt.token)] = alt.logprob;
      entries[label(t)] = values[j];
      return entries;
    }),
    text_offset: offsets,
  };
}

/** The prompt of choice `index` (prompt-major). */
function promptOf(call: CompletionsCall, index: number): readonly number[] {
  return call.prompts[Math.floor(index / call.sampling.n)];
}

/** The whole answer at once. */
async function answer(call: CompletionsCall, signal: AbortSignal, admission: Admission | undefined): Promise<unknown> {
  const { ctx, sampling, logprobs, promptTopK } = call;
  const { responses, promptLogprobs, version } = await sample(
    ctx,
    call.prompts,
    call.maxTokens,
    sampling,
    logprobs ?? 0,
    signal,
    promptTopK,
  );
  let completionTokens = 0;
  const finished: Finished[] = [];
  const choices = await mapInTurns(responses, (response, index) => {
    const done = finish(ctx, response, sampling);
    finished.push(done);
    completionTokens += response.tokens.length;
    return {
      index,
      text: done.text,
      finish_reason: done.finishReason,
      logprobs: logprobs === undefined ? null : logprobsJson(call, done.tokens, done.logprobs, done.top, done.offsets),
      ...(promptTopK === undefined
        ? {}
        : { prompt_logprobs: promptLogprobsJson(ctx, promptLogprobs[Math.floor(index / sampling.n)] ?? [], sampling.tokensAsIds) }),
      ...(sampling.returnTokenIds ? { token_ids: done.tokens, prompt_token_ids: promptOf(call, index) } : {}),
    };
  });
  const head = envelope(ctx, 'cmpl', 'text_completion', version);
  record(call, admission, String(head.id), version, finished);
  return { ...head, choices, usage: usage(call, completionTokens) };
}

/**
 * The streamed answer: text chunks per choice as tokens are sampled (once complete when alternatives are scored),
 * written as the client's connection has room; then each choice's finish reason and, when asked, the usage.
 */
function streamCompletions(call: CompletionsCall, signal: AbortSignal, admission: Admission | undefined): EventStream {
  const { ctx, sampling, logprobs, promptTopK } = call;
  const live = (logprobs ?? 0) === 0 && promptTopK === undefined;
  return new EventStream(async (sink: EventSink) => {
    try {
      const { id, created } = envelope(ctx, 'cmpl', 'text_completion', ctx.engine.version);
      const head = { id, object: 'text_completion', created, model: ctx.modelName };
      const finished: (Finished | undefined)[] = [];
      let promptLogprobs: ((PromptTokenLogprob | null)[] | undefined)[] = [];
      const chunk = (index: number, choice: Record<string, unknown>, extra: Record<string, unknown> = {}): void =>
        sink.send({ ...head, ...extra, choices: [{ index, text: '', logprobs: null, finish_reason: null, ...choice }] });
      const streams = Array.from({ length: call.prompts.length * sampling.n }, (_, index) => {
        let first = true;
        const emit = (piece: StreamPiece): void => {
          if (!worthSending(piece, sampling, logprobs !== undefined) && !first) return;
          const top = finished[index]?.top?.slice(piece.first, piece.first + piece.tokens.length);
          chunk(index, {
            text: piece.text,
            logprobs: logprobs === undefined ? null : logprobsJson(call, piece.tokens, piece.logprobs, top, piece.offsets),
            ...(sampling.returnTokenIds ? { token_ids: piece.tokens, ...(first ? { prompt_token_ids: promptOf(call, index) } : {}) } : {}),
            ...(first && promptTopK !== undefined
              ? { prompt_logprobs: promptLogprobsJson(ctx, promptLogprobs[Math.floor(index / sampling.n)] ?? [], sampling.tokensAsIds) }
              : {}),
          });
          first = false;
        };
        return new LiveChoice(ctx.tokenizer, sampling.stop, emit, () => sink.room);
      });
      sink.onDrain(() => streams.forEach((s) => s.flush()));
      const result = await sample(
        ctx,
        call.prompts,
        call.maxTokens,
        sampling,
        logprobs ?? 0,
        signal,
        promptTopK,
        live ? (i, t, lp) => streams[i].push(t, lp) : undefined,
      );
      promptLogprobs = result.promptLogprobs;
      let completionTokens = 0;
      for (const [index, response] of result.responses.entries()) {
        const done = finish(ctx, response, sampling);
        completionTokens += response.tokens.length;
        finished[index] = done;
        streams[index].end(done);
        await drainChoice(streams[index], sink);
        chunk(
          index,
          { finish_reason: done.finishReason },
          { system_fingerprint: `rxrl-v${result.version}`, policy_version: result.version },
        );
      }
      record(call, admission, String(id), result.version, finished as Finished[]);
      if (call.stream.includeUsage) sink.send({ ...head, choices: [], usage: usage(call, completionTokens) });
    } finally {
      admission?.end();
    }
  });
}
