/**
 * `POST /v1/chat/completions` of `rxrl serve`: messages rendered by the chat template, tool calls parsed by it
 * (the bundled template's `name(args)` format, or `<tool_call>` blocks for a model's Jinja template).
 *
 * @packageDocumentation
 */
import { ReasoningStream, splitReasoning, type ReasoningDelta } from './reasoning.js';
import { isToolName } from '../chat/toolCalls.js';
import type { ChatMessage, ChatRole, ChatTool, ToolCall, ToolParameters } from '../chat/types.js';
import { ContextLengthError, DecodeError } from '../core/errors.js';
import { mapInTurns } from '../core/turns.js';
import type { TopLogprob } from './servingModel.js';
import { MAX_TOP_LOGPROBS, type ServeContext } from './context.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, absent, excerpt, invalid, readBoolean, readInteger, type JsonObject } from './protocol.js';
import {
  checkContext,
  checkModel,
  envelope,
  finish,
  readSampling,
  sample,
  sessionMaxTokens,
  tokenLabel,
  type Finished,
  type Sampling,
} from './sampling.js';
import type { Admission, Drift, Session } from './sessions.js';
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

function readContent(value: unknown, param: string, nullable: boolean): string {
  if (typeof value === 'string') return value;
  if ((value === null || value === undefined) && nullable) return '';
  if (Array.isArray(value)) {
    return value
      .map((part, i) => {
        const { type, text } = (typeof part === 'object' && part !== null ? part : {}) as { type?: unknown; text?: unknown };
        if (type !== 'text' || typeof text !== 'string') {
          const where = `${param}[${i}]`;
          throw new RequestError(400, `${where}: only text content parts are supported`, { param: where, code: 'unsupported_content' });
        }
        return text;
      })
      .join('');
  }
  throw invalid(param, `${param} must be a string or an array of text parts`);
}

function readToolCalls(value: unknown, param: string): ToolCall[] {
  if (value === undefined || value === null) return [];
  if (!Array.isArray(value)) throw invalid(param, `${param} must be an array`);
  return value.map((call, i) => {
    const where = `${param}[${i}]`;
    const fn = typeof call === 'object' && call !== null ? (call as { function?: unknown }).function : undefined;
    const id = typeof call === 'object' && call !== null ? (call as { id?: unknown }).id : undefined;
    const name = typeof fn === 'object' && fn !== null ? (fn as { name?: unknown }).name : undefined;
    const args = typeof fn === 'object' && fn !== null ? (fn as { arguments?: unknown }).arguments : undefined;
    if (typeof id !== 'string' || typeof name !== 'string' || !isToolName(name) || typeof args !== 'string') {
      throw invalid(where, `${where} must be { id, type: 'function', function: { name, arguments } } with a valid name`);
    }
    return { id, name, arguments: args };
  });
}

function readMessages(body: JsonObject): ChatMessage[] {
  const messages = body.messages;
  if (!Array.isArray(messages) || messages.length === 0) {
    throw invalid(
      'messages',
      "'messages' must be a non-empty array",
      absent(body, 'messages') ? 'missing_required_parameter' : 'invalid_type',
    );
  }
  return messages.map((raw, i): ChatMessage => {
    const where = `messages[${i}]`;
    if (typeof raw !== 'object' || raw === null) throw invalid(where, `${where} must be an object`);
    const m = raw as Record<string, unknown>;
    const role = m.role === 'developer' ? 'system' : m.role;
    if (role !== 'system' && role !== 'user' && role !== 'assistant' && role !== 'tool') {
      throw invalid(`${where}.role`, `${where}.role must be one of system, developer, user, assistant, tool`);
    }
    const toolCalls = role === 'assistant' ? readToolCalls(m.tool_calls, `${where}.tool_calls`) : [];
    const content = readContent(m.content, `${where}.content`, role === 'assistant' && toolCalls.length > 0);
    if (role === 'tool' && typeof m.tool_call_id !== 'string')
      throw invalid(`${where}.tool_call_id`, `${where}.tool_call_id must be a string`);
    return {
      role: role as ChatRole,
      content,
      ...(toolCalls.length > 0 ? { toolCalls } : {}),
      ...(role === 'tool' ? { toolCallId: m.tool_call_id as string } : {}),
    };
  });
}

function readTools(body: JsonObject): ChatTool[] {
  if (absent(body, 'tools')) return [];
  if (!Array.isArray(body.tools)) throw invalid('tools', "'tools' must be an array");
  return body.tools.map((raw, i) => {
    const where = `tools[${i}]`;
    const tool = (typeof raw === 'object' && raw !== null ? raw : {}) as { type?: unknown; function?: unknown };
    const fn = tool.type === 'function' ? tool.function : undefined;
    if (typeof fn !== 'object' || fn === null)
      throw invalid(where, `${where} must be { type: 'function', function: { name, parameters? } }`);
    const { name, description, parameters } = fn as { name?: unknown; description?: unknown; parameters?: unknown };
    if (typeof name !== 'string' || !isToolName(name))
      throw invalid(`${where}.function.name`, `${where}.function.name must match [A-Za-z_][A-Za-z0-9_]*`);
    if (parameters !== undefined && (typeof parameters !== 'object' || parameters === null || Array.isArray(parameters))) {
      throw invalid(`${where}.function.parameters`, `${where}.function.parameters must be a JSON schema object`);
    }
    return {
      name,
      ...(typeof description === 'string' ? { description } : {}),
      ...(parameters === undefined ? {} : { parameters: parameters as ToolParameters }),
    };
  });
}

/** Whether tool calls are parsed: `none` turns parsing off; `auto`, `required` and named choices parse. */
function readToolChoice(body: JsonObject): boolean {
  const choice = body.tool_choice;
  if (choice === undefined || choice === null || choice === 'auto' || choice === 'required') return true;
  if (choice === 'none') return false;
  if (typeof choice === 'object' && (choice as { type?: unknown }).type === 'function') return true;
  throw invalid('tool_choice', "'tool_choice' must be 'none', 'auto', 'required' or { type: 'function', function: { name } }");
}

/** The `logprobs.content` entries of some tokens of a choice, with their top alternatives when scored. */
function logprobContent(
  ctx: ServeContext,
  tokens: readonly number[],
  logprobs: readonly number[],
  top: readonly (readonly TopLogprob[])[] | undefined,
  asIds: boolean,
): unknown[] {
  const label = (t: number): string => tokenLabel(ctx, t, asIds);
  return tokens.map((t, j) => ({
    token: label(t),
    logprob: logprobs[j],
    bytes: [...Buffer.from(label(t), 'utf8')],
    top_logprobs: (top?.[j] ?? []).map((alt) => ({
      token: label(alt.token),
      logprob: alt.logprob,
      bytes: [...Buffer.from(label(alt.token), 'utf8')],
    })),
  }));
}

/** The assistant's reply of one choice, as the client gets it. */
interface Reply {
  readonly content: string;
  /** The reply's thinking, split off by the server's reasoning parser. */
  readonly reasoning?: string | undefined;
  readonly toolCalls: readonly {
    readonly id: string;
    readonly type: 'function';
    readonly function: { readonly name: string; readonly arguments: string };
  }[];
  readonly finishReason: Finished['finishReason'] | 'tool_calls';
}

/** The assistant's reply of one choice: content and the calls of offered tools. */
function reply(ctx: ServeContext, done: Finished, tools: readonly ChatTool[], parseTools: boolean, id: string, index: number): Reply {
  const split = ctx.reasoningParser ? splitReasoning(ctx.reasoningParser, done.text) : { content: done.text };
  const parsed = parseTools ? ctx.template.parse(split.content, tools) : { content: split.content, toolCalls: [] };
  const toolCalls = parsed.toolCalls.map((call, i) => ({
    id: `call_${id.slice(-12)}_${index}_${i}`,
    type: 'function' as const,
    function: { name: call.name, arguments: call.arguments },
  }));
  return {
    content: parsed.content,
    ...(split.reasoning === undefined ? {} : { reasoning: split.reasoning }),
    toolCalls,
    finishReason: toolCalls.length > 0 ? 'tool_calls' : done.finishReason,
  };
}

/** A validated chat request. */
interface ChatRequest {
  readonly ctx: ServeContext;
  readonly sampling: Sampling;
  readonly messages: ChatMessage[];
  readonly tools: ChatTool[];
  readonly parseTools: boolean;
  readonly prompt: number[];
  readonly maxTokens: number;
  readonly wantLogprobs: boolean;
  readonly topK: number;
  readonly stream: StreamRequest;
  /** The earlier call whose exact tokens the prompt continues (sessions). */
  readonly continues: { call: string; choice: number } | undefined;
  readonly drift: Drift | undefined;
}

/**
 * The prompt of `messages` as the template renders it; a conversation that certainly cannot fit the context with
 * `requested` new tokens is refused (`context_length_exceeded`) before it is encoded.
 */
function renderPrompt(
  ctx: ServeContext,
  messages: readonly ChatMessage[],
  tools: readonly ChatTool[],
  requested: number,
  param: string,
): number[] {
  try {
    return ctx.template.render(messages, tools, { addGenerationPrompt: true, maxTokens: ctx.maxSeqLen - requested });
  } catch (error) {
    if (error instanceof ContextLengthError) {
      const { atLeast } = error.context;
      throw invalid(
        requested > 0 ? param : 'messages',
        `This model's maximum context length is ${ctx.maxSeqLen} tokens; the messages have at least ${String(atLeast)} tokens${requested > 0 ? ` and ${requested} new tokens were requested` : ''}`,
        'context_length_exceeded',
      );
    }
    const index = error instanceof DecodeError ? error.context.message : undefined;
    const why = excerpt(error instanceof Error ? error.message : String(error), MAX_ERROR_MESSAGE_CHARS);
    throw invalid(typeof index === 'number' ? `messages[${index}].content` : 'messages', why);
  }
}

function readChatRequest(server: ServeContext, body: JsonObject, session: Session | undefined): ChatRequest {
  const ctx = checkModel(server, body); // the base model's context, or the named adapter's
  const sampling = readSampling(ctx, body);
  const stream = readStream(body);
  const messages = readMessages(body);
  const tools = readTools(body);
  const parseTools = readToolChoice(body) && tools.length > 0;
  const param = absent(body, 'max_completion_tokens') ? 'max_tokens' : 'max_completion_tokens';
  const requested = readInteger(body, 'max_completion_tokens', 0, ctx.maxSeqLen) ?? readInteger(body, 'max_tokens', 0, ctx.maxSeqLen);
  let prompt = renderPrompt(ctx, messages, tools, requested ?? 0, param);
  let exact: { continues?: { call: string; choice: number }; drift?: Drift | undefined } = {};
  if (session !== undefined) {
    const found = session.chatPrompt(ctx.template, ctx.tokenizer.stopIds, messages, tools, prompt);
    prompt = found.prompt;
    exact = found;
  }
  let fallback = Math.max(Math.min(ctx.maxSeqLen - prompt.length, session?.defaults.maxTokens ?? Infinity), 0);
  if (session !== undefined) fallback = sessionMaxTokens(session, ctx.sessions.maxTokens, prompt.length, sampling.n, fallback);
  const maxTokens = requested ?? fallback;
  checkContext(ctx, prompt.length, maxTokens, param);
  const wantLogprobs = readBoolean(body, 'logprobs', false);
  const topK = readInteger(body, 'top_logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize), 0);
  if (topK > 0 && !wantLogprobs) throw invalid('top_logprobs', "'top_logprobs' needs 'logprobs': true");
  return {
    ctx,
    sampling,
    messages,
    tools,
    parseTools,
    prompt,
    maxTokens,
    wantLogprobs,
    topK,
    stream,
    continues: exact.continues,
    drift: exact.drift,
  };
}

/** Records a session's call: what each choice's client was given. */
function recordCall(
  request: ChatRequest,
  admission: Admission | undefined,
  id: string,
  version: number,
  replies: readonly { done: Finished; reply: Reply }[],
): void {
  admission?.session.record({
    id,
    route: 'chat',
    promptIds: request.prompt,
    version,
    messages: request.messages,
    ...(request.continues ? { continues: request.continues } : {}),
    ...(request.drift ? { drift: request.drift } : {}),
    choices: replies.map(({ done, reply: r }) => ({
      tokens: done.tokens,
      logprobs: done.logprobs,
      finishReason: r.finishReason,
      text: done.text,
      message: {
        role: 'assistant',
        content: r.content,
        ...(r.toolCalls.length > 0 ? { toolCalls: r.toolCalls.map((c) => ({ id: c.id, ...c.function })) } : {}),
      },
    })),
  });
}

/**
 * Answers `POST /v1/chat/completions`: renders the messages with the template, samples `n` assistant turns and
 * parses tool calls of the offered tools (unless `tool_choice` is `none`); `return_token_ids` adds
 * `prompt_token_ids` and per-choice `token_ids`. With `stream: true` the answer is a stream of
 * `chat.completion.chunk`s ({@link streamChat}). In session `sessionId` (`/sessions/{id}/v1/…`), a valid call opens
 * the session, reserves its tokens there (prompt and `n × max_tokens`) and is recorded.
 */
export async function chatCompletions(server: ServeContext, body: JsonObject, signal: AbortSignal, sessionId?: string): Promise<unknown> {
  const session = sessionId === undefined ? undefined : server.sessions.find(sessionId);
  const request = readChatRequest(server, session?.withDefaults(body) ?? body, session);
  const admission =
    session === undefined ? undefined : server.sessions.admit(session, request.prompt.length + request.sampling.n * request.maxTokens);
  if (request.stream.stream) return streamChat(request, signal, admission);
  try {
    return await answerChat(request, signal, admission);
  } finally {
    admission?.end();
  }
}

/** The whole answer at once. */
async function answerChat(request: ChatRequest, signal: AbortSignal, admission: Admission | undefined): Promise<unknown> {
  const { ctx, sampling, prompt, wantLogprobs } = request;
  const { responses, version } = await sample(ctx, [prompt], request.maxTokens, sampling, request.topK, signal);
  const base = envelope(ctx, 'chatcmpl', 'chat.completion', version);
  let completionTokens = 0;
  const replies: { done: Finished; reply: Reply }[] = [];
  const choices = await mapInTurns(responses, (response, index) => {
    const done = finish(ctx, response, sampling);
    completionTokens += response.tokens.length;
    const r = reply(ctx, done, request.tools, request.parseTools, String(base.id), index);
    replies.push({ done, reply: r });
    const { content, toolCalls, finishReason } = r;
    return {
      index,
      message: {
        role: 'assistant',
        content: content === '' && (toolCalls.length > 0 || r.reasoning !== undefined) ? null : content,
        ...(r.reasoning === undefined ? {} : { reasoning_content: r.reasoning }),
        refusal: null,
        ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
      },
      finish_reason: finishReason,
      logprobs: wantLogprobs
        ? { content: logprobContent(ctx, done.tokens, done.logprobs, done.top, sampling.tokensAsIds), refusal: null }
        : null,
      ...(sampling.returnTokenIds ? { token_ids: done.tokens } : {}),
    };
  });
  recordCall(request, admission, String(base.id), version, replies);
  return {
    ...base,
    choices,
    ...(sampling.returnTokenIds ? { prompt_token_ids: prompt } : {}),
    usage: { prompt_tokens: prompt.length, completion_tokens: completionTokens, total_tokens: prompt.length + completionTokens },
  };
}

/**
 * The streamed answer: a first chunk per choice with the role, content deltas as tokens are sampled (with their
 * `logprobs` and vLLM's `token_ids` when asked), then a chunk with the finish reason, `policy_version` and
 * `system_fingerprint`, and with `stream_options.include_usage` a last chunk with `usage` and no choices.
 * When tool calls are parsed, or top alternatives scored, a choice's deltas come once it is complete (its text has
 * to be whole to be parsed or scored); tool calls come as one `tool_calls` delta per choice.
 */
function streamChat(request: ChatRequest, signal: AbortSignal, admission: Admission | undefined): EventStream {
  const { ctx, sampling, prompt, wantLogprobs } = request;
  const live = !request.parseTools && request.topK === 0;
  return new EventStream(async (sink: EventSink) => {
    try {
      const { id, created } = envelope(ctx, 'chatcmpl', 'chat.completion.chunk', ctx.engine.version);
      const head = { id, object: 'chat.completion.chunk', created, model: ctx.modelName };
      const tops: (Finished | undefined)[] = [];
      const thinking = Array.from({ length: sampling.n }, () =>
        ctx.reasoningParser ? new ReasoningStream(ctx.reasoningParser) : undefined,
      );
      const chunk = (index: number, delta: unknown, extra: Record<string, unknown> = {}): void =>
        sink.send({ ...head, choices: [{ index, delta, logprobs: null, finish_reason: null, ...extra }] });
      const content = (
        index: number,
        text: string | ReasoningDelta,
        tokens: readonly number[],
        logprobs: readonly number[],
        top: Finished['top'],
      ): void =>
        chunk(index, typeof text === 'string' ? { content: text } : reasoningDelta(text), {
          logprobs: wantLogprobs ? { content: logprobContent(ctx, tokens, logprobs, top, sampling.tokensAsIds), refusal: null } : null,
          ...(sampling.returnTokenIds ? { token_ids: tokens } : {}),
        });
      const streams = Array.from({ length: sampling.n }, (_, index) => {
        sink.send({
          ...head,
          choices: [{ index, delta: { role: 'assistant', content: '' }, logprobs: null, finish_reason: null }],
          ...(index === 0 && sampling.returnTokenIds ? { prompt_token_ids: prompt } : {}),
        });
        const emit = (piece: StreamPiece): void => {
          const split = thinking[index]?.push(piece.text);
          if (worthSending(piece, sampling, wantLogprobs) || (split !== undefined && split.reasoning + split.content !== ''))
            content(
              index,
              split ?? piece.text,
              piece.tokens,
              piece.logprobs,
              tops[index]?.top?.slice(piece.first, piece.first + piece.tokens.length),
            );
        };
        return new LiveChoice(ctx.tokenizer, sampling.stop, emit, () => sink.room);
      });
      sink.onDrain(() => streams.forEach((s) => s.flush()));
      const { responses, version } = await sample(
        ctx,
        [prompt],
        request.maxTokens,
        sampling,
        request.topK,
        signal,
        undefined,
        live ? (i, t, lp) => streams[i].push(t, lp) : undefined,
      );
      let completionTokens = 0;
      const replies: { done: Finished; reply: Reply }[] = [];
      for (const [index, response] of responses.entries()) {
        const done = finish(ctx, response, sampling);
        completionTokens += response.tokens.length;
        tops[index] = done;
        const r = reply(ctx, done, request.tools, request.parseTools, String(id), index);
        replies.push({ done, reply: r });
        if (r.toolCalls.length === 0) {
          streams[index].end(done);
          await drainChoice(streams[index], sink);
          const rest = thinking[index]?.end();
          if (rest !== undefined && rest.reasoning + rest.content !== '') chunk(index, reasoningDelta(rest));
        } else {
          await sink.drained();
          if (r.content !== '' || r.reasoning !== undefined || wantLogprobs || sampling.returnTokenIds)
            content(index, { reasoning: r.reasoning ?? '', content: r.content }, done.tokens, done.logprobs, done.top);
          chunk(index, { tool_calls: r.toolCalls.map((call, i) => ({ index: i, ...call })) });
        }
        sink.send({
          ...head,
          system_fingerprint: `rxrl-v${version}`,
          policy_version: version,
          choices: [{ index, delta: {}, logprobs: null, finish_reason: r.finishReason }],
        });
      }
      recordCall(request, admission, String(id), version, replies);
      if (request.stream.includeUsage) {
        sink.send({
          ...head,
          choices: [],
          usage: { prompt_tokens: prompt.length, completion_tokens: completionTokens, total_tokens: prompt.length + completionTokens },
        });
      }
    } finally {
      admission?.end();
    }
  });
}

/** A streamed delta of a reasoning parser's split: `reasoning_content`, `content`, or both. */
function reasoningDelta(delta: ReasoningDelta): Record<string, string> {
  return {
    ...(delta.reasoning === '' ? {} : { reasoning_content: delta.reasoning }),
    ...(delta.content === '' && delta.reasoning !== '' ? {} : { content: delta.content }),
  };
}
