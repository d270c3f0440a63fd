/**
 * rxrl as a Tinker-API service: the official `tinker` SDK (PyPI) trains LoRA adapters on a model directory that
 * rxrl holds, with rxrl's trainer and engine behind the API.
 *
 * | route (`/api/v1/…`) | what |
 * | --- | --- |
 * | `client/config`, `create_session`, `session_heartbeat`, `sessions/{id}/finish`, `telemetry` | the SDK's bootstrap; a session that finishes or stops heartbeating frees its training clients |
 * | `get_server_capabilities`, `healthz` | the served base model |
 * | `create_model` | a LoRA training client on the base (`lora_config.rank`); id `{session}:train:{seq}` |
 * | `get_info`, `unload_model` | the client's model, rank and tokenizer; freeing it |
 * | `forward_backward`, `forward` | protobuf datums within the model's context; losses `cross_entropy`, `importance_sampling`, `ppo` |
 * | `optim_step` | Adam with the call's `adam_params` |
 * | `save_weights`, `load_weights` | the adapter and Adam state, as `tinker://<model>/weights/<name>` (read from the state directory only); a `load_weights` addressed by `session_id` creates the client from the state |
 * | `save_weights_for_sampler`, `create_sampling_session`, `GET samplers/{id}`, `asample` | sampling sessions and named sampler weights (bounded) |
 * | `retrieve_future` | long-polls a request's result (protobuf for forward/backward and samples, JSON else) |
 *
 * Every call that trains or samples returns a future (`{ request_id, model_id }`) at once; each training client runs
 * its requests one at a time in the order they arrived (the SDK pipelines `forward_backward` and `optim_step`),
 * yielding to the event loop between chunks of a long forward pass, so the health check answers meanwhile. The
 * SDK's key header (`X-API-Key`) is checked on every route when the service has a key. Unsupported or malformed
 * requests (full fine-tuning, another loss, another base, a datum past the context) get a 4xx with `{ "detail": … }`.
 *
 * The parts: the registries and their bounds in `clients.ts`, `sampling.ts`, `futures.ts` (shared through
 * `context.ts`); one function per route in `sessionRoutes.ts`, `trainingRoutes.ts`, `samplingRoutes.ts`; this file
 * is the transport.
 *
 * @packageDocumentation
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { mkdir, mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import type { Tokenizer } from '../model/types.js';
import { ConfigError } from '../core/errors.js';
import { WEIGHTS_HEADER_SLACK_BYTES } from '../model/files.js';
import { LORA_TARGETS, LoraAdapter } from '../model/lora.js';
import type { PolicyModel } from '../model/transformer.js';
import { listen, readBody, sameSecret, sendJson } from '../serve/http.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, excerpt, parseJsonObject, type JsonObject } from '../serve/protocol.js';
import { TrainingClients } from './clients.js';
import type { Reply, TinkerContext, TinkerLimits, TinkerLogger } from './context.js';
import { FutureStore, isUserError } from './futures.js';
import { SamplerPool, SamplerWeights } from './sampling.js';
import { asample, createSamplingSession, getSampler, saveWeightsForSampler } from './samplingRoutes.js';
import { createSession, finishSession, retrieveFuture, sessionHeartbeat } from './sessionRoutes.js';
import { DEFAULT_CHUNK_TOKENS, TinkerTrainer } from './training.js';
import { createModel, forwardBackward, getInfo, loadWeights, optimStep, saveWeights, unloadModel } from './trainingRoutes.js';

/** Options of {@link tinkerService}. */
export interface TinkerServiceOptions {
  /** The base model every training client adapts (not owned: the caller disposes of it after `close`). */
  readonly model: PolicyModel;
  /** The name clients ask for as `base_model`. */
  readonly baseModel: string;
  /** What `get_info` reports as the tokenizer (a local directory the SDK can load). Default: `baseModel`. */
  readonly tokenizerId?: string;
  /** Interface to bind. Default `127.0.0.1`. */
  readonly host?: string | undefined;
  /** TCP port; 0 picks a free one. Default 0. */
  readonly port?: number;
  /** When set, every request needs `X-API-Key: <apiKey>`; an empty or blank key is refused. */
  readonly apiKey?: string;
  /** Most training clients at once (those being freed included). Default 8. */
  readonly maxModels?: number;
  /** Most sessions at once. Default 1024. */
  readonly maxSessions?: number;
  /**
   * A session with no heartbeat (the SDK sends one every 10 s) and no request for this long ends, and its training
   * clients are freed, in ms. Default 120 000.
   */
  readonly sessionTimeoutMs?: number;
  /** Largest LoRA rank. Default 64. */
  readonly maxRank?: number;
  /**
   * Sampling sessions kept at once; opening one more lets the oldest go (a run opens one per trained version and
   * samples from the newest); one let go lives on until the requests on it settle. Default 64.
   */
  readonly maxSamplers?: number;
  /** Named sampler weights kept (`save_weights_for_sampler` with a path); past it the least recently used go. Default 64. */
  readonly maxSamplerWeights?: number;
  /** Bytes of named sampler weights kept, over every name. Default 1 GiB. */
  readonly maxSamplerWeightBytes?: number;
  /** Requests queued or running at once, over every client; one more is refused with 429. Default 1024. */
  readonly maxInFlight?: number;
  /** Finished requests whose results are kept until polled; past this the oldest is dropped. Default 4096. */
  readonly maxFinished?: number;
  /** Largest request body in bytes (a JSON one: 8 MiB at most). Default 64 MiB. */
  readonly maxBodyBytes?: number;
  /** Most tokens and tensor elements of one `forward_backward` (summed over its datums). Default 2^24. */
  readonly maxForwardElements?: number;
  /** Padded positions a forward pass computes between two turns of the event loop. Default 128. */
  readonly chunkTokens?: number;
  /** How long `retrieve_future` holds a poll before answering `try_again`, in ms. Default 20 000. */
  readonly pollMs?: number;
  /** Seed of adapters' initialization (with the model's index). Default 0. */
  readonly seed?: number;
  /** The base model's tokenizer: its stop ids end samples, and string stop sequences are encoded with it. */
  readonly tokenizer: Tokenizer;
  /** Where `save_weights` writes states (`<dir>/<model id>/<name>.safetensors`). Default: a fresh temporary directory. */
  readonly stateDir?: string;
  /** Structured log lines (internal errors). Default: none. */
  readonly log?: TinkerLogger;
}

/** A running service. */
export interface TinkerService {
  /** `http://host:port`: the SDK's `TINKER_BASE_URL`. */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

/** Most samples of one `asample`. */
const MAX_SAMPLES = 128;

/**
 * Largest JSON body (the protobuf `forward_backward` may take `maxBodyBytes`): a prompt of 128k tokens is about
 * 1 MB of JSON, and parsing tens of megabytes would hold the event loop.
 */
const MAX_JSON_BODY_BYTES = 8 * 1024 * 1024;

/**
 * Starts a Tinker-API service over `options.model`.
 *
 * @example
 * ```ts
 * const { model } = await loadModelDir(dir);
 * const service = await tinkerService({ model, baseModel: 'tiny-qwen3', tokenizerId: dir });
 * // TINKER_BASE_URL=service.url TINKER_API_KEY=tml-local python3 train.py
 * ```
 * @param options - The base model, its name, address and limits.
 * @returns The running service.
 * @throws {@link ConfigError} for invalid options (a limit that is not a positive integer, an empty key).
 */
export async function tinkerService(options: TinkerServiceOptions): Promise<TinkerService> {
  if (options.apiKey !== undefined && options.apiKey.trim() === '')
    throw new ConfigError('apiKey must not be empty', { context: { key: 'apiKey' } });
  const ctx = await createContext(options);
  await warmUp(ctx);
  const server = createServer((req, res) => void handle(ctx, options.apiKey, req, res));
  server.on('clientError', (error: NodeJS.ErrnoException, socket) => {
    if (!socket.writable || error.code === 'ECONNRESET') return void socket.destroy();
    const text = JSON.stringify({ detail: 'malformed HTTP request' });
    socket.end(
      `HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\nConnection: close\r\n\r\n${text}`,
    );
  });
  try {
    await listen(server, options.port ?? 0, options.host ?? '127.0.0.1');
  } catch (error) {
    await ctx.clients.close();
    throw error;
  }
  const address = server.address() as AddressInfo;
  let closed: Promise<void> | undefined;
  return {
    url: `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`,
    port: address.port,
    close: () => {
      closed ??= new Promise<void>((done) => {
        server.close(() => done());
        server.closeAllConnections();
      }).then(async () => {
        await ctx.futures.settled();
        await ctx.clients.close();
        ctx.samplers.close();
      });
      return closed;
    },
  };
}

/** The service's context: options checked and resolved, the state directory made, the registries empty. */
async function createContext(options: TinkerServiceOptions): Promise<TinkerContext> {
  const limit = (key: string, value: number): number => {
    if (!Number.isSafeInteger(value) || value < 1)
      throw new ConfigError(`${key} must be an integer >= 1, got ${value}`, { context: { key } });
    return value;
  };
  const maxRank = limit('maxRank', options.maxRank ?? 64);
  const limits: TinkerLimits = {
    maxRank,
    maxBodyBytes: limit('maxBodyBytes', options.maxBodyBytes ?? 64 * 1024 * 1024),
    pollMs: limit('pollMs', options.pollMs ?? 20_000),
    context: options.model.config.maxSeqLen,
    maxForwardElements: limit('maxForwardElements', options.maxForwardElements ?? 2 ** 24),
    chunkTokens: limit('chunkTokens', options.chunkTokens ?? DEFAULT_CHUNK_TOKENS),
    maxStateBytes: maxStateBytes(options.model, maxRank),
    maxSamples: MAX_SAMPLES,
  };
  const clients = new TrainingClients({
    maxModels: limit('maxModels', options.maxModels ?? 8),
    maxSessions: limit('maxSessions', options.maxSessions ?? 1024),
    sessionTimeoutMs: limit('sessionTimeoutMs', options.sessionTimeoutMs ?? 120_000),
  });
  const rest = {
    samplers: new SamplerPool(limit('maxSamplers', options.maxSamplers ?? 64)),
    samplerWeights: new SamplerWeights({
      maxCount: limit('maxSamplerWeights', options.maxSamplerWeights ?? 64),
      maxBytes: limit('maxSamplerWeightBytes', options.maxSamplerWeightBytes ?? 2 ** 30),
    }),
    futures: new FutureStore({
      maxInFlight: limit('maxInFlight', options.maxInFlight ?? 1024),
      maxFinished: limit('maxFinished', options.maxFinished ?? 4096),
    }),
  };
  try {
    const stateDir = options.stateDir === undefined ? await mkdtemp(join(tmpdir(), 'rxrl-tinker-')) : resolve(options.stateDir);
    await mkdir(stateDir, { recursive: true });
    return {
      model: options.model,
      tokenizer: options.tokenizer,
      baseModel: options.baseModel,
      tokenizerId: options.tokenizerId ?? options.baseModel,
      stateDir,
      limits,
      nextSeed: options.seed ?? 0,
      clients,
      ...rest,
      log: options.log ?? (() => undefined),
    };
  } catch (error) {
    await clients.close();
    throw error;
  }
}

/**
 * One forward and backward pass of two tokens on a throwaway adapter: the backend's first-use costs (compiling its
 * kernels, about 100 ms on wasm) are paid at start rather than inside a client's first request.
 */
async function warmUp(ctx: TinkerContext): Promise<void> {
  const trainer = new TinkerTrainer(ctx.model, 1, 0);
  try {
    const ints = { dtype: 'int64' as const, data: [0, 0], shape: [2] };
    await trainer.forward(
      [{ tokens: [0, 0], lossFnInputs: { target_tokens: ints, weights: { dtype: 'float32', data: Float32Array.of(1, 1), shape: [2] } } }],
      'cross_entropy',
      {},
      true,
    );
  } finally {
    trainer.dispose();
  }
}

/** The largest saved state read: an adapter of `maxRank` on `model` with Adam's two moments, and header room. */
function maxStateBytes(model: PolicyModel, maxRank: number): number {
  const probe = LoraAdapter.create(model.config, { rank: 1, alpha: 1, targetModules: LORA_TARGETS }, 0);
  const perRank = probe.numParameters();
  probe.dispose();
  return 3 * maxRank * perRank * 4 + WEIGHTS_HEADER_SLACK_BYTES;
}

/** Answers one request: its route's reply, a 4xx `{ detail }` for a bad request, a bare 500 for a bug. */
async function handle(ctx: TinkerContext, apiKey: string | undefined, req: IncomingMessage, res: ServerResponse): Promise<void> {
  try {
    send(res, await route(ctx, apiKey, req));
  } catch (error) {
    const refused = asRequestError(error);
    if (refused !== undefined)
      return sendJson(res, refused.status, { detail: refused.message }, refused.status === 413 ? { connection: 'close' } : {});
    ctx.log({ event: 'internal_error', error: String(error) });
    sendJson(res, 500, { detail: 'internal server error' });
  }
}

function send(res: ServerResponse, reply: Reply): void {
  if (!('proto' in reply)) return sendJson(res, 200, reply.json);
  if (res.headersSent || res.destroyed) return;
  res.writeHead(200, { 'content-type': 'application/x-protobuf', 'content-length': reply.proto.length });
  res.end(Buffer.from(reply.proto.buffer, reply.proto.byteOffset, reply.proto.byteLength));
}

/** Errors that describe a bad request (rather than a bug), as a {@link RequestError}. */
function asRequestError(error: unknown): RequestError | undefined {
  if (error instanceof RequestError) return error;
  if (isUserError(error)) return new RequestError(400, excerpt(error.message, MAX_ERROR_MESSAGE_CHARS), {}, { cause: error });
  return undefined;
}

/** The JSON routes (`POST /api/v1/<name>` with a JSON object body). */
const JSON_ROUTES: ReadonlyMap<string, (ctx: TinkerContext, body: JsonObject) => unknown> = new Map<
  string,
  (ctx: TinkerContext, body: JsonObject) => unknown
>([
  [
    'client/config',
    () => ({ use_pyqwest_transport: false, parallel_fwdbwd_chunks: false, pjwt_auth_enabled: false, create_model_via_load_weights: true }),
  ],
  ['create_session', createSession],
  ['session_heartbeat', sessionHeartbeat],
  ['telemetry', () => ({ status: 'accepted' })],
  ['create_model', createModel],
  ['get_info', getInfo],
  ['unload_model', unloadModel],
  ['optim_step', optimStep],
  ['save_weights', saveWeights],
  ['load_weights', loadWeights],
  ['save_weights_for_sampler', saveWeightsForSampler],
  ['create_sampling_session', createSamplingSession],
  ['asample', asample],
]);

/** Checks the key, then dispatches on method and path. */
async function route(ctx: TinkerContext, apiKey: string | undefined, req: IncomingMessage): Promise<Reply> {
  const path = (req.url ?? '/').split('?')[0].replace(/\/+$/, '');
  if (apiKey !== undefined && !sameSecret(String(req.headers['x-api-key'] ?? ''), apiKey))
    throw new RequestError(401, 'missing or wrong X-API-Key');
  const name = path.startsWith('/api/v1/') ? path.slice('/api/v1/'.length) : undefined;
  if (req.method === 'GET') {
    if (name === 'healthz') return { json: { status: 'ok' } };
    if (name === 'get_server_capabilities') return { json: { supported_models: [{ model_name: ctx.baseModel }] } };
    const sampler = /^samplers\/([^/]+)$/.exec(name ?? '');
    if (sampler !== null) return { json: getSampler(ctx, decodeSegment(sampler[1])) };
    throw new RequestError(404, `GET ${excerpt(path)} is not served by rxrl's Tinker service`);
  }
  if (req.method !== 'POST') throw new RequestError(405, `${excerpt(String(req.method))} ${excerpt(path)} is not served`);
  if (name === 'forward_backward' || name === 'forward') {
    if (!/application\/x-protobuf/.test(String(req.headers['content-type'] ?? '')))
      throw new RequestError(415, `${path} takes application/x-protobuf`);
    const encoding = req.headers['content-encoding'];
    if (encoding !== undefined && encoding !== 'identity')
      throw new RequestError(415, `content-encoding ${excerpt(String(encoding))} is not supported`);
    return { json: forwardBackward(ctx, await readBody(req, ctx.limits.maxBodyBytes), name === 'forward') };
  }
  const raw = await readBody(req, Math.min(ctx.limits.maxBodyBytes, MAX_JSON_BODY_BYTES));
  const body = raw.length === 0 ? {} : parseJsonObject(raw.toString('utf8'));
  const finish = /^sessions\/([^/]+)\/finish$/.exec(name ?? '');
  if (finish !== null) return { json: finishSession(ctx, decodeSegment(finish[1])) };
  if (name === 'retrieve_future') return retrieveFuture(ctx, body);
  const handler = name === undefined ? undefined : JSON_ROUTES.get(name);
  if (handler === undefined) throw new RequestError(404, `${excerpt(path)} is not served by rxrl's Tinker service`);
  return { json: await handler(ctx, body) };
}

/** A percent-encoded path segment, decoded; 400 when its escapes are not UTF-8. */
function decodeSegment(segment: string): string {
  try {
    return decodeURIComponent(segment);
  } catch (cause) {
    throw new RequestError(400, `the path segment '${excerpt(segment)}' is not valid percent-encoded UTF-8`, {}, { cause });
  }
}
