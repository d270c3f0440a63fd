/**
 * Weight versions across processes: the trainer writes each version as a safetensors file on a disk shared with
 * the workers and announces it on the `weights` topic; each worker follows the topic and loads the newest version
 * into its local engine before its next generation.
 *
 * Why files and not the weights inline: a Kafka message is capped at 1 MiB by default (`message.max.bytes`), a
 * 0.1 M-parameter policy is already 400 KB and a real one is gigabytes, and every worker would download every
 * version even when it only needs the newest. A file is written once (atomically: temporary file, then rename),
 * checked by size and SHA-256 on load, and only the newest announced version is loaded. The limits: trainer and
 * workers must see the same path (one machine, or a network file system mounted at the same place), and only the
 * last `keepVersions` files are kept, so a worker that falls further behind skips to the newest one.
 *
 * @packageDocumentation
 */
import { createHash } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { basename, join, resolve } from 'node:path';

import type { Producer } from 'kafkajs';
import { Subject, type Observable, type Subscription } from 'rxjs';

import { LocalEngine, type LocalEngineOptions } from '../engine/local.js';
import type { NamedWeights, Tokenizer } from '../model/types.js';
import { ConfigError, DecodeError, isRetriable, throwIfAborted } from '../core/errors.js';
import { sleep } from '../core/retry.js';
import { entryExists, readJsonObject, readRegularFile, resolveInside } from '../model/files.js';
import {
  LoraAdapter,
  PEFT_FILES,
  loraWeightBytes,
  readPeftAdapterConfig,
  renamePeftWeights,
  savePeftWeights,
  type ResolvedLoraConfig,
} from '../model/lora.js';
import {
  MODEL_FILES,
  POLICY_VERSION_METADATA_KEY,
  maxWeightBytesOf,
  policyConfigFromHf,
  readModelDir,
  saveModelDir,
  type SpecialTokenIds,
} from '../model/modelDir.js';
import { decodeSafetensors } from '../model/safetensors.js';
import { PolicyModel, type PolicyConfig, type ResolvedPolicyConfig } from '../model/transformer.js';
import type { ModelTag, PolicyVersion } from '../core/types.js';
import { encodeWeightsMessage } from './codec.js';
import { KafkaBridgeError } from './errors.js';
import { markWeightsRun, removeEndedRuns, type WeightsCleanup } from './weightsCleanup.js';
import type { KafkaRecord, RunEndMessage, WeightsMessage, WeightsVersionMessage } from './types.js';

/** Metadata key of the policy version in a published weights file. */
export const WEIGHTS_VERSION_METADATA_KEY = 'rxrl.version';
/** Metadata key of the run id in a published weights file. */
export const WEIGHTS_RUN_METADATA_KEY = 'rxrl.run';

/** Options of {@link WeightsPublisher}. */
export interface WeightsPublisherOptions {
  /** A connected producer (idempotent: see `createProducer`). */
  readonly producer: Producer;
  /** The `weights` topic. */
  readonly topic: string;
  /** Directory shared with the workers; each version is a model directory `<dir>/<run>/<modelTag>/v<version>/`. */
  readonly dir: string;
  /** Run id written on every announcement. */
  readonly run: string;
  /** Model the weights belong to. */
  readonly modelTag: ModelTag;
  /** Architecture, written as each version's `config.json` so a worker can build the model from the directory alone. */
  readonly policyConfig: PolicyConfig;
  /** Tokenizer files written into each version's directory (`tokenizer.files()`), so it loads in transformers. */
  readonly tokenizerFiles?: Readonly<Record<string, string>>;
  /** Special token ids for `config.json` / `generation_config.json`. */
  readonly special?: SpecialTokenIds;
  /** Versions of this policy kept on disk (the newest ones; `kafka.keepVersions`). Default 3. */
  readonly keepVersions?: number | undefined;
  /**
   * Told, after this run's first announcement, which run directories of ended trainer processes were removed from
   * `dir` (see {@link removeEndedRuns}), which were kept and which could not be removed.
   */
  readonly onCleanup?: (cleanup: WeightsCleanup) => void;
  /**
   * A LoRA policy: each version is then a PEFT directory (`adapter_config.json` + `adapter_model.safetensors`) of
   * the adapter weights alone, whose `base_model_name_or_path` is `baseDir`, a model directory the workers can read
   * (written once per run by the trainer). Default: a full model directory per version.
   */
  readonly adapter?: { readonly lora: ResolvedLoraConfig; readonly baseDir: string };
  /** Writes the announcements: plain Protocol Buffers (default), or framed for a schema registry. */
  readonly encode?: ((message: WeightsMessage) => Uint8Array) | undefined;
}

/** The directory of a run's files under a weights directory (`<dir>/<run>`). */
export function weightsRunDir(dir: string, run: string): string {
  return resolve(join(dir, safeName(run)));
}

/** The trainer's side: writes weight files and announces them, then the end of the run. */
export class WeightsPublisher {
  private readonly published: string[] = [];
  private readonly keep: number;

  constructor(private readonly options: WeightsPublisherOptions) {
    this.keep = options.keepVersions ?? 3;
    if (!Number.isInteger(this.keep) || this.keep < 1) {
      throw new ConfigError(`keepVersions must be an integer >= 1, got ${this.keep}`);
    }
  }

  /**
   * Writes `weights` as version `version` and announces it; resolves once the broker acknowledged the
   * announcement (`acks: -1`).
   *
   * @param version - the policy version the weights make.
   * @param weights - the weights (copied into the file).
   * @param signal - cancels before the file is written and before it is announced.
   * @throws {@link KafkaBridgeError} when the announcement cannot be sent; `AbortError` when `signal` fired.
   */
  async publish(version: PolicyVersion, weights: NamedWeights, signal?: AbortSignal): Promise<WeightsVersionMessage> {
    throwIfAborted(signal, { version });
    const { run, modelTag, policyConfig } = this.options;
    const runDir = weightsRunDir(this.options.dir, run);
    const first = this.published.length === 0;
    if (first) await markWeightsRun(runDir, run);
    const path = join(runDir, safeName(modelTag), `v${version}`);
    const metadata = {
      [POLICY_VERSION_METADATA_KEY]: String(version),
      [WEIGHTS_VERSION_METADATA_KEY]: String(version),
      [WEIGHTS_RUN_METADATA_KEY]: run,
    };
    const { adapter } = this.options;
    const written = adapter
      ? await savePeftWeights(path, adapter.lora, weights, adapter.baseDir, metadata)
      : await saveModelDir(
          path,
          { config: policyConfig, weights },
          {
            ...(this.options.tokenizerFiles ? { tokenizerFiles: this.options.tokenizerFiles } : {}),
            ...(this.options.special ? { special: this.options.special } : {}),
            metadata,
          },
        );
    throwIfAborted(signal, { version });
    const message: WeightsVersionMessage = {
      kind: 'version',
      run,
      version,
      modelTag,
      path,
      bytes: written.bytes,
      sha256: written.sha256,
      timestamp: Date.now(),
    };
    await this.send(message);
    this.published.push(path);
    while (this.published.length > this.keep) {
      await rm(this.published.shift()!, { recursive: true, force: true });
    }
    // Workers now follow this run: earlier trainer processes' runs are no longer needed by anyone.
    if (first) this.options.onCleanup?.(await removeEndedRuns(this.options.dir, basename(runDir)));
    return message;
  }

  /** Announces the end of the run at version `version` (workers following it stop). */
  async end(version: PolicyVersion): Promise<void> {
    await this.send({ kind: 'end', run: this.options.run, version, timestamp: Date.now() });
  }

  private async send(message: WeightsMessage): Promise<void> {
    try {
      await this.options.producer.send({
        topic: this.options.topic,
        acks: -1,
        messages: [{ key: message.run, value: Buffer.from((this.options.encode ?? encodeWeightsMessage)(message)) }],
      });
    } catch (cause) {
      throw new KafkaBridgeError(`could not announce ${message.kind} ${message.version} of run ${message.run}: ${String(cause)}`, {
        cause,
      });
    }
  }
}

/** Options of {@link WeightsFollower}. */
export interface WeightsFollowerOptions {
  /** Tokenizer of the policy (its vocabulary must match the announced model's). */
  readonly tokenizer: Tokenizer;
  /** Local engine settings (batching, weight sync policy). */
  readonly engine?: Omit<LocalEngineOptions, 'tokenizer' | 'version' | 'modelTag'> | undefined;
  /** Attempts to read a weights file that is missing or incomplete before refusing it. Default 20 (every 100 ms). */
  readonly loadAttempts?: number | undefined;
  /**
   * The directory every announced file must lie in once links are followed (`kafka.weightsRoot`; the CLI's default
   * is the run's weights directory). An announcement naming anything else is refused. Default: no confinement.
   */
  readonly root?: string;
  /**
   * The worker's stop: a weight load in progress ends when it fires (it does not wait for the running generation),
   * and no other starts. {@link WeightsFollower.close} does the same. Default: none.
   */
  readonly signal?: AbortSignal | undefined;
}

/** What a follower reports. */
export type WeightsFollowerEvent =
  | {
      readonly type: 'loaded';
      readonly run: string;
      readonly modelTag: ModelTag;
      readonly version: PolicyVersion;
      readonly seconds: number;
    }
  | {
      readonly type: 'skipped';
      readonly run: string;
      readonly modelTag: ModelTag;
      readonly version: PolicyVersion;
      readonly reason: string;
    }
  /**
   * An announcement whose files were refused (outside the root, not regular files, larger than the architecture
   * or the announcement, not matching its SHA-256 after every attempt, malformed): the engines keep what they hold.
   */
  | {
      readonly type: 'refused';
      readonly run: string;
      readonly modelTag: ModelTag;
      readonly version: PolicyVersion;
      readonly reason: string;
    }
  | { readonly type: 'end'; readonly message: RunEndMessage };

interface Waiter {
  readonly run: string;
  readonly minVersion: PolicyVersion;
  /** Policies that must all hold `minVersion`; undefined: any one policy of the run (single-policy runs). */
  readonly tags: readonly ModelTag[] | undefined;
  readonly resolve: (engines: ReadonlyMap<ModelTag, LocalEngine> | undefined) => void;
  readonly reject: (error: unknown) => void;
}

interface LoadedPolicy {
  version: PolicyVersion;
  readonly engine: LocalEngine;
  /** The engine's model: a full model, or a LoRA view over one of the run's bases. */
  readonly model: PolicyModel;
  readonly adapter?: LoraAdapter;
}

/**
 * The worker's side: follows the `weights` topic from its beginning (give it `fromKafka` over that topic with a
 * consumer group of its own, since every worker must see every announcement) and keeps one {@link LocalEngine} per
 * policy (`modelTag`) of the newest run, each holding the newest version announced for it. Announcements that
 * arrive while a load runs are coalesced: only the newest of each policy is loaded. A run is followed once weights
 * of it were loaded; its end, or a newer run, makes it over.
 *
 * @example
 * ```ts
 * import { WeightsFollower, decodeWeightsMessage } from 'rxrl';
 * import { fromKafka } from 'rxrl/operators';
 * const follower = new WeightsFollower(
 *   fromKafka(kafka, { groupId: `weights-${process.pid}`, topics: ['rxrl.weights'], decode: decodeWeightsMessage }),
 *   { tokenizer },
 * );
 * follower.start();
 * const engine = await follower.waitFor(run, 3); // holds version ≥ 3 of `run`, or undefined once the run is over
 * const engines = await follower.waitForAll(run, 3, ['writer', 'editor']); // one engine per policy
 * ```
 */
export class WeightsFollower {
  private subscription: Subscription | undefined;
  /** Newest announcement per policy of the newest run, not loaded yet or loading. */
  private readonly latest = new Map<ModelTag, WeightsVersionMessage>();
  private loadedRun: string | undefined;
  private readonly loaded = new Map<ModelTag, LoadedPolicy>();
  /** Base models of the run's LoRA policies, by directory: several adapters share one in memory. */
  private readonly bases = new Map<string, PolicyModel>();
  private readonly retired: { dispose(): void }[] = [];
  private readonly over = new Set<string>();
  private newestRun: string | undefined;
  private loading = false;
  private waiters: Waiter[] = [];
  private readonly events$ = new Subject<WeightsFollowerEvent>();
  private failure: unknown;
  /** Aborted by {@link close}. */
  private readonly closing = new AbortController();
  /** Ends a load in progress: the worker's stop (`options.signal`) or {@link close}. */
  private readonly stop: AbortSignal;

  /**
   * Loads, skips, refusals and run ends, as they happen. Errors when the follower fails: the worker's tokenizer does
   * not fit the run's models, or the announcements' stream failed.
   */
  readonly events: Observable<WeightsFollowerEvent> = this.events$.asObservable();

  /**
   * @param announcements - records of the `weights` topic, read from its beginning; each is acknowledged on receipt.
   * @param options - tokenizer, engine settings and load retries.
   */
  constructor(
    private readonly announcements: Observable<KafkaRecord<WeightsMessage>>,
    private readonly options: WeightsFollowerOptions,
  ) {
    this.stop = options.signal ? AbortSignal.any([options.signal, this.closing.signal]) : this.closing.signal;
  }

  /** An engine of the followed run (its first policy loaded) and the version it holds, if any weights were loaded. */
  get current(): { readonly run: string; readonly version: PolicyVersion; readonly engine: LocalEngine } | undefined {
    const [first] = this.loaded.values();
    return first === undefined || this.loadedRun === undefined
      ? undefined
      : { run: this.loadedRun, version: first.version, engine: first.engine };
  }

  /** Starts following the announcements. */
  start(): void {
    if (this.subscription) return;
    this.subscription = this.announcements.subscribe({
      next: (record) => {
        record.ack();
        this.receive(record.value);
      },
      error: (error: unknown) => this.fail(error),
    });
  }

  /**
   * Resolves with the engine of `run` once it holds version `minVersion` or newer (a single-policy run), or with
   * undefined once `run` is over (ended, or superseded by a newer run). Rejects if the follower failed or `signal` fired.
   */
  async waitFor(run: string, minVersion: PolicyVersion, signal?: AbortSignal): Promise<LocalEngine | undefined> {
    const engines = await this.wait(run, minVersion, undefined, signal);
    return engines === undefined ? undefined : [...engines.values()][0];
  }

  /**
   * Resolves with one engine per policy in `tags` once each holds version `minVersion` or newer of `run` (a
   * multi-policy run), or with undefined once `run` is over. Rejects if the follower failed or `signal` fired.
   */
  waitForAll(
    run: string,
    minVersion: PolicyVersion,
    tags: readonly ModelTag[],
    signal?: AbortSignal,
  ): Promise<ReadonlyMap<ModelTag, LocalEngine> | undefined> {
    return this.wait(run, minVersion, tags, signal);
  }

  /** Stops following and disposes the engines' models; a load in progress is dropped. Pending waits resolve with undefined. */
  close(): void {
    this.closing.abort();
    this.subscription?.unsubscribe();
    this.subscription = undefined;
    for (const waiter of this.waiters) waiter.resolve(undefined);
    this.waiters = [];
    this.retireRun();
    for (const model of this.retired) model.dispose();
    this.retired.length = 0;
    this.loadedRun = undefined;
    this.events$.complete();
  }

  private wait(
    run: string,
    minVersion: PolicyVersion,
    tags: readonly ModelTag[] | undefined,
    signal?: AbortSignal,
  ): Promise<ReadonlyMap<ModelTag, LocalEngine> | undefined> {
    if (this.failure !== undefined) return Promise.reject(this.failure);
    if (this.over.has(run)) return Promise.resolve(undefined);
    const ready = this.ready(run, minVersion, tags);
    if (ready !== undefined) return Promise.resolve(ready);
    return new Promise((resolvePromise, reject) => {
      const onAbort = (): void => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(signal?.reason ?? new Error('aborted'));
      };
      const waiter: Waiter = {
        run,
        minVersion,
        tags,
        resolve: (engines) => {
          signal?.removeEventListener('abort', onAbort);
          resolvePromise(engines);
        },
        reject: (error) => {
          signal?.removeEventListener('abort', onAbort);
          reject(error);
        },
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  /** The engines a wait asks for, when all hold `minVersion` of `run`. */
  private ready(run: string, minVersion: PolicyVersion, tags: readonly ModelTag[] | undefined): Map<ModelTag, LocalEngine> | undefined {
    if (this.loadedRun !== run) return undefined;
    const wanted = tags ?? [...this.loaded.keys()].slice(0, 1);
    if (wanted.length === 0) return undefined;
    const engines = new Map<ModelTag, LocalEngine>();
    for (const tag of wanted) {
      const policy = this.loaded.get(tag);
      if (policy === undefined || policy.version < minVersion) return undefined;
      engines.set(tag, policy.engine);
    }
    return engines;
  }

  private receive(message: WeightsMessage): void {
    if (this.over.has(message.run)) return;
    if (this.newestRun !== undefined && this.newestRun !== message.run) this.finishRun(this.newestRun);
    this.newestRun = message.run;
    if (message.kind === 'end') {
      const followed = this.loadedRun === message.run;
      this.finishRun(message.run);
      if (followed) this.events$.next({ type: 'end', message });
      return;
    }
    const previous = this.latest.get(message.modelTag);
    if (previous === undefined || previous.run !== message.run || message.version > previous.version) {
      this.latest.set(message.modelTag, message);
    }
    void this.pump();
  }

  private finishRun(run: string): void {
    this.over.add(run);
    for (const [tag, message] of this.latest) if (message.run === run) this.latest.delete(tag);
    this.wake();
  }

  private wake(): void {
    const still: Waiter[] = [];
    for (const waiter of this.waiters) {
      if (this.over.has(waiter.run)) {
        waiter.resolve(undefined);
        continue;
      }
      const ready = this.ready(waiter.run, waiter.minVersion, waiter.tags);
      if (ready !== undefined) waiter.resolve(ready);
      else still.push(waiter);
    }
    this.waiters = still;
  }

  /** The next announcement to load: a policy whose newest version is not loaded yet. */
  private next(): WeightsVersionMessage | undefined {
    for (const message of this.latest.values()) {
      if (this.over.has(message.run)) continue;
      const loaded = this.loadedRun === message.run ? this.loaded.get(message.modelTag) : undefined;
      if (loaded === undefined || loaded.version < message.version) return message;
    }
    return undefined;
  }

  private async pump(): Promise<void> {
    if (this.loading) return;
    this.loading = true;
    try {
      // A stopped follower loads nothing more: the announcement a stopped load dropped stays unloaded.
      for (let next = this.next(); next !== undefined && !this.stop.aborted; next = this.next()) {
        await this.load(next);
        this.wake();
      }
    } catch (error) {
      this.fail(error);
    } finally {
      this.loading = false;
    }
  }

  private async load(message: WeightsVersionMessage): Promise<void> {
    const started = performance.now();
    const attempts = this.options.loadAttempts ?? 20;
    const { run, modelTag, version } = message;
    let reason = '';
    for (let attempt = 0; attempt < attempts; attempt++) {
      // Stopped: the load is dropped, neither loaded nor refused.
      if (this.stop.aborted) return;
      if (this.latest.get(modelTag) !== message) {
        this.events$.next({ type: 'skipped', run, modelTag, version, reason: 'a newer version was announced' });
        return;
      }
      let policy: LoadedPolicy | undefined;
      try {
        policy = await this.read(message);
      } catch (error) {
        // This worker cannot use the run's models at all: fail loudly rather than skip every version.
        if (error instanceof ConfigError && error.context.key === 'tokenizer') throw error;
        if (this.stop.aborted) return;
        reason = error instanceof Error ? error.message : String(error);
        if (!isRetriable(error)) break;
        await sleep(100, this.stop).catch(() => undefined);
        continue;
      }
      await this.install(message, policy);
      this.events$.next({ type: 'loaded', run, modelTag, version, seconds: (performance.now() - started) / 1000 });
      return;
    }
    // Refused: the engines keep the version they hold, and a later announcement of this policy is loaded.
    if (this.latest.get(modelTag) === message) this.latest.delete(modelTag);
    this.events$.next({ type: 'refused', run, modelTag, version, reason });
  }

  /**
   * Reads an announced directory through rxrl's one file reader, confined to `root` (when set): its configuration
   * first, then the weights file, which must be a regular file of exactly the announced size, no larger than the
   * configuration's parameters in float32, with the announced SHA-256. A version of the followed run is returned
   * as new weights for the loaded policy; otherwise as a new policy (model or adapter view) with its engine.
   *
   * @throws a retriable {@link KafkaBridgeError} when the file is missing or does not (yet) match the announcement;
   *   anything else is a refusal.
   */
  private async read(message: WeightsVersionMessage): Promise<LoadedPolicy> {
    const root = this.options.root;
    const limits = root === undefined ? {} : { root };
    const dir = await resolveInside(message.path, root);
    const peft = await entryExists(join(dir, PEFT_FILES.config));
    let config: ResolvedPolicyConfig;
    let adapter: { lora: ResolvedLoraConfig; base: PolicyModel } | undefined;
    if (peft) {
      const { lora, baseModel } = await readPeftAdapterConfig(dir, root);
      if (baseModel === null)
        throw new DecodeError(`${message.path}: adapter_config.json names no base model`, { context: { path: message.path } });
      adapter = { lora, base: await this.baseOf(baseModel) };
      config = adapter.base.config;
    } else {
      config = this.fitsTokenizer(
        policyConfigFromHf(await readJsonObject(join(dir, MODEL_FILES.config), root), join(message.path, MODEL_FILES.config)),
      );
    }
    const bound = adapter ? loraWeightBytes(config, adapter.lora) : maxWeightBytesOf(config);
    if (message.bytes > bound) {
      throw new KafkaBridgeError(
        `${message.path}: the announcement says ${message.bytes} bytes, more than the ${bound} its architecture allows`,
        {
          context: { path: message.path, bytes: message.bytes, limit: bound },
        },
      );
    }
    const file = join(dir, peft ? PEFT_FILES.weights : MODEL_FILES.weights);
    let data: Buffer;
    try {
      // Never more than announced: a larger file is refused unread.
      data = await readRegularFile(file, { maxBytes: message.bytes, ...limits });
    } catch (cause) {
      if ((cause as { cause?: NodeJS.ErrnoException }).cause?.code !== 'ENOENT') throw cause;
      throw new KafkaBridgeError(`${file} does not exist (yet)`, { cause, retriable: true, context: { path: file } });
    }
    if (data.length !== message.bytes || createHash('sha256').update(data).digest('hex') !== message.sha256) {
      throw new KafkaBridgeError(`${file} does not match the announced size and SHA-256`, { retriable: true, context: { path: file } });
    }
    const { weights } = decodeSafetensors(data);
    const loaded = this.loadedRun === message.run ? this.loaded.get(message.modelTag) : undefined;
    if (loaded !== undefined) {
      // A stopped worker does not wait for its running generation to load weights it will never sample from.
      await loaded.engine.loadWeights(message.version, adapter ? renamePeftWeights(weights) : weights, this.stop);
      return loaded;
    }
    if (adapter) {
      const lora = LoraAdapter.fromWeights(config, adapter.lora, renamePeftWeights(weights));
      const model = PolicyModel.withAdapter(adapter.base, lora);
      return { version: message.version, engine: this.engineOf(model, message), model, adapter: lora };
    }
    const model = PolicyModel.fromWeights(config, weights);
    return { version: message.version, engine: this.engineOf(model, message), model };
  }

  /** Records a read version: new weights of a loaded policy, or a new policy of the (perhaps new) followed run. */
  private async install(message: WeightsVersionMessage, policy: LoadedPolicy): Promise<void> {
    const loaded = this.loadedRun === message.run ? this.loaded.get(message.modelTag) : undefined;
    if (loaded === policy) {
      loaded.version = message.version;
      return;
    }
    if (this.loadedRun !== message.run) {
      // The previous run's engines may still be finishing a generation: retire their models, dispose them on close.
      this.retireRun();
      this.loadedRun = message.run;
    }
    this.loaded.set(message.modelTag, policy);
  }

  /** The base model of a LoRA run's adapters (a model directory inside the root), read once per run and shared. */
  private async baseOf(dir: string): Promise<PolicyModel> {
    let base = this.bases.get(dir);
    if (base === undefined) {
      const read = await readModelDir(dir, this.options.root === undefined ? {} : { root: this.options.root });
      base = PolicyModel.fromWeights(this.fitsTokenizer(read.config), read.weights);
      this.bases.set(dir, base);
    }
    return base;
  }

  /** `config`, when its vocabulary fits this worker's tokenizer; a `ConfigError` otherwise. */
  private fitsTokenizer(config: ResolvedPolicyConfig): ResolvedPolicyConfig {
    if (config.vocabSize !== this.options.tokenizer.vocabSize) {
      throw new ConfigError(
        `the announced model has ${config.vocabSize} token ids but this worker's tokenizer has ${this.options.tokenizer.vocabSize}`,
        { context: { key: 'tokenizer' } },
      );
    }
    return config;
  }

  private engineOf(model: PolicyModel, message: WeightsVersionMessage): LocalEngine {
    return new LocalEngine(model, {
      ...this.options.engine,
      tokenizer: this.options.tokenizer,
      modelTag: message.modelTag,
      version: message.version,
    });
  }

  /** Hands the followed run's models, adapters and bases to `retired` (disposed on close). */
  private retireRun(): void {
    for (const policy of this.loaded.values()) {
      this.retired.push(policy.model);
      if (policy.adapter) this.retired.push(policy.adapter);
    }
    this.loaded.clear();
    for (const base of this.bases.values()) this.retired.push(base);
    this.bases.clear();
    this.loadedRun = undefined;
  }

  private fail(error: unknown): void {
    if (this.failure !== undefined) return;
    this.failure = error;
    for (const waiter of this.waiters) waiter.reject(error);
    this.waiters = [];
    this.events$.error(error);
  }
}

function safeName(run: string): string {
  return run.replace(/[^A-Za-z0-9._-]/g, '_');
}
