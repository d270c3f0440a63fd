/**
 * rxrl as a Tinker-API client: a {@link Trainer} whose steps run on a Tinker service (rxrl's own `rxrl tinker`, or
 * any service speaking the API) and a {@link RolloutEngine} that samples through the service's sampling sessions.
 *
 * A GRPO step becomes one `forward_backward` with the `ppo` loss and one `optim_step`: each row of the prepared
 * batch is a datum (its prompt and response tokens; position `i` predicts token `i + 1`), the sampler's log-probs
 * and the advantages sit on the response positions (0 elsewhere), and the advantages are divided by the batch's
 * loss tokens, so the service's summed loss is the token-mean loss `GrpoTrainer` minimizes. After the step,
 * `save_weights_for_sampler` makes a sampling session of the new weights; weight sync points the engine at it.
 *
 * @packageDocumentation
 */
import type { RolloutEngine } from '../engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../model/types.js';
import { AbortError, EngineError, RetriesExhaustedError, RxrlError } from '../core/errors.js';
import { retry, type RetryOptions } from '../core/retry.js';
import { limitBody, readBoundedText } from '../core/http.js';
import { stalenessMetrics, type TrainerLoss } from '../train/grpoTrainer.js';
import type { StepResult, Trainer } from '../train/types.js';
import type { Batch, ModelTag, PolicyVersion } from '../core/types.js';
import { readCapabilities, type TinkerCapabilities } from './capabilities.js';
import {
  decodeForwardBackwardOutput,
  decodeSampleResponse,
  encodeForwardBackwardRequest,
  type ForwardBackwardOutputWire,
  type SampleResponseWire,
  type WireDatum,
} from './proto.js';

/** A call the Tinker service refused or failed (its HTTP status, or the future's error). */
export class TinkerError extends RxrlError {
  override readonly name = 'TinkerError';
}

/** How to reach a Tinker service. */
export interface TinkerClientOptions {
  /** The service's base URL (the SDK's `TINKER_BASE_URL`), e.g. `http://127.0.0.1:8000`. */
  readonly baseURL: string;
  /** Its API key (`TINKER_API_KEY`). */
  readonly apiKey: string;
  /**
   * Backoff of calls that failed transiently. Reads (bootstrap, `retrieve_future`) are retried on connection errors
   * and 5xx/408/429 answers; calls that change state (`forward_backward`, `optim_step`, saves, samples) only when the
   * connection was refused, i.e. the request never reached the service, so nothing is trained twice. Default: the
   * project's retry defaults.
   */
  readonly retry?: Omit<RetryOptions, 'signal' | 'isRetriable'>;
  /**
   * How long a future may stay unfinished before the call fails with a {@link TinkerError} (`context.lost`: the
   * service is not making progress): one deadline over all of its polls; and the deadline of every other request,
   * its retries included. Default 600 000 ms.
   */
  readonly futureTimeoutMs?: number;
  /** Largest answer read, in bytes (a longer one is a `DecodeError`). Default {@link TINKER_MAX_RESPONSE_BYTES}. */
  readonly maxResponseBytes?: number;
  /**
   * How long one `retrieve_future` poll may be held before it is given up and polled again, in ms (the SDK's 45 s;
   * a service holds a poll until the result is ready, or answers 408 "not yet"). Default 45 000.
   */
  readonly pollTimeoutMs?: number;
  /** The run's stop: it aborts the client's calls and polls at once (an {@link AbortError}). */
  readonly signal?: AbortSignal;
  /**
   * How often the session is kept alive with a heartbeat (a service ends sessions that go silent, and frees their
   * training clients), in ms. Default 10 000, as the SDK.
   */
  readonly heartbeatMs?: number;
}

/**
 * Whether `error` says the Tinker service lost what this client had on it — it cannot be reached, it answered
 * 5xx or "no such model / session / request" (a restarted service), or a future never finished — rather than
 * refusing one request. A run under `continue` then restarts from its last saved state.
 */
export function tinkerServiceLost(error: unknown): boolean {
  if (error instanceof RetriesExhaustedError) return tinkerServiceLost(error.cause);
  return (error instanceof EngineError || error instanceof TinkerError) && error.context.lost === true;
}

const RETRIEVE_FUTURE = '/api/v1/retrieve_future';

/**
 * Default bound of one answer of a Tinker service, in bytes: 512 MiB. The largest answers are a step's outputs (two
 * numbers per token of the batch: some 10 bytes each as protobuf, 20 as JSON), and V8 cannot hold a JSON text much
 * longer as one string anyway.
 */
export const TINKER_MAX_RESPONSE_BYTES = 512 * 1024 * 1024;

/** How much of an error answer is read for its message, in bytes (the message keeps 300 characters of it). */
const ERROR_TEXT_BYTES = 64 * 1024;

/** Calls that may be repeated whatever happened to the first attempt. */
const IDEMPOTENT = new Set(['/api/v1/client/config', '/api/v1/create_session', RETRIEVE_FUTURE, '/api/v1/get_info']);

/**
 * A seed as the Tinker API carries it, a non-negative int32: rxrl's seeds are uint32, and the API's are int32 (the
 * SDK and SkyRL refuse larger ones). The top bit is dropped, so seeds below 2^31 pass unchanged.
 */
export function tinkerSeed(seed: number): number {
  return (seed >>> 0) & 0x7fffffff;
}

/** A session on a Tinker service: training clients, sampling sessions, futures. */
export class TinkerClient {
  private readonly seqs = new Map<string, number>();
  private samplerSeq = 0;
  private heartbeat: ReturnType<typeof setInterval> | undefined;

  private constructor(
    private readonly options: TinkerClientOptions,
    /** The service's session id. */
    readonly sessionId: string,
    /** What the service does with rxrl's requests, read at {@link TinkerClient.connect}. */
    readonly capabilities: TinkerCapabilities,
  ) {}

  /**
   * Opens a session (`client/config`, `create_session`) and keeps it alive with heartbeats until
   * {@link TinkerClient.close}; reads the service's {@link TinkerClient.capabilities} first.
   */
  static async connect(options: TinkerClientOptions): Promise<TinkerClient> {
    const none: TinkerCapabilities = { loadCreatesModel: false, finishesSessions: true, unhonoured: [] };
    const probe = new TinkerClient(options, '', none);
    const config = await probe.post('/api/v1/client/config', { sdk_version: 'rxrl' });
    const capabilities = await readCapabilities(options.baseURL, options.apiKey, config, options.signal);
    const { session_id } = (await probe.post('/api/v1/create_session', {
      tags: [],
      user_metadata: {},
      sdk_version: 'rxrl',
      type: 'create_session',
    })) as {
      session_id: string;
    };
    const client = new TinkerClient(options, session_id, capabilities);
    client.heartbeat = setInterval(() => void client.beat(), options.heartbeatMs ?? 10_000);
    client.heartbeat.unref();
    return client;
  }

  /**
   * Stops the heartbeats and frees what the session holds on the service: each training client it made is unloaded
   * (`unload_model`, asked for, not awaited: the service frees it in its order, before any later client is made), and
   * the session finished (`sessions/{id}/finish`) where the service has that. Each request has 5 s; a service that
   * cannot be reached is left alone (it ends silent sessions itself).
   */
  async close(): Promise<void> {
    clearInterval(this.heartbeat);
    this.heartbeat = undefined;
    const once = (path: string, body: unknown) => this.postOnce(path, body, AbortSignal.timeout(5_000), false).catch(() => undefined);
    for (const modelId of this.seqs.keys()) await once('/api/v1/unload_model', { model_id: modelId, type: 'unload_model' });
    this.seqs.clear();
    if (this.capabilities.finishesSessions)
      await once(`/api/v1/sessions/${encodeURIComponent(this.sessionId)}/finish`, { reason: { type: 'success' }, detail: null });
  }

  /** One heartbeat; a session the service ended (410) is beaten no more. A failed one is retried at the next beat. */
  private async beat(): Promise<void> {
    try {
      await this.postOnce(
        '/api/v1/session_heartbeat',
        { session_id: this.sessionId, type: 'session_heartbeat' },
        AbortSignal.timeout(10_000),
        false,
      );
    } catch (error) {
      if (error instanceof TinkerError && error.context.status === 410) clearInterval(this.heartbeat);
    }
  }

  /**
   * A LoRA training client of `rank` on `baseModel`, its adapter initialised from `seed` where given (an int32, as
   * services take it); resolves with its model id.
   */
  async createLoraModel(baseModel: string, rank: number, seed?: number): Promise<string> {
    const future = await this.post('/api/v1/create_model', {
      session_id: this.sessionId,
      model_seq_id: this.seqs.size,
      base_model: baseModel,
      lora_config: {
        rank,
        train_unembed: true,
        train_mlp: true,
        train_attn: true,
        ...(seed === undefined ? {} : { seed: tinkerSeed(seed) }),
      },
      type: 'create_model',
    });
    const model_id = ((await this.result(future)) as { model_id?: unknown }).model_id ?? (future as { model_id?: unknown }).model_id;
    if (typeof model_id !== 'string') throw new TinkerError('create_model answered without a model_id');
    this.seqs.set(model_id, 0);
    return model_id;
  }

  /**
   * A training client made from a saved state, with the optimizer's state when `withOptimizer`; resolves with its
   * model id. Where the service creates clients from states (`load_weights` addressed by session, the rank from the
   * state) that is one request; elsewhere, as the SDK does, a client of `rank` is made first and the state loaded
   * into it.
   */
  async createModelFromState(path: string, withOptimizer: boolean, baseModel: string, rank: number): Promise<string> {
    if (!this.capabilities.loadCreatesModel) {
      const modelId = await this.createLoraModel(baseModel, rank);
      const body = { model_id: modelId, path, optimizer: withOptimizer, seq_id: this.nextSeq(modelId), type: 'load_weights' };
      await this.result(await this.post('/api/v1/load_weights', body));
      return modelId;
    }
    const modelSeqId = this.seqs.size;
    const modelId = `${this.sessionId}:train:${modelSeqId}`;
    const future = await this.post('/api/v1/load_weights', {
      session_id: this.sessionId,
      model_seq_id: modelSeqId,
      path,
      optimizer: withOptimizer,
      base_model: baseModel,
      type: 'load_weights',
    });
    await this.result(future);
    this.seqs.set(modelId, 0);
    return modelId;
  }

  /** Frees the training client `modelId` on the service (`unload_model`); resolves once it is freed. */
  async unloadModel(modelId: string): Promise<void> {
    const future = await this.post('/api/v1/unload_model', { model_id: modelId, type: 'unload_model' });
    this.seqs.delete(modelId);
    await this.result(future);
  }

  /** `save_state`: the adapter and the optimizer's state under `name`; resolves with its `tinker://` path. */
  async saveState(modelId: string, name: string): Promise<string> {
    const future = await this.post('/api/v1/save_weights', {
      model_id: modelId,
      path: name,
      seq_id: this.nextSeq(modelId),
      type: 'save_weights',
    });
    const { path } = (await this.result(future)) as { path?: unknown };
    if (typeof path !== 'string') throw new TinkerError('save_weights answered without a path');
    return path;
  }

  /** `forward_backward` (or `forward` with `forwardOnly`) of datums under `lossFn`. */
  async forwardBackward(
    modelId: string,
    data: readonly WireDatum[],
    lossFn: string,
    lossFnConfig: Readonly<Record<string, number>>,
    forwardOnly = false,
  ): Promise<ForwardBackwardOutputWire> {
    const body = encodeForwardBackwardRequest({
      modelId,
      seqId: this.nextSeq(modelId),
      data: [...data],
      lossFn,
      lossFnConfig,
      forwardOnly,
    });
    const future = await this.post('/api/v1/forward_backward', body);
    return decodeForwardBackwardOutput(this.bytes(await this.result(future, true)));
  }

  /** `optim_step` with Adam's parameters; resolves with the service's metrics. */
  async optimStep(
    modelId: string,
    adam: { learningRate: number; beta1: number; beta2: number; eps: number; weightDecay: number; gradClipNorm: number },
  ): Promise<Record<string, number>> {
    const future = await this.post('/api/v1/optim_step', {
      model_id: modelId,
      seq_id: this.nextSeq(modelId),
      adam_params: {
        learning_rate: adam.learningRate,
        beta1: adam.beta1,
        beta2: adam.beta2,
        eps: adam.eps,
        weight_decay: adam.weightDecay,
        grad_clip_norm: adam.gradClipNorm,
      },
      type: 'optim_step',
    });
    return ((await this.result(future)) as { metrics?: Record<string, number> }).metrics ?? {};
  }

  /** A sampling session of the model's current weights (`save_weights_for_sampler`). */
  async samplerOf(modelId: string): Promise<string> {
    const future = await this.post('/api/v1/save_weights_for_sampler', {
      model_id: modelId,
      sampling_session_seq_id: this.samplerSeq++,
      kind: 'snapshot',
      seq_id: this.nextSeq(modelId),
      type: 'save_weights_for_sampler',
    });
    return ((await this.result(future)) as { sampling_session_id: string }).sampling_session_id;
  }

  /** Samples `n` continuations of `prompt` in a sampling session. */
  async sample(
    samplingSessionId: string,
    prompt: readonly number[],
    n: number,
    params: { maxTokens: number; temperature: number; topP: number; seed?: number; stop: readonly number[] },
    signal?: AbortSignal,
  ): Promise<SampleResponseWire> {
    const future = await this.post(
      '/api/v1/asample',
      {
        sampling_session_id: samplingSessionId,
        seq_id: 0,
        num_samples: n,
        prompt: { chunks: [{ type: 'encoded_text', tokens: prompt }] },
        sampling_params: {
          max_tokens: params.maxTokens,
          temperature: params.temperature,
          top_p: params.topP,
          top_k: -1,
          stop: params.stop,
          ...(params.seed === undefined ? {} : { seed: tinkerSeed(params.seed) }),
        },
        type: 'sample',
      },
      signal,
    );
    return decodeSampleResponse(this.bytes(await this.result(future, true, signal)));
  }

  private nextSeq(modelId: string): number {
    const next = (this.seqs.get(modelId) ?? 0) + 1;
    this.seqs.set(modelId, next);
    return next;
  }

  /**
   * Polls a future until it completes, as the SDK does: each poll held at most `pollTimeoutMs`, a poll that times
   * out or answers 408 ("not yet") polled again, all of it within one `futureTimeoutMs` deadline.
   *
   * @throws {@link TinkerError} for an `error` result, a failing poll, or a future unfinished at the deadline
   *   (`context.lost`); {@link AbortError} at once when the run's or the caller's signal fires.
   */
  private async result(future: unknown, proto = false, signal?: AbortSignal): Promise<unknown> {
    const id = (future as { request_id?: unknown }).request_id;
    if (typeof id !== 'string') throw new TinkerError('the service answered without a request_id');
    const timeoutMs = this.options.futureTimeoutMs ?? 600_000;
    const deadline = AbortSignal.timeout(timeoutMs);
    const stop = this.stopOf(signal);
    for (;;) {
      const poll = AbortSignal.timeout(this.options.pollTimeoutMs ?? 45_000);
      let answer: unknown;
      try {
        const body = { request_id: id, allow_metadata_only: false };
        answer = await this.post(RETRIEVE_FUTURE, body, AbortSignal.any([deadline, poll, ...(stop ? [stop] : [])]), proto);
      } catch (error) {
        if (stop?.aborted) throw new AbortError(`request ${id}: the run was stopped`, { cause: stop.reason });
        if (deadline.aborted)
          throw new TinkerError(`request ${id} did not finish within ${timeoutMs} ms`, {
            cause: error,
            context: { lost: true, requestId: id, timeoutMs },
          });
        if (poll.aborted || (error instanceof TinkerError && error.context.status === 408)) continue;
        throw error;
      }
      if (answer instanceof Uint8Array) return answer;
      const record = answer as Record<string, unknown>;
      if (record.type === 'try_again') continue;
      if ('error' in record)
        throw new TinkerError(`the service failed request ${id}: ${String(record.error)}`, { context: { category: record.category } });
      return record;
    }
  }

  private bytes(value: unknown): Uint8Array {
    if (!(value instanceof Uint8Array)) throw new TinkerError('the service answered JSON where protobuf was expected');
    return value;
  }

  /** The run's stop and the caller's signal as one (undefined when neither is given). */
  private stopOf(signal?: AbortSignal): AbortSignal | undefined {
    const signals = [this.options.signal, signal].filter((s): s is AbortSignal => s !== undefined);
    return signals.length > 1 ? AbortSignal.any(signals) : signals[0];
  }

  private post(path: string, body: unknown, signal?: AbortSignal, proto = false): Promise<unknown> {
    const idempotent = IDEMPOTENT.has(path);
    const isRetriable = (error: unknown): boolean => {
      if (error instanceof EngineError) return idempotent || error.context.refused === true;
      // A future's 408 is the service's "not yet": `result` polls again, it is no failed attempt.
      if (path === RETRIEVE_FUTURE && error instanceof TinkerError && error.context.status === 408) return false;
      return idempotent && error instanceof TinkerError && error.retriable;
    };
    const stop = this.stopOf(signal);
    const timeoutMs = this.options.futureTimeoutMs ?? 600_000;
    const deadline = AbortSignal.timeout(timeoutMs);
    const attempt = async (): Promise<unknown> => {
      try {
        return await this.postOnce(path, body, stop ? AbortSignal.any([stop, deadline]) : deadline, proto);
      } catch (error) {
        if (!deadline.aborted || stop?.aborted) throw error;
        throw new TinkerError(`${path}: no answer within ${timeoutMs} ms`, { cause: error, context: { lost: true, timeoutMs } });
      }
    };
    return retry(attempt, { ...this.options.retry, isRetriable, ...(stop ? { signal: stop } : {}) });
  }

  private async postOnce(path: string, body: unknown, signal: AbortSignal | undefined, proto: boolean): Promise<unknown> {
    const binary = body instanceof Uint8Array;
    let response: Response;
    try {
      response = await fetch(`${this.options.baseURL.replace(/\/+$/, '')}${path}`, {
        method: 'POST',
        headers: {
          'content-type': binary ? 'application/x-protobuf' : 'application/json',
          accept: proto ? 'application/x-protobuf' : 'application/json',
          'x-api-key': this.options.apiKey,
        },
        body: binary ? body : JSON.stringify(body),
        ...(signal ? { signal } : {}),
      });
    } catch (cause) {
      if (signal?.aborted) throw cause;
      const code = (cause as { cause?: { code?: unknown } } | undefined)?.cause?.code;
      throw new EngineError(
        `cannot reach the Tinker service at ${this.options.baseURL} (${path}): ${String(code ?? (cause instanceof Error ? cause.message : cause))}`,
        {
          cause,
          retriable: true,
          context: { refused: code === 'ECONNREFUSED', lost: true },
        },
      );
    }
    if (!response.ok) {
      const text = await readBoundedText(response, ERROR_TEXT_BYTES).catch(() => '');
      const transient = response.status >= 500 || response.status === 408 || response.status === 429;
      // A 404 of a known route means the service no longer has the model, session, sampler or request.
      const lost = response.status >= 500 || response.status === 404 || response.status === 410;
      throw new TinkerError(`${path}: HTTP ${response.status} ${text.slice(0, 300)}`, {
        retriable: transient,
        context: { status: response.status, lost },
      });
    }
    const answer = await limitBody(response, this.options.maxResponseBytes ?? TINKER_MAX_RESPONSE_BYTES, `tinker ${path}`);
    if ((response.headers.get('content-type') ?? '').includes('application/x-protobuf')) return new Uint8Array(await answer.arrayBuffer());
    return (await answer.json()) as unknown;
  }
}

/**
 * Whether the Tinker service at `options.baseURL` answers its health check (`GET /api/v1/healthz`) within 5 s.
 *
 * @param options - Its address and key.
 * @param signal - Cancels the probe.
 */
export async function tinkerHealthy(options: Pick<TinkerClientOptions, 'baseURL' | 'apiKey'>, signal?: AbortSignal): Promise<boolean> {
  const timeout = AbortSignal.timeout(5_000);
  try {
    const response = await fetch(`${options.baseURL.replace(/\/+$/, '')}/api/v1/healthz`, {
      headers: { 'x-api-key': options.apiKey },
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
    await response.body?.cancel();
    return response.ok;
  } catch {
    return false;
  }
}

/** Options of {@link TinkerClientTrainer}. */
export interface TinkerClientTrainerOptions {
  /** `policy-gradient`: the `ppo` loss over the batch's advantages; `cross-entropy`: `cross_entropy` weighted by them. Default `policy-gradient`. */
  readonly loss?: TrainerLoss;
  readonly learningRate?: number;
  readonly adamBeta1?: number;
  readonly adamBeta2?: number;
  readonly adamEpsilon?: number;
  /** Clip the gradient's global norm to this. Default 1 (as `GrpoTrainer`). */
  readonly maxGradNorm?: number;
  /** PPO clip range `[1 − clipLow, 1 + clipHigh]`. Defaults 0.2 and `clipLow`. */
  readonly clipLow?: number;
  readonly clipHigh?: number;
  readonly modelTag?: ModelTag;
  /** Seed of the adapter's initialisation (sent as an int32; a service may choose its own without it). */
  readonly seed?: number;
}

/**
 * A {@link Trainer} whose GRPO steps run on a Tinker service (see the module comment); each step's sampler is
 * what {@link TinkerEngine} samples from once the step's version is synced.
 */
export class TinkerClientTrainer implements Trainer {
  readonly modelTag: ModelTag;
  step = 0;
  /** Sampling session of each version since the client started (the first: the weights it started with). */
  private readonly samplers = new Map<PolicyVersion, string>();

  private constructor(
    readonly client: TinkerClient,
    readonly modelId: string,
    private readonly options: TinkerClientTrainerOptions,
    step: number,
    sampler: string,
  ) {
    this.modelTag = options.modelTag ?? 'policy';
    this.step = step;
    this.samplers.set(step, sampler);
  }

  /**
   * A LoRA training client of `rank` on `baseModel`, and its first sampling session; with `from`, the client is
   * made from that saved state (its rank, adapter and optimizer state) and starts at its step.
   */
  static async create(
    client: TinkerClient,
    baseModel: string,
    rank: number,
    options: TinkerClientTrainerOptions = {},
    from?: { readonly path: string; readonly step: number },
  ): Promise<TinkerClientTrainer> {
    const modelId =
      from === undefined
        ? await client.createLoraModel(baseModel, rank, options.seed)
        : await client.createModelFromState(from.path, true, baseModel, rank);
    const trainer = new TinkerClientTrainer(client, modelId, options, from?.step ?? 0, await client.samplerOf(modelId));
    return trainer;
  }

  /** Saves the adapter and the optimizer's state on the service as `name`; resolves with the state's path. */
  saveState(name: string): Promise<string> {
    return this.client.saveState(this.modelId, name);
  }

  /** The sampling session of `version`. */
  samplerFor(version: PolicyVersion): string {
    const id = this.samplers.get(version);
    if (id === undefined) throw new TinkerError(`no sampling session for version ${version}`);
    return id;
  }

  /**
   * One step on the service: `forward_backward` of the batch's rows, then `optim_step`, then a sampling session of
   * the new weights. A batch of no rows (every sample of the step was lost) sends nothing — the API has no empty
   * `forward_backward` — and is a skipped step whose version samples from the weights before it.
   *
   * @throws {@link TinkerError} when the service's loss is not finite, before the update (it would corrupt the
   *   adapter); `context`: `step`, `loss`.
   */
  async trainStep(batch: Batch): Promise<StepResult> {
    const started = performance.now();
    const sft = this.options.loss === 'cross-entropy';
    const { data, tokens } = datumsOf(batch, sft ? 'cross_entropy' : 'ppo');
    const step = this.step;
    const base = { ...stalenessMetrics(batch, step), 'actor/loss_tokens': tokens };
    const result = (metrics: Record<string, number>, skipped: boolean): StepResult => ({
      step,
      version: step + 1,
      metrics: { ...base, ...metrics, 'timing/step_s': (performance.now() - started) / 1000 },
      skipped,
      trajectoryIds: batch.meta.trajectoryIds,
      weights: (): NamedWeights => new Map(),
    });
    if (data.length === 0) {
      this.samplers.set(step + 1, this.samplerFor(step));
      this.step++;
      return result({ 'actor/skipped_empty': 1 }, true);
    }
    const clipLow = this.options.clipLow ?? 0.2;
    const clipHigh = this.options.clipHigh ?? clipLow;
    const out = sft
      ? await this.client.forwardBackward(this.modelId, data, 'cross_entropy', {})
      : await this.client.forwardBackward(this.modelId, data, 'ppo', {
          clip_low_threshold: 1 - clipLow,
          clip_high_threshold: 1 + clipHigh,
        });
    const loss = lossOf(out);
    if (loss !== undefined && !Number.isFinite(loss))
      throw new TinkerError(`step ${step}: the service computed a non-finite loss (${loss}); the update was not applied`, {
        context: { step, loss },
      });
    const optim = await this.client.optimStep(this.modelId, {
      learningRate: this.options.learningRate ?? 1e-3,
      beta1: this.options.adamBeta1 ?? 0.9,
      beta2: this.options.adamBeta2 ?? 0.999,
      eps: this.options.adamEpsilon ?? 1e-8,
      weightDecay: 0,
      gradClipNorm: this.options.maxGradNorm ?? 1,
    });
    this.samplers.set(step + 1, await this.client.samplerOf(this.modelId));
    this.step++;
    const gradNorm = GRAD_NORM_KEYS.map((key) => optim[key]).find((v) => v !== undefined);
    const metrics: Record<string, number> = {};
    if (loss !== undefined) metrics[sft ? 'actor/sft_loss' : 'actor/pg_loss'] = loss;
    if (gradNorm !== undefined) metrics['actor/grad_norm'] = gradNorm;
    return result(metrics, false);
  }
}

/** Where services report the gradient's norm in `optim_step`'s metrics: the API's `name:reduction`, SkyRL's own. */
const GRAD_NORM_KEYS = ['grad_norm:mean', 'skyrl.ai/grad_norm'] as const;

/**
 * The summed loss of a `forward_backward`: the service's `loss:sum` metric, or — from services that report none —
 * the sum of every datum's `elementwise_loss` (the per-token loss, weights and advantages applied); undefined when
 * the service says neither.
 */
function lossOf(out: ForwardBackwardOutputWire): number | undefined {
  const reported = out.metrics['loss:sum'];
  if (reported !== undefined) return reported;
  let sum = 0;
  let found = false;
  for (const output of out.outputs) {
    const elementwise = output.elementwise_loss;
    if (elementwise === undefined) continue;
    found = true;
    for (const value of elementwise) sum += value;
  }
  return found ? sum : undefined;
}

/**
 * The batch's rows as datums of `loss`, advantages scaled so the summed loss is the token mean: `ppo` datums carry
 * the sampler's log-probs and the advantages, `cross_entropy` ones the advantages as the tokens' weights.
 */
function datumsOf(batch: Batch, loss: 'ppo' | 'cross_entropy'): { data: WireDatum[]; tokens: number } {
  const P = batch.promptLength;
  const R = batch.responseLength;
  const T = P + R;
  let tokens = 0;
  for (let i = 0; i < batch.size * R; i++) tokens += batch.lossMask[i];
  const scale = tokens > 0 ? 1 / tokens : 0;
  const data: WireDatum[] = [];
  for (let b = 0; b < batch.size; b++) {
    let first = 0;
    while (first < P && batch.attentionMask[b * T + first] === 0) first++;
    let length = 0;
    while (length < R && batch.responseMask[b * R + length] === 1) length++;
    const ids = Array.from(batch.inputIds.subarray(b * T + first, b * T + P + length));
    const n = ids.length - 1;
    const logprobs = new Float32Array(n);
    const advantages = new Float32Array(n);
    for (let i = 0; i < length; i++) {
      const k = P - first + i - 1; // input position predicting response token i
      logprobs[k] = batch.oldLogprobs[b * R + i];
      advantages[k] = batch.advantages[b * R + i] * batch.lossMask[b * R + i] * scale;
    }
    data.push({
      tokens: ids.slice(0, n),
      lossFnInputs: {
        target_tokens: { dtype: 'int64', data: ids.slice(1), shape: [n] },
        ...(loss === 'ppo'
          ? { logprobs: { dtype: 'float32', data: logprobs, shape: [n] }, advantages: { dtype: 'float32', data: advantages, shape: [n] } }
          : { weights: { dtype: 'float32', data: advantages, shape: [n] } }),
      },
    });
  }
  return { data, tokens };
}

/** A {@link RolloutEngine} that samples through a Tinker service, from the session of the synced version. */
export class TinkerEngine implements RolloutEngine {
  readonly modelTag: ModelTag;
  private current: PolicyVersion;

  constructor(
    private readonly trainer: TinkerClientTrainer,
    readonly tokenizer: Tokenizer,
  ) {
    this.modelTag = trainer.modelTag;
    this.current = trainer.step;
  }

  get version(): PolicyVersion {
    return this.current;
  }

  async generate(requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]> {
    const version = this.current;
    const session = this.trainer.samplerFor(version);
    return Promise.all(
      requests.map(async (request) => {
        const out = await this.trainer.client.sample(
          session,
          request.promptTokens,
          1,
          {
            maxTokens: request.maxTokens,
            temperature: request.temperature ?? 1,
            topP: request.topP ?? 1,
            stop: request.stopTokens ?? this.tokenizer.stopIds,
            ...(request.seed === undefined ? {} : { seed: request.seed }),
          },
          signal,
        );
        const [sequence] = out.sequences;
        return {
          tokens: [...sequence.tokens],
          logprobs: [...sequence.logprobs],
          finishReason: sequence.stopReason,
          policyVersion: version,
        };
      }),
    );
  }

  /** Samples from the session the trainer made for `version` (the weights travel on the service). */
  async loadWeights(version: PolicyVersion): Promise<void> {
    this.trainer.samplerFor(version);
    this.current = version;
  }
}
