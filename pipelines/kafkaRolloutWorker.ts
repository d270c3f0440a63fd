import { hostname } from 'node:os';
import { randomBytes } from 'node:crypto';

import type { ConsumerConfig, Kafka } from 'kafkajs';
import {
  Observable,
  concatMap,
  defer,
  delay,
  filter,
  finalize,
  fromEvent,
  identity,
  ignoreElements,
  map,
  merge,
  mergeMap,
  of,
  reduce,
  takeUntil,
  tap,
  type Subscription,
} from 'rxjs';

import type { AgentSpec, MultiAgentEnvironment, TrajectoryGranularity } from '../lib/agent/environment.js';
import type { LocalEngineOptions } from '../lib/engine/local.js';
import type { Tokenizer } from '../lib/engine/types.js';
import { ConfigError } from '../lib/errors.js';
import type { Evaluator } from '../lib/evaluator.js';
import { createProducer, ensureTopics, type TopicPartitions } from '../lib/kafka/client.js';
import { decodeTaskMessage, decodeWeightsMessage, encodeTrajectoryMessage } from '../lib/kafka/codec.js';
import type { KafkaEvent, KafkaEventType, KafkaRecord, KafkaTopics, TaskMessage, TrajectoryMessage } from '../lib/kafka/types.js';
import { WeightsFollower } from '../lib/kafka/weights.js';
import { isSampleFailure, type ModelTag, type PolicyVersion } from '../lib/types.js';
import type { RolloutWorker } from '../lib/worker.js';
import { fromKafka } from '../operators/fromKafka.js';
import { groupIdOf, rollout } from '../operators/rollout.js';
import { rolloutEpisodes } from '../operators/rolloutEpisodes.js';
import { toKafka } from '../operators/toKafka.js';

/** The multi-agent side of a Kafka run: the environment, its agents and the trajectory granularity. */
export interface KafkaEpisodes {
  readonly environment: MultiAgentEnvironment;
  readonly agents: readonly AgentSpec[];
  /** Default `turn`. */
  readonly granularity?: TrajectoryGranularity;
}

/** Configuration of {@link kafkaRolloutWorker}. */
export interface KafkaRolloutWorkerConfig {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** Tokenizer of the policy; its vocabulary must match the trainer's model. */
  readonly tokenizer: Tokenizer;
  /** Scores responses (required unless `episodes` is given: then the environment scores). */
  readonly evaluator?: Evaluator;
  /** Produces each sample (multi-turn, tools, chat templates). Default: one completion of the prompt. */
  readonly worker?: RolloutWorker;
  /**
   * A sample running this long (ms) is cancelled and published as a failure, so the trainer's group shrinks
   * instead of waiting on a stuck engine or tool. Default: no limit.
   */
  readonly sampleTimeoutMs?: number;
  /** Consumer group shared by the workers (they split the tasks). Default `<tasks topic>.workers`. */
  readonly groupId?: string;
  /** Name of this worker (its weights consumer group derives from it). Default `<host>-<pid>-<random>`. */
  readonly workerId?: string;
  /** Tasks rolled out at once (each with all its samples; the engine batches them together). Default 8. */
  readonly concurrency?: number;
  /** Local engine settings: micro-batch size and wait, weight sync policy. */
  readonly engine?: Omit<LocalEngineOptions, 'tokenizer' | 'version' | 'modelTag'>;
  /**
   * Announced weight files must lie in this directory once links are followed (the trainer's weights directory);
   * others are refused (`worker.weights_refused`) and the engines keep their version. Default: no confinement.
   */
  readonly weightsRoot?: string;
  /** Extra latency before each task's rollout, in ms (simulates a slow engine in demos and crash tests). Default 0. */
  readonly rolloutDelayMs?: number;
  /** Complete when the run this worker follows ends. Default true. */
  readonly untilRunEnds?: boolean;
  /** Partition counts used if this worker creates the topics. */
  readonly partitions?: TopicPartitions;
  /**
   * kafkajs settings of the tasks consumer. Default session timeout 6 s, so the tasks of a worker that died are
   * handed to the others within seconds.
   */
  readonly consumer?: Omit<ConsumerConfig, 'groupId'>;
  /**
   * Multi-agent runs: play each task's episodes (`rolloutEpisodes`) with one engine per policy, each following its
   * policy's weights on the weights topic; `evaluator` and `worker` are then unused (the environment scores).
   * Must match the trainer's `episodes`.
   */
  readonly episodes?: KafkaEpisodes;
  /** Stops the worker: rollouts are cancelled, consumers leave their groups, the stream completes. */
  readonly signal?: AbortSignal;
  /** Instrumentation: consumer events and `worker.*` events. */
  readonly onEvent?: (event: KafkaEvent) => void;
}

/** What a worker reports per task. */
export interface WorkerTaskResult {
  readonly run: string;
  /** Admission index of the task. */
  readonly index: number;
  readonly taskId: string;
  readonly groupId: string;
  /** Trajectories published. */
  readonly trajectories: number;
  /** Failed samples published. */
  readonly failures: number;
  /** Oldest policy version among the outputs (−1 when none was rolled out). */
  readonly policyVersion: PolicyVersion;
  /** `rolled-out`; `duplicate` when a copy of the task was already in flight here; `skipped` when its run was over. */
  readonly outcome: 'rolled-out' | 'duplicate' | 'skipped';
}

/**
 * The rollout-worker half of a Kafka deployment. Joins the workers' consumer group on the `tasks` topic; for
 * each task it waits until its engine holds the version the task requires (`minVersion`, which keeps the
 * trainer's staleness bound), samples the task's group with the weights it has, publishes every trajectory (and
 * failed sample) to `trajectories`, and only then acknowledges the task, so a worker that dies mid-task has its
 * tasks redelivered to the others. Weights come from the `weights` topic (see `WeightsFollower`); the first
 * announcement builds the engine, so a worker needs no model settings of its own.
 *
 * ```
 * tasks topic:        --t0--t1------t2--------
 * weights topic:      v0-----------v1---------
 * kafkaRolloutWorker  (waits for t.minVersion, rolls out with the newest weights)
 * trajectories topic: -----t0/*--t1/*----t2/*--
 * output:             -----r0----r1------r2--|   (completes when the followed run ends)
 * ```
 *
 * @example
 * ```ts
 * import { CharTokenizer, createKafka, kafkaTopics } from 'rxrl';
 * import { kafkaRolloutWorker } from 'rxrl/pipelines';
 * import { stringTransformTask } from 'rxrl/recipes';
 * const task = stringTransformTask({ transform: 'reverse' });
 * kafkaRolloutWorker({
 *   kafka: createKafka(process.env.KAFKA_BROKERS ?? 'localhost:9092'),
 *   topics: kafkaTopics('rxrl'),
 *   tokenizer: new CharTokenizer(task.characters),
 *   evaluator: task.evaluator,
 * }).subscribe((r) => console.error(`task ${r.taskId}: ${r.trajectories} trajectories`));
 * ```
 * @param config - client, topics, tokenizer, evaluator, concurrency.
 * @returns a cold Observable of per-task results; each subscription is one worker.
 * @see kafkaTrainer
 */
export function kafkaRolloutWorker(config: KafkaRolloutWorkerConfig): Observable<WorkerTaskResult> {
  const concurrency = config.concurrency ?? 8;
  const rolloutDelayMs = config.rolloutDelayMs ?? 0;
  if (!Number.isInteger(concurrency) || concurrency < 1) {
    throw new ConfigError(`worker concurrency must be an integer >= 1, got ${concurrency}`, { context: { key: 'concurrency' } });
  }
  if (!(rolloutDelayMs >= 0)) throw new ConfigError(`rolloutDelayMs must be >= 0, got ${rolloutDelayMs}`);
  const { kafka, topics } = config;
  const groupId = config.groupId ?? `${topics.tasks}.workers`;
  const workerId = config.workerId ?? `${hostname()}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const { episodes, evaluator } = config;
  const tags = episodes ? policyTags(episodes) : [];
  if (episodes === undefined && evaluator === undefined) {
    throw new ConfigError('kafkaRolloutWorker needs an evaluator (or episodes, whose environment scores)', { context: { key: 'evaluator' } });
  }

  return new Observable<WorkerTaskResult>((subscriber) => {
    const controller = new AbortController();
    const signal = config.signal ? AbortSignal.any([config.signal, controller.signal]) : controller.signal;
    const producer = createProducer(kafka);
    const deadLetter = { producer, topic: topics.deadLetter };
    const closings: Promise<void>[] = [];
    const onClosed = (closing: Promise<void>): void => void closings.push(closing.catch(() => undefined));
    let eventSeq = 0;
    const emit = (type: KafkaEventType, payload: Record<string, unknown>): void => {
      config.onEvent?.({ id: `${workerId}#${eventSeq++}`, type, timestamp: Date.now(), payload });
    };
    const follower = new WeightsFollower(
      fromKafka(kafka, {
        groupId: `${topics.weights}.${workerId}`,
        topics: [topics.weights],
        decode: decodeWeightsMessage,
        capacity: 4096,
        fromBeginning: true,
        deadLetter,
        onEvent: config.onEvent,
        onClosed,
      }),
      { tokenizer: config.tokenizer, engine: config.engine, ...(config.weightsRoot === undefined ? {} : { root: config.weightsRoot }) },
    );
    // A task delivered again while its first copy is still in flight here (a rebalance re-read it) waits for
    // that copy instead of rolling out twice. Resolves true when the copy's outputs were all acknowledged.
    const inFlight = new Map<string, Promise<boolean>>();

    const processTask = (record: KafkaRecord<TaskMessage>): Observable<WorkerTaskResult> => {
      const m = record.value;
      const base = { run: m.run, index: m.index, taskId: m.task.id, groupId: groupIdOf(m.task) };
      const key = `${m.run}/${m.index}`;
      const earlier = inFlight.get(key);
      if (earlier !== undefined) {
        return defer(() => earlier).pipe(
          filter(Boolean),
          map(() => {
            record.ack();
            return { ...base, trajectories: 0, failures: 0, policyVersion: -1, outcome: 'duplicate' as const };
          }),
        );
      }
      let settle!: (ok: boolean) => void;
      inFlight.set(key, new Promise<boolean>((resolve) => (settle = resolve)));
      let ok = false;
      // One engine per policy of a multi-agent run; the run's only engine otherwise.
      const engines$ = defer(() =>
        episodes
          ? follower.waitForAll(m.run, m.minVersion, tags, signal)
          : follower.waitFor(m.run, m.minVersion, signal).then((e) => (e === undefined ? undefined : new Map([[e.modelTag, e]]))),
      );
      return engines$.pipe(
        concatMap((engines) => {
          const engine = engines === undefined ? undefined : [...engines.values()][0];
          if (engines === undefined || engine === undefined) {
            return of({ ...base, trajectories: 0, failures: 0, policyVersion: -1, outcome: 'skipped' as const });
          }
          emit('worker.task_start', { ...base, version: engine.version });
          return of(m.task).pipe(
            rolloutDelayMs > 0 ? delay(rolloutDelayMs) : identity,
            episodes
              ? rolloutEpisodes(engines, {
                  environment: episodes.environment,
                  agents: episodes.agents,
                  samplesPerTask: m.samples,
                  concurrency: m.samples,
                  maxTokens: m.sampling.maxTokens,
                  temperature: m.sampling.temperature,
                  topP: m.sampling.topP,
                  seed: m.sampling.seed,
                  ...(episodes.granularity ? { granularity: episodes.granularity } : {}),
                  ...(config.sampleTimeoutMs === undefined ? {} : { episodeTimeoutMs: config.sampleTimeoutMs }),
                })
              : rollout(engine, {
                  samplesPerTask: m.samples,
                  concurrency: m.samples,
                  evaluator: evaluator as Evaluator,
                  maxTokens: m.sampling.maxTokens,
                  temperature: m.sampling.temperature,
                  topP: m.sampling.topP,
                  seed: m.sampling.seed,
                  modelTag: engine.modelTag,
                  ...(config.worker ? { worker: config.worker } : {}),
                  ...(config.sampleTimeoutMs === undefined ? {} : { sampleTimeoutMs: config.sampleTimeoutMs }),
                }),
            map((output): TrajectoryMessage => ({ run: m.run, output })),
            toKafka(producer, {
              topic: topics.trajectories,
              encode: encodeTrajectoryMessage,
              key: (message) => message.output.groupId,
            }),
            reduce(
              (acc, { output }) =>
                isSampleFailure(output)
                  ? output.skipped === true
                    ? acc
                    : { ...acc, failures: acc.failures + 1 }
                  : {
                      ...acc,
                      trajectories: acc.trajectories + 1,
                      policyVersion: acc.policyVersion < 0 ? output.policyVersion : Math.min(acc.policyVersion, output.policyVersion),
                    },
              { ...base, trajectories: 0, failures: 0, policyVersion: -1, outcome: 'rolled-out' as const },
            ),
            tap((result) => emit('worker.task_done', { ...result })),
          );
        }),
        tap(() => {
          ok = true;
          record.ack();
        }),
        finalize(() => {
          inFlight.delete(key);
          settle(ok);
        }),
      );
    };

    let inner: Subscription | undefined;
    let cleaned: Promise<void> | undefined;
    const cleanup = (): Promise<void> =>
      (cleaned ??= (async () => {
        inner?.unsubscribe();
        follower.close();
        await Promise.all(closings);
        await producer.disconnect().catch(() => undefined);
      })());

    const run = async (): Promise<void> => {
      await ensureTopics(kafka, topics, config.partitions, signal);
      await producer.connect();
      signal.throwIfAborted();
      const runEnd$ = follower.events.pipe(
        tap((event) => {
          if (event.type === 'loaded') emit('worker.weights_loaded', { run: event.run, version: event.version, seconds: event.seconds });
          if (event.type === 'refused') {
            emit('worker.weights_refused', { run: event.run, modelTag: event.modelTag, version: event.version, reason: event.reason });
          }
          if (event.type === 'end') emit('worker.run_end', { run: event.message.run, version: event.message.version });
        }),
        filter((event) => event.type === 'end'),
      );
      const work$ = fromKafka(kafka, {
        groupId,
        topics: [topics.tasks],
        decode: decodeTaskMessage,
        capacity: concurrency,
        deadLetter,
        consumer: { sessionTimeout: 6_000, heartbeatInterval: 1_000, ...config.consumer },
        onEvent: config.onEvent,
        onClosed,
      }).pipe(mergeMap(processTask, concurrency));
      await new Promise<void>((resolve, reject) => {
        inner = merge(work$, follower.events.pipe(ignoreElements()))
          .pipe(
            config.untilRunEnds ?? true ? takeUntil(runEnd$) : identity,
            takeUntil(signal.aborted ? of(true) : fromEvent(signal, 'abort')),
          )
          .subscribe({ next: (result) => subscriber.next(result), error: reject, complete: resolve });
        // The follower's events are hot: start it once the pipeline listens.
        follower.start();
      });
    };

    run().then(
      () => cleanup().then(() => subscriber.complete()),
      (error: unknown) => cleanup().then(() => (signal.aborted ? subscriber.complete() : subscriber.error(error))),
    );
    return () => {
      controller.abort();
      void cleanup();
    };
  });
}

/** The policies of a multi-agent run, in the order its agents name them. */
export function policyTags(episodes: Pick<KafkaEpisodes, 'agents'>): ModelTag[] {
  return [...new Set(episodes.agents.map((agent) => agent.policy))];
}
