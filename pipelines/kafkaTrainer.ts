import { randomBytes } from 'node:crypto';
import { join } from 'node:path';

import type { ConsumerConfig, Kafka } from 'kafkajs';
import { Observable, Subject, concatMap, filter, finalize, map, merge, of, share, take, tap, type Subscriber, type Subscription, type TeardownLogic } from 'rxjs';

import type { StdKind } from '../lib/algos/advantages.js';
import { taskStream, type LoadTasksOptions, type TaskSource } from '../lib/data/loader.js';
import type { NamedWeights } from '../lib/engine/types.js';
import { episodeSlots } from '../lib/agent/environment.js';
import { ConfigError } from '../lib/errors.js';
import { createProducer, ensureTopics, type TopicPartitions } from '../lib/kafka/client.js';
import { decodeTrajectoryMessage, encodeTaskMessage } from '../lib/kafka/codec.js';
import type { KafkaEvent, KafkaEventType, KafkaRecord, KafkaTopics, TaskMessage, TrajectoryMessage } from '../lib/kafka/types.js';
import { WeightsPublisher, weightsRunDir } from '../lib/kafka/weights.js';
import { markWeightsRun } from '../lib/kafka/weightsCleanup.js';
import type { ResolvedLoraConfig } from '../lib/model/lora.js';
import type { PolicyConfig } from '../lib/model/transformer.js';
import type { Tokenizer } from '../lib/engine/types.js';
import { saveModelDir, specialIdsOf } from '../lib/model/modelDir.js';
import { AdmissionGate, allGates, type StalenessMode } from '../lib/sync/gate.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Group, Metrics, RolloutOutput, Task } from '../lib/types.js';
import { admit } from '../operators/admit.js';
import { batchGroups } from '../operators/batchGroups.js';
import { dropDuplicates } from '../operators/dropDuplicates.js';
import { fromKafka } from '../operators/fromKafka.js';
import { groupTrajectories } from '../operators/groupTrajectories.js';
import { grpoPrepare, type KlInRewardOptions } from '../operators/grpoPrepare.js';
import { groupIdOf } from '../operators/rollout.js';
import { agentMap } from '../operators/rolloutEpisodes.js';
import { toKafka } from '../operators/toKafka.js';
import { train } from '../operators/train.js';
import { prefixed, prepareOptions, type PolicyStepResult } from './grpoPipeline.js';
import type { KafkaEpisodes } from './kafkaRolloutWorker.js';

/** One policy a Kafka trainer trains. */
export interface KafkaPolicy {
  /** Takes the policy's steps; its `modelTag` names the policy. */
  readonly trainer: Trainer;
  /** Its architecture and initial weights (announced as version `trainer.step`). */
  readonly policy: { readonly config: PolicyConfig; getWeights(): NamedWeights };
  /**
   * A LoRA policy: `policy` gives the adapter's weights, `base` the frozen model under it. Each version goes out
   * as a PEFT directory of the adapter alone; the base is written once per run (shared by every policy that
   * names the same base object), and workers build each adapter over it.
   */
  readonly adapter?: { readonly lora: ResolvedLoraConfig; readonly base: { readonly config: PolicyConfig; getWeights(): NamedWeights } };
}

/** Configuration of {@link kafkaTrainer}. */
export interface KafkaTrainerConfig {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Training tasks: an array, an iterable or `{ jsonl }` (read with `loader`), or an async iterable (a loader) used as it is. */
  readonly tasks: TaskSource;
  /** Loader options (epochs, seeded shuffle, resume position). */
  readonly loader?: LoadTasksOptions;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** Takes the train steps (a single-policy run; a multi-agent run gives `policies`). */
  readonly trainer?: Trainer;
  /** The policy being trained: its architecture and initial weights (announced as version `trainer.step`, 0 unless resumed). */
  readonly policy?: KafkaPolicy['policy'];
  /**
   * Multi-agent runs: every policy with its trainer and initial weights, each with its own group store, batches,
   * trainer, gate and weights on the weights topic (under its `modelTag`). Give `episodes` with it.
   */
  readonly policies?: readonly KafkaPolicy[];
  /** Multi-agent runs: the environment's turn order and budget, its agents and the granularity, as the workers have them. */
  readonly episodes?: KafkaEpisodes;
  /** Token id of padding (the workers' tokenizer's `padId`). */
  readonly padId: number;
  /**
   * The policy's tokenizer: its files and special ids are written into every published version's model
   * directory, so each one also loads in transformers. Optional.
   */
  readonly tokenizer?: Tokenizer;
  /** Directory shared with the workers where weight files are written. */
  readonly weightsDir: string;
  /**
   * Versions of each policy kept on disk (`kafka.keepVersions`). Default 3. The run directories of earlier trainer
   * processes that have ended are removed once this run announced its first version (`trainer.weights_cleaned`).
   */
  readonly keepVersions?: number;
  /** Run id on every message (workers skip other runs). Default: random. */
  readonly run?: string;
  /** Consumer group of the trainer on the trajectories topic. Default `<trajectories topic>.trainer`. */
  readonly groupId?: string;
  /** Staleness mode. Default `sync`. */
  readonly mode?: StalenessMode;
  /** η of `batch-async`. Default 1. */
  readonly stalenessThreshold?: number;
  /** `fully-async`: most tasks admitted but untrained. Default 4 batches. */
  readonly capacity?: number;
  /** Tasks (groups) per train step. */
  readonly batchSize: number;
  /** Samples per task (GRPO group size), sent with each task. */
  readonly groupSize: number;
  /** Largest response length in tokens. */
  readonly maxTokens: number;
  /** Sampling temperature. Default 1. */
  readonly temperature?: number;
  /** Nucleus mass. Default 1. */
  readonly topP?: number;
  /** Base seed of the sampling streams. Default 0. */
  readonly seed?: number;
  /** Train steps; exactly `steps · batchSize` tasks are admitted. Default: until the loader is exhausted. */
  readonly steps?: number;
  /** Advantage settings and the zero-variance filter. */
  readonly advantage?: { readonly normalizeByStd?: boolean; readonly std?: StdKind; readonly epsilon?: number; readonly filterZeroVariance?: boolean };
  /** Optional KL penalty in the reward. */
  readonly klInReward?: KlInRewardOptions;
  /** Close a group this long (ms) after its first trajectory arrived, complete or not. Default: wait. */
  readonly groupTimeoutMs?: number;
  /** A timed-out group is trained with the samples it has (`release`, default) or dropped and counted (`drop`). */
  readonly onGroupTimeout?: 'release' | 'drop';
  /** Called as each task is admitted, with its admission index (0-based, counted from this subscription). */
  readonly onAdmit?: (task: Task, index: number) => void;
  /**
   * Called after each step is trained and its weights are announced, before the gate admits on its credit; the
   * metrics it returns are merged into the step's (validation scores, for instance).
   */
  readonly afterStep?: (step: PolicyStepResult) => Promise<Metrics | void>;
  /**
   * Whether a checkpoint holds the work of every step up to `step` (asked after `afterStep`). The trajectories of
   * trained steps are acknowledged, and their offsets committed, only once this says so; a trainer killed between
   * checkpoints reads them again. Default: always (offsets are committed as soon as a step is trained).
   */
  readonly checkpointed?: (step: StepResult) => boolean;
  /** Most steps between two checkpoints: sizes the buffer of trajectories held unacknowledged. Default 1. */
  readonly stepsPerCheckpoint?: number;
  /** Partition counts of the topics if the trainer creates them. */
  readonly partitions?: TopicPartitions;
  /** kafkajs settings of the trajectories consumer. */
  readonly consumer?: Omit<ConsumerConfig, 'groupId'>;
  /** Cancels the run: the stream completes without announcing the end. */
  readonly signal?: AbortSignal;
  /** Instrumentation: consumer events and `trainer.*` events (admissions, steps, duplicates). */
  readonly onEvent?: (event: KafkaEvent) => void;
}

/**
 * The trainer half of a Kafka deployment: the GRPO loop of `grpoPipeline` with its rollout stage replaced by two
 * topics.
 *
 * - The admission gate pulls the loader on credit; each admitted task goes to `tasks` with the version it
 *   requires (`b − η` for admission batch `b`), its group size and sampling settings.
 * - Trajectories come back from `trajectories` (any number of workers); redeliveries are dropped by trajectory id,
 *   outputs of other runs are ignored, and undecodable messages go to the dead-letter topic.
 * - Groups are batched (one admission batch per train batch in `sync` and `batch-async`), trained, and each new
 *   version is written to `weightsDir` and announced on `weights` before the gate admits more.
 * - Offsets of the trajectories topic are committed only once the step that trained them is done.
 * - With `policies` and `episodes` (a multi-agent run, the workers playing the same `episodes`), each policy has
 *   its own group store, batches, trainer and gate, and announces its weights under its `modelTag` (a LoRA
 *   policy: its adapter alone, over a base written once); a task is admitted when every policy still training
 *   admits it, and step results carry `modelTag` with metrics namespaced `<tag>/…`.
 *
 * At the end (after `steps` steps, or when every admitted task is trained) it announces the end of the run, so
 * workers following it stop, and completes. Staleness metrics (`rollout/staleness_*`) use the versions the workers
 * wrote on each trajectory.
 *
 * ```
 * loader ─admit─▶ tasks topic ⇢ workers ⇢ trajectories topic ─▶ dropDuplicates ─▶ groupTrajectories
 *   ▲                                                               ─▶ batchGroups ─▶ grpoPrepare ─▶ train
 *   └──── gate.publish(v) ◀── weights topic (file on shared disk) ◀──────────────────────────┘
 * ```
 *
 * @example
 * ```ts
 * import { CharTokenizer, GrpoTrainer, PolicyModel, createKafka, kafkaTopics } from 'rxrl';
 * import { kafkaTrainer } from 'rxrl/pipelines';
 * const policy = PolicyModel.create(config, 1);
 * kafkaTrainer({
 *   kafka: createKafka(process.env.KAFKA_BROKERS ?? 'localhost:9092'),
 *   topics: kafkaTopics('rxrl'),
 *   tasks: task.train, loader: { epochs: Infinity, shuffle: true },
 *   trainer: new GrpoTrainer(policy), policy, padId: tokenizer.padId, weightsDir: 'runs/weights',
 *   batchSize: 16, groupSize: 8, maxTokens: 5, steps: 100,
 * }).subscribe((step) => console.log(step.step, step.metrics['rollout/reward_mean']));
 * ```
 * @param config - client, topics, tasks, trainer, policy, sizes and staleness mode.
 * @returns a cold Observable of step results; each subscription is one run.
 * @see kafkaRolloutWorker
 */
export function kafkaTrainer(config: KafkaTrainerConfig): Observable<PolicyStepResult> {
  const { policies, slots } = checkTrainerConfig(config);
  const run = config.run ?? `run-${Date.now().toString(36)}-${randomBytes(3).toString('hex')}`;
  return new Observable<PolicyStepResult>((subscriber) => new TrainerRun(config, policies, slots, run, subscriber).begin());
}

/** A slot of a task: the suffix of its group id and the policy that samples it. */
type Slot = { readonly suffix: string; readonly modelTag: string };

/** Refuses a configuration kafkaTrainer cannot run; returns its policies and each task's slots. */
function checkTrainerConfig(config: KafkaTrainerConfig): { policies: readonly KafkaPolicy[]; slots: readonly Slot[] } {
  const { groupSize } = config;
  if (config.steps !== undefined && !(Number.isInteger(config.steps) && config.steps >= 0)) {
    throw new ConfigError(`steps must be an integer >= 0, got ${config.steps}`, { context: { key: 'steps' } });
  }
  if (!Number.isInteger(groupSize) || groupSize < 1) {
    throw new ConfigError(`groupSize must be an integer >= 1, got ${groupSize}`, { context: { key: 'groupSize' } });
  }
  const policies = config.policies ?? (config.trainer && config.policy ? [{ trainer: config.trainer, policy: config.policy }] : []);
  if (policies.length === 0) throw new ConfigError('kafkaTrainer needs a trainer and its policy, or policies', { context: { key: 'policies' } });
  const { episodes } = config;
  const slots = episodes
    ? episodeSlots(episodes.environment, agentMap(episodes.agents), episodes.granularity ?? 'turn')
    : [{ suffix: '', modelTag: policies[0].trainer.modelTag }];
  for (const tag of new Set(slots.map((slot) => slot.modelTag))) {
    if (!policies.some((p) => p.trainer.modelTag === tag)) {
      throw new ConfigError(`an agent samples from policy '${tag}', which kafkaTrainer does not train`, { context: { key: 'policies', modelTag: tag } });
    }
  }
  return { policies, slots };
}

/** One policy of a Kafka run: its gate, its weights on the topic (under its modelTag), its version. */
interface Lane {
  readonly trainer: Trainer;
  readonly policy: KafkaPolicy['policy'];
  readonly modelTag: string;
  /** Groups each task gives this policy. */
  readonly slotsPerTask: number;
  readonly gate: AdmissionGate;
  readonly publisher: WeightsPublisher;
  version: number;
}

/** One subscription of {@link kafkaTrainer}: the admission, the trajectories, the lanes' steps, the end. */
class TrainerRun {
  private readonly multi: boolean;
  private readonly ordered: boolean;
  private readonly eta: number;
  /** A resumed trainer starts at its checkpoint's version: admission batches (and the versions their tasks require) count from there. */
  private readonly startVersion: number;
  private readonly controller = new AbortController();
  private readonly signal: AbortSignal;
  private readonly producer: ReturnType<typeof createProducer>;
  /** Bases of LoRA policies, each written once under the run's directory: object → directory. */
  private readonly bases = new Map<NonNullable<KafkaPolicy['adapter']>['base'], string>();
  private readonly tokenizerFiles: { tokenizerFiles?: Readonly<Record<string, string>>; special?: ReturnType<typeof specialIdsOf> };
  private readonly lanes: Lane[];
  /** Most tasks admitted and not yet trained. */
  private readonly admittable: number;
  private readonly closings: Promise<void>[] = [];
  private eventSeq = 0;
  // Admission state: group id → admission batch (ordered modes), admitted groups, counts.
  private readonly admissionBatch = new Map<string, number>();
  private readonly admittedGroups = new Set<string>();
  private readonly trainedGroups = new Set<string>();
  private admitted = 0;
  private admittedSlots = 0;
  private admissionDone = false;
  private released = 0;
  // Trajectory records waiting for the step that trains their group, and those trained but not yet checkpointed.
  private readonly pending = new Map<string, KafkaRecord<TrajectoryMessage>[]>();
  private readonly held: KafkaRecord<TrajectoryMessage>[] = [];
  private readonly input = new Subject<RolloutOutput>();
  private readonly subscriptions: Subscription[] = [];
  private cleaned: Promise<void> | undefined;

  constructor(
    private readonly config: KafkaTrainerConfig,
    policies: readonly KafkaPolicy[],
    private readonly slots: readonly Slot[],
    private readonly run: string,
    private readonly subscriber: Subscriber<PolicyStepResult>,
  ) {
    const mode = config.mode ?? 'sync';
    this.multi = config.episodes !== undefined;
    this.startVersion = Math.min(...policies.map((p) => p.trainer.step));
    this.ordered = mode !== 'fully-async';
    this.eta = mode === 'sync' ? 0 : mode === 'batch-async' ? (config.stalenessThreshold ?? 1) : Infinity;
    this.signal = config.signal ? AbortSignal.any([config.signal, this.controller.signal]) : this.controller.signal;
    this.producer = createProducer(config.kafka);
    for (const { adapter } of policies) {
      if (adapter && !this.bases.has(adapter.base)) this.bases.set(adapter.base, join(weightsRunDir(config.weightsDir, run), `base${this.bases.size}`));
    }
    this.tokenizerFiles = config.tokenizer ? { tokenizerFiles: config.tokenizer.files(), special: specialIdsOf(config.tokenizer) } : {};
    this.lanes = policies.map((policy) => this.lane(policy, mode));
    this.admittable = this.ordered ? (this.eta + 1) * config.batchSize : this.lanes[0].gate.capacity;
  }

  /** Starts the run; returns the teardown of the subscription. */
  begin(): TeardownLogic {
    const idle = this.lanes.find((lane) => lane.slotsPerTask === 0);
    if (idle) {
      this.subscriber.error(new ConfigError(`policy '${idle.modelTag}' gets no trajectories: no agent samples from it`, { context: { key: 'policies' } }));
      return undefined;
    }
    this.start().then(
      () => this.cleanup().then(() => this.subscriber.complete()),
      (error: unknown) => this.fail(error),
    );
    return () => {
      this.controller.abort();
      void this.cleanup();
    };
  }

  private lane({ trainer, policy, adapter }: KafkaPolicy, mode: StalenessMode): Lane {
    const { config } = this;
    return {
      trainer,
      policy,
      modelTag: trainer.modelTag,
      slotsPerTask: this.slots.filter((slot) => slot.modelTag === trainer.modelTag).length,
      gate: new AdmissionGate({ mode, tasksPerBatch: config.batchSize, stalenessThreshold: config.stalenessThreshold, capacity: config.capacity, startVersion: trainer.step }),
      publisher: new WeightsPublisher({
        producer: this.producer,
        topic: config.topics.weights,
        dir: config.weightsDir,
        run: this.run,
        modelTag: trainer.modelTag,
        policyConfig: policy.config,
        keepVersions: config.keepVersions,
        onCleanup: (cleanup) => this.emit('trainer.weights_cleaned', { ...cleanup }),
        ...this.tokenizerFiles,
        ...(adapter ? { adapter: { lora: adapter.lora, baseDir: this.bases.get(adapter.base) as string } } : {}),
      }),
      version: trainer.step,
    };
  }

  private readonly emit = (type: KafkaEventType, payload: Record<string, unknown>): void => {
    this.config.onEvent?.({ id: `${this.run}#${this.eventSeq++}`, type, timestamp: Date.now(), payload });
  };

  private checkAllIn(): void {
    if (this.admissionDone && this.released === this.admittedSlots) queueMicrotask(() => this.input.complete());
  }

  private message(task: Task, index: number): TaskMessage {
    const { config } = this;
    return {
      run: this.run,
      index,
      // Ordered modes: the version the task's admission batch may be η behind. Fully-async: the version published
      // when the task was admitted, as an in-process engine would sample it — a worker still loading older weights
      // waits rather than widening the staleness by its own lag.
      minVersion: this.ordered
        ? Math.max(0, this.startVersion + Math.floor(index / config.batchSize) - this.eta)
        : Math.min(...this.lanes.map((lane) => lane.version)),
      samples: config.groupSize,
      sampling: { maxTokens: config.maxTokens, temperature: config.temperature ?? 1, topP: config.topP ?? 1, seed: config.seed ?? 0 },
      task,
    };
  }

  /** Tasks admitted on the gates' credit, each sent to the tasks topic with the version it requires. */
  private admission$(): Observable<TaskMessage> {
    const { config } = this;
    const maxTasks = config.steps === undefined ? Infinity : config.steps * config.batchSize;
    // A task may start when every policy still training lets it (a finished policy's gate is closed).
    const gate = allGates(this.lanes.map((lane) => lane.gate));
    return admit(limit(taskStream(config.tasks, config.loader), maxTasks), gate, {
      onAdmit: (task, index) => {
        this.admitted++;
        for (const slot of this.slots) {
          const id = groupIdOf(task) + slot.suffix;
          this.admittedSlots++;
          this.admittedGroups.add(id);
          if (this.ordered) this.admissionBatch.set(id, Math.floor(index / config.batchSize));
        }
        config.onAdmit?.(task, index);
      },
    }).pipe(
      map((task) => this.message(task, this.admitted - 1)),
      toKafka(this.producer, { topic: config.topics.tasks, encode: encodeTaskMessage, key: (m) => m.task.id }),
      tap((m) => this.emit('trainer.admitted', { taskId: m.task.id, groupId: groupIdOf(m.task), index: m.index, minVersion: m.minVersion })),
    );
  }

  /** Trajectory records from the trajectories topic, redeliveries dropped. */
  private records$(): Observable<KafkaRecord<TrajectoryMessage>> {
    const { config } = this;
    return fromKafka(config.kafka, {
      groupId: config.groupId ?? `${config.topics.trajectories}.trainer`,
      topics: [config.topics.trajectories],
      decode: decodeTrajectoryMessage,
      // Every output of every admittable task, twice over for redeliveries, plus those held until a checkpoint.
      capacity: Math.max(64, this.slots.length * (2 * this.admittable * config.groupSize + (config.stepsPerCheckpoint ?? 1) * config.batchSize * config.groupSize)),
      deadLetter: { producer: this.producer, topic: config.topics.deadLetter },
      consumer: config.consumer,
      onEvent: config.onEvent,
      onClosed: (closing) => void this.closings.push(closing.catch(() => undefined)),
    }).pipe(
      // Per run: a restarted trainer's run re-samples tasks of a killed one, under the same trajectory ids.
      dropDuplicates((record) => `${record.value.run}\u0000${record.value.output.id}`, {
        onDuplicate: (record) => {
          this.emit('trainer.duplicate', { id: record.value.output.id, groupId: record.value.output.groupId });
          record.ack(); // the first copy is outstanding or trained: acknowledging this one loses nothing
        },
      }),
    );
  }

  /** A record of this run for a group admitted and not yet trained goes to the group store; others are acknowledged. */
  private onRecord(record: KafkaRecord<TrajectoryMessage>): void {
    const { run: from, output } = record.value;
    if (from !== this.run || !this.admittedGroups.has(output.groupId) || this.trainedGroups.has(output.groupId)) {
      if (from !== this.run) this.emit('trainer.foreign', { run: from, id: output.id });
      else this.emit('trainer.duplicate', { id: output.id, groupId: output.groupId });
      record.ack();
      return;
    }
    let list = this.pending.get(output.groupId);
    if (list === undefined) {
      list = [];
      this.pending.set(output.groupId, list);
    }
    list.push(record);
    this.input.next(output);
  }

  /** Complete groups of the trajectories that came in, shared by every lane. */
  private groups$(): Observable<Group> {
    const { config } = this;
    return this.input.pipe(
      groupTrajectories({
        keys: ['groupId'],
        groupSize: config.groupSize,
        ...(config.groupTimeoutMs === undefined ? {} : { timeoutMs: config.groupTimeoutMs }),
        ...(config.onGroupTimeout === undefined ? {} : { onTimeout: config.onGroupTimeout }),
      }),
      (source) =>
        new Observable<Group>((inner) =>
          source.subscribe({
            next: (group) => {
              inner.next(group);
              this.released++;
              this.checkAllIn();
            },
            error: (error: unknown) => inner.error(error),
            complete: () => inner.complete(),
          }),
        ),
      share(),
    );
  }

  /** Every lane's steps: its groups batched (one admission batch per train batch in ordered modes) and trained. */
  private steps$(groups$: Observable<Group>): Observable<PolicyStepResult> {
    const { config } = this;
    const batchOf = (group: Group): number => {
      const n = this.admissionBatch.get(group.key[0]) ?? 0;
      this.admissionBatch.delete(group.key[0]);
      return n;
    };
    return merge(
      ...this.lanes.map((lane) =>
        groups$.pipe(
          filter((group) => group.modelTag === lane.modelTag),
          // Each task feeds this policy slotsPerTask groups, all of one admission batch.
          batchGroups({ batchSize: config.batchSize * lane.slotsPerTask, ...(this.ordered ? { batchOf } : {}) }),
          concatMap((groups) => this.trainBatch(lane, groups)),
          config.steps === undefined ? (s: Observable<PolicyStepResult>) => s : take<PolicyStepResult>(config.steps),
          finalize(() => lane.gate.close()),
        ),
      ),
    );
  }

  private trainBatch(lane: Lane, groups: Group[]): Observable<PolicyStepResult> {
    return of(groups).pipe(
      grpoPrepare(prepareOptions(this.config, this.config.padId, lane.modelTag, this.signal)),
      train(lane.trainer, { signal: this.signal }),
      concatMap((trained) => this.afterTrained(lane, groups, trained)),
    );
  }

  /**
   * A trained step: its version announced, the caller's `afterStep`, its records acknowledged once a checkpoint
   * holds it, then the gate credited.
   */
  private async afterTrained(lane: Lane, groups: Group[], trained: StepResult): Promise<PolicyStepResult> {
    const { config } = this;
    const published = await lane.publisher.publish(trained.version, trained.weights(), this.signal);
    lane.version = trained.version;
    this.emit('trainer.published', { modelTag: lane.modelTag, version: published.version, path: published.path });
    const tagged: PolicyStepResult = { ...trained, modelTag: lane.modelTag, ...(this.multi ? { metrics: prefixed(lane.modelTag, trained.metrics) } : {}) };
    const extra = config.afterStep ? await config.afterStep(tagged) : undefined;
    const result = extra ? { ...tagged, metrics: { ...tagged.metrics, ...extra } } : tagged;
    const groupIds = groups.map((g) => g.key[0]);
    for (const id of groupIds) {
      this.held.push(...(this.pending.get(id) ?? []));
      this.pending.delete(id);
      this.trainedGroups.add(id);
    }
    if (config.checkpointed?.(result) ?? true) for (const record of this.held.splice(0)) record.ack();
    this.emit('trainer.trained', {
      modelTag: lane.modelTag,
      step: result.step,
      version: result.version,
      groupIds,
      taskIds: groups.map((g) => g.trajectories[0]?.taskId ?? g.key[0].replace(/@\d+(\/.*)?$/, '')),
      trajectoryIds: result.trajectoryIds,
    });
    lane.gate.publish(result.version, groups.length / lane.slotsPerTask);
    return result;
  }

  private cleanup(): Promise<void> {
    return (this.cleaned ??= (async () => {
      for (const s of this.subscriptions) s.unsubscribe();
      await Promise.all(this.closings);
      await this.producer.disconnect().catch(() => undefined);
    })());
  }

  private fail(error: unknown): void {
    void this.cleanup().then(() => (this.signal.aborted ? this.subscriber.complete() : this.subscriber.error(error)));
  }

  /** Topics, producer, bases and first versions; then the run until its steps are done; then the end of the run. */
  private async start(): Promise<void> {
    const { config, signal } = this;
    await ensureTopics(config.kafka, config.topics, config.partitions, signal);
    await this.producer.connect();
    signal.throwIfAborted();
    if (this.bases.size > 0) await markWeightsRun(weightsRunDir(config.weightsDir, this.run), this.run); // before anything is written under it
    for (const [base, dir] of this.bases) await saveModelDir(dir, { config: base.config, weights: base.getWeights() }, this.tokenizerFiles);
    // The weights the run starts from: version 0, or a resumed trainer's checkpoint version.
    for (const lane of this.lanes) {
      await lane.publisher.publish(lane.version, lane.policy.getWeights(), signal);
      this.emit('trainer.published', { modelTag: lane.modelTag, version: lane.version });
    }
    const steps$ = this.steps$(this.groups$());
    await new Promise<void>((resolve, reject) => {
      this.subscriptions.push(steps$.subscribe({ next: (step) => this.subscriber.next(step), error: reject, complete: resolve }));
      this.subscriptions.push(this.records$().subscribe({ next: (record) => this.onRecord(record), error: reject }));
      this.subscriptions.push(
        this.admission$().subscribe({
          error: reject,
          complete: () => {
            this.admissionDone = true;
            this.checkAllIn();
          },
        }),
      );
      signal.addEventListener('abort', () => resolve(), { once: true });
    });
    // One end for the run: workers stop following every policy of it.
    if (!signal.aborted) await this.lanes[0].publisher.end(Math.max(...this.lanes.map((lane) => lane.version)));
  }
}

/** The first `n` items of an async iterable; closes it (its `finally` runs) after the last one. */
async function* limit<T>(source: AsyncIterable<T>, n: number): AsyncGenerator<T> {
  if (n <= 0) return;
  let count = 0;
  for await (const item of source) {
    yield item;
    if (++count >= n) return;
  }
}
