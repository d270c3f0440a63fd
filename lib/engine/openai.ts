/**
 * A rollout engine over any OpenAI-compatible server (vLLM, SGLang, `rxrl serve`), through the `openai` client.
 *
 * Token-level sampling (`generate`) goes through `/v1/completions` with the prompt as token ids; chat turns
 * (`chat`, used by agent rollouts) go through `/v1/chat/completions`. Token ids come back through vLLM's
 * `return_tokens_as_token_ids` extension (log-prob tokens spelled `token_id:<id>`) or its `token_ids` /
 * `prompt_token_ids` fields (`return_token_ids`); log-probs through the standard `logprobs` fields.
 *
 * Every HTTP call has a deadline and goes through the one retry helper ({@link retry}): timeouts, connection
 * errors, 5xx answers and malformed bodies are retried with exponential backoff and jitter; 4xx answers are not.
 * A call that still fails rejects that one sample (the `rollout` operator reports it as a `SampleFailure`) and
 * is counted in {@link OpenAIEngine.stats}.
 *
 * Weight sync writes a safetensors checkpoint where the server can read it and calls the server's
 * weight-update endpoint (SGLang's `POST /update_weights_from_disk { model_path }` by default).
 *
 * @packageDocumentation
 */
import { rm } from 'node:fs/promises';
import { join } from 'node:path';

import OpenAI, { APIConnectionError, APIConnectionTimeoutError, APIError, APIUserAbortError } from 'openai';
import type {
  ChatCompletion,
  ChatCompletionCreateParamsNonStreaming,
  ChatCompletionMessageParam,
  ChatCompletionTool,
} from 'openai/resources/chat/completions';
import type { Completion, CompletionCreateParamsNonStreaming } from 'openai/resources/completions';

import type { ChatTemplate } from '../chat/template.js';
import type { ChatEngine, ChatMessage, ChatRequest, ChatResult, ChatTool, ToolCall } from '../chat/types.js';
import { AbortError, ConfigError, DecodeError, EngineError, isAbortError, throwIfAborted } from '../core/errors.js';
import { POLICY_VERSION_METADATA_KEY, saveModelDir, specialIdsOf, type SpecialTokenIds } from '../model/modelDir.js';
import { savePeftWeights, type ResolvedLoraConfig } from '../model/lora.js';
import type { PolicyConfig } from '../model/config.js';
import { retry, type RetryOptions } from '../core/retry.js';
import { openaiClient } from './openaiClient.js';
import type { FinishReason, Metrics, ModelTag, PolicyVersion } from '../core/types.js';
import type { RolloutEngine } from './types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../model/types.js';

/** Prefix of a log-prob token spelled as its id (vLLM's `return_tokens_as_token_ids`). */
export const TOKEN_ID_PREFIX = 'token_id:';

export { DEFAULT_MAX_RESPONSE_BYTES } from './openaiClient.js';

/** Default path of the weight-update endpoint (SGLang's API). */
export const DEFAULT_WEIGHT_UPDATE_ENDPOINT = '/update_weights_from_disk';

/** Where and how {@link OpenAIEngine.loadWeights} publishes weights. */
export interface OpenAIWeightSyncOptions {
  /** Directory the server can read; checkpoints are written below it. */
  readonly directory: string;
  /**
   * Weight-update endpoint: a path on the server's origin (the base URL without its `/v1`) or an absolute URL.
   * Default {@link DEFAULT_WEIGHT_UPDATE_ENDPOINT}.
   */
  readonly endpoint?: string;
  /**
   * Architecture of the weights: each version is written as a complete Hugging Face model directory
   * `<directory>/v<version>/` (config.json, model.safetensors, generation_config.json, tokenizer files), the
   * `model_path` SGLang, vLLM and `rxrl serve` load.
   */
  readonly config: PolicyConfig;
  /** Special token ids written into `config.json` / `generation_config.json`. */
  readonly special?: SpecialTokenIds;
  /** How many published checkpoints to keep on disk (older ones are deleted). Default 2. */
  readonly keep?: number;
  /** Body of the update request. Default `{ model_path, weight_version: String(version) }`. */
  readonly body?: (modelPath: string, version: PolicyVersion) => Record<string, unknown>;
  /**
   * Deadline of one update, in ms: of each attempt, and of the whole update with its retries (a LoRA load's check in
   * `/v1/models` included). Default 300 000.
   */
  readonly timeoutMs?: number;
  /**
   * A LoRA policy (vLLM's `--enable-lora`, `rxrl serve`): each version is written as a PEFT adapter directory
   * `<directory>/v<version>/` of the adapter's weights alone and loaded with `POST /v1/load_lora_adapter` as
   * `<name>-v<version>` (`load_inplace`, so a resumed run may load a version again), which later requests name;
   * the versions beyond the last `keep` are unloaded (`POST /v1/unload_lora_adapter`) and deleted, and the first
   * load unloads every other `<name>-v*` the server lists (what a killed run left): the name belongs to one run.
   * After each load the adapter must be listed in `GET /v1/models` (a server that answered the load without loading
   * it is an {@link EngineError}). The server serves the base model the adapters adapt.
   */
  readonly lora?: { readonly config: ResolvedLoraConfig; readonly name: string; readonly baseModel?: string | null };
}

/** Options of {@link OpenAIEngine}. */
export interface OpenAIEngineOptions {
  /** Base URL of the OpenAI API, e.g. `http://127.0.0.1:8000/v1`. */
  readonly baseURL: string;
  /** Served model name (the `model` field of every request). */
  readonly model: string;
  /** Tokenizer of the served model (prompts are sent as token ids). */
  readonly tokenizer: Tokenizer;
  /** API key. Default `OPENAI_API_KEY`, else `EMPTY` (local servers ignore it). */
  readonly apiKey?: string;
  /** Model tag written on responses. Default `policy`. */
  readonly modelTag?: ModelTag;
  /** Version of the weights the server holds now. Default 0. */
  readonly version?: PolicyVersion;
  /** Most HTTP calls in flight at once (≥ 1, finite). Default 256. */
  readonly concurrency?: number;
  /** Deadline of one attempt, in ms (covers the response body too). Default 120 000. */
  readonly timeoutMs?: number;
  /** Backoff of retried calls (see {@link retry}); `retries` 0 turns retrying off. */
  readonly retry?: Omit<RetryOptions, 'signal' | 'isRetriable' | 'onRetry'>;
  /** Renders chat prompts when the server does not return `prompt_token_ids`. */
  readonly chatTemplate?: ChatTemplate;
  /** Weight publication; without it `loadWeights` throws a `ConfigError`. */
  readonly weightSync?: OpenAIWeightSyncOptions;
  /** Extra fields merged into every completion and chat request body (server-specific extensions). */
  readonly extraBody?: Readonly<Record<string, unknown>>;
  /** Largest answer body read, in bytes (a larger one is a {@link DecodeError}). Default {@link DEFAULT_MAX_RESPONSE_BYTES}. */
  readonly maxResponseBytes?: number;
}

/** Counters of an {@link OpenAIEngine}. */
export interface OpenAIEngineStats {
  /** Calls made (generation samples, chat turns, weight updates). */
  readonly calls: number;
  /** HTTP attempts, including retries. */
  readonly attempts: number;
  /** Attempts that were retried. */
  readonly retries: number;
  /** Attempts that hit the deadline. */
  readonly timeouts: number;
  /** Calls that failed for good (after their retries, or at once when not retriable). */
  readonly failures: number;
  /** Weight versions published. */
  readonly weightLoads: number;
}

/** vLLM-style extensions rxrl sends and `rxrl serve` understands. */
interface TokenIdExtensions {
  return_tokens_as_token_ids?: boolean;
  return_token_ids?: boolean;
  stop_token_ids?: number[];
  /** vLLM's and SGLang's: the model's end-of-sequence tokens end no completion. */
  ignore_eos?: boolean;
}

/** Fields an rxrl or vLLM server may add to a response. */
interface ResponseExtensions {
  policy_version?: unknown;
  prompt_token_ids?: unknown;
}

/** Fields vLLM adds to a choice. */
interface ChoiceExtensions {
  token_ids?: unknown;
}

type Mutable<T> = { -readonly [K in keyof T]: T[K] };

/**
 * A {@link RolloutEngine} (and {@link ChatEngine}) over an OpenAI-compatible server.
 *
 * @example
 * ```ts
 * import { CharTokenizer, OpenAIEngine } from 'rxrl';
 * const engine = new OpenAIEngine({
 *   baseURL: 'http://127.0.0.1:8000/v1', model: 'rxrl-policy', tokenizer: new CharTokenizer('abcde='),
 *   weightSync: { directory: '/tmp/rxrl-weights', config: policy.config },
 * });
 * const [response] = await engine.generate([{ promptTokens: [1, 3, 4, 8], maxTokens: 5, seed: 1 }]);
 * ```
 */
export class OpenAIEngine implements RolloutEngine, ChatEngine {
  readonly modelTag: ModelTag;
  readonly tokenizer: Tokenizer;
  /** The model name requests carry now: the served model, or the adapter of the current version. */
  private served: string;
  /** The underlying `openai` client (built-in retries off: the engine retries itself). */
  readonly client: OpenAI;
  private current: PolicyVersion;
  private readonly limiter: Limiter;
  private readonly timeoutMs: number;
  private readonly counters: Mutable<OpenAIEngineStats> = {
    calls: 0,
    attempts: 0,
    retries: 0,
    timeouts: 0,
    failures: 0,
    weightLoads: 0,
  };
  private lastLoad: Promise<void> = Promise.resolve();
  /** The versions on disk (and, for a LoRA policy, loaded on the server under `adapter`), oldest first. */
  private published: { readonly path: string; readonly adapter?: string }[] = [];
  /** Whether the server was cleared of this policy's versions that another process left. */
  private swept = false;

  constructor(private readonly options: OpenAIEngineOptions) {
    this.modelTag = options.modelTag ?? 'policy';
    this.tokenizer = options.tokenizer;
    this.served = options.model;
    this.current = options.version ?? 0;
    this.timeoutMs = options.timeoutMs ?? 120_000;
    const concurrency = options.concurrency ?? 256;
    if (!Number.isInteger(concurrency) || concurrency < 1) {
      throw new ConfigError(`concurrency must be a finite integer >= 1, got ${concurrency}`);
    }
    if (!(Number.isInteger(this.timeoutMs) && this.timeoutMs > 0)) {
      throw new ConfigError(`timeoutMs must be a positive integer, got ${this.timeoutMs}`);
    }
    if (options.model === '') throw new ConfigError('model must be a non-empty name');
    const keep = options.weightSync?.keep ?? 2;
    if (!Number.isInteger(keep) || keep < 1) throw new ConfigError(`weightSync.keep must be an integer >= 1, got ${keep}`);
    this.limiter = new Limiter(concurrency);
    this.client = openaiClient({
      baseURL: options.baseURL,
      apiKey: options.apiKey ?? process.env.OPENAI_API_KEY ?? 'EMPTY',
      timeoutMs: this.timeoutMs,
      maxResponseBytes: options.maxResponseBytes,
    });
  }

  get version(): PolicyVersion {
    return this.current;
  }

  /** The model name requests carry: the served model, or for a LoRA policy the adapter of the current version. */
  get model(): string {
    return this.served;
  }

  /** A snapshot of the counters. */
  stats(): OpenAIEngineStats {
    return { ...this.counters };
  }

  /** The counters as namespaced metrics (`engine/attempts`, `engine/failures`, …). */
  metrics(): Metrics {
    const out: Metrics = {};
    for (const [key, value] of Object.entries(this.counters)) out[`engine/${key}`] = value;
    return out;
  }

  /**
   * Samples one response per request through `/v1/completions` (one HTTP call per request, at most
   * `concurrency` in flight). The first request that fails for good aborts its siblings and rejects the call.
   */
  generate(requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]> {
    if (signal?.aborted) return Promise.reject(new AbortError('generate aborted before it started', { cause: signal.reason }));
    if (requests.length === 1) return this.complete(requests[0], signal).then((response) => [response]);
    const siblings = new AbortController();
    const shared = signal ? AbortSignal.any([signal, siblings.signal]) : siblings.signal;
    return Promise.all(
      requests.map((request) =>
        this.complete(request, shared).catch((error: unknown) => {
          siblings.abort(error);
          throw error;
        }),
      ),
    );
  }

  /** Generates one assistant turn through `/v1/chat/completions`. */
  async chat(request: ChatRequest, signal?: AbortSignal): Promise<ChatResult> {
    const tools = request.tools ?? [];
    const body: ChatCompletionCreateParamsNonStreaming & TokenIdExtensions = {
      ...this.options.extraBody,
      model: this.served,
      messages: request.messages.map(toOpenAIMessage),
      ...(tools.length > 0 ? { tools: tools.map(toOpenAITool) } : {}),
      max_tokens: request.maxTokens,
      temperature: request.temperature ?? 1,
      top_p: request.topP ?? 1,
      n: 1,
      logprobs: true,
      top_logprobs: 0,
      ...(request.seed === undefined ? {} : { seed: request.seed }),
      return_tokens_as_token_ids: true,
      return_token_ids: true,
    };
    const startVersion = this.current;
    return this.call(
      'chat',
      (options) => this.client.chat.completions.create(body, options),
      (completion) => this.parseChat(this.checkAdapter(completion, body.model, startVersion), request, startVersion),
      signal,
    );
  }

  /**
   * Publishes weights: writes a safetensors checkpoint under `weightSync.directory` and calls the server's
   * update endpoint; later generations are tagged with `version`. Loads run one at a time, in call order. Each
   * update ends at `weightSync.timeoutMs`, its retries included, and at once when `signal` fires.
   *
   * @throws {@link ConfigError} when the engine has no `weightSync`.
   * @throws {@link EngineError} when the server refuses the update (`success: false` or an error status), or a LoRA
   *   adapter it answered for is not listed in `/v1/models`.
   * @throws {@link AbortError} when `signal` fires.
   */
  loadWeights(version: PolicyVersion, weights: NamedWeights, signal?: AbortSignal): Promise<void> {
    const sync = this.options.weightSync;
    if (sync === undefined) {
      return Promise.reject(new ConfigError('OpenAIEngine.loadWeights needs the weightSync option (a directory the server can read)'));
    }
    const load = this.lastLoad.then(() => this.publish(sync, version, weights, signal));
    this.lastLoad = load.catch(() => undefined);
    return load;
  }

  private async publish(sync: OpenAIWeightSyncOptions, version: PolicyVersion, weights: NamedWeights, signal?: AbortSignal): Promise<void> {
    throwIfAborted(signal);
    if (sync.lora) return this.publishAdapter(sync, sync.lora, version, weights, signal);
    const modelPath = join(sync.directory, `v${version}`);
    await saveModelDir(
      modelPath,
      { config: sync.config, weights },
      {
        tokenizerFiles: this.options.tokenizer.files(),
        special: sync.special ?? specialIdsOf(this.options.tokenizer),
        metadata: { [POLICY_VERSION_METADATA_KEY]: String(version) },
      },
    );
    const body = sync.body ? sync.body(modelPath, version) : { model_path: modelPath, weight_version: String(version) };
    const update = new WeightUpdate(sync.timeoutMs ?? DEFAULT_WEIGHT_UPDATE_TIMEOUT_MS, signal);
    await this.updateCall(sync.endpoint ?? DEFAULT_WEIGHT_UPDATE_ENDPOINT, body, version, update);
    this.current = version;
    this.counters.weightLoads++;
    await this.retire(sync, { path: modelPath }, version, update);
  }

  /**
   * A LoRA version: its PEFT directory, `load_lora_adapter` as `<name>-v<version>`, checked listed in `/v1/models`,
   * then the old ones unloaded.
   */
  private async publishAdapter(
    sync: OpenAIWeightSyncOptions,
    lora: NonNullable<OpenAIWeightSyncOptions['lora']>,
    version: PolicyVersion,
    weights: NamedWeights,
    signal: AbortSignal | undefined,
  ): Promise<void> {
    const path = join(sync.directory, `v${version}`);
    const name = `${lora.name}-v${version}`;
    await savePeftWeights(path, lora.config, weights, lora.baseModel ?? null, { [POLICY_VERSION_METADATA_KEY]: String(version) });
    const update = new WeightUpdate(sync.timeoutMs ?? DEFAULT_WEIGHT_UPDATE_TIMEOUT_MS, signal);
    // In place: a resumed run publishes again a version the server may still hold from before.
    await this.updateCall('/v1/load_lora_adapter', { lora_name: name, lora_path: path, load_inplace: true }, version, update);
    // A server may answer the load without loading (then every request naming the adapter fails): it must list it.
    const listed = await this.call(
      'models',
      (options) => this.client.models.list(options),
      (page) => modelIds(page),
      signal,
      update.limits(),
    );
    if (!listed.includes(name)) {
      throw new EngineError(
        `/v1/load_lora_adapter for version ${version} was answered, but the server does not list ${name} in /v1/models: the adapter is not loaded`,
        { context: { version, route: '/v1/load_lora_adapter', adapter: name, kind: 'not-listed' } },
      );
    }
    this.current = version;
    this.served = name;
    this.counters.weightLoads++;
    // A run that was killed left its versions loaded: the first load of this process unloads them.
    if (!this.swept) {
      this.swept = true;
      const own = new RegExp(`^${lora.name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}-v\\d+$`);
      for (const id of listed) {
        if (id !== name && own.test(id)) await this.updateCall('/v1/unload_lora_adapter', { lora_name: id }, version, update, true);
      }
    }
    await this.retire(sync, { path, adapter: name }, version, update);
  }

  /**
   * Records a published version, then drops the oldest beyond `keep`: a LoRA version is unloaded from the server first
   * (requests already running on it finish there, in vLLM and rxrl serve), and its files are deleted.
   */
  private async retire(
    sync: OpenAIWeightSyncOptions,
    latest: (typeof this.published)[number],
    version: PolicyVersion,
    update: WeightUpdate,
  ): Promise<void> {
    this.published = [...this.published.filter((p) => p.path !== latest.path), latest];
    while (this.published.length > (sync.keep ?? 2)) {
      const old = this.published.shift()!;
      if (old.adapter !== undefined) await this.updateCall('/v1/unload_lora_adapter', { lora_name: old.adapter }, version, update, true);
      await rm(old.path, { recursive: true, force: true });
    }
  }

  /**
   * `POST` of a weight route (a path on the server's origin, or a URL) within the update's deadline and signal:
   * `success: false` is refused, and so is an error status — but a 404 when `gone` (what to unload is not there).
   */
  private async updateCall(
    route: string,
    body: Record<string, unknown>,
    version: PolicyVersion,
    update: WeightUpdate,
    gone = false,
  ): Promise<void> {
    const url = resolveEndpoint(this.options.baseURL, route);
    try {
      await this.call(
        'weights',
        (options) => this.client.post<unknown>(url, { body, ...options }),
        (answer) => {
          if (typeof answer === 'object' && answer !== null && (answer as { success?: unknown }).success === false) {
            const message = String((answer as { message?: unknown }).message ?? 'no message');
            throw new EngineError(`${route} for version ${version} refused: ${message}`, { context: { version, route } });
          }
        },
        update.signal,
        update.limits(),
      );
    } catch (error) {
      if (gone && error instanceof EngineError && error.context.status === 404) return;
      throw error;
    }
  }

  /**
   * A LoRA policy's answer must come from the adapter it asked for; its version is that adapter's, whatever version
   * the server reports for its base.
   */
  private checkAdapter<R extends { model?: string }>(answer: R, requested: string, version: PolicyVersion): R {
    if (this.options.weightSync?.lora === undefined) return answer;
    if (answer?.model !== requested) throw malformed(`asked adapter ${requested}, answered by ${String(answer?.model)}`);
    return { ...answer, policy_version: version };
  }

  private async complete(request: GenerateRequest, signal?: AbortSignal): Promise<GenerateResponse> {
    const body: CompletionCreateParamsNonStreaming & TokenIdExtensions = {
      ...this.options.extraBody,
      model: this.served,
      prompt: [...request.promptTokens],
      max_tokens: request.maxTokens,
      temperature: request.temperature ?? 1,
      top_p: request.topP ?? 1,
      n: 1,
      logprobs: 0,
      ...(request.seed === undefined ? {} : { seed: request.seed }),
      ...(request.stopTokens === undefined ? {} : { stop_token_ids: [...request.stopTokens] }),
      // No stop tokens: the server's own end-of-sequence tokens must not end the completion either.
      ...(request.stopTokens?.length === 0 ? { ignore_eos: true } : {}),
      return_tokens_as_token_ids: true,
    };
    const startVersion = this.current;
    return this.call(
      'completion',
      (options) => this.client.completions.create(body, options),
      (completion) => this.parseCompletion(this.checkAdapter(completion, body.model, startVersion), startVersion),
      signal,
    );
  }

  /**
   * One logical call: bounded concurrency, a deadline per attempt (and, when `limits.deadlineMs` is given, one for
   * the attempts and their waits together), retries through the retry helper, errors
   * classified into typed errors, the answer parsed (an unusable answer is not retried), and the counters.
   */
  private async call<R, T>(
    what: string,
    send: (options: { signal: AbortSignal; timeout: number; maxRetries: number }) => PromiseLike<R>,
    parse: (answer: R) => T,
    signal: AbortSignal | undefined,
    limits: CallLimits = {},
  ): Promise<T> {
    const timeoutMs = limits.timeoutMs ?? this.timeoutMs;
    this.counters.calls++;
    try {
      const answer = await this.limiter.run(signal, () =>
        retry(
          async () => {
            this.counters.attempts++;
            const deadline = new AbortController();
            const timer = setTimeout(() => deadline.abort(), timeoutMs);
            const combined = signal ? AbortSignal.any([signal, deadline.signal]) : deadline.signal;
            try {
              return await send({ signal: combined, timeout: timeoutMs, maxRetries: 0 });
            } catch (error) {
              const typed = classifyError(error, what, signal, deadline.signal, timeoutMs);
              if (typed instanceof EngineError && typed.context.kind === 'timeout') this.counters.timeouts++;
              throw typed;
            } finally {
              clearTimeout(timer);
            }
          },
          { ...this.options.retry, deadlineMs: limits.deadlineMs, signal, onRetry: () => void this.counters.retries++ },
        ),
      );
      return parse(answer);
    } catch (error) {
      if (!isAbortError(error)) this.counters.failures++;
      throw error;
    }
  }

  private parseCompletion(completion: Completion, startVersion: PolicyVersion): GenerateResponse {
    const choice = completion?.choices?.[0];
    if (choice === undefined) throw malformed('completion has no choices');
    const lp = choice.logprobs;
    const tokens = tokenIds(lp?.tokens, (choice as ChoiceExtensions).token_ids, this.tokenizer);
    const logprobs = lp?.token_logprobs;
    if (tokens === undefined) throw malformed('completion carries no token ids (logprobs.tokens or token_ids)');
    checkLogprobs(logprobs, tokens.length);
    return {
      tokens,
      logprobs: [...logprobs!],
      finishReason: finishReasonOf(choice.finish_reason),
      policyVersion: versionOf(completion as ResponseExtensions, startVersion),
    };
  }

  private parseChat(completion: ChatCompletion, request: ChatRequest, startVersion: PolicyVersion): ChatResult {
    const choice = completion?.choices?.[0];
    if (choice === undefined) throw malformed('chat completion has no choices');
    const content = choice.logprobs?.content ?? undefined;
    const tokens = tokenIds(
      content?.map((c) => c.token),
      (choice as ChoiceExtensions).token_ids,
      this.tokenizer,
    );
    if (tokens === undefined) throw malformed('chat completion carries no token ids (logprobs.content or token_ids)');
    const logprobs = content?.map((c) => c.logprob);
    checkLogprobs(logprobs, tokens.length);
    const extensions = completion as ResponseExtensions;
    let promptTokens: number[];
    if (isTokenArray(extensions.prompt_token_ids, this.tokenizer.vocabSize)) {
      promptTokens = [...extensions.prompt_token_ids];
    } else if (this.options.chatTemplate) {
      promptTokens = this.options.chatTemplate.render(request.messages, request.tools ?? [], { addGenerationPrompt: true });
    } else {
      throw malformed('chat completion has no prompt_token_ids; pass a chatTemplate to render prompts locally');
    }
    const toolCalls: ToolCall[] = (choice.message.tool_calls ?? []).flatMap((call) =>
      call.type === 'function' ? [{ id: call.id, name: call.function.name, arguments: call.function.arguments }] : [],
    );
    const message: ChatMessage = {
      role: 'assistant',
      content: choice.message.content ?? '',
      ...(toolCalls.length > 0 ? { toolCalls } : {}),
    };
    return {
      message,
      promptTokens,
      tokens,
      logprobs: [...logprobs!],
      finishReason: finishReasonOf(choice.finish_reason),
      policyVersion: versionOf(extensions, startVersion),
    };
  }
}

/** Default deadline of one weight update, in ms. */
export const DEFAULT_WEIGHT_UPDATE_TIMEOUT_MS = 300_000;

/** The deadlines of one {@link OpenAIEngine} call: of each attempt, and of all its attempts together. */
interface CallLimits {
  readonly timeoutMs?: number | undefined;
  readonly deadlineMs?: number | undefined;
}

/**
 * One weight update's deadline, shared by its calls (the load, its check, the unloads): each call gets what is
 * left of it, and the caller's signal.
 */
class WeightUpdate {
  private readonly end: number;

  constructor(
    timeoutMs: number,
    readonly signal: AbortSignal | undefined,
  ) {
    this.end = performance.now() + timeoutMs;
  }

  /** What is left of the deadline (at least 1 ms), for an attempt and for the call's retries. */
  limits(): CallLimits {
    const left = Math.max(1, Math.ceil(this.end - performance.now()));
    return { timeoutMs: left, deadlineMs: left };
  }
}

/** The ids of a `/v1/models` answer (refused when it has no list of models). */
function modelIds(page: { data?: unknown }): string[] {
  if (!Array.isArray(page?.data)) throw malformed('/v1/models has no data list');
  return page.data.flatMap((m: unknown) =>
    typeof m === 'object' && m !== null && typeof (m as { id?: unknown }).id === 'string' ? [(m as { id: string }).id] : [],
  );
}

/** The server origin's URL for an endpoint path (the base URL without a trailing `/v1`), or the URL itself. */
export function resolveEndpoint(baseURL: string, endpoint: string): string {
  if (/^https?:\/\//i.test(endpoint)) return endpoint;
  const origin = baseURL.replace(/\/+$/, '').replace(/\/v1$/, '');
  return `${origin}${endpoint.startsWith('/') ? '' : '/'}${endpoint}`;
}

/**
 * Turns what the `openai` client threw into a typed error: a cancellation by the caller becomes an
 * {@link AbortError}; deadlines, connection failures, 5xx answers and unreadable bodies become retriable
 * {@link EngineError}s (`context.kind` says which); other statuses become non-retriable ones. Anything else is
 * passed through unchanged (a bug, not to be retried).
 */
function classifyError(error: unknown, what: string, caller: AbortSignal | undefined, deadline: AbortSignal, timeoutMs: number): unknown {
  if (caller?.aborted) return new AbortError(`${what} aborted`, { cause: caller.reason });
  const fail = (kind: string, message: string, retriable: boolean, context: Record<string, unknown> = {}): EngineError =>
    new EngineError(`${what}: ${message}`, { cause: error, retriable, context: { kind, ...context } });
  if (deadline.aborted && (isAbortError(error) || error instanceof APIUserAbortError || error instanceof APIConnectionError)) {
    return fail('timeout', `no complete answer within ${timeoutMs} ms`, true, { timeoutMs });
  }
  if (error instanceof APIConnectionTimeoutError) return fail('timeout', `no answer within ${timeoutMs} ms`, true, { timeoutMs });
  if (error instanceof APIConnectionError) return fail('connection', `connection failed (${error.message})`, true);
  if (error instanceof APIError && typeof error.status === 'number') {
    const retriable = error.status >= 500;
    return fail('status', `server answered ${error.status}: ${error.message}`, retriable, { status: error.status });
  }
  if (error instanceof SyntaxError) return fail('malformed', `unreadable response body (${error.message})`, true);
  if (error instanceof TypeError && isNetworkTypeError(error)) return fail('connection', `connection lost (${error.message})`, true);
  if (isAbortError(error)) return new AbortError(`${what} aborted`, { cause: error });
  return error;
}

/** Undici reports a connection lost mid-body as `TypeError: terminated` with a socket error as its cause. */
function isNetworkTypeError(error: TypeError): boolean {
  const cause = (error as { cause?: unknown }).cause;
  const hasCode = typeof cause === 'object' && cause !== null && 'code' in cause;
  return error.message === 'terminated' || error.message === 'fetch failed' || hasCode;
}

function malformed(message: string): DecodeError {
  return new DecodeError(`malformed server response: ${message}`);
}

function isTokenArray(value: unknown, vocabSize: number): value is number[] {
  return Array.isArray(value) && value.every((t) => Number.isInteger(t) && t >= 0 && t < vocabSize);
}

/** Token ids from `token_id:<id>` strings, else from a `token_ids` array, else from one-token strings. */
function tokenIds(strings: readonly string[] | undefined, ids: unknown, tokenizer: Tokenizer): number[] | undefined {
  if (strings !== undefined && strings.every((s) => s.startsWith(TOKEN_ID_PREFIX))) {
    const out = strings.map((s) => Number(s.slice(TOKEN_ID_PREFIX.length)));
    if (!isTokenArray(out, tokenizer.vocabSize)) throw malformed(`token ids outside [0, ${tokenizer.vocabSize})`);
    return out;
  }
  if (ids !== undefined) {
    if (!isTokenArray(ids, tokenizer.vocabSize)) throw malformed(`token_ids is not an array of ids in [0, ${tokenizer.vocabSize})`);
    return [...ids];
  }
  if (strings === undefined) return undefined;
  return strings.map((s) => {
    const encoded = tokenizer.encode(s);
    if (encoded.length !== 1) throw malformed(`token ${JSON.stringify(s)} is not exactly one token of the tokenizer`);
    return encoded[0];
  });
}

function checkLogprobs(logprobs: readonly (number | null)[] | null | undefined, length: number): void {
  const valid = (x: number | null): boolean => typeof x === 'number' && x <= 0 && !Number.isNaN(x);
  if (!Array.isArray(logprobs) || logprobs.length !== length || !logprobs.every(valid)) {
    throw malformed(`expected ${length} token log-probs (numbers <= 0)`);
  }
}

function finishReasonOf(reason: string | null | undefined): FinishReason {
  switch (reason) {
    case 'length':
      return 'length';
    case 'abort':
      return 'abort';
    default:
      return 'stop';
  }
}

function versionOf(response: ResponseExtensions, fallback: PolicyVersion): PolicyVersion {
  const v = response.policy_version;
  return typeof v === 'number' && Number.isInteger(v) && v >= 0 ? v : fallback;
}

function toOpenAIMessage(message: ChatMessage): ChatCompletionMessageParam {
  switch (message.role) {
    case 'system':
      return { role: 'system', content: message.content };
    case 'user':
      return { role: 'user', content: message.content };
    case 'tool':
      return { role: 'tool', content: message.content, tool_call_id: message.toolCallId ?? '' };
    case 'assistant':
      return {
        role: 'assistant',
        content: message.content,
        ...(message.toolCalls && message.toolCalls.length > 0
          ? {
              tool_calls: message.toolCalls.map((call) => ({
                id: call.id,
                type: 'function' as const,
                function: { name: call.name, arguments: call.arguments },
              })),
            }
          : {}),
      };
    default:
      throw new ConfigError(`unknown chat role ${JSON.stringify((message as { role: unknown }).role)}`);
  }
}

function toOpenAITool(tool: ChatTool): ChatCompletionTool {
  return {
    type: 'function',
    function: {
      name: tool.name,
      ...(tool.description === undefined ? {} : { description: tool.description }),
      ...(tool.parameters === undefined ? {} : { parameters: { ...tool.parameters } as Record<string, unknown> }),
    },
  };
}

/** A counting semaphore whose waiters can be cancelled. */
class Limiter {
  private active = 0;
  private readonly waiters: { start: () => void }[] = [];

  constructor(private readonly limit: number) {}

  async run<T>(signal: AbortSignal | undefined, task: () => Promise<T>): Promise<T> {
    if (this.active >= this.limit) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = (): void => {
          const i = this.waiters.indexOf(waiter);
          if (i >= 0) this.waiters.splice(i, 1);
          reject(new AbortError('aborted while waiting for a free request slot', { cause: signal?.reason }));
        };
        const waiter = {
          start: () => {
            signal?.removeEventListener('abort', onAbort);
            resolve();
          },
        };
        if (signal?.aborted) {
          onAbort();
          return;
        }
        signal?.addEventListener('abort', onAbort, { once: true });
        this.waiters.push(waiter);
      });
    } else {
      this.active++;
    }
    try {
      return await task();
    } finally {
      const next = this.waiters.shift();
      if (next) next.start();
      else this.active--;
    }
  }
}
