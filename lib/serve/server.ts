/**
 * `rxrl serve`: an OpenAI-compatible HTTP server for the embedded policy, on node's `http`.
 *
 * | route | what |
 * | --- | --- |
 * | `GET /health` | `{ status: 'ok', policy_version }` (503 while closing) |
 * | `GET /metrics` | Prometheus text with vLLM's metric names (requests running, waiting, tokens, latencies) |
 * | `GET /v1/models`, `GET /v1/models/{id}` | the served model |
 * | `POST /v1/completions` | prompt as text, token ids or a list of either; `n`, `max_tokens`, `temperature`, |
 * |  | `top_p`, `stop`, `seed`, `logprobs` ({@link completions}) |
 * | `POST /v1/chat/completions` | the bundled chat template; `tools` / `tool_calls` in the `name(args)` text |
 * |  | format ({@link chatCompletions}) |
 * | `POST /update_weights_from_disk` | SGLang's API: `{ model_path, weight_version? }` loads a safetensors |
 * |  | checkpoint as a new version ({@link updateWeights}) |
 * | `POST /v1/load_lora_adapter` | vLLM's API: `{ lora_name, lora_path, load_inplace? }` serves a PEFT LoRA |
 * |  | directory as model `lora_name` on the shared base ({@link loadLoraAdapter}) |
 * | `POST /v1/unload_lora_adapter` | `{ lora_name }` |
 * | `/sessions/{id}/v1/…` | the routes above, recorded in session `id` (opened by its first valid call; each call |
 * |  | reserves its tokens there): token-exact multi-turn prompts, calls, trajectories ({@link SessionStore}) |
 * | `GET /sessions/{id}` | the calls and samples (`?mode=trajectory|transition`, `?discount=`); `DELETE` frees it |
 * | `POST /sessions/{id}/reward`, `POST /sessions/{id}/end` | `{ reward, call? }`; no more calls after the end |
 *
 * `"stream": true` answers both completion routes with server-sent events, as OpenAI does ({@link EventStream}):
 * text as it is sampled, `stream_options.include_usage`, `data: [DONE]` at the end; written as the client's
 * connection drains, so a slow reader cannot make the server pile up its stream.
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
import { ServeMetrics } from './metrics.js';
import type { ReasoningParserName } from './reasoning.js';
import { stat } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { createChatTemplate, type ChatTemplate } from '../chat/template.js';
import { LocalEngine } from '../engine/local.js';
import type { RolloutEngine } from '../engine/types.js';
import type { Tokenizer } from '../model/types.js';
import { AbortError, ConfigError, ContextLengthError, DecodeError, ShapeError, isAbortError } from '../core/errors.js';
import type { PolicyModel } from '../model/transformer.js';
import type { PolicyVersion } from '../core/types.js';
import { chatCompletions } from './chat.js';
import { completions } from './completions.js';
import type { ServeContext, ServeLogger } from './context.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, encodeJson, errorBody, excerpt, parseJsonObject, type JsonObject } from './protocol.js';
import { addAdapter, loadLoraAdapter, modelContext, unloadLoraAdapter } from './adapters.js';
import { ServingModel } from './servingModel.js';
import { SessionStore, postReward, sessionJson, type SessionLimits } from './sessions.js';
import { listen, readBody, sameSecret, sendEncoded, sendJson } from './http.js';
import { EventStream, type EventSink } from './stream.js';
import { updateWeights } from './weights.js';

/** Default name of the served model. */
export const DEFAULT_MODEL_NAME = 'rxrl-policy';

export { MAX_TOP_LOGPROBS } from './context.js';
export type { ServeLogger } from './context.js';

/** Options of {@link serve}. */
export interface ServeOptions {
  /**
   * The policy to serve (or `engine`). The server reads and replaces its weights; the caller disposes of it after
   * `close`.
   */
  readonly model?: PolicyModel | undefined;
  /**
   * An engine to serve instead of a model: a training run's (`LocalEngine` or an upstream OpenAI-compatible
   * server), so that agents reach it over HTTP. Weight updates, LoRA routes, `top_logprobs` and `prompt_logprobs`
   * are then refused (400); `maxModelLen` is required.
   */
  readonly engine?: RolloutEngine | undefined;
  /** Tokenizer of the policy. */
  readonly tokenizer: Tokenizer;
  /** Name clients put in `model`. Default {@link DEFAULT_MODEL_NAME}. */
  readonly modelName?: string | undefined;
  /** Interface to bind. Default `127.0.0.1` (loopback only). */
  readonly host?: string | undefined;
  /** TCP port; 0 picks a free one. Default 0. */
  readonly port?: number | undefined;
  /** Version of the weights the model holds. Default 0. */
  readonly version?: PolicyVersion | undefined;
  /** Most samples in one batched generation. Default 256. */
  readonly maxBatchSize?: number | undefined;
  /** How long an idle engine waits for more requests before starting a batch, in ms. Default 5. */
  readonly maxWaitMs?: number | undefined;
  /** Chat template. Default: {@link createChatTemplate} over the tokenizer. */
  readonly chatTemplate?: ChatTemplate | undefined;
  /** Largest request body, in bytes. Default 4 MiB. */
  readonly maxBodyBytes?: number | undefined;
  /**
   * Longest context served, prompt and completion (vLLM's `--max-model-len`). Default and upper bound: the
   * model's `maxSeqLen` (`max_position_embeddings`).
   */
  readonly maxModelLen?: number | undefined;
  /**
   * Confines `POST /update_weights_from_disk` to model directories below this directory (after resolving links);
   * others get 403. Default: any directory the process can read.
   */
  readonly weightsRoot?: string | undefined;
  /** As vLLM's `--api-key`: every route but `/health` and `/metrics` needs `Authorization: Bearer <key>` (else 401). */
  readonly apiKey?: string | undefined;
  /** Largest `n` (samples per prompt). Default 128. */
  readonly maxN?: number | undefined;
  /**
   * Most samples one request may ask for: prompts × `n` (a completions request may list many prompts). Others
   * get 400 before anything is encoded or queued, so one request cannot hold the engine for long. Default 4096.
   */
  readonly maxSamplesPerRequest?: number | undefined;
  /**
   * LoRA adapters to serve from the start, model name → PEFT directory (vLLM's `--lora-modules name=path`).
   * Each is a model of its own in `/v1/models` and in requests' `model`, computed on the shared base weights.
   */
  readonly loraModules?: Readonly<Record<string, string>> | undefined;
  /** Limits of `/sessions/{id}/v1/…` sessions (count, tokens, idle time). */
  readonly sessions?: SessionLimits | undefined;
  /**
   * vLLM's `--reasoning-parser`: a chat reply's `<think>…</think>` becomes `reasoning_content` (streamed as its own
   * deltas), the rest `content`. Default: none (the thinking stays in `content`).
   */
  readonly reasoningParser?: ReasoningParserName | undefined;
  /** Receives one record per request and per weight update. Default: silent. */
  readonly log?: ServeLogger | undefined;
  /** Closes the server when it fires. */
  readonly signal?: AbortSignal | undefined;
}

/** A running server. */
export interface RxrlServer<E extends RolloutEngine = LocalEngine> {
  /** Origin, e.g. `http://127.0.0.1:41234` (health and weight updates live here). */
  readonly url: string;
  /** Base URL of the OpenAI API: `${url}/v1`. */
  readonly baseURL: string;
  /** The bound port. */
  readonly port: number;
  /** Served model name. */
  readonly modelName: string;
  /** The engine that batches the requests (the one given, when `engine` was). */
  readonly engine: E;
  /** Recorded sessions (`/sessions/{id}/v1/…`). */
  readonly sessions: SessionStore;
  /** Version of the weights being served. */
  readonly version: PolicyVersion;
  /** Stops listening, cancels requests in flight and resolves once every connection is closed. Idempotent. */
  close(): Promise<void>;
}

/**
 * Starts an OpenAI-compatible server for `options.model`.
 *
 * @example
 * ```ts
 * import OpenAI from 'openai';
 * import { CharTokenizer, PolicyModel, serve } from 'rxrl';
 * const tokenizer = new CharTokenizer('abcde=');
 * const config = { vocabSize: tokenizer.vocabSize, dModel: 64, nLayers: 2, nHeads: 4, dFF: 256, maxSeqLen: 24 };
 * const model = PolicyModel.create(config, 1);
 * const server = await serve({ model, tokenizer });
 * const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
 * const out = await client.completions.create({ model: server.modelName, prompt: 'abcd=', max_tokens: 5, n: 4, logprobs: 1 });
 * await server.close();
 * ```
 * @param options - the model, its tokenizer, the address and batching settings.
 * @returns the running server, once it listens.
 * @throws {@link ConfigError} for invalid options.
 */
export async function serve(options: ServeOptions & { readonly model: PolicyModel }): Promise<RxrlServer>;
export async function serve(options: ServeOptions & { readonly engine: RolloutEngine }): Promise<RxrlServer<RolloutEngine>>;
export async function serve(options: ServeOptions): Promise<RxrlServer<RolloutEngine>> {
  const limits = await checkOptions(options);
  const ctx = serveContext(options, limits);
  for (const [name, path] of Object.entries(options.loraModules ?? {})) {
    try {
      await addAdapter(ctx, name, path);
    } catch (error) {
      disposeAdapters(ctx);
      throw error instanceof RequestError
        ? new ConfigError(`loraModules.${name}: ${error.message}`, { context: { key: `loraModules.${name}` }, cause: error })
        : error;
    }
  }
  const server = httpServer(ctx);
  await listen(server, limits.port, options.host ?? '127.0.0.1');
  const address = server.address() as AddressInfo;
  const url = `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`;
  let closed: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closed ??= new Promise<void>((resolve) => {
      ctx.closing = true;
      server.close(() => resolve());
      server.closeAllConnections();
    }).then(async () => {
      await Promise.all([...ctx.adapters.values()].map((a) => a.engine.idle()));
      disposeAdapters(ctx);
    });
    return closed;
  };
  options.signal?.addEventListener('abort', () => void close(), { once: true });
  if (options.signal?.aborted) await close();
  const engine = ctx.engine;
  return {
    url,
    baseURL: `${url}/v1`,
    port: address.port,
    modelName: ctx.modelName,
    engine,
    sessions: ctx.sessions,
    get version() {
      return engine.version;
    },
    close,
  };
}

/** The limits of {@link ServeOptions}, checked, with their defaults. */
interface ServeLimits {
  readonly port: number;
  readonly maxN: number;
  readonly maxBodyBytes: number;
  readonly maxSamplesPerRequest: number;
}

/** Checks the options ({@link ConfigError} for an invalid one) and resolves the limits' defaults. */
async function checkOptions(options: ServeOptions): Promise<ServeLimits> {
  const port = options.port ?? 0;
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new ConfigError(`port must be an integer in [0, 65535], got ${port}`);
  const maxN = options.maxN ?? 128;
  const maxBodyBytes = options.maxBodyBytes ?? 4 * 1024 * 1024;
  const maxSamplesPerRequest = options.maxSamplesPerRequest ?? 4096;
  if (!Number.isInteger(maxN) || maxN < 1) throw new ConfigError(`maxN must be an integer >= 1, got ${maxN}`);
  if (!Number.isInteger(maxSamplesPerRequest) || maxSamplesPerRequest < 1) {
    throw new ConfigError(`maxSamplesPerRequest must be an integer >= 1, got ${maxSamplesPerRequest}`);
  }
  if (!Number.isInteger(maxBodyBytes) || maxBodyBytes < 1)
    throw new ConfigError(`maxBodyBytes must be an integer >= 1, got ${maxBodyBytes}`);
  if (options.maxModelLen !== undefined && !(Number.isInteger(options.maxModelLen) && options.maxModelLen >= 1)) {
    throw new ConfigError(`maxModelLen must be an integer >= 1, got ${options.maxModelLen}`, { context: { key: 'maxModelLen' } });
  }
  if (options.weightsRoot !== undefined && !(await stat(options.weightsRoot).catch(() => undefined))?.isDirectory()) {
    throw new ConfigError(`weightsRoot ${options.weightsRoot} is not a directory`, { context: { key: 'weightsRoot' } });
  }
  if (options.apiKey !== undefined && options.apiKey.trim() === '')
    throw new ConfigError('apiKey must not be empty', { context: { key: 'apiKey' } });
  if ((options.model === undefined) === (options.engine === undefined))
    throw new ConfigError('serve needs a model or an engine (one of them)');
  if (options.engine !== undefined && options.maxModelLen === undefined) {
    throw new ConfigError('maxModelLen is required when serving an engine', { context: { key: 'maxModelLen' } });
  }
  return { port, maxN, maxBodyBytes, maxSamplesPerRequest };
}

/** The state every request handler reads: the engine (a new {@link LocalEngine} over `options.model`), limits, sessions. */
function serveContext(options: ServeOptions, limits: ServeLimits): ServeContext {
  const modelName = options.modelName ?? DEFAULT_MODEL_NAME;
  let own: ServeContext['own'];
  if (options.model !== undefined) {
    const serving = new ServingModel(options.model);
    const local = new LocalEngine(serving, {
      tokenizer: options.tokenizer,
      modelTag: modelName,
      maxBatchSize: options.maxBatchSize ?? 256,
      maxWaitMs: options.maxWaitMs ?? 5,
      version: options.version ?? 0,
    });
    own = { serving, engine: local };
  }
  return {
    engine: own?.engine ?? options.engine!,
    own,
    tokenizer: options.tokenizer,
    template: options.chatTemplate ?? createChatTemplate(options.tokenizer),
    modelName,
    adapters: new Map(),
    maxSeqLen: Math.min(options.model?.config.maxSeqLen ?? Infinity, options.maxModelLen ?? Infinity),
    maxN: limits.maxN,
    maxSamplesPerRequest: limits.maxSamplesPerRequest,
    maxBodyBytes: limits.maxBodyBytes,
    weightsRoot: options.weightsRoot,
    apiKey: options.apiKey,
    created: Math.floor(Date.now() / 1000),
    log: options.log ?? (() => undefined),
    sessions: new SessionStore(options.sessions),
    reasoningParser: options.reasoningParser,
    metrics: new ServeMetrics(modelName, () => own?.engine.queued ?? 0),
    closing: false,
  };
}

/** The HTTP server: each request to {@link handle}; requests node's parser refuses get an OpenAI-style error. */
function httpServer(ctx: ServeContext): Server {
  const server = createServer((req, res) => {
    handle(ctx, req, res).catch((error: unknown) => {
      ctx.log({ event: 'internal_error', error: String(error) });
      sendJson(res, 500, errorBody('internal server error', 'server_error'));
    });
  });
  server.on('clientError', (error: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || error.code === 'ECONNRESET') {
      socket.destroy();
      return;
    }
    // Requests node's parser refuses (garbage, headers past its limit) still get an OpenAI-style error body.
    const tooLarge = error.code === 'HPE_HEADER_OVERFLOW';
    const text = JSON.stringify(
      tooLarge
        ? errorBody('request headers are too large', 'invalid_request_error', null, 'headers_too_large')
        : errorBody('malformed HTTP request', 'invalid_request_error', null, 'bad_request'),
    );
    const status = tooLarge ? '431 Request Header Fields Too Large' : '400 Bad Request';
    socket.end(
      `HTTP/1.1 ${status}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`,
    );
  });
  return server;
}

/** Disposes every served adapter's view and weights (the base model is the caller's). */
function disposeAdapters(ctx: ServeContext): void {
  for (const served of ctx.adapters.values()) {
    served.view.dispose();
    served.adapter.dispose();
  }
  ctx.adapters.clear();
}

async function handle(ctx: ServeContext, req: IncomingMessage, res: ServerResponse): Promise<void> {
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
    const query = new URLSearchParams((req.url ?? '').split('?')[1] ?? '');
    const result = await route(ctx, method, path, query, req, controller.signal);
    if (result instanceof EventStream) await sendEvents(ctx, res, result, controller.signal);
    else if (result instanceof TextBody) res.writeHead(200, { 'content-type': result.contentType }).end(result.text);
    else sendEncoded(res, 200, await encodeJson(result));
  } catch (error) {
    if (controller.signal.aborted && isAbortError(error)) {
      status = 499;
      return;
    }
    const refused = asRequestError(error);
    if (refused === undefined) {
      status = 500; // answered (and logged) by the caller
      throw error;
    }
    status = refused.status;
    const sglang = path === '/update_weights_from_disk'; // SGLang clients read `success` and `message`
    const body = sglang ? { success: false, message: refused.message, ...refused.toBody() } : refused.toBody();
    sendJson(res, refused.status, body, refused.status === 413 ? { connection: 'close' } : {});
  } finally {
    ctx.log({
      event: 'request',
      method,
      path: excerpt(path, MAX_ERROR_MESSAGE_CHARS),
      status,
      ms: Math.round(performance.now() - started),
    });
  }
}

/** Errors that describe a bad request (rather than a server bug), as a {@link RequestError}. */
function asRequestError(error: unknown): RequestError | undefined {
  if (error instanceof RequestError) return error;
  if (error instanceof ContextLengthError) {
    return new RequestError(400, excerpt(error.message, MAX_ERROR_MESSAGE_CHARS), { code: 'context_length_exceeded' }, { cause: error });
  }
  if (error instanceof DecodeError || error instanceof ShapeError || error instanceof ConfigError) {
    return new RequestError(400, excerpt(error.message, MAX_ERROR_MESSAGE_CHARS), { code: 'invalid_value' }, { cause: error });
  }
  return undefined;
}

/** 405 unless the request's method is `allowed`. */
function expectMethod(method: string, path: string, allowed: string): void {
  if (method !== allowed) {
    throw new RequestError(405, `${method} is not allowed on ${excerpt(path)}; use ${allowed}`, { code: 'method_not_allowed' });
  }
}

async function route(
  ctx: ServeContext,
  method: string,
  path: string,
  query: URLSearchParams,
  req: IncomingMessage,
  signal: AbortSignal,
): Promise<unknown> {
  const expect = (allowed: string): void => expectMethod(method, path, allowed);
  if (path === '/health') {
    expect('GET');
    return { status: 'ok', model: ctx.modelName, policy_version: ctx.engine.version };
  }
  // As vLLM's: open like /health, for the scraper.
  if (path === '/metrics') {
    expect('GET');
    return new TextBody('text/plain; version=0.0.4; charset=utf-8', ctx.metrics.text());
  }
  if (ctx.apiKey !== undefined && !sameSecret(req.headers.authorization ?? '', `Bearer ${ctx.apiKey}`)) {
    throw new RequestError(401, 'missing or wrong API key (Authorization: Bearer <key>)', {
      type: 'authentication_error',
      code: 'invalid_api_key',
    });
  }
  // JSON only: a browser page can POST a form or text/plain to a loopback server without asking (no preflight).
  if (method === 'POST' && !/^application\/json\s*(;|$)/i.test(req.headers['content-type'] ?? '')) {
    throw new RequestError(415, `${excerpt(path)} accepts only 'content-type: application/json'`, { code: 'unsupported_media_type' });
  }
  const session = /^\/sessions\/([^/]+)(\/.*)?$/.exec(path);
  if (session !== null) return sessionRoute(ctx, method, decodePathSegment(session[1]), session[2] ?? '', query, req, signal);
  return v1Route(ctx, method, path, req, signal);
}

/**
 * `/sessions/{id}…`: `GET` (the calls and samples; `?mode=trajectory|transition`, `?discount=`), `DELETE` (frees
 * it), `POST …/reward`, `POST …/end`, and `…/v1/…` (the OpenAI routes, recorded in the session, which the first
 * call opens).
 */
async function sessionRoute(
  ctx: ServeContext,
  method: string,
  id: string,
  rest: string,
  query: URLSearchParams,
  req: IncomingMessage,
  signal: AbortSignal,
): Promise<unknown> {
  const path = `/sessions/${id}${rest}`;
  if (rest === '') {
    if (method === 'DELETE') return { id, object: 'session', deleted: ctx.sessions.delete(id) };
    expectMethod(method, path, 'GET');
    return sessionJson(ctx.sessions.get(id), query);
  }
  if (rest === '/reward') {
    expectMethod(method, path, 'POST');
    return postReward(ctx.sessions.get(id), await readJson(req, ctx.maxBodyBytes));
  }
  if (rest === '/end') {
    expectMethod(method, path, 'POST');
    const ended = ctx.sessions.get(id);
    ended.ended = true;
    return { id, object: 'session', ended: true, calls: ended.calls.length };
  }
  if (rest.startsWith('/v1/')) return v1Route(ctx, method, rest, req, signal, rest.startsWith('/v1/models') ? undefined : id);
  throw new RequestError(404, `no route ${method} ${excerpt(path)}`, { code: 'not_found' });
}

/** The OpenAI routes (`/v1/…`) and the weight routes; completions are recorded in session `session` when given. */
async function v1Route(
  ctx: ServeContext,
  method: string,
  path: string,
  req: IncomingMessage,
  signal: AbortSignal,
  session?: string,
): Promise<unknown> {
  const expect = (allowed: string): void => expectMethod(method, path, allowed);
  if (path === '/v1/models') {
    expect('GET');
    return { object: 'list', data: [ctx.modelName, ...ctx.adapters.keys()].map((id) => modelCard(ctx, id)) };
  }
  if (path.startsWith('/v1/models/')) {
    expect('GET');
    return modelCard(ctx, decodePathSegment(path.slice('/v1/models/'.length)));
  }
  if (path === '/v1/completions') {
    expect('POST');
    return completions(ctx, await readJson(req, ctx.maxBodyBytes), signal, session);
  }
  if (path === '/v1/chat/completions') {
    expect('POST');
    return chatCompletions(ctx, await readJson(req, ctx.maxBodyBytes), signal, session);
  }
  if (session !== undefined) throw new RequestError(404, `no route ${method} ${excerpt(path)} in a session`, { code: 'not_found' });
  if (path === '/update_weights_from_disk') {
    expect('POST');
    return updateWeights(ctx, await readJson(req, ctx.maxBodyBytes));
  }
  if (path === '/v1/load_lora_adapter') {
    expect('POST');
    return loadLoraAdapter(ctx, await readJson(req, ctx.maxBodyBytes));
  }
  if (path === '/v1/unload_lora_adapter') {
    expect('POST');
    return unloadLoraAdapter(ctx, await readJson(req, ctx.maxBodyBytes));
  }
  throw new RequestError(404, `no route ${method} ${excerpt(path)}`, { code: 'not_found' });
}

/** The request body as a JSON object (413 past `limit`, 400 when it is not one). */
async function readJson(req: IncomingMessage, limit: number): Promise<JsonObject> {
  return parseJsonObject((await readBody(req, limit)).toString('utf8'));
}

/** A percent-encoded path segment, decoded; 400 when its escapes are not UTF-8 (`decodeURIComponent` throws). */
function decodePathSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch (cause) {
    throw new RequestError(
      400,
      `the path segment '${excerpt(segment)}' is not valid percent-encoded UTF-8`,
      { code: 'invalid_path' },
      { cause },
    );
  }
}

/** The `/v1/models` card of the base model or of an adapter (with vLLM's `root` and `parent`); 404 for others. */
function modelCard(ctx: ServeContext, id: string): Record<string, unknown> {
  const served = modelContext(ctx, id);
  const adapter = ctx.adapters.get(id);
  return {
    id,
    object: 'model',
    created: ctx.created,
    owned_by: 'rxrl',
    root: adapter?.path ?? id,
    parent: adapter === undefined ? null : ctx.modelName,
    max_model_len: ctx.maxSeqLen,
    policy_version: served.engine.version,
  };
}

/**
 * Answers with server-sent events: each chunk as `data: <json>`, then `data: [DONE]`. An error once the stream
 * has begun is sent as a last `data: {"error": …}` event (the status is already 200); an abort (the client went
 * away) rethrows, so the request is logged as cancelled. The stream writes as the connection has room
 * ({@link eventSink}).
 */
async function sendEvents(ctx: ServeContext, res: ServerResponse, stream: EventStream, signal: AbortSignal): Promise<void> {
  let started = false;
  const begin = (): void => {
    if (started || res.destroyed) return;
    started = true;
    res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', connection: 'keep-alive' });
  };
  const { sink, close, stats } = eventSink(res, signal, begin);
  try {
    await stream.run(sink);
  } catch (error) {
    if (!started || (signal.aborted && isAbortError(error))) throw error;
    const refused = asRequestError(error);
    ctx.log({ event: 'stream_error', error: String(error) });
    sink.send(refused?.toBody() ?? errorBody('internal server error', 'server_error'));
  } finally {
    close();
    // How much the stream wrote, and the most it left waiting in the connection's buffer (a slow reader's cost).
    ctx.log({ event: 'stream', chunks: stats.chunks, bytes: stats.bytes, peak_buffered_bytes: stats.peakBuffered });
  }
  begin();
  if (!res.destroyed) res.end('data: [DONE]\n\n');
}

/**
 * The {@link EventSink} of a response: `send` writes a chunk and notes when `res.write` returns false (the
 * connection's buffer passed its high-water mark); `room` is false from then until `'drain'`; `drained` waits for
 * it and rejects once the client is gone (`signal`). `close` detaches it from the response; `stats` counts the
 * chunks and bytes written and the most bytes the response buffered.
 */
function eventSink(
  res: ServerResponse,
  signal: AbortSignal,
  begin: () => void,
): { sink: EventSink; close: () => void; stats: { chunks: number; bytes: number; peakBuffered: number } } {
  const stats = { chunks: 0, bytes: 0, peakBuffered: 0 };
  let room = true;
  const listeners: (() => void)[] = [];
  let waiting: { resolve: () => void; reject: (error: unknown) => void }[] = [];
  const settle = (error?: unknown): void => {
    const woken = waiting;
    waiting = [];
    for (const w of woken)
      if (error === undefined) w.resolve();
      else w.reject(error);
  };
  const gone = (): AbortError => new AbortError('the client went away', { cause: signal.reason });
  const onDrain = (): void => {
    room = true;
    for (const listener of listeners) listener();
    settle();
  };
  const onAbort = (): void => settle(gone());
  res.on('drain', onDrain);
  signal.addEventListener('abort', onAbort, { once: true });
  const sink: EventSink = {
    send(chunk) {
      begin();
      if (res.destroyed) return;
      const event = `data: ${JSON.stringify(chunk)}\n\n`;
      if (!res.write(event)) room = false;
      stats.chunks++;
      stats.bytes += Buffer.byteLength(event);
      stats.peakBuffered = Math.max(stats.peakBuffered, res.writableLength);
    },
    get room() {
      return room && !res.destroyed;
    },
    drained() {
      if (signal.aborted) return Promise.reject(gone());
      if (room) return Promise.resolve();
      return new Promise((resolve, reject) => waiting.push({ resolve, reject }));
    },
    onDrain(listener) {
      listeners.push(listener);
    },
  };
  const close = (): void => {
    res.off('drain', onDrain);
    signal.removeEventListener('abort', onAbort);
    listeners.length = 0;
    settle(gone());
  };
  return { sink, close, stats };
}

/** A plain-text answer (`GET /metrics`). */
class TextBody {
  constructor(
    readonly contentType: string,
    readonly text: string,
  ) {}
}
