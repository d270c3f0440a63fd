/**
 * The Kafka transport of the policy loop: the rollout stage that sends admitted tasks to the tasks topic and takes
 * rollout outputs back from the trajectories topic, the records it holds until their step is done, the weights of
 * each policy on the weights topic, and the producer of the run.
 *
 * @packageDocumentation
 */
import { join } from 'node:path';

import type { ConsumerConfig, Kafka, Producer } from 'kafkajs';
import { Observable, Subject, Subscription, map, tap, type OperatorFunction } from 'rxjs';

import type { NamedWeights, Tokenizer } from '../lib/model/types.js';
import { createProducer, ensureTopics, type TopicPartitions } from '../lib/kafka/client.js';
import { decodeTrajectoryMessage, encodeTaskMessage } from '../lib/kafka/codec.js';
import type {
  KafkaEvent,
  KafkaEventType,
  KafkaRecord,
  KafkaTopics,
  RecordEncoders,
  TaskMessage,
  TaskSampling,
  TrajectoryMessage,
} from '../lib/kafka/types.js';
import { WeightsPublisher, weightsRunDir } from '../lib/kafka/weights.js';
import { markWeightsRun } from '../lib/kafka/weightsCleanup.js';
import type { ResolvedLoraConfig } from '../lib/model/lora.js';
import { saveModelDir, specialIdsOf } from '../lib/model/modelDir.js';
import type { PolicyConfig } from '../lib/model/transformer.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { ModelTag, PolicyVersion, RolloutOutput, Task } from '../lib/core/types.js';
import { dropDuplicates } from '../operators/dropDuplicates.js';
import { fromKafka } from '../operators/fromKafka.js';
import { groupIdOf } from '../operators/rollout.js';
import { toKafka } from '../operators/toKafka.js';
import type { LoopAdmission, RolloutStage } from './grpoPipeline.js';

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

/** Emits one `trainer.*` event of a run. */
export type RunEmit = (type: KafkaEventType, payload: Record<string, unknown>) => void;

/** The events of run `run`, with ids `<run>#<n>`, to `onEvent`. */
export function runEvents(run: string, onEvent: ((event: KafkaEvent) => void) | undefined): RunEmit {
  let seq = 0;
  return (type, payload) => onEvent?.({ id: `${run}#${seq++}`, type, timestamp: Date.now(), payload });
}

/**
 * The trajectory records of one run, per group: a group is live from its admission until the step that trains it;
 * the records of its trajectories wait for that step, then for a checkpoint that holds it, and are acknowledged
 * (their offsets committed) then.
 */
export class GroupRecords {
  /** Admitted groups not trained yet → their task's id. */
  private readonly live = new Map<string, string>();
  private readonly pending = new Map<string, KafkaRecord<unknown>[]>();
  /** Records of trained steps that no checkpoint holds yet. */
  private readonly held: KafkaRecord<unknown>[] = [];
  private admitted = 0;
  private releasedGroups = 0;

  /** Group `groupId` of task `taskId` was admitted. */
  admit(groupId: string, taskId: string): void {
    this.live.set(groupId, taskId);
    this.admitted++;
  }

  /** Holds `record` when its group is live and returns true; false for a group not admitted or already trained. */
  hold(groupId: string, record: KafkaRecord<unknown>): boolean {
    if (!this.live.has(groupId)) return false;
    const list = this.pending.get(groupId);
    if (list) list.push(record);
    else this.pending.set(groupId, [record]);
    return true;
  }

  /** The group store released one more group. */
  release(): void {
    this.releasedGroups++;
  }

  /** Whether every admitted group was released. */
  get allReleased(): boolean {
    return this.releasedGroups === this.admitted;
  }

  /**
   * A step trained `groupIds`: their records wait for a checkpoint; with `checkpointed`, every record waiting is
   * acknowledged. Returns the groups' task ids.
   */
  trained(groupIds: readonly string[], checkpointed: boolean): string[] {
    const taskIds = groupIds.map((id) => this.live.get(id) ?? id);
    for (const id of groupIds) {
      this.held.push(...(this.pending.get(id) ?? []));
      this.pending.delete(id);
      this.live.delete(id);
    }
    if (checkpointed) for (const record of this.held.splice(0)) record.ack();
    return taskIds;
  }
}

/** The producer of one run and the cancellation of its work, opened once and closed once. */
export class RunProducer {
  readonly producer: Producer;
  /** The caller's signal, or the run's teardown. */
  readonly signal: AbortSignal;
  private readonly controller = new AbortController();
  private readonly closings: Promise<void>[] = [];
  private closed: Promise<void> | undefined;

  constructor(
    private readonly kafka: Kafka,
    signal: AbortSignal | undefined,
  ) {
    this.producer = createProducer(kafka);
    this.signal = signal ? AbortSignal.any([signal, this.controller.signal]) : this.controller.signal;
  }

  /** Creates the topics if needed and connects the producer. */
  async open(topics: KafkaTopics, partitions: TopicPartitions | undefined): Promise<void> {
    await ensureTopics(this.kafka, topics, partitions, this.signal);
    await this.producer.connect();
    this.signal.throwIfAborted();
  }

  /** Takes the promise of a consumer's close, awaited before the producer disconnects. */
  readonly onClosed = (closing: Promise<void>): void => void this.closings.push(closing.catch(() => undefined));

  /** Cancels the run's work. */
  abort(): void {
    this.controller.abort();
  }

  /** Waits for the consumers' closes, then disconnects the producer. */
  close(): Promise<void> {
    return (this.closed ??= (async () => {
      await Promise.all(this.closings);
      await this.producer.disconnect().catch(() => undefined);
    })());
  }
}

/** Options of {@link PolicyWeights}. */
export interface PolicyWeightsOptions {
  /** The weights topic. */
  readonly topic: string;
  /** Directory shared with the workers. */
  readonly dir: string;
  readonly run: string;
  /** Versions of each policy kept on disk. */
  readonly keepVersions?: number | undefined;
  /** Its files and special ids go into every version's directory. */
  readonly tokenizer?: Tokenizer | undefined;
  readonly emit: RunEmit;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
}

/** The weights of a run's policies on the weights topic: the first versions, each trained one, and the end. */
export class PolicyWeights {
  private readonly publishers = new Map<ModelTag, WeightsPublisher>();
  private readonly versions = new Map<ModelTag, PolicyVersion>();
  /** LoRA bases, each written once under the run's directory: object → directory. */
  private readonly bases = new Map<NonNullable<KafkaPolicy['adapter']>['base'], string>();
  private readonly files: { tokenizerFiles?: Readonly<Record<string, string>>; special?: ReturnType<typeof specialIdsOf> };

  constructor(
    producer: Producer,
    private readonly policies: readonly KafkaPolicy[],
    private readonly options: PolicyWeightsOptions,
  ) {
    const { tokenizer, run, dir, emit } = options;
    this.files = tokenizer ? { tokenizerFiles: tokenizer.files(), special: specialIdsOf(tokenizer) } : {};
    for (const { trainer, policy, adapter } of policies) {
      if (adapter && !this.bases.has(adapter.base)) this.bases.set(adapter.base, join(weightsRunDir(dir, run), `base${this.bases.size}`));
      const publisher = new WeightsPublisher({
        producer,
        topic: options.topic,
        dir,
        run,
        modelTag: trainer.modelTag,
        policyConfig: policy.config,
        keepVersions: options.keepVersions,
        onCleanup: (cleanup) => emit('trainer.weights_cleaned', { ...cleanup }),
        encode: options.encoders?.weights,
        ...this.files,
        ...(adapter ? { adapter: { lora: adapter.lora, baseDir: this.bases.get(adapter.base) as string } } : {}),
      });
      this.publishers.set(trainer.modelTag, publisher);
      this.versions.set(trainer.modelTag, trainer.step);
    }
  }

  /** Writes the LoRA bases, then announces the weights each policy starts from (version 0, or a resumed step). */
  async open(signal: AbortSignal): Promise<void> {
    const { dir, run, emit } = this.options;
    if (this.bases.size > 0) await markWeightsRun(weightsRunDir(dir, run), run); // before anything is written under it
    for (const [base, baseDir] of this.bases) await saveModelDir(baseDir, { config: base.config, weights: base.getWeights() }, this.files);
    for (const { trainer, policy } of this.policies) {
      const version = this.versions.get(trainer.modelTag) as PolicyVersion;
      await this.publisherOf(trainer.modelTag).publish(version, policy.getWeights(), signal);
      emit('trainer.published', { modelTag: trainer.modelTag, version });
    }
  }

  /** Writes and announces the weights of `step` of policy `modelTag`. */
  async publish(modelTag: ModelTag, step: StepResult, signal?: AbortSignal): Promise<void> {
    const published = await this.publisherOf(modelTag).publish(step.version, step.weights(), signal);
    this.versions.set(modelTag, step.version);
    this.options.emit('trainer.published', { modelTag, version: published.version, path: published.path });
  }

  /** The lowest version announced of any policy. */
  lowest(): PolicyVersion {
    return Math.min(...this.versions.values());
  }

  /** Announces the end of the run (one end for every policy): workers following it stop. */
  async end(): Promise<void> {
    await this.publisherOf(this.policies[0].trainer.modelTag).end(Math.max(...this.versions.values()));
  }

  private publisherOf(modelTag: ModelTag): WeightsPublisher {
    return this.publishers.get(modelTag) as WeightsPublisher;
  }
}

/** Options of {@link kafkaRollout}. */
export interface KafkaRolloutOptions {
  readonly kafka: Kafka;
  /** Sends the tasks (connected by `open`). */
  readonly producer: Producer;
  readonly topics: KafkaTopics;
  /** Run id on every task; outputs of other runs are skipped. */
  readonly run: string;
  /** The suffixes of the groups each task feeds. */
  readonly slots: readonly { readonly suffix: string }[];
  /** Samples per task. */
  readonly groupSize: number;
  /** Tasks admitted per train step (the generation batch). */
  readonly batchSize: number;
  /** How the workers sample each task. */
  readonly sampling: TaskSampling;
  /** Makes the producer ready and announces the first versions; called before the first task goes out. */
  readonly open: () => Promise<void>;
  /** The lowest version announced: what a task admitted in `fully-async` requires. */
  readonly announcedVersion: () => PolicyVersion;
  /** Consumer group on the trajectories topic. Default `<trajectories topic>.trainer`. */
  readonly groupId?: string | undefined;
  readonly consumer?: Omit<ConsumerConfig, 'groupId'> | undefined;
  /** Whether a checkpoint holds a trained step. Default: always. */
  readonly checkpointed?: ((step: StepResult) => boolean) | undefined;
  /** Most steps between two checkpoints: sizes the records held unacknowledged. Default 1. */
  readonly stepsPerCheckpoint?: number | undefined;
  /** Takes the promise of the consumer's close. */
  readonly onClosed?: (closing: Promise<void>) => void;
  /** Consumer events. */
  readonly onEvent?: ((event: KafkaEvent) => void) | undefined;
  /** `trainer.*` events. */
  readonly emit: RunEmit;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
}

/**
 * The rollout stage of a Kafka run: each admitted task goes to the tasks topic with the version it requires, and
 * the outputs of its groups come back from the trajectories topic, redeliveries dropped; outputs of other runs and
 * of groups not admitted or already trained are acknowledged and skipped. Its records are acknowledged once their
 * step is trained (and checkpointed). The stage completes when its input completed and every admitted group was
 * released by the group store.
 *
 * ```
 * tasks ─▶ tasks topic ⇢ workers ⇢ trajectories topic ─▶ dropDuplicates ─▶ live groups ─▶ outputs
 * ```
 *
 * @param options - client, producer, topics, run, sizes and hooks.
 * @returns the stage `policyLoop` plugs in.
 */
export function kafkaRollout(options: KafkaRolloutOptions): RolloutStage {
  const groups = new GroupRecords();
  const released$ = new Subject<void>();
  return {
    rollout: (admission) => (tasks$) => overKafka(tasks$, admission, groups, released$, options),
    released: () => {
      groups.release();
      released$.next();
    },
    trained: (step, groupIds) => {
      const taskIds = groups.trained(groupIds, options.checkpointed?.(step) ?? true);
      options.emit('trainer.trained', {
        modelTag: step.modelTag,
        step: step.step,
        version: step.version,
        groupIds,
        taskIds,
        trajectoryIds: step.trajectoryIds,
      });
    },
  };
}

/** The stage's stream: opens the run, then sends the tasks and forwards the outputs of live groups. */
function overKafka(
  tasks$: Observable<Task>,
  admission: LoopAdmission,
  groups: GroupRecords,
  released$: Observable<void>,
  options: KafkaRolloutOptions,
): Observable<RolloutOutput> {
  return new Observable<RolloutOutput>((subscriber) => {
    const subscriptions = new Subscription();
    let inputDone = false;
    const allIn = (): void => {
      if (inputDone && groups.allReleased) queueMicrotask(() => subscriber.complete());
    };
    const error = (e: unknown): void => subscriber.error(e);
    subscriptions.add(released$.subscribe(allIn));
    options.open().then(() => {
      if (subscriptions.closed) return;
      subscriptions.add(
        trajectoryRecords(options, admission.concurrency).subscribe({
          next: (record) => {
            const output = liveOutput(record, groups, options);
            if (output) subscriber.next(output);
          },
          error,
        }),
      );
      subscriptions.add(
        tasks$.pipe(sendTasks(admission, groups, options)).subscribe({
          error,
          complete: () => {
            inputDone = true;
            allIn();
          },
        }),
      );
    }, error);
    return subscriptions;
  });
}

/** Each task, its groups made live, sent to the tasks topic with the version it requires. */
function sendTasks(admission: LoopAdmission, groups: GroupRecords, options: KafkaRolloutOptions): OperatorFunction<Task, TaskMessage> {
  let index = 0;
  return (tasks$) =>
    tasks$.pipe(
      map((task) => {
        for (const slot of options.slots) groups.admit(groupIdOf(task) + slot.suffix, task.id);
        return taskMessage(task, index++, admission, options);
      }),
      toKafka(options.producer, {
        topic: options.topics.tasks,
        encode: options.encoders?.task ?? encodeTaskMessage,
        key: (m) => m.task.id,
      }),
      tap((m) =>
        options.emit('trainer.admitted', { taskId: m.task.id, groupId: groupIdOf(m.task), index: m.index, minVersion: m.minVersion }),
      ),
    );
}

/** The message of the task admitted `index`-th. */
function taskMessage(task: Task, index: number, admission: LoopAdmission, options: KafkaRolloutOptions): TaskMessage {
  return {
    run: options.run,
    index,
    // Ordered modes: the version the task's admission batch waited for (η behind it). Fully-async: the version
    // announced when the task was admitted, as an in-process engine would sample it — a worker still loading older
    // weights waits rather than widening the staleness by its own lag.
    minVersion: admission.admissionVersion(index) ?? options.announcedVersion(),
    samples: options.groupSize,
    sampling: options.sampling,
    task,
  };
}

/** Trajectory records from the trajectories topic, redeliveries dropped (per run: a restarted trainer's run re-samples tasks of a killed one, under the same trajectory ids). */
function trajectoryRecords(options: KafkaRolloutOptions, concurrency: number): Observable<KafkaRecord<TrajectoryMessage>> {
  const { topics, slots } = options;
  return fromKafka(options.kafka, {
    groupId: options.groupId ?? `${topics.trajectories}.trainer`,
    topics: [topics.trajectories],
    decode: decodeTrajectoryMessage,
    // Every output of every admittable task, twice over for redeliveries, plus those held until a checkpoint.
    capacity: Math.max(64, slots.length * (2 * concurrency + (options.stepsPerCheckpoint ?? 1) * options.batchSize * options.groupSize)),
    deadLetter: { producer: options.producer, topic: topics.deadLetter },
    consumer: options.consumer,
    onEvent: options.onEvent,
    onClosed: options.onClosed,
  }).pipe(
    dropDuplicates((record) => `${record.value.run}\u0000${record.value.output.id}`, {
      onDuplicate: (record) => {
        options.emit('trainer.duplicate', { id: record.value.output.id, groupId: record.value.output.groupId });
        record.ack(); // the first copy is outstanding or trained: acknowledging this one loses nothing
      },
    }),
  );
}

/** The output of a record of this run for a live group (held until its step); any other record is acknowledged. */
function liveOutput(record: KafkaRecord<TrajectoryMessage>, groups: GroupRecords, options: KafkaRolloutOptions): RolloutOutput | undefined {
  const { run: from, output } = record.value;
  if (from === options.run && groups.hold(output.groupId, record)) return output;
  if (from !== options.run) options.emit('trainer.foreign', { run: from, id: output.id });
  else options.emit('trainer.duplicate', { id: output.id, groupId: output.groupId });
  record.ack();
  return undefined;
}
