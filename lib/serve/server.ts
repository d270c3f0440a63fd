/**
 * `rxrl serve`: an OpenAI-compatible HTTP server for the embedded policy, on node's `http`.
 *
 * | route | what |
 * | --- | --- |
 * | `GET /health` | `{ status: 'ok', policy_version }` (503 while closing) |
 * | `GET /v1/models`, `GET /v1/models/{id}` | the served model |
 * | `POST /v1/completions` | prompt as text, token ids or a list of either; `n`, `max_tokens`, `temperature`, `top_p`, `stop`, `seed`, `logprobs` |
 * | `POST /v1/chat/completions` | the bundled chat template; `tools` / `tool_calls` in the `name(args)` text format |
 * | `POST /update_weights_from_disk` | SGLang's API: `{ model_path, weight_version? }` loads a safetensors checkpoint as a new version |
 *
 * vLLM's extensions are understood: `return_tokens_as_token_ids` (log-prob tokens spelled `token_id:<id>`),
 * `return_token_ids` (`token_ids` per choice and `prompt_token_ids`), `stop_token_ids` and
 * `include_stop_str_in_output`. Every response carries `policy_version` (and `system_fingerprint`
 * `rxrl-v<version>`): the version of the weights that produced it.
 *
 * Concurrent requests are gathered into batched generations by a {@link LocalEngine}; a weight update waits for
 * the running batch, so no response mixes two versions. A request whose client disconnects is cancelled.
 * Malformed requests get OpenAI-style JSON errors with 4xx statuses; the server never crashes on bad input.
 * Generated tokens include the stop token (so a trainer sees the policy end its turn); the text never does.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';

import { createChatTemplate, type ChatTemplate } from '../chat/template.js';
import { isToolName } from '../chat/toolCalls.js';
import type { ChatMessage, ChatRole, ChatTool, ToolCall, ToolParameters } from '../chat/types.js';
import { LocalEngine } from '../engine/local.js';
import type { GenerateRequest, GenerateResponse, Tokenizer } from '../engine/types.js';
import { ConfigError, DecodeError, ShapeError, isAbortError } from '../errors.js';
import { loadSafetensors } from '../model/safetensors.js';
import type { PolicyModel } from '../model/transformer.js';
import { hashSeed } from '../random.js';
import type { PolicyVersion } from '../types.js';
import {
  RequestError,
  absent,
  errorBody,
  invalid,
  parseJsonObject,
  readBoolean,
  readInteger,
  readNumber,
  readStop,
  readString,
  readTokenIds,
  refuse,
  type JsonObject,
} from './protocol.js';
import { ServingModel, type TopLogprob } from './servingModel.js';

/** Default name of the served model. */
export const DEFAULT_MODEL_NAME = 'rxrl-policy';

/** Most alternatives per position a request may ask for (`logprobs`, `top_logprobs`). */
export const MAX_TOP_LOGPROBS = 20;

/** A structured log line of the server. */
export type ServeLogger = (record: Readonly<Record<string, unknown>>) => void;

/** Options of {@link serve}. */
export interface ServeOptions {
  /** The policy to serve. The server reads and replaces its weights; the caller disposes of it after `close`. */
  readonly model: PolicyModel;
  /** Tokenizer of the policy. */
  readonly tokenizer: Tokenizer;
  /** Name clients put in `model`. Default {@link DEFAULT_MODEL_NAME}. */
  readonly modelName?: string;
  /** Interface to bind. Default `127.0.0.1` (loopback only). */
  readonly host?: string;
  /** TCP port; 0 picks a free one. Default 0. */
  readonly port?: number;
  /** Version of the weights the model holds. Default 0. */
  readonly version?: PolicyVersion;
  /** Most samples in one batched generation. Default 256. */
  readonly maxBatchSize?: number;
  /** How long an idle engine waits for more requests before starting a batch, in ms. Default 5. */
  readonly maxWaitMs?: number;
  /** Chat template. Default: {@link createChatTemplate} over the tokenizer. */
  readonly chatTemplate?: ChatTemplate;
  /** Largest request body, in bytes. Default 4 MiB. */
  readonly maxBodyBytes?: number;
  /** Largest `n` (samples per prompt). Default 128. */
  readonly maxN?: number;
  /** Receives one record per request and per weight update. Default: silent. */
  readonly log?: ServeLogger;
  /** Closes the server when it fires. */
  readonly signal?: AbortSignal;
}

/** A running server. */
export interface RxrlServer {
  /** Origin, e.g. `http://127.0.0.1:41234` (health and weight updates live here). */
  readonly url: string;
  /** Base URL of the OpenAI API: `${url}/v1`. */
  readonly baseURL: string;
  /** The bound port. */
  readonly port: number;
  /** Served model name. */
  readonly modelName: string;
  /** The engine that batches the requests. */
  readonly engine: LocalEngine;
  /** Version of the weights being served. */
  readonly version: PolicyVersion;
  /** Stops listening, cancels requests in flight and resolves once every connection is closed. Idempotent. */
  close(): Promise<void>;
}

interface Context {
  readonly engine: LocalEngine;
  readonly serving: ServingModel;
  readonly tokenizer: Tokenizer;
  readonly template: ChatTemplate;
  readonly modelName: string;
  readonly maxSeqLen: number;
  readonly maxN: number;
  readonly maxBodyBytes: number;
  readonly created: number;
  readonly log: ServeLogger;
  closing: boolean;
}

/**
 * Starts an OpenAI-compatible server for `options.model`.
 *
 * @example
 * ```ts
 * import OpenAI from 'openai';
 * import { CharTokenizer, PolicyModel, serve } from 'rxrl';
 * const tokenizer = new CharTokenizer('abcde=');
 * const model = PolicyModel.create({ vocabSize: tokenizer.vocabSize, dModel: 64, nLayers: 2, nHeads: 4, dFF: 256, maxSeqLen: 24 }, 1);
 * const server = await serve({ model, tokenizer });
 * const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
 * const out = await client.completions.create({ model: server.modelName, prompt: 'abcd=', max_tokens: 5, n: 4, logprobs: 1 });
 * await server.close();
 * ```
 * @param options - the model, its tokenizer, the address and batching settings.
 * @returns the running server, once it listens.
 * @throws {@link ConfigError} for invalid options.
 */
export async function serve(options: ServeOptions): Promise<RxrlServer> {
  const host = options.host ?? '127.0.0.1';
  const port = options.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(`port must be an integer in [0, 65535], got ${port}`);
  const maxN = options.maxN ?? 128;
  const maxBodyBytes = options.maxBodyBytes ?? 4 * 1024 * 1024;
  if (!Number.isInteger(maxN) || maxN < 1) throw new ConfigError(`maxN must be an integer >= 1, got ${maxN}`);
  if (!Number.isInteger(maxBodyBytes) || maxBodyBytes < 1) throw new ConfigError(`maxBodyBytes must be an integer >= 1, got ${maxBodyBytes}`);
  const modelName = options.modelName ?? DEFAULT_MODEL_NAME;
  const serving = new ServingModel(options.model);
  const engine = new LocalEngine(serving, {
    tokenizer: options.tokenizer,
    modelTag: modelName,
    maxBatchSize: options.maxBatchSize ?? 256,
    maxWaitMs: options.maxWaitMs ?? 5,
    version: options.version ?? 0,
  });
  const ctx: Context = {
    engine,
    serving,
    tokenizer: options.tokenizer,
    template: options.chatTemplate ?? createChatTemplate(options.tokenizer),
    modelName,
    maxSeqLen: options.model.config.maxSeqLen,
    maxN,
    maxBodyBytes,
    created: Math.floor(Date.now() / 1000),
    log: options.log ?? (() => undefined),
    closing: false,
  };
  const server = createServer((req, res) => {
    handle(ctx, req, res).catch((error: unknown) => {
      ctx.log({ event: 'internal_error', error: String(error) });
      sendJson(res, 500, errorBody('internal server error', 'server_error'));
    });
  });
  server.on('clientError', (_error, socket) => {
    if (socket.writable) socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
    else socket.destroy();
  });
  await listen(server, port, host);
  const address = server.address() as AddressInfo;
  const url = `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closed ??= new Promise<void>((resolve) => {
      ctx.closing = true;
      server.close(() => resolve());
      server.closeAllConnections();
    });
    return closed;
  };
  options.signal?.addEventListener('abort', () => void close(), { once: true });
  if (options.signal?.aborted) await close();
  return {
    url,
    baseURL: `${url}/v1`,
    port: address.port,
    modelName,
    engine,
    get version() {
      return engine.version;
    },
    close,
  };
}

function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}

async function handle(ctx: Context, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const controller = new AbortController();
  res.on('close', () => {
    if (!res.writableFinished) controller.abort(new Error('client disconnected'));
  });
  const path = (req.url ?? '/').split('?')[0].replace(/\/+$/, '') || '/';
  const method = req.method ?? 'GET';
  const started = performance.now();
  let status = 200;
  try {
    if (ctx.closing) throw new RequestError(503, 'server is shutting down', { type: 'server_error', code: 'unavailable' });
    const result = await route(ctx, method, path, req, controller.signal);
    sendJson(res, 200, result);
  } catch (error) {
    if (controller.signal.aborted && isAbortError(error)) {
      status = 499;
      return;
    }
    const refused = asRequestError(error);
    if (refused === undefined) throw error;
    status = refused.status;
    const body = path === '/update_weights_from_disk' ? { success: false, message: refused.message, ...refused.toBody() } : refused.toBody();
    sendJson(res, refused.status, body, refused.status === 413 ? { connection: 'close' } : {});
  } finally {
    ctx.log({ event: 'request', method, path, status, ms: Math.round(performance.now() - started) });
  }
}

/** Errors that describe a bad request (rather than a server bug), as a {@link RequestError}. */
function asRequestError(error: unknown): RequestError | undefined {
  if (error instanceof RequestError) return error;
  if (error instanceof DecodeError || error instanceof ShapeError || error instanceof ConfigError) {
    return new RequestError(400, error.message, { code: 'invalid_value' }, { cause: error });
  }
  return undefined;
}

async function route(ctx: Context, method: string, path: string, req: IncomingMessage, signal: AbortSignal): Promise<unknown> {
  const expect = (allowed: string): void => {
    if (method !== allowed) {
      throw new RequestError(405, `${method} is not allowed on ${path}; use ${allowed}`, { code: 'method_not_allowed' });
    }
  };
  if (path === '/health') {
    expect('GET');
    return { status: 'ok', model: ctx.modelName, policy_version: ctx.engine.version };
  }
  if (path === '/v1/models') {
    expect('GET');
    return { object: 'list', data: [modelCard(ctx)] };
  }
  if (path.startsWith('/v1/models/')) {
    expect('GET');
    const id = decodeURIComponent(path.slice('/v1/models/'.length));
    if (id !== ctx.modelName) throw new RequestError(404, `The model '${id}' does not exist`, { param: 'model', code: 'model_not_found' });
    return modelCard(ctx);
  }
  if (path === '/v1/completions') {
    expect('POST');
    return completions(ctx, parseJsonObject(await readBody(req, ctx.maxBodyBytes)), signal);
  }
  if (path === '/v1/chat/completions') {
    expect('POST');
    return chatCompletions(ctx, parseJsonObject(await readBody(req, ctx.maxBodyBytes)), signal);
  }
  if (path === '/update_weights_from_disk') {
    expect('POST');
    return updateWeights(ctx, parseJsonObject(await readBody(req, ctx.maxBodyBytes)));
  }
  throw new RequestError(404, `no route ${method} ${path}`, { code: 'not_found' });
}

function modelCard(ctx: Context): Record<string, unknown> {
  return {
    id: ctx.modelName,
    object: 'model',
    created: ctx.created,
    owned_by: 'rxrl',
    max_model_len: ctx.maxSeqLen,
    policy_version: ctx.engine.version,
  };
}

function readBody(req: IncomingMessage, limit: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    req.on('data', (chunk: Buffer) => {
      if (over) return;
      size += chunk.length;
      if (size > limit) {
        over = true;
        chunks.length = 0;
        reject(new RequestError(413, `request body is larger than ${limit} bytes`, { code: 'request_too_large' }));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!over) resolve(Buffer.concat(chunks).toString('utf8'));
    });
    req.on('error', reject);
  });
}

function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const text = JSON.stringify(body);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text), ...headers });
  res.end(text);
}

// ── sampling parameters shared by both endpoints ──────────────────────────────────

interface Sampling {
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

function checkModel(ctx: Context, body: JsonObject): void {
  const model = readString(body, 'model');
  if (model !== ctx.modelName) throw new RequestError(404, `The model '${model}' does not exist`, { param: 'model', code: 'model_not_found' });
}

function readSampling(ctx: Context, body: JsonObject): Sampling {
  refuse(body, 'stream', (v) => v === false, 'streaming');
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
  return {
    n,
    temperature: readNumber(body, 'temperature', 0, 2, 1),
    topP: readNumber(body, 'top_p', 0, 1, 1, true),
    seed: readInteger(body, 'seed', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER),
    stop,
    stopTokens: [...new Set([ctx.tokenizer.eosId, ...single, ...readTokenIds(body, 'stop_token_ids', V)])],
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

function checkContext(ctx: Context, promptLength: number, maxTokens: number, param: string): void {
  if (promptLength === 0) throw invalid(param, 'the prompt is empty');
  if (promptLength + maxTokens > ctx.maxSeqLen) {
    throw invalid(
      param,
      `This model's maximum context length is ${ctx.maxSeqLen} tokens; the prompt has ${promptLength} tokens and ${maxTokens} new tokens were requested`,
      'context_length_exceeded',
    );
  }
}

/** A finished sample after stop strings are applied. */
interface Finished {
  readonly tokens: number[];
  readonly logprobs: number[];
  readonly top: TopLogprob[][] | undefined;
  readonly text: string;
  /** Character offset of each kept token in `text`. */
  readonly offsets: number[];
  readonly finishReason: 'stop' | 'length';
}

function tokenText(ctx: Context, token: number): string {
  const { padId, bosId, eosId } = ctx.tokenizer;
  return token === padId || token === bosId || token === eosId ? '' : ctx.tokenizer.decode([token]);
}

function tokenLabel(ctx: Context, token: number, asId: boolean): string {
  if (asId) return `token_id:${token}`;
  const { padId, bosId, eosId } = ctx.tokenizer;
  if (token === eosId) return '<eos>';
  if (token === bosId) return '<bos>';
  if (token === padId) return '<pad>';
  return ctx.tokenizer.decode([token]);
}

/** Applies stop strings: the text and the tokens end before the first stop string (or after it, if asked). */
function finish(ctx: Context, response: GenerateResponse, sampling: Sampling): Finished {
  const top = ctx.serving.topLogprobs(response);
  let text = '';
  const offsets: number[] = [];
  for (let j = 0; j < response.tokens.length; j++) {
    offsets.push(text.length);
    text += tokenText(ctx, response.tokens[j]);
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
      const keep = sampling.includeStop ? j + 1 : offsets.filter((o, i) => o + tokenText(ctx, response.tokens[i]).length <= at).length;
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

async function sample(
  ctx: Context,
  prompts: readonly number[][],
  maxTokens: number,
  sampling: Sampling,
  topK: number,
  signal: AbortSignal,
): Promise<{ responses: GenerateResponse[]; version: PolicyVersion }> {
  const requests: GenerateRequest[] = [];
  prompts.forEach((promptTokens, p) => {
    for (let i = 0; i < sampling.n; i++) {
      const request: GenerateRequest = {
        promptTokens,
        maxTokens,
        temperature: sampling.temperature,
        topP: sampling.topP,
        stopTokens: sampling.stopTokens,
        seed: choiceSeed(sampling.seed, p * sampling.n + i),
      };
      ctx.serving.requestTopLogprobs(request, topK);
      requests.push(request);
    }
  });
  const responses = await ctx.engine.generate(requests, signal);
  return { responses, version: Math.min(...responses.map((r) => r.policyVersion)) };
}

function envelope(ctx: Context, prefix: string, object: string, version: PolicyVersion): Record<string, unknown> {
  return {
    id: `${prefix}-${randomUUID().replaceAll('-', '')}`,
    object,
    created: Math.floor(Date.now() / 1000),
    model: ctx.modelName,
    system_fingerprint: `rxrl-v${version}`,
    policy_version: version,
  };
}

// ── /v1/completions ─────────────────────────────────────────────────────────────

function readPrompts(ctx: Context, body: JsonObject): number[][] {
  const prompt = body.prompt;
  const V = ctx.tokenizer.vocabSize;
  const isIds = (x: unknown): x is number[] => Array.isArray(x) && x.length > 0 && x.every((t) => Number.isInteger(t) && t >= 0 && t < V);
  const encode = (text: string, param: string): number[] => {
    try {
      return ctx.tokenizer.encode(text, { addBos: true });
    } catch (cause) {
      throw invalid(param, `${param}: ${cause instanceof Error ? cause.message : String(cause)}`);
    }
  };
  if (typeof prompt === 'string') return [encode(prompt, 'prompt')];
  if (isIds(prompt)) return [[...prompt]];
  if (Array.isArray(prompt) && prompt.length > 0) {
    if (prompt.every((p) => typeof p === 'string')) return prompt.map((p, i) => encode(p as string, `prompt[${i}]`));
    if (prompt.every(isIds)) return prompt.map((p) => [...(p as number[])]);
  }
  throw invalid(
    'prompt',
    `'prompt' must be a string, a non-empty array of token ids in [0, ${V}), or a non-empty array of either`,
    absent(body, 'prompt') ? 'missing_required_parameter' : 'invalid_type',
  );
}

async function completions(ctx: Context, body: JsonObject, signal: AbortSignal): Promise<unknown> {
  checkModel(ctx, body);
  refuse(body, 'echo', (v) => v === false, 'echo');
  refuse(body, 'suffix', (v) => v === '', 'suffix');
  const sampling = readSampling(ctx, body);
  refuse(body, 'best_of', (v) => v === sampling.n, 'best_of other than n');
  const prompts = readPrompts(ctx, body);
  const maxTokens = readInteger(body, 'max_tokens', 0, ctx.maxSeqLen, Math.max(0, Math.min(16, ctx.maxSeqLen - Math.max(...prompts.map((p) => p.length)))));
  prompts.forEach((p) => checkContext(ctx, p.length, maxTokens, 'max_tokens'));
  const logprobs = readInteger(body, 'logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize));
  const { responses, version } = await sample(ctx, prompts, maxTokens, sampling, logprobs ?? 0, signal);
  let completionTokens = 0;
  const choices = responses.map((response, index) => {
    const done = finish(ctx, response, sampling);
    completionTokens += response.tokens.length;
    const label = (t: number): string => tokenLabel(ctx, t, sampling.tokensAsIds);
    return {
      index,
      text: done.text,
      finish_reason: done.finishReason,
      logprobs:
        logprobs === undefined
          ? null
          : {
              tokens: done.tokens.map(label),
              token_logprobs: done.logprobs,
              top_logprobs: done.tokens.map((t, j) => {
                const entries: Record<string, number> = {};
                for (const alt of done.top?.[j] ?? []) entries[label(alt.token)] = alt.logprob;
                entries[label(t)] = done.logprobs[j];
                return entries;
              }),
              text_offset: done.offsets,
            },
      ...(sampling.returnTokenIds ? { token_ids: done.tokens, prompt_token_ids: prompts[Math.floor(index / sampling.n)] } : {}),
    };
  });
  const promptTokens = prompts.reduce((sum, p) => sum + p.length, 0);
  return {
    ...envelope(ctx, 'cmpl', 'text_completion', version),
    choices,
    usage: { prompt_tokens: promptTokens, completion_tokens: completionTokens, total_tokens: promptTokens + completionTokens },
  };
}

// ── /v1/chat/completions ────────────────────────────────────────────────────────

function readContent(value: unknown, param: string, nullable: boolean): string {
  if (typeof value === 'string') return value;
  if ((value === null || value === undefined) && nullable) return '';
  if (Array.isArray(value)) {
    return value
      .map((part, i) => {
        if (typeof part !== 'object' || part === null || (part as { type?: unknown }).type !== 'text' || typeof (part as { text?: unknown }).text !== 'string') {
          throw new RequestError(400, `${param}[${i}]: only text content parts are supported`, { param: `${param}[${i}]`, code: 'unsupported_content' });
        }
        return (part as { text: string }).text;
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
    throw invalid('messages', "'messages' must be a non-empty array", absent(body, 'messages') ? 'missing_required_parameter' : 'invalid_type');
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
    if (role === 'tool' && typeof m.tool_call_id !== 'string') throw invalid(`${where}.tool_call_id`, `${where}.tool_call_id must be a string`);
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
    const fn = typeof raw === 'object' && raw !== null && (raw as { type?: unknown }).type === 'function' ? (raw as { function?: unknown }).function : undefined;
    if (typeof fn !== 'object' || fn === null) throw invalid(where, `${where} must be { type: 'function', function: { name, parameters? } }`);
    const { name, description, parameters } = fn as { name?: unknown; description?: unknown; parameters?: unknown };
    if (typeof name !== 'string' || !isToolName(name)) throw invalid(`${where}.function.name`, `${where}.function.name must match [A-Za-z_][A-Za-z0-9_]*`);
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

async function chatCompletions(ctx: Context, body: JsonObject, signal: AbortSignal): Promise<unknown> {
  checkModel(ctx, body);
  const sampling = readSampling(ctx, body);
  const messages = readMessages(body);
  const tools = readTools(body);
  const parseTools = readToolChoice(body) && tools.length > 0;
  let prompt: number[];
  try {
    prompt = ctx.template.render(messages, tools, { addGenerationPrompt: true });
  } catch (error) {
    const index = error instanceof DecodeError ? error.context.message : undefined;
    throw invalid(typeof index === 'number' ? `messages[${index}].content` : 'messages', error instanceof Error ? error.message : String(error));
  }
  const limit = ctx.maxSeqLen - prompt.length;
  const maxTokens =
    readInteger(body, 'max_completion_tokens', 0, ctx.maxSeqLen) ?? readInteger(body, 'max_tokens', 0, ctx.maxSeqLen) ?? Math.max(limit, 0);
  checkContext(ctx, prompt.length, maxTokens, absent(body, 'max_completion_tokens') ? 'max_tokens' : 'max_completion_tokens');
  const wantLogprobs = readBoolean(body, 'logprobs', false);
  const topK = readInteger(body, 'top_logprobs', 0, Math.min(MAX_TOP_LOGPROBS, ctx.tokenizer.vocabSize), 0);
  if (topK > 0 && !wantLogprobs) throw invalid('top_logprobs', "'top_logprobs' needs 'logprobs': true");
  const { responses, version } = await sample(ctx, [prompt], maxTokens, sampling, topK, signal);
  const base = envelope(ctx, 'chatcmpl', 'chat.completion', version);
  let completionTokens = 0;
  const choices = responses.map((response, index) => {
    const done = finish(ctx, response, sampling);
    completionTokens += response.tokens.length;
    const parsed = parseTools ? ctx.template.parse(done.text, tools) : { content: done.text, toolCalls: [] };
    const toolCalls = parsed.toolCalls.map((call, i) => ({
      id: `call_${String(base.id).slice(-12)}_${index}_${i}`,
      type: 'function' as const,
      function: { name: call.name, arguments: call.arguments },
    }));
    const label = (t: number): string => tokenLabel(ctx, t, sampling.tokensAsIds);
    return {
      index,
      message: {
        role: 'assistant',
        content: parsed.content === '' && toolCalls.length > 0 ? null : parsed.content,
        refusal: null,
        ...(toolCalls.length > 0 ? { tool_calls: toolCalls } : {}),
      },
      finish_reason: toolCalls.length > 0 ? 'tool_calls' : done.finishReason,
      logprobs: wantLogprobs
        ? {
            content: done.tokens.map((t, j) => ({
              token: label(t),
              logprob: done.logprobs[j],
              bytes: [...Buffer.from(label(t), 'utf8')],
              top_logprobs: (done.top?.[j] ?? []).map((alt) => ({
                token: label(alt.token),
                logprob: alt.logprob,
                bytes: [...Buffer.from(label(alt.token), 'utf8')],
              })),
            })),
            refusal: null,
          }
        : null,
      ...(sampling.returnTokenIds ? { token_ids: done.tokens } : {}),
    };
  });
  return {
    ...base,
    choices,
    ...(sampling.returnTokenIds ? { prompt_token_ids: prompt } : {}),
    usage: { prompt_tokens: prompt.length, completion_tokens: completionTokens, total_tokens: prompt.length + completionTokens },
  };
}

// ── /update_weights_from_disk (SGLang) ───────────────────────────────────────────

/** Metadata key under which rxrl writes the policy version into a checkpoint. */
export const POLICY_VERSION_METADATA_KEY = 'rxrl.policyVersion';

async function updateWeights(ctx: Context, body: JsonObject): Promise<unknown> {
  const modelPath = readString(body, 'model_path');
  let file = modelPath;
  try {
    if ((await stat(modelPath)).isDirectory()) file = join(modelPath, 'model.safetensors');
  } catch (cause) {
    throw new RequestError(400, `model_path ${JSON.stringify(modelPath)} does not exist`, { param: 'model_path', code: 'not_found' }, { cause });
  }
  const { weights, metadata } = await loadSafetensors(file);
  const version = readVersion(body.weight_version, 'weight_version') ?? readVersion(metadata[POLICY_VERSION_METADATA_KEY], 'metadata') ?? ctx.engine.version + 1;
  await ctx.engine.loadWeights(version, weights);
  ctx.log({ event: 'weights', version, modelPath });
  return {
    success: true,
    message: `loaded ${file} as policy version ${version}`,
    weight_version: String(version),
    policy_version: version,
    num_paused_requests: 0,
  };
}

function readVersion(value: unknown, param: string): PolicyVersion | undefined {
  if (value === undefined || value === null) return undefined;
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) {
    throw invalid(param === 'metadata' ? 'model_path' : param, `${param} must be a non-negative integer version, got ${JSON.stringify(value)}`);
  }
  return n;
}
