/**
 * The in-process rollout engine: samples from a policy model held in this process, gathering concurrent
 * requests into one batched generation (micro-batching with a size and a wait bound).
 *
 * @packageDocumentation
 */
import { AbortError, ConfigError } from '../core/errors.js';
import { hashSeed } from '../core/random.js';
import { yieldToEventLoop } from '../core/turns.js';
import type { ModelTag, PolicyVersion } from '../core/types.js';
import type { RolloutEngine } from './types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../model/types.js';

/** What the local engine needs of a model: batched sampling and weight replacement. */
export interface SamplingModel {
  /** Samples one response per request in one batched pass; responses are tagged with `version`. */
  generate(
    requests: readonly GenerateRequest[],
    options: {
      readonly signal?: AbortSignal;
      readonly version?: PolicyVersion;
      readonly stopIds?: readonly number[];
      /** One signal per request: a row whose signal fires may stop early (`finishReason: 'abort'`). */
      readonly rowSignals?: readonly (AbortSignal | undefined)[];
    },
  ): Promise<GenerateResponse[]>;
  /** Replaces the weights. */
  setWeights(weights: NamedWeights): void;
}

/** Options of {@link LocalEngine}. */
export interface LocalEngineOptions {
  /** Tokenizer of the model. */
  readonly tokenizer: Tokenizer;
  /** Model tag written on responses. Default `policy`. */
  readonly modelTag?: ModelTag;
  /** Most requests in one batched generation. Default 256. */
  readonly maxBatchSize?: number;
  /** How long an idle engine waits for more requests before starting a batch, in ms. Default 2. */
  readonly maxWaitMs?: number;
  /** Version of the weights the model holds now. Default 0. */
  readonly version?: PolicyVersion;
  /**
   * What a weight load does to a generation in flight: `continue` (default) lets it finish with the old weights
   * (tagged with the old version); `interrupt` stops it at the next decoding step, keeps the partial response,
   * and resumes it with the new weights — a partial rollout, tagged with the oldest version it used.
   */
  readonly weightSync?: WeightSyncPolicy;
  /**
   * The model is the trainer's own (sync mode: a rollout never runs while the trainer steps, and a generation in
   * flight samples from the weights it started with, `PolicyModel`'s sampling copy): a weight load then only moves
   * the version, and {@link RolloutEngine.sharesTrainerWeights} tells publishers not to copy the weights. Default
   * false.
   */
  readonly sharesTrainerWeights?: boolean;
}

/** What a weight load does to generations in flight. */
export type WeightSyncPolicy = 'continue' | 'interrupt';

/** Tokens already generated for a request that was interrupted by a weight load. */
interface Prefix {
  readonly tokens: readonly number[];
  readonly logprobs: readonly number[];
  readonly policyVersion: PolicyVersion;
}

interface Pending {
  readonly request: GenerateRequest;
  readonly prefix?: Prefix;
  readonly signal?: AbortSignal | undefined;
  readonly resolve: (response: GenerateResponse) => void;
  readonly reject: (error: unknown) => void;
}

/** How many batch sizes {@link LocalEngine.batchSizes} keeps (a long-running server must not grow it forever). */
export const BATCH_HISTORY = 1024;

/**
 * A {@link RolloutEngine} over an in-process model. Concurrent `generate` calls are gathered into batches of at
 * most `maxBatchSize` requests; one batch runs at a time, and requests that arrive meanwhile form the next one.
 * `loadWeights` waits for the running batch to finish, so every response is produced by one version.
 */
export class LocalEngine implements RolloutEngine {
  readonly modelTag: ModelTag;
  readonly tokenizer: Tokenizer;
  private current: PolicyVersion;
  /** Most requests in one batch. */
  readonly maxBatchSize: number;
  /** How long an idle engine waits for more requests before starting a batch, in ms. */
  readonly maxWaitMs: number;
  private queue: Pending[] = [];

  /** Requests queued and not yet in a batch. */
  get queued(): number {
    return this.queue.length;
  }
  private running: Promise<void> | undefined;
  private timer: ReturnType<typeof setTimeout> | undefined;
  /** Weight loads queued or running; no batch starts while one is pending. */
  private loads = 0;
  private lastLoad: Promise<void> = Promise.resolve();
  private readonly weightSync: WeightSyncPolicy;
  /** Aborts the running batch when a weight load interrupts it. */
  private interrupt: AbortController | undefined;
  /** Sizes of the batches run so far, the newest {@link BATCH_HISTORY} of them (for tests and metrics). */
  readonly batchSizes: number[] = [];
  /** Requests resumed after a weight load interrupted them. */
  resumed = 0;
  readonly sharesTrainerWeights: boolean;

  constructor(
    private readonly model: SamplingModel,
    options: LocalEngineOptions,
  ) {
    this.tokenizer = options.tokenizer;
    this.modelTag = options.modelTag ?? 'policy';
    this.maxBatchSize = options.maxBatchSize ?? 256;
    this.maxWaitMs = options.maxWaitMs ?? 2;
    this.current = options.version ?? 0;
    this.weightSync = options.weightSync ?? 'continue';
    this.sharesTrainerWeights = options.sharesTrainerWeights ?? false;
    if (this.weightSync !== 'continue' && this.weightSync !== 'interrupt') {
      throw new ConfigError(`unknown weightSync '${String(this.weightSync)}'; valid: continue, interrupt`);
    }
    if (!Number.isInteger(this.maxBatchSize) || this.maxBatchSize < 1) {
      throw new ConfigError(`maxBatchSize must be an integer >= 1, got ${this.maxBatchSize}`);
    }
    if (!(this.maxWaitMs >= 0)) throw new ConfigError(`maxWaitMs must be >= 0, got ${this.maxWaitMs}`);
  }

  get version(): PolicyVersion {
    return this.current;
  }

  generate(requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]> {
    if (signal?.aborted) return Promise.reject(new AbortError('generate aborted before it started'));
    const responses = requests.map(
      (request) =>
        new Promise<GenerateResponse>((resolve, reject) => {
          this.queue.push({ request, signal, resolve, reject });
        }),
    );
    this.schedule();
    return Promise.all(responses);
  }

  /**
   * Resolves once the engine has answered every request submitted so far and runs nothing (callers stop sending
   * requests first, e.g. before disposing the model).
   */
  async idle(): Promise<void> {
    for (;;) {
      if (this.running) {
        await this.running.catch(() => undefined);
      } else if (this.queue.length > 0 || this.loads > 0) {
        await new Promise((resolve) => setTimeout(resolve, this.maxWaitMs + 1));
      } else {
        return;
      }
    }
  }

  /**
   * Loads `weights` as `version` once the running batch (and any earlier load) is done. When `signal` fires first, the
   * wait ends at once with an `AbortError` and the load changes nothing (neither the weights nor the version).
   */
  async loadWeights(version: PolicyVersion, weights: NamedWeights, signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) throw new AbortError('weight load aborted before it started', { cause: signal.reason, context: { version } });
    this.loads++;
    const previous = this.lastLoad;
    if (this.weightSync === 'interrupt') this.interrupt?.abort();
    const load = (async () => {
      await previous;
      while (this.running && !signal?.aborted) await this.running;
      // A load stopped while it waited is dropped.
      if (signal?.aborted) return;
      if (!this.sharesTrainerWeights) this.model.setWeights(weights);
      this.current = version;
    })();
    this.lastLoad = load.catch(() => undefined);
    try {
      await untilAborted(load, signal, version);
    } finally {
      this.loads--;
      this.schedule();
    }
  }

  /** Starts a batch now if the queue is full, or after the wait bound if the engine is idle. */
  private schedule(): void {
    if (this.running || this.loads > 0 || this.queue.length === 0) return;
    if (this.queue.length >= this.maxBatchSize || this.maxWaitMs === 0) {
      this.startBatch();
    } else if (this.timer === undefined) {
      this.timer = setTimeout(() => this.startBatch(), this.maxWaitMs);
    }
  }

  private startBatch(): void {
    if (this.timer !== undefined) {
      clearTimeout(this.timer);
      this.timer = undefined;
    }
    if (this.running || this.loads > 0 || this.queue.length === 0) return;
    this.running = this.runBatch().finally(() => {
      this.running = undefined;
      this.schedule();
    });
  }

  private async runBatch(): Promise<void> {
    // A turn of the event loop between batches: the responses of the last batch are handled (encoded, sent) in
    // their own turns, not in the one that also builds and prefills the next batch.
    await yieldToEventLoop();
    if (this.loads > 0) return; // a weight load came in meanwhile: it goes first
    const batch = this.takeLive();
    if (batch.length === 0) return;
    this.batchSizes.push(batch.length);
    if (this.batchSizes.length > BATCH_HISTORY) this.batchSizes.splice(0, this.batchSizes.length - BATCH_HISTORY);
    const controller = new AbortController();
    const interrupt = new AbortController();
    this.interrupt = interrupt;
    const signal = AbortSignal.any([controller.signal, interrupt.signal]);
    const onAbort = (): void => {
      if (batch.every((p) => p.signal?.aborted)) controller.abort();
    };
    for (const p of batch) p.signal?.addEventListener('abort', onAbort, { once: true });
    const resume: Pending[] = [];
    try {
      let responses: GenerateResponse[];
      try {
        responses = await this.model.generate(
          batch.map((p) => p.request),
          { signal, version: this.current, stopIds: this.tokenizer.stopIds, rowSignals: batch.map((p) => p.signal) },
        );
      } catch (error) {
        // Interrupted before the first step: run the same requests again with the new weights.
        if (interrupt.signal.aborted && !controller.signal.aborted) {
          resume.push(...batch);
          return;
        }
        // One invalid request (a prompt longer than the model, say) fails alone: the others run again.
        const bad = error instanceof ConfigError ? error.context.request : undefined;
        if (typeof bad === 'number' && batch.length > 1 && bad >= 0 && bad < batch.length) {
          batch[bad].reject(error);
          resume.push(...batch.filter((_, i) => i !== bad));
          return;
        }
        throw error;
      }
      batch.forEach((p, i) => {
        if (p.signal?.aborted) return p.reject(new AbortError('generate aborted'));
        const response = p.prefix ? joinResponses(p.prefix, responses[i]) : responses[i];
        const remaining = p.request.maxTokens - responses[i].tokens.length;
        if (interrupt.signal.aborted && responses[i].finishReason === 'abort' && remaining > 0) {
          this.resumed++;
          resume.push({ ...p, request: continuation(p.request, responses[i].tokens), prefix: response });
        } else {
          p.resolve(response);
        }
      });
    } catch (error) {
      for (const p of batch) p.reject(error);
    } finally {
      if (this.interrupt === interrupt) this.interrupt = undefined;
      for (const p of batch) p.signal?.removeEventListener('abort', onAbort);
      this.queue.unshift(...resume);
    }
  }

  /**
   * Takes up to `maxBatchSize` queued requests, rejecting those already aborted. The queue is spliced, not
   * shifted: a shift moves the whole queue (10⁵ requests under a flood) once per request taken.
   */
  private takeLive(): Pending[] {
    const batch: Pending[] = [];
    while (batch.length < this.maxBatchSize && this.queue.length > 0) {
      for (const next of this.queue.splice(0, this.maxBatchSize - batch.length)) {
        if (next.signal?.aborted) next.reject(new AbortError('generate aborted while queued'));
        else batch.push(next);
      }
    }
    return batch;
  }
}

/** The request that resumes `request` after `generated` tokens: they join the prompt and the budget shrinks. */
function continuation(request: GenerateRequest, generated: readonly number[]): GenerateRequest {
  return {
    ...request,
    promptTokens: [...request.promptTokens, ...generated],
    maxTokens: request.maxTokens - generated.length,
    ...(request.seed === undefined ? {} : { seed: hashSeed(request.seed, 'resume', String(generated.length)) }),
  };
}

/** A response made of an interrupted prefix and its continuation, tagged with the oldest version used. */
function joinResponses(prefix: Prefix, rest: GenerateResponse): GenerateResponse {
  return {
    tokens: [...prefix.tokens, ...rest.tokens],
    logprobs: [...prefix.logprobs, ...rest.logprobs],
    finishReason: rest.finishReason,
    policyVersion: Math.min(prefix.policyVersion, rest.policyVersion),
  };
}

/** `work`, or an {@link AbortError} as soon as `signal` fires (`work` goes on, unawaited). */
function untilAborted(work: Promise<void>, signal: AbortSignal | undefined, version: PolicyVersion): Promise<void> {
  if (signal === undefined) return work;
  return new Promise<void>((resolve, reject) => {
    const onAbort = (): void =>
      reject(new AbortError('weight load aborted while it waited', { cause: signal.reason, context: { version } }));
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}
