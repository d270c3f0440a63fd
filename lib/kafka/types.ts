/**
 * What crosses the Kafka topics between a trainer and its rollout workers, and the record envelope the
 * `fromKafka` source emits.
 *
 * Topics of one deployment (see {@link kafkaTopics}):
 *
 * ```
 * trainer ──tasks (TaskMessage)──────────▶ workers (one consumer group)
 * trainer ◀──trajectories (TrajectoryMessage)── workers
 * trainer ──weights (WeightsMessage)─────▶ every worker (one consumer group each)
 * trainer ◀──heartbeats (HeartbeatMessage)── every worker, every `kafka.heartbeatMs`
 * poison messages of any topic ──────────▶ dead-letter topic (original bytes + reason headers)
 * ```
 *
 * @packageDocumentation
 */
import type { ModelTag, PolicyVersion, RolloutOutput, Task } from '../core/types.js';

/** Names of the topics of one trainer/worker deployment. */
export interface KafkaTopics {
  /** Admitted tasks, trainer → workers. */
  readonly tasks: string;
  /** Trajectories and failed samples, workers → trainer. */
  readonly trajectories: string;
  /** Weight versions and the end of a run, trainer → every worker. */
  readonly weights: string;
  /** Messages that failed to decode, with the reason in their headers. */
  readonly deadLetter: string;
  /** Workers' heartbeats, workers → trainer (its status shows each worker, and the ones gone). */
  readonly heartbeats: string;
}

/**
 * The topic names under a prefix: `<prefix>.tasks`, `<prefix>.trajectories`, `<prefix>.weights`,
 * `<prefix>.dlq`, `<prefix>.heartbeats`.
 *
 * @param prefix - Topic prefix (letters, digits, `.`, `_`, `-`). Default `rxrl`.
 */
export function kafkaTopics(prefix = 'rxrl'): KafkaTopics {
  return {
    tasks: `${prefix}.tasks`,
    trajectories: `${prefix}.trajectories`,
    weights: `${prefix}.weights`,
    deadLetter: `${prefix}.dlq`,
    heartbeats: `${prefix}.heartbeats`,
  };
}

/** An admitted task on the `tasks` topic. */
export interface TaskMessage {
  /** Id of the training run that admitted it (workers skip tasks of runs that are over). */
  readonly run: string;
  /** 0-based admission index (admission batch = `⌊index / tasksPerBatch⌋`). */
  readonly index: number;
  /**
   * Lowest policy version a worker may roll this task out with: the version the admission gate required
   * (`b − η` for admission batch `b`; 0 in `fully-async`). Workers wait for it before generating, which keeps
   * the staleness bound across processes.
   */
  readonly minVersion: PolicyVersion;
  /** Samples to draw (the GRPO group size): the trainer decides it, so workers need no matching setting. */
  readonly samples: number;
  /** How to sample them. */
  readonly sampling: TaskSampling;
  /** The task itself. */
  readonly task: Task;
}

/** Sampling settings a task carries to the workers. */
export interface TaskSampling {
  /** Largest number of new tokens. */
  readonly maxTokens: number;
  /** Temperature (0 = greedy). */
  readonly temperature: number;
  /** Nucleus mass in (0, 1]. */
  readonly topP: number;
  /** Base seed; each sample's seed derives from it, its group id and its run id. */
  readonly seed: number;
  /**
   * Stop tokens end no response: every sample runs to `maxTokens` (finish reason `length`), as vLLM's `ignore_eos`.
   * Absent: false (records written before the field existed, and by writers that leave it out, read as false).
   */
  readonly ignoreEos?: boolean;
}

/** A rollout output (a trajectory or a failed sample) on the `trajectories` topic. */
export interface TrajectoryMessage {
  /** Run of the task it answers. */
  readonly run: string;
  /** The trajectory, or the report of a failed sample (its group shrinks by one). */
  readonly output: RolloutOutput;
  /** When the worker wrote the record, in milliseconds since the Unix epoch (absent: not given). */
  readonly producedAt?: number;
  /** When the trajectory was generated and scored, by the worker's wall clock (absent: not measured). */
  readonly times?: RolloutTimes;
}

/**
 * How a process writes each topic's records: plain Protocol Buffers (`PLAIN_ENCODERS`, the default), or framed for a
 * schema registry (`registerRecordSchemas`).
 */
export interface RecordEncoders {
  readonly task: (message: TaskMessage) => Uint8Array;
  readonly trajectory: (message: TrajectoryMessage) => Uint8Array;
  readonly weights: (message: WeightsMessage) => Uint8Array;
  readonly heartbeat: (message: HeartbeatMessage) => Uint8Array;
}

/** When one sample was generated and scored, in milliseconds since the Unix epoch. */
export interface RolloutTimes {
  /** The worker started encoding the prompt and generating. */
  readonly generateStart: number;
  /** Generation ended and scoring started. */
  readonly generateEnd: number;
  /** The evaluator returned the reward. */
  readonly rewardEnd: number;
}

/** A new policy version, readable from a safetensors file on disk shared by the trainer and the workers. */
export interface WeightsVersionMessage {
  readonly kind: 'version';
  readonly run: string;
  /** Policy version the file holds (0 = the initial weights). */
  readonly version: PolicyVersion;
  /** Model the weights belong to. */
  readonly modelTag: ModelTag;
  /** Absolute path of the safetensors file (weights plus the policy configuration in its metadata). */
  readonly path: string;
  /** Size of the file in bytes. */
  readonly bytes: number;
  /** Lower-case hex SHA-256 of the file, checked by the worker before loading. */
  readonly sha256: string;
  /** Milliseconds since the epoch when the trainer announced it. */
  readonly timestamp: number;
}

/** The run is over: workers following it stop. */
export interface RunEndMessage {
  readonly kind: 'end';
  readonly run: string;
  /** The last policy version of the run (= train steps taken). */
  readonly version: PolicyVersion;
  /** Milliseconds since the epoch. */
  readonly timestamp: number;
}

/** A rollout worker's heartbeat on the `heartbeats` topic: it is alive, and what it is doing. */
export interface HeartbeatMessage {
  /** The worker's id. */
  readonly worker: string;
  /** The run whose weights it holds (empty before any). */
  readonly run: string;
  /** Tasks it rolls out now. */
  readonly inFlight: number;
  /** Tasks it finished since it started. */
  readonly done: number;
  /** Samples that failed on it since it started. */
  readonly failed: number;
  /** Policy version it holds, once it holds one. */
  readonly version?: PolicyVersion | undefined;
  /** Its last beat: it stops (a killed worker sends none; the trainer sees it gone after three silent periods). */
  readonly leaving: boolean;
  /** Milliseconds since the epoch (the worker's clock). */
  readonly timestamp: number;
}

/** What the `weights` topic carries. */
export type WeightsMessage = WeightsVersionMessage | RunEndMessage;

/**
 * One consumed message: its decoded value, where it came from, and `ack()`, which says the work it carries is
 * done. Offsets are committed per partition once every earlier offset of that partition is acknowledged, so
 * delivery is at-least-once: an unacknowledged message is delivered again after a crash or a rebalance.
 */
export interface KafkaRecord<T> {
  /** The decoded message. */
  readonly value: T;
  readonly topic: string;
  readonly partition: number;
  /** Offset in its partition (a decimal string, as kafkajs gives it). */
  readonly offset: string;
  /** Message key, decoded as UTF-8, if any. */
  readonly key: string | undefined;
  /** Message headers, decoded as UTF-8 (the first value of a repeated header). */
  readonly headers: Readonly<Record<string, string>>;
  /** Broker timestamp (ms since the epoch, decimal string). */
  readonly timestamp: string;
  /** Marks the work this record carries as done. Idempotent; acknowledging after the source closed is a no-op. */
  ack(): void;
}

/** Kinds of {@link KafkaEvent}. */
export type KafkaEventType =
  /** The consumer joined its group; `payload.assignment` maps topics to partitions. */
  | 'kafka.join'
  /** The consumer paused fetching: `payload.inFlight` records are unacknowledged, the capacity. */
  | 'kafka.pause'
  /** The consumer resumed fetching. */
  | 'kafka.resume'
  /** Offsets were committed: `payload.offsets`. */
  | 'kafka.commit'
  /** A commit failed (it is tried again with the next acknowledgement): `payload.error`. */
  | 'kafka.commit_failed'
  /** A message that failed to decode went to the dead-letter topic: `payload.reason`, topic, partition, offset. */
  | 'kafka.dead_letter'
  /** The kafkajs consumer crashed and restarts (`payload.restart`). */
  | 'kafka.crash'
  /** The trainer admitted a task and published it: `taskId`, `groupId`, `index`, `minVersion`. */
  | 'trainer.admitted'
  /** The trainer announced a weights version: `version`, `path`. */
  | 'trainer.published'
  /** After its first announcement, the trainer removed ended trainers' runs from the weights directory: `removed`, `kept`, `failed`. */
  | 'trainer.weights_cleaned'
  /** The trainer took a step: `step`, `version`, `groupIds`, `taskIds`, `trajectoryIds`. */
  | 'trainer.trained'
  /** The trainer dropped a redelivered rollout output: `id`, `groupId`. */
  | 'trainer.duplicate'
  /** The trainer dropped an output of another run: `run`, `id`. */
  | 'trainer.foreign'
  /** A worker starts rolling out a task: `run`, `taskId`, `index`, `version`. */
  | 'worker.task_start'
  /** A worker published every output of a task: `run`, `taskId`, `index`, `trajectories`, `failures`. */
  | 'worker.task_done'
  /** A worker loaded a weights version: `run`, `version`, `seconds`. */
  | 'worker.weights_loaded'
  /** A worker refused an announced weights version and keeps the one it has: `run`, `modelTag`, `version`, `reason`. */
  | 'worker.weights_refused'
  /** The run a worker followed is over: `run`, `version`. */
  | 'worker.run_end'
  /** A worker's heartbeat could not be sent (it tries again next period): `error`. */
  | 'worker.heartbeat_failed'
  /** The trainer heard a worker's heartbeat: the {@link HeartbeatMessage}'s fields. */
  | 'trainer.heartbeat';

/** An instrumentation event of the Kafka bridge and its pipelines, in the envelope every rxrl module uses. */
export interface KafkaEvent {
  /** Unique within the emitting source. */
  readonly id: string;
  readonly type: KafkaEventType;
  /** Milliseconds since the epoch. */
  readonly timestamp: number;
  readonly payload: Readonly<Record<string, unknown>>;
}
