import { randomBytes } from 'node:crypto';

import type { ConsumerConfig, Kafka } from 'kafkajs';
import { Observable, type Subscription } from 'rxjs';

import type { TaskSource } from '../lib/data/loader.js';
import type { Tokenizer } from '../lib/model/types.js';
import { episodeSlots } from '../lib/agent/environment.js';
import { ConfigError } from '../lib/core/errors.js';
import type { TopicPartitions } from '../lib/kafka/client.js';
import type { KafkaEvent, KafkaTopics, RecordEncoders } from '../lib/kafka/types.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Metrics, Task } from '../lib/core/types.js';
import { agentMap } from '../operators/rolloutEpisodes.js';
import {
  generationBatchSize,
  policyLoop,
  type LoopSettings,
  type PolicyLoopConfig,
  type PolicyStepResult,
  type PublishingLane,
} from './grpoPipeline.js';
import { PolicyWeights, RunProducer, kafkaRollout, runEvents, type KafkaPolicy, type RunEmit } from './kafkaRollout.js';
import { decodeHeartbeatMessage } from '../lib/kafka/codec.js';
import type { ActivityTracker } from '../lib/observe/activity.js';
import { fromKafka } from '../operators/fromKafka.js';
import type { KafkaEpisodes } from './kafkaRolloutWorker.js';

export type { KafkaPolicy } from './kafkaRollout.js';

/** Configuration of {@link kafkaTrainer}. */
export interface KafkaTrainerConfig extends LoopSettings {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Training tasks: an array, an iterable or `{ jsonl }` (read with `loader`), or an async iterable (a loader) used as it is. */
  readonly tasks: TaskSource;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
  /** Takes the train steps (a single-policy run; a multi-agent run gives `policies`). */
  readonly trainer?: Trainer | undefined;
  /** The policy being trained: its architecture and initial weights (announced as version `trainer.step`, 0 unless resumed). */
  readonly policy?: KafkaPolicy['policy'] | undefined;
  /**
   * Multi-agent runs: every policy with its trainer and initial weights, each with its own group store, batches,
   * trainer, gate and weights on the weights topic (under its `modelTag`). Give `episodes` with it.
   */
  readonly policies?: readonly KafkaPolicy[] | undefined;
  /** Multi-agent runs: the environment's turn order and budget, its agents and the granularity, as the workers have them. */
  readonly episodes?: KafkaEpisodes | undefined;
  /** Token id of padding (the workers' tokenizer's `padId`). */
  readonly padId: number;
  /**
   * The policy's tokenizer: its files and special ids are written into every published version's model
   * directory, so each one also loads in transformers. Optional.
   */
  readonly tokenizer?: Tokenizer | undefined;
  /** Directory shared with the workers where weight files are written. */
  readonly weightsDir: string;
  /**
   * Versions of each policy kept on disk (`kafka.keepVersions`). Default 3. The run directories of earlier trainer
   * processes that have ended are removed once this run announced its first version (`trainer.weights_cleaned`).
   */
  readonly keepVersions?: number | undefined;
  /** Run id on every message (workers skip other runs). Default: random. */
  readonly run?: string | undefined;
  /** Consumer group of the trainer on the trajectories topic. Default `<trajectories topic>.trainer`. */
  readonly groupId?: string | undefined;
  /** Train steps; exactly `steps · generationBatchSize` tasks are admitted. Default: until the loader is exhausted. */
  readonly steps?: number | undefined;
  /**
   * Called after each step is trained and its weights are announced, before the gate admits on its credit; the
   * metrics it returns are merged into the step's (validation scores, for instance).
   */
  readonly afterStep?: ((step: PolicyStepResult) => Promise<Metrics | void>) | undefined;
  /**
   * Whether a checkpoint holds the work of every step up to `step` (asked after `afterStep`). The trajectories of
   * trained steps are acknowledged, and their offsets committed, only once this says so; a trainer killed between
   * checkpoints reads them again. Answer about `step` itself: by the time it is asked the trainer may have trained
   * the next step already (training goes on while a step's weights are published), and records never acknowledged
   * fill the consumer's capacity until the run stalls. Default: always (offsets are committed as soon as a step is
   * trained).
   */
  readonly checkpointed?: ((step: StepResult) => boolean) | undefined;
  /** Most steps between two checkpoints: sizes the buffer of trajectories held unacknowledged. Default 1. */
  readonly stepsPerCheckpoint?: number | undefined;
  /** Partition counts of the topics if the trainer creates them. */
  readonly partitions?: TopicPartitions | undefined;
  /** kafkajs settings of the trajectories consumer. */
  readonly consumer?: Omit<ConsumerConfig, 'groupId'> | undefined;
  /** Cancels the run: the stream completes without announcing the end. */
  readonly signal?: AbortSignal | undefined;
  /** Instrumentation: consumer events and `trainer.*` events (admissions, steps, duplicates). */
  readonly onEvent?: ((event: KafkaEvent) => void) | undefined;
}

/**
 * The trainer half of a Kafka deployment: the GRPO loop of `grpoPipeline` (`policyLoop`, the same admission,
 * batching and staleness semantics) with its rollout stage replaced by two topics (`kafkaRollout`) and each
 * policy's weights published on a third.
 *
 * - The admission gate pulls the loader on credit; each admitted task goes to `tasks` with the version it
 *   requires (`b − η` for admission batch `b`), its group size and sampling settings.
 * - Trajectories come back from `trajectories` (any number of workers); redeliveries are dropped by trajectory id,
 *   outputs of other runs are ignored, and undecodable messages go to the dead-letter topic.
 * - Groups are batched (one admission batch per train batch in `sync` and `batch-async`), prepared as the loop's
 *   settings say (`grpoPrepare`; `sftPrepare` with `sft`, `distillPrepare` with `distill`), trained, and each new
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
  return new Observable<PolicyStepResult>((subscriber) => {
    const link = new RunProducer(config.kafka, config.signal);
    const emit = runEvents(run, config.onEvent);
    let beats: Subscription | undefined;
    const weights = new PolicyWeights(link.producer, policies, {
      topic: config.topics.weights,
      dir: config.weightsDir,
      run,
      keepVersions: config.keepVersions,
      tokenizer: config.tokenizer,
      emit,
      encoders: config.encoders,
    });
    const { kafka, topics, groupSize, groupId, consumer, checkpointed, stepsPerCheckpoint, onEvent } = config;
    const stage = kafkaRollout({
      kafka,
      topics,
      groupSize,
      batchSize: generationBatchSize(config),
      groupId,
      consumer,
      checkpointed,
      stepsPerCheckpoint,
      onEvent,
      encoders: config.encoders,
      producer: link.producer,
      run,
      slots,
      sampling: {
        maxTokens: config.maxTokens,
        temperature: config.temperature ?? 1,
        topP: config.topP ?? 1,
        seed: config.seed ?? 0,
        ...(config.ignoreEos === true ? { ignoreEos: true } : {}),
      },
      // Topics, producer, LoRA bases and first versions, before the first task goes out.
      open: async () => {
        await link.open(topics, config.partitions);
        // Workers' heartbeats go to the run's tracker (its status shows each worker, and the ones gone).
        if (config.activity) beats = heartbeats(config, config.activity, run, link, emit);
        await weights.open(link.signal);
      },
      announcedVersion: () => weights.lowest(),
      onClosed: link.onClosed,
      emit,
    });
    const lanes: PublishingLane[] = policies.map(({ trainer }) => ({
      trainer,
      startVersion: trainer.step,
      padId: config.padId,
      publish: (step, signal) => weights.publish(trainer.modelTag, step, signal),
      afterStep: config.afterStep,
    }));
    const fail = (error: unknown): void => {
      beats?.unsubscribe();
      void link.close().then(() => (link.signal.aborted ? subscriber.complete() : subscriber.error(error)));
    };
    const subscription = policyLoop(loopConfig(config, link.signal), {
      ...stage,
      lanes,
      slots,
      namespaceMetrics: config.episodes !== undefined,
    }).subscribe({
      next: (step) => subscriber.next(step),
      error: fail,
      // One end for the run: workers stop following every policy of it. A cancelled run ends without it.
      complete: () => {
        beats?.unsubscribe();
        void (link.signal.aborted ? Promise.resolve() : weights.end()).then(() => link.close().then(() => subscriber.complete()), fail);
      },
    });
    return () => {
      beats?.unsubscribe();
      link.abort();
      subscription.unsubscribe();
      void link.close();
    };
  });
}

/** The settings of a Kafka trainer that are its transport's and its lanes', not its loop's. */
type TransportKey = Exclude<keyof KafkaTrainerConfig, keyof PolicyLoopConfig>;

/**
 * Every {@link TransportKey}, listed once: the compiler requires each of them here and no other, so a setting added to
 * the loop (`LoopSettings`) reaches a Kafka run's loop without being named again — the algorithm's `sft` and
 * `distill`, the advantage and KL settings, the context bound alike.
 */
const TRANSPORT_KEYS: Readonly<Record<TransportKey, true>> = {
  kafka: true,
  topics: true,
  encoders: true,
  trainer: true,
  policy: true,
  policies: true,
  episodes: true,
  padId: true,
  tokenizer: true,
  weightsDir: true,
  keepVersions: true,
  run: true,
  groupId: true,
  afterStep: true,
  checkpointed: true,
  stepsPerCheckpoint: true,
  partitions: true,
  consumer: true,
  onEvent: true,
};

/**
 * The loop settings of a Kafka run: every setting of the config but its transport's, so the loop prepares and trains
 * as an embedded run of the same settings does (one policy loop: SFT's and distillation's batches too).
 */
function loopConfig(config: KafkaTrainerConfig, signal: AbortSignal): PolicyLoopConfig {
  const settings = Object.fromEntries(Object.entries(config).filter(([key]) => !Object.hasOwn(TRANSPORT_KEYS, key))) as Omit<
    KafkaTrainerConfig,
    TransportKey
  >;
  return {
    ...settings,
    // No steps, no task: the loop reads `steps: 0` as "until the loader is exhausted", a Kafka run as "admit none".
    tasks: config.steps === 0 ? noTasks() : config.tasks,
    signal,
  };
}

/** An empty loader. */
async function* noTasks(): AsyncGenerator<Task> {}

/** Reads the workers' heartbeats from now on (a consumer group of this run's own) into `activity`. */
function heartbeats(config: KafkaTrainerConfig, activity: ActivityTracker, run: string, link: RunProducer, emit: RunEmit): Subscription {
  const { topics } = config;
  return fromKafka(config.kafka, {
    groupId: `${topics.heartbeats}.${run}`,
    topics: [topics.heartbeats],
    decode: decodeHeartbeatMessage,
    capacity: 1024,
    deadLetter: { producer: link.producer, topic: topics.deadLetter },
    consumer: config.consumer,
    onEvent: config.onEvent,
    onClosed: link.onClosed,
  }).subscribe({
    next: (record) => {
      record.ack();
      const { timestamp: _sent, ...beat } = record.value;
      // A beat of another run (a worker still following an older trainer, a stray client) is not this run's.
      if (activity.heartbeat(beat, run)) emit('trainer.heartbeat', { ...beat });
    },
    // Heartbeats only inform the status: a failed consumer leaves the workers' rows ageing into 'gone'.
    error: () => undefined,
  });
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
  if (policies.length === 0)
    throw new ConfigError('kafkaTrainer needs a trainer and its policy, or policies', { context: { key: 'policies' } });
  const { episodes } = config;
  const slots = episodes
    ? episodeSlots(episodes.environment, agentMap(episodes.agents), episodes.granularity ?? 'turn')
    : [{ suffix: '', modelTag: policies[0].trainer.modelTag }];
  for (const tag of new Set(slots.map((slot) => slot.modelTag))) {
    if (!policies.some((p) => p.trainer.modelTag === tag)) {
      throw new ConfigError(`an agent samples from policy '${tag}', which kafkaTrainer does not train`, {
        context: { key: 'policies', modelTag: tag },
      });
    }
  }
  return { policies, slots };
}
