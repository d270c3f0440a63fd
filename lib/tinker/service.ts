/**
 * rxrl as a Tinker-API service: the official `tinker` SDK (PyPI) trains LoRA adapters on a model directory that
 * rxrl holds, with rxrl's trainer and engine behind the API.
 *
 * | route (`/api/v1/…`) | what |
 * | --- | --- |
 * | `client/config`, `create_session`, `session_heartbeat`, `sessions/{id}/finish`, `telemetry` | the SDK's bootstrap |
 * | `get_server_capabilities`, `healthz` | the served base model |
 * | `create_model` | a LoRA training client on the base (`lora_config.rank`); id `{session}:train:{seq}` |
 * | `get_info` | the client's model, rank and tokenizer |
 * | `forward_backward`, `forward` | protobuf datums; losses `cross_entropy`, `importance_sampling`, `ppo` |
 * | `optim_step` | Adam with the call's `adam_params` |
 * | `save_weights`, `load_weights` | the adapter and Adam state, as `tinker://<model>/weights/<name>`; a `load_weights` addressed by `session_id` creates the client from the state |
 * | `retrieve_future` | long-polls a request's result (protobuf for forward/backward and samples, JSON else) |
 *
 * Every call that trains or samples returns a future (`{ request_id, model_id }`) at once; each model runs its
 * requests one at a time in the order they arrived (the SDK pipelines `forward_backward` and `optim_step`). The
 * SDK's key header (`X-API-Key`) is checked when the service has a key. Unsupported requests (full fine-tuning,
 * another loss, another base) get a 4xx with `{ "detail": … }`.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { mkdir, mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../engine/types.js';
import { ConfigError, ShapeError } from '../errors.js';
import { LORA_TARGETS, LoraAdapter } from '../model/lora.js';
import { loadSafetensors, saveSafetensors } from '../model/safetensors.js';
import { PolicyModel } from '../model/transformer.js';
import { hashSeed } from '../random.js';
import { readBody, sameSecret, sendJson } from '../serve/http.js';
import { RequestError } from '../serve/protocol.js';
import { ProtoError, decodeForwardBackwardRequest, encodeForwardBackwardOutput, encodeSampleResponse, type SampledSequenceWire } from './proto.js';
import { TinkerTrainer, type AdamParams } from './training.js';

/** Options of {@link tinkerService}. */
export interface TinkerServiceOptions {
  /** The base model every training client adapts (not owned: the caller disposes of it after `close`). */
  readonly model: PolicyModel;
  /** The name clients ask for as `base_model`. */
  readonly baseModel: string;
  /** What `get_info` reports as the tokenizer (a local directory the SDK can load). Default: `baseModel`. */
  readonly tokenizerId?: string;
  /** Interface to bind. Default `127.0.0.1`. */
  readonly host?: string;
  /** TCP port; 0 picks a free one. Default 0. */
  readonly port?: number;
  /** When set, requests need `X-API-Key: <apiKey>`. */
  readonly apiKey?: string;
  /** Most training clients at once. Default 8. */
  readonly maxModels?: number;
  /** Largest LoRA rank. Default 64. */
  readonly maxRank?: number;
  /**
   * Sampling sessions kept at once; opening one more closes the oldest (a run opens one per trained version and
   * samples from the newest). Default 64.
   */
  readonly maxSamplers?: number;
  /** Requests queued or running at once, over every client; one more is refused with 429. Default 1024. */
  readonly maxInFlight?: number;
  /** Finished requests whose results are kept until polled; past this the oldest is dropped. Default 4096. */
  readonly maxFinished?: number;
  /** Largest request body in bytes. Default 64 MiB. */
  readonly maxBodyBytes?: number;
  /** How long `retrieve_future` holds a poll before answering `try_again`, in ms. Default 20 000. */
  readonly pollMs?: number;
  /** Seed of adapters' initialization (with the model's index). Default 0. */
  readonly seed?: number;
  /** The base model's tokenizer: its stop ids end samples, and string stop sequences are encoded with it. */
  readonly tokenizer: Tokenizer;
  /** Where `save_weights` writes states (`<dir>/<model id>/<name>.safetensors`). Default: a fresh temporary directory. */
  readonly stateDir?: string;
}

/** A running service. */
export interface TinkerService {
  /** `http://host:port`: the SDK's `TINKER_BASE_URL`. */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

/** A future's outcome: a JSON value, protobuf bytes, or an error the SDK raises as `RequestFailedError`. */
type Outcome = { readonly json: unknown } | { readonly proto: Uint8Array } | { readonly error: string; readonly category: 'user' | 'server' };

interface Model {
  readonly id: string;
  readonly trainer: TinkerTrainer;
  /** The tail of this model's queue: requests run one after another. */
  queue: Promise<unknown>;
}

/** A sampling session: frozen adapter weights (none: the base model) and its own view of the base. */
interface Sampler {
  readonly id: string;
  readonly view: PolicyModel;
  readonly adapter: LoraAdapter | undefined;
  /** The tail of its generation turns. */
  queue: Promise<unknown>;
  /** Sample requests waiting for the next turn: each turn decodes all of them as one batch. */
  readonly waiting: SampleJob[];
}

/** One `asample` call's sequences, waiting for a sampler's turn. */
interface SampleJob {
  readonly requests: readonly GenerateRequest[];
  resolve(responses: GenerateResponse[]): void;
  reject(error: unknown): void;
}

/** Most sequences one generation turn of a sampler decodes together. */
const MAX_SAMPLE_BATCH = 256;

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
 */
export async function tinkerService(options: TinkerServiceOptions): Promise<TinkerService> {
  const maxModels = options.maxModels ?? 8;
  const maxRank = options.maxRank ?? 64;
  const maxBodyBytes = options.maxBodyBytes ?? 64 * 1024 * 1024;
  const pollMs = options.pollMs ?? 20_000;
  const maxSamplers = options.maxSamplers ?? 64;
  const maxInFlight = options.maxInFlight ?? 1024;
  const maxFinished = options.maxFinished ?? 4096;
  for (const [key, value] of [['maxModels', maxModels], ['maxRank', maxRank], ['maxBodyBytes', maxBodyBytes], ['pollMs', pollMs], ['maxSamplers', maxSamplers], ['maxInFlight', maxInFlight], ['maxFinished', maxFinished]] as const) {
    if (!Number.isInteger(value) || value < 1) throw new ConfigError(`${key} must be an integer >= 1, got ${value}`, { context: { key } });
  }
  const models = new Map<string, Model>();
  const samplers = new Map<string, Sampler>();
  const stateDir = options.stateDir ?? (await mkdtemp(join(tmpdir(), 'rxrl-tinker-')));
  /** Named sampler weights (`tinker://<model>/sampler_weights/<name>`): adapter weights and rank. */
  const samplerWeights = new Map<string, { weights: NamedWeights; rank: number }>();
  const futures = new Map<string, Promise<Outcome>>();
  /** Requests whose future settled, oldest first (their results wait for a poll). */
  const finished: string[] = [];
  let inFlight = 0;
  const sessions = new Set<string>();
  let modelSeed = 0;

  /** Runs `work` after every earlier request of `model`; the future settles with its outcome. */
  const enqueue = (model: Model | undefined, work: () => Outcome | Promise<Outcome>): { request_id: string; model_id?: string } => {
    const id = `req-${randomUUID()}`;
    const run = async (): Promise<Outcome> => {
      try {
        return await work();
      } catch (error) {
        const user = error instanceof ShapeError || error instanceof ConfigError || error instanceof ProtoError || error instanceof RequestError;
        return { error: error instanceof Error ? error.message : String(error), category: user ? 'user' : 'server' };
      }
    };
    if (inFlight >= maxInFlight) throw new RequestError(429, `${maxInFlight} requests are in flight; retry later`);
    inFlight++;
    const outcome = (model === undefined ? run() : model.queue.then(run)).finally(() => {
      inFlight--;
      // Results nobody polls for are kept for the newest maxFinished requests only.
      finished.push(id);
      while (finished.length > maxFinished) futures.delete(finished.shift() as string);
    });
    if (model !== undefined) model.queue = outcome;
    futures.set(id, outcome);
    return { request_id: id, ...(model ? { model_id: model.id } : {}) };
  };

  const modelOf = (id: unknown): Model => {
    const model = typeof id === 'string' ? models.get(id) : undefined;
    if (model === undefined) throw new RequestError(404, `no training client '${String(id)}'`);
    return model;
  };

  /**
   * Checks what a new training client needs — its session, the base model (which a client made from a state may
   * leave out), room for one more, a free id — and returns its id `{session}:train:{seq}`.
   */
  const newModelId = (body: Record<string, unknown>, baseOptional: boolean): string => {
    const session = String(body.session_id ?? '');
    if (!sessions.has(session)) throw new RequestError(404, `no session '${session}'`);
    const base = body.base_model;
    if (!(baseOptional && (base === undefined || base === null)) && base !== options.baseModel) {
      throw new RequestError(400, `this service trains '${options.baseModel}', not '${String(base)}'`);
    }
    if (models.size >= maxModels) throw new RequestError(429, `${maxModels} training clients are open`);
    const id = `${session}:train:${String(body.model_seq_id ?? models.size)}`;
    if (models.has(id)) throw new RequestError(409, `training client '${id}' exists`);
    return id;
  };

  /** Registers a training client; its first request (the creation's future) answers `result`. */
  const addModel = (id: string, trainer: TinkerTrainer, result: unknown): unknown => {
    const model: Model = { id, trainer, queue: Promise.resolve() };
    models.set(id, model);
    return enqueue(model, () => ({ json: result }));
  };

  const createModel = (body: Record<string, unknown>): unknown => {
    const id = newModelId(body, false);
    const lora = body.lora_config as { rank?: unknown } | undefined | null;
    if (lora === undefined || lora === null) throw new RequestError(400, 'full fine-tuning is not supported: give lora_config');
    const rank = lora.rank;
    if (typeof rank !== 'number' || !Number.isInteger(rank) || rank < 1 || rank > maxRank) {
      throw new RequestError(400, `lora_config.rank must be an integer in [1, ${maxRank}]`);
    }
    return addModel(id, new TinkerTrainer(options.model, rank, (options.seed ?? 0) + modelSeed++), { model_id: id, type: 'create_model' });
  };

  const getInfo = (body: Record<string, unknown>): unknown => {
    const model = modelOf(body.model_id);
    return {
      model_id: model.id,
      model_data: { model_name: options.baseModel, tokenizer_id: options.tokenizerId ?? options.baseModel, arch: null },
      is_lora: true,
      lora_rank: model.trainer.rank,
      type: 'get_info',
    };
  };

  const forwardBackward = (bytes: Uint8Array, forwardOnly: boolean): unknown => {
    const request = decodeForwardBackwardRequest(bytes);
    const model = modelOf(request.modelId);
    return enqueue(model, () => {
      const out = model.trainer.forward(request.data, request.lossFn, request.lossFnConfig, !(forwardOnly || request.forwardOnly));
      return { proto: encodeForwardBackwardOutput({ outputs: out.outputs, metrics: out.metrics }) };
    });
  };

  const optimStep = (body: Record<string, unknown>): unknown => {
    const model = modelOf(body.model_id);
    const p = (body.adam_params ?? null) as Record<string, unknown> | null;
    if (p === null) throw new RequestError(400, 'optim_step needs adam_params (other optimizers are not supported)');
    const num = (name: string, fallback: number): number => {
      const v = p[name] ?? fallback;
      if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) throw new RequestError(400, `adam_params.${name} must be a finite number >= 0`);
      return v;
    };
    const adam: AdamParams = {
      learningRate: num('learning_rate', 1e-4),
      beta1: num('beta1', 0.9),
      beta2: num('beta2', 0.95),
      eps: num('eps', 1e-12),
      weightDecay: num('weight_decay', 0),
      gradClipNorm: num('grad_clip_norm', 0),
    };
    return enqueue(model, () => ({ json: { metrics: model.trainer.optimStep(adam), type: 'optim_step' } }));
  };

  /** A sampler over a snapshot of the adapter (or the base model, without one). */
  const openSampler = (snapshot: { weights: NamedWeights; rank: number } | undefined): string => {
    const id = `ss-${randomUUID()}`;
    const adapter = snapshot === undefined ? undefined : LoraAdapter.fromWeights(options.model.config, { rank: snapshot.rank, alpha: snapshot.rank, targetModules: LORA_TARGETS }, snapshot.weights);
    const view = adapter === undefined ? options.model : PolicyModel.withAdapter(options.model, adapter);
    samplers.set(id, { id, view, adapter, queue: Promise.resolve(), waiting: [] });
    if (samplers.size > maxSamplers) {
      const [oldest] = samplers.values();
      samplers.delete(oldest.id);
      void oldest.queue.then(() => releaseSampler(oldest));
    }
    return id;
  };

  const saveForSampler = (body: Record<string, unknown>): unknown => {
    const model = modelOf(body.model_id);
    return enqueue(model, () => {
      const snapshot = { weights: model.trainer.adapter.getWeights(), rank: model.trainer.rank };
      if (typeof body.path === 'string' && body.path !== '') {
        const path = `tinker://${model.id}/sampler_weights/${checkName(body.path)}`;
        samplerWeights.set(path, snapshot);
        return { json: { path, type: 'save_weights_for_sampler' } };
      }
      return { json: { path: null, sampling_session_id: openSampler(snapshot), type: 'save_weights_for_sampler' } };
    });
  };

  const createSamplingSession = (body: Record<string, unknown>): unknown => {
    if (typeof body.model_path === 'string') {
      const snapshot = samplerWeights.get(body.model_path);
      if (snapshot === undefined) throw new RequestError(404, `no sampler weights at '${body.model_path}'`);
      return { sampling_session_id: openSampler(snapshot), type: 'create_sampling_session' };
    }
    if (body.base_model !== options.baseModel) throw new RequestError(400, `this service samples '${options.baseModel}', not '${String(body.base_model)}'`);
    return { sampling_session_id: openSampler(undefined), type: 'create_sampling_session' };
  };

  const sample = (body: Record<string, unknown>): unknown => {
    const sampler = samplers.get(String(body.sampling_session_id));
    if (sampler === undefined) throw new RequestError(404, `no sampling session '${String(body.sampling_session_id)}'`);
    const chunks = ((body.prompt as { chunks?: unknown } | undefined)?.chunks ?? []) as { type?: unknown; tokens?: unknown }[];
    if (!Array.isArray(chunks) || chunks.some((c) => c.type !== 'encoded_text' || !Array.isArray(c.tokens))) {
      throw new RequestError(400, 'prompt.chunks must be encoded_text chunks (images are not supported)');
    }
    const prompt = chunks.flatMap((c) => c.tokens as number[]);
    const V = options.model.config.vocabSize;
    if (prompt.length === 0 || !prompt.every((t) => Number.isInteger(t) && t >= 0 && t < V)) throw new RequestError(400, `prompt must be token ids in [0, ${V})`);
    const n = body.num_samples ?? 1;
    if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 128) throw new RequestError(400, 'num_samples must be an integer in [1, 128]');
    const params = (body.sampling_params ?? {}) as Record<string, unknown>;
    const maxTokens = params.max_tokens ?? 16;
    if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens) || maxTokens < 1) throw new RequestError(400, 'sampling_params.max_tokens must be an integer >= 1');
    const topK = params.top_k ?? -1;
    if (topK !== -1 && topK !== 0) throw new RequestError(400, 'sampling_params.top_k is not supported (give -1)');
    const temperature = typeof params.temperature === 'number' ? params.temperature : 1;
    const topP = typeof params.top_p === 'number' ? params.top_p : 1;
    const seed = typeof params.seed === 'number' ? params.seed : typeof body.seed === 'number' ? body.seed : undefined;
    const stopTokens = stopIds(params.stop, options.tokenizer);
    const wantPromptLogprobs = body.prompt_logprobs === true;
    const ids = Array.from({ length: n }, (_, i) => `${sampler.id}:${String(body.seq_id ?? 0)}:${i}`);
    const future = enqueue(undefined, async () => {
      const responses = await generateOn(
        sampler,
        Array.from({ length: n }, (_, i) => ({
          promptTokens: prompt,
          maxTokens,
          temperature,
          topP,
          stopTokens,
          ...(seed === undefined ? {} : { seed: i === 0 ? seed : hashSeed(seed, 'choice', String(i)) }),
        })),
      );
      const sequences: SampledSequenceWire[] = responses.map((r) => ({ tokens: r.tokens, logprobs: r.logprobs, stopReason: r.finishReason === 'stop' ? 'stop' : 'length' }));
      const promptLogprobs = wantPromptLogprobs ? scorePrompt(sampler.view, prompt) : undefined;
      return { proto: encodeSampleResponse({ sequences, ...(promptLogprobs ? { promptLogprobs } : {}) }) };
    });
    return { ...future, sample_sequence_ids: ids };
  };

  /**
   * Samples `requests` on `sampler` in its next generation turn, batched with every other call waiting then (the
   * samples of a GRPO group, or of several clients, decode together; seeded samples do not depend on the batch).
   */
  const generateOn = (sampler: Sampler, requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> =>
    new Promise((resolve, reject) => {
      sampler.waiting.push({ requests, resolve, reject });
      if (sampler.waiting.length === 1) scheduleTurn(sampler);
    });

  /** Queues one generation turn of `sampler` over the calls waiting when it starts (up to a batch's worth). */
  const scheduleTurn = (sampler: Sampler): void => {
    sampler.queue = sampler.queue.then(async () => {
      const jobs: SampleJob[] = [];
      let size = 0;
      while (sampler.waiting.length > 0 && (jobs.length === 0 || size + sampler.waiting[0].requests.length <= MAX_SAMPLE_BATCH)) {
        const job = sampler.waiting.shift() as SampleJob;
        jobs.push(job);
        size += job.requests.length;
      }
      if (sampler.waiting.length > 0) scheduleTurn(sampler);
      try {
        const out = await sampler.view.generate(
          jobs.flatMap((job) => job.requests),
          { stopIds: options.tokenizer.stopIds },
        );
        let at = 0;
        for (const job of jobs) {
          job.resolve(out.slice(at, at + job.requests.length));
          at += job.requests.length;
        }
      } catch (error) {
        for (const job of jobs) job.reject(error);
      }
    });
  };

  const saveState = (body: Record<string, unknown>): unknown => {
    const model = modelOf(body.model_id);
    const name = checkName(body.path);
    return enqueue(model, async () => {
      const path = `tinker://${model.id}/weights/${name}`;
      const dir = join(stateDir, encodeURIComponent(model.id));
      await mkdir(dir, { recursive: true });
      const state = model.trainer.state(true);
      await saveSafetensors(join(dir, `${encodeURIComponent(name)}.safetensors`), state, { rank: String(model.trainer.rank), model_id: model.id });
      return { json: { path, type: 'save_weights' } };
    });
  };

  /** The file of the state at `tinker://<model>/weights/<name>` (in `stateDir`, whichever process wrote it). */
  const stateFile = (path: unknown): string => {
    const match = /^tinker:\/\/([^/]+)\/weights\/([^/]+)$/.exec(String(path ?? ''));
    if (match === null) throw new RequestError(400, `path must be tinker://<model>/weights/<name>, got '${String(path)}'`);
    return join(stateDir, encodeURIComponent(match[1]), `${encodeURIComponent(match[2])}.safetensors`);
  };

  const readState = async (path: unknown): Promise<{ weights: ReadonlyMap<string, { shape: number[]; data: Float32Array }>; rank: number }> => {
    const file = stateFile(path);
    let contents;
    try {
      contents = await loadSafetensors(file);
    } catch (cause) {
      throw new RequestError(404, `no saved state at '${String(path)}'${cause instanceof Error ? ` (${cause.message})` : ''}`);
    }
    return { weights: contents.weights as ReadonlyMap<string, { shape: number[]; data: Float32Array }>, rank: Number(contents.metadata.rank) };
  };

  const loadState = (body: Record<string, unknown>): unknown => {
    const model = modelOf(body.model_id);
    stateFile(body.path);
    return enqueue(model, async () => {
      const state = await readState(body.path);
      if (state.rank !== model.trainer.rank) {
        throw new RequestError(400, `the state at '${String(body.path)}' has rank ${state.rank}, this client ${model.trainer.rank}`);
      }
      model.trainer.restore(state.weights, body.optimizer === true);
      return { json: { path: body.path, type: 'load_weights' } };
    });
  };

  /** `load_weights` addressed by session: a new training client whose rank and weights come from the state. */
  const createFromState = async (body: Record<string, unknown>): Promise<unknown> => {
    newModelId(body, true);
    const state = await readState(body.path);
    if (!Number.isInteger(state.rank) || state.rank < 1 || state.rank > maxRank) throw new RequestError(400, `the state at '${String(body.path)}' has no valid rank`);
    // Checked again: other clients may have been made while the state was read.
    const id = newModelId(body, true);
    const trainer = new TinkerTrainer(options.model, state.rank, (options.seed ?? 0) + modelSeed++);
    try {
      trainer.restore(state.weights, body.optimizer === true);
    } catch (error) {
      trainer.dispose();
      throw error;
    }
    return addModel(id, trainer, { path: body.path, type: 'load_weights' });
  };

  const retrieve = async (body: Record<string, unknown>, res: ServerResponse): Promise<void> => {
    const id = String(body.request_id ?? '');
    const future = futures.get(id);
    if (future === undefined) return sendJson(res, 404, { detail: `no request '${id}'` });
    let timer: ReturnType<typeof setTimeout> | undefined;
    const waited = await Promise.race([future, new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), pollMs)))]);
    clearTimeout(timer);
    if (waited === undefined) return sendJson(res, 200, { type: 'try_again', request_id: id, queue_state: 'active' });
    futures.delete(id);
    if ('proto' in waited) {
      res.writeHead(200, { 'content-type': 'application/x-protobuf', 'content-length': waited.proto.length });
      res.end(Buffer.from(waited.proto.buffer, waited.proto.byteOffset, waited.proto.byteLength));
      return;
    }
    if ('error' in waited) return sendJson(res, 200, { error: waited.error, category: waited.category });
    sendJson(res, 200, waited.json);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (res.headersSent) return void res.destroy();
      const status = error instanceof RequestError ? error.status : error instanceof ProtoError || error instanceof ShapeError || error instanceof ConfigError ? 400 : 500;
      sendJson(res, status, { detail: error instanceof Error ? error.message : String(error) });
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const path = (req.url ?? '/').split('?')[0].replace(/\/+$/, '');
    if (options.apiKey !== undefined && !sameSecret(String(req.headers['x-api-key'] ?? ''), options.apiKey)) {
      throw new RequestError(401, 'missing or wrong X-API-Key');
    }
    if (req.method === 'GET' && path === '/api/v1/healthz') return sendJson(res, 200, { status: 'ok' });
    if (req.method === 'GET' && path === '/api/v1/get_server_capabilities') {
      return sendJson(res, 200, { supported_models: [{ model_name: options.baseModel }] });
    }
    if (req.method !== 'POST') throw new RequestError(405, `${req.method} ${path} is not served`);
    const raw = await readBody(req, maxBodyBytes);
    if (path === '/api/v1/forward_backward' || path === '/api/v1/forward') {
      if (!/application\/x-protobuf/.test(String(req.headers['content-type'] ?? ''))) {
        throw new RequestError(415, `${path} takes application/x-protobuf`);
      }
      if (req.headers['content-encoding'] !== undefined && req.headers['content-encoding'] !== 'identity') {
        throw new RequestError(415, `content-encoding ${String(req.headers['content-encoding'])} is not supported`);
      }
      return sendJson(res, 200, forwardBackward(raw, path === '/api/v1/forward'));
    }
    let body: Record<string, unknown>;
    try {
      const parsed: unknown = raw.length === 0 ? {} : JSON.parse(Buffer.from(raw).toString('utf8'));
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw new Error('not an object');
      body = parsed as Record<string, unknown>;
    } catch {
      throw new RequestError(400, `${path}: the body is not a JSON object`);
    }
    const finish = /^\/api\/v1\/sessions\/([^/]+)\/finish$/.exec(path);
    if (finish !== null) {
      sessions.delete(decodeURIComponent(finish[1]));
      return sendJson(res, 200, {});
    }
    switch (path) {
      case '/api/v1/client/config':
        return sendJson(res, 200, { use_pyqwest_transport: false, parallel_fwdbwd_chunks: false, pjwt_auth_enabled: false });
      case '/api/v1/create_session': {
        const id = `sess-${randomUUID()}`;
        sessions.add(id);
        return sendJson(res, 200, { session_id: id, type: 'create_session' });
      }
      case '/api/v1/session_heartbeat':
        return sendJson(res, sessions.has(String(body.session_id)) ? 200 : 410, {});
      case '/api/v1/telemetry':
        return sendJson(res, 200, { status: 'accepted' });
      case '/api/v1/create_model':
        return sendJson(res, 200, createModel(body));
      case '/api/v1/get_info':
        return sendJson(res, 200, getInfo(body));
      case '/api/v1/optim_step':
        return sendJson(res, 200, optimStep(body));
      case '/api/v1/save_weights_for_sampler':
        return sendJson(res, 200, saveForSampler(body));
      case '/api/v1/create_sampling_session':
        return sendJson(res, 200, createSamplingSession(body));
      case '/api/v1/asample':
        return sendJson(res, 200, sample(body));
      case '/api/v1/save_weights':
        return sendJson(res, 200, saveState(body));
      case '/api/v1/load_weights':
        return sendJson(res, 200, body.model_id === undefined || body.model_id === null ? await createFromState(body) : loadState(body));
      case '/api/v1/retrieve_future':
        return retrieve(body, res);
      default:
        throw new RequestError(404, `${path} is not served by rxrl's Tinker service`);
    }
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const address = server.address() as AddressInfo;
  let closed: Promise<void> | undefined;
  return {
    url: `http://${address.family === 'IPv6' ? `[${address.address}]` : address.address}:${address.port}`,
    port: address.port,
    close: () => {
      closed ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }).then(async () => {
        await Promise.all([...models.values(), ...samplers.values()].map((m) => m.queue.catch(() => undefined)));
        for (const m of models.values()) m.trainer.dispose();
        models.clear();
        for (const sampler of samplers.values()) releaseSampler(sampler);
        samplers.clear();
      });
      return closed;
    },
  };
}

/** Frees a sampler's adapter copy and its view (a base-model sampler holds nothing of its own). */
function releaseSampler(sampler: Sampler): void {
  if (sampler.adapter === undefined) return;
  sampler.view.dispose();
  sampler.adapter.dispose();
}

/** A checkpoint name: non-empty, no `/`. */
function checkName(value: unknown): string {
  if (typeof value !== 'string' || value === '' || value.includes('/') || value.length > 200) {
    throw new RequestError(400, `a checkpoint name must be a non-empty string without '/', got ${JSON.stringify(value)}`);
  }
  return value;
}

/** `sampling_params.stop`: absent (the model's stop ids), token ids, or strings of one token each. */
function stopIds(stop: unknown, tokenizer: Tokenizer): number[] {
  if (stop === undefined || stop === null) return [...tokenizer.stopIds];
  const list = Array.isArray(stop) ? stop : [stop];
  return list.map((s) => {
    if (typeof s === 'number' && Number.isInteger(s)) return s;
    if (typeof s === 'string') {
      const ids = tokenizer.encode(s);
      if (ids.length === 1) return ids[0];
    }
    throw new RequestError(400, `sampling_params.stop: ${JSON.stringify(s)} is not a token id or a one-token string`);
  });
}

/** Log-prob of each prompt token given its prefix; NaN for the first. */
function scorePrompt(view: PolicyModel, prompt: readonly number[]): number[] {
  if (prompt.length < 2) return [Number.NaN];
  const values = tf.tidy(() => {
    const T = prompt.length;
    const ids = tf.tensor2d([...prompt], [1, T], 'int32');
    const mask = tf.ones([1, T]) as tf.Tensor2D;
    const positions = tf.tensor2d([prompt.map((_, i) => i)], [1, T], 'int32');
    return view.tokenLogprobs(ids, mask, positions).logprobs.dataSync();
  });
  return [Number.NaN, ...Array.from(values)];
}
