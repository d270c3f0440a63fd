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
  type OperatorFunction,
  type Subscriber,
  type Subscription,
  type TeardownLogic,
} from 'rxjs';

import type { LocalEngine, LocalEngineOptions } from '../lib/engine/local.js';
import type { Tokenizer } from '../lib/model/types.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Evaluator } from '../lib/core/evaluator.js';
import { createProducer, ensureTopics, type TopicPartitions } from '../lib/kafka/client.js';
import { decodeTaskMessage, decodeWeightsMessage, encodeHeartbeatMessage, encodeTrajectoryMessage } from '../lib/kafka/codec.js';
import { workerIdOf, workerIdProblem } from '../lib/kafka/workerId.js';
import type {
  KafkaEvent,
  KafkaEventType,
  KafkaRecord,
  KafkaTopics,
  RecordEncoders,
  TaskMessage,
  TrajectoryMessage,
} from '../lib/kafka/types.js';
import { WeightsFollower } from '../lib/kafka/weights.js';
import { isSampleFailure, type ModelTag, type PolicyVersion, type RolloutOutput, type Task } from '../lib/core/types.js';
import type { RolloutWorker } from '../lib/engine/worker.js';
import { fromKafka } from '../operators/fromKafka.js';
import { groupIdOf, rollout } from '../operators/rollout.js';
import { rolloutEpisodes } from '../operators/rolloutEpisodes.js';
import { toKafka } from '../operators/toKafka.js';
import type { KafkaEpisodes } from './parts/contracts.js';

export type { KafkaEpisodes } from './parts/contracts.js';

/** Configuration of {@link kafkaRolloutWorker}. */
export interface KafkaRolloutWorkerConfig {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
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
  /**
   * Name of this worker (its weights consumer group derives from it): 1–255 characters of `A-Z a-z 0-9 . _ : @ -`
   * (`workerIdProblem`), else a ConfigError. Default `<host>-<pid>-<random>`.
   */
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
  /** A heartbeat on the `heartbeats` topic every this many ms (0: none), and a last one as it stops. Default 5000. */
  readonly heartbeatMs?: number;
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
  if (config.episodes === undefined && config.evaluator === undefined) {
    throw new ConfigError('kafkaRolloutWorker needs an evaluator (or episodes, whose environment scores)', {
      context: { key: 'evaluator' },
    });
  }
  // The host name may hold what an id may not (or be long): made into one, leaving room for the pid and the random part.
  const workerId = config.workerId ?? `${workerIdOf(hostname(), 200)}-${process.pid}-${randomBytes(3).toString('hex')}`;
  const problem = workerIdProblem(workerId);
  if (problem !== undefined) {
    throw new ConfigError(`workerId: ${problem}`, { context: { key: 'workerId', problem } });
  }
  return new Observable<WorkerTaskResult>((subscriber) =>
    new WorkerRun(config, { concurrency, rolloutDelayMs, workerId }, subscriber).begin(),
  );
}

/** A task's result before it is rolled out: its ids and no trajectories. */
type TaskBase = Pick<WorkerTaskResult, 'run' | 'index' | 'taskId' | 'groupId'>;

/** One subscription of {@link kafkaRolloutWorker}: the weights it follows, the tasks it rolls out, its end. */
class WorkerRun {
  private readonly controller = new AbortController();
  private readonly signal: AbortSignal;
  private readonly producer: ReturnType<typeof createProducer>;
  private readonly deadLetter: { producer: ReturnType<typeof createProducer>; topic: string };
  private readonly closings: Promise<void>[] = [];
  private eventSeq = 0;
  private readonly follower: WeightsFollower;
  /** The policies of a multi-agent run. */
  private readonly tags: ModelTag[];
  /**
   * A task delivered again while its first copy is still in flight here (a rebalance re-read it) waits for that
   * copy instead of rolling out twice. Resolves true when the copy's outputs were all acknowledged.
   */
  private readonly inFlight = new Map<string, Promise<boolean>>();
  private inner: Subscription | undefined;
  private cleaned: Promise<void> | undefined;
  /** Tasks finished and samples failed, for the heartbeats. */
  private readonly counts = { done: 0, failed: 0 };
  private beating: ReturnType<typeof setInterval> | undefined;

  constructor(
    private readonly config: KafkaRolloutWorkerConfig,
    private readonly settings: { readonly concurrency: number; readonly rolloutDelayMs: number; readonly workerId: string },
    private readonly subscriber: Subscriber<WorkerTaskResult>,
  ) {
    const { topics } = config;
    this.signal = config.signal ? AbortSignal.any([config.signal, this.controller.signal]) : this.controller.signal;
    this.producer = createProducer(config.kafka);
    this.deadLetter = { producer: this.producer, topic: topics.deadLetter };
    this.tags = config.episodes ? policyTags(config.episodes) : [];
    this.follower = new WeightsFollower(
      fromKafka(config.kafka, {
        groupId: `${topics.weights}.${settings.workerId}`,
        topics: [topics.weights],
        decode: decodeWeightsMessage,
        capacity: 4096,
        fromBeginning: true,
        deadLetter: this.deadLetter,
        onEvent: config.onEvent,
        onClosed: this.onClosed,
      }),
      {
        tokenizer: config.tokenizer,
        engine: config.engine,
        ...(config.weightsRoot === undefined ? {} : { root: config.weightsRoot }),
        // A stopped worker does not wait on a weight load (for its running generation to end).
        signal: this.signal,
      },
    );
  }

  /** Starts the worker; returns the teardown of the subscription. */
  begin(): TeardownLogic {
    this.run().then(
      () => this.cleanup().then(() => this.subscriber.complete()),
      (error: unknown) => this.cleanup().then(() => (this.signal.aborted ? this.subscriber.complete() : this.subscriber.error(error))),
    );
    return () => {
      this.controller.abort();
      void this.cleanup();
    };
  }

  private readonly onClosed = (closing: Promise<void>): void => void this.closings.push(closing.catch(() => undefined));

  private readonly emit = (type: KafkaEventType, payload: Record<string, unknown>): void => {
    this.config.onEvent?.({ id: `${this.settings.workerId}#${this.eventSeq++}`, type, timestamp: Date.now(), payload });
  };

  private cleanup(): Promise<void> {
    return (this.cleaned ??= (async () => {
      this.inner?.unsubscribe();
      this.follower.close();
      await Promise.all(this.closings);
      if (this.beating !== undefined) {
        clearInterval(this.beating);
        await this.beat(true);
      }
      await this.producer.disconnect().catch(() => undefined);
    })());
  }

  /** Sends a heartbeat (the last one with `leaving`); a failed send is an event, and the next period tries again. */
  private async beat(leaving: boolean): Promise<void> {
    const current = this.follower.current;
    const value = (this.config.encoders?.heartbeat ?? encodeHeartbeatMessage)({
      worker: this.settings.workerId,
      run: current?.run ?? '',
      inFlight: this.inFlight.size,
      ...this.counts,
      ...(current === undefined ? {} : { version: current.version }),
      leaving,
      timestamp: Date.now(),
    });
    const message = { key: this.settings.workerId, value: Buffer.from(value) };
    await this.producer.send({ topic: this.config.topics.heartbeats, messages: [message] }).catch((error: unknown) => {
      this.emit('worker.heartbeat_failed', { error: String(error) });
    });
  }

  /** Heartbeats every `heartbeatMs`, the first at once. */
  private startBeating(): void {
    const every = this.config.heartbeatMs ?? 5_000;
    if (every <= 0) return;
    void this.beat(false);
    this.beating = setInterval(() => void this.beat(false), every);
    this.beating.unref();
  }

  /** Topics and producer; then tasks rolled out until the followed run ends (or the signal fires). */
  private async run(): Promise<void> {
    const { config, signal } = this;
    await ensureTopics(config.kafka, config.topics, config.partitions, signal);
    await this.producer.connect();
    signal.throwIfAborted();
    this.startBeating();
    const work$ = fromKafka(config.kafka, {
      groupId: config.groupId ?? `${config.topics.tasks}.workers`,
      topics: [config.topics.tasks],
      decode: decodeTaskMessage,
      capacity: this.settings.concurrency,
      deadLetter: this.deadLetter,
      consumer: { sessionTimeout: 6_000, heartbeatInterval: 1_000, ...config.consumer },
      onEvent: config.onEvent,
      onClosed: this.onClosed,
    }).pipe(mergeMap((record) => this.processTask(record), this.settings.concurrency));
    await new Promise<void>((resolve, reject) => {
      this.inner = merge(work$, this.follower.events.pipe(ignoreElements()))
        .pipe(
          (config.untilRunEnds ?? true) ? takeUntil(this.runEnd$()) : identity,
          takeUntil(signal.aborted ? of(true) : fromEvent(signal, 'abort')),
        )
        .subscribe({
          next: (result) => {
            if (result.outcome === 'rolled-out') this.counts.done++;
            this.counts.failed += result.failures;
            this.subscriber.next(result);
          },
          error: reject,
          complete: resolve,
        });
      // The follower's events are hot: start it once the pipeline listens.
      this.follower.start();
    });
  }

  /** The follower's events as worker events; emits when the followed run ends. */
  private runEnd$(): Observable<unknown> {
    return this.follower.events.pipe(
      tap((event) => {
        if (event.type === 'loaded') this.emit('worker.weights_loaded', { run: event.run, version: event.version, seconds: event.seconds });
        if (event.type === 'refused') {
          this.emit('worker.weights_refused', { run: event.run, modelTag: event.modelTag, version: event.version, reason: event.reason });
        }
        if (event.type === 'end') this.emit('worker.run_end', { run: event.message.run, version: event.message.version });
      }),
      filter((event) => event.type === 'end'),
    );
  }

  /** One task: a copy already in flight is waited for; else rolled out once its weights are here, then acknowledged. */
  private processTask(record: KafkaRecord<TaskMessage>): Observable<WorkerTaskResult> {
    const m = record.value;
    const base: TaskBase = { run: m.run, index: m.index, taskId: m.task.id, groupId: groupIdOf(m.task) };
    const key = `${m.run}/${m.index}`;
    const earlier = this.inFlight.get(key);
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
    this.inFlight.set(key, new Promise<boolean>((resolve) => (settle = resolve)));
    let ok = false;
    // One engine per policy of a multi-agent run; the run's only engine otherwise.
    const engines$ = defer(() =>
      this.config.episodes
        ? this.follower.waitForAll(m.run, m.minVersion, this.tags, this.signal)
        : this.follower.waitFor(m.run, m.minVersion, this.signal).then((e) => (e === undefined ? undefined : new Map([[e.modelTag, e]]))),
    );
    return engines$.pipe(
      concatMap((engines) => this.rollOut(m, base, engines)),
      tap(() => {
        ok = true;
        record.ack();
      }),
      finalize(() => {
        this.inFlight.delete(key);
        settle(ok);
      }),
    );
  }

  /** Rolls out a task with the engines of its version (skipped when its run is over) and sends the outputs. */
  private rollOut(m: TaskMessage, base: TaskBase, engines: ReadonlyMap<ModelTag, LocalEngine> | undefined): Observable<WorkerTaskResult> {
    const engine = engines === undefined ? undefined : [...engines.values()][0];
    if (engines === undefined || engine === undefined) {
      return of({ ...base, trajectories: 0, failures: 0, policyVersion: -1, outcome: 'skipped' as const });
    }
    this.emit('worker.task_start', { ...base, version: engine.version });
    const { config } = this;
    return of(m.task).pipe(
      this.settings.rolloutDelayMs > 0 ? delay(this.settings.rolloutDelayMs) : identity,
      this.sampler(m, engines, engine),
      map((output) => trajectoryMessageOf(m.run, output)),
      toKafka(this.producer, {
        topic: config.topics.trajectories,
        encode: config.encoders?.trajectory ?? encodeTrajectoryMessage,
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
        { ...base, trajectories: 0, failures: 0, policyVersion: -1, outcome: 'rolled-out' as WorkerTaskResult['outcome'] },
      ),
      tap((result) => this.emit('worker.task_done', { ...result })),
    );
  }

  /** The rollout of a task's samples: episodes of the environment, or single turns scored by the evaluator. */
  private sampler(m: TaskMessage, engines: ReadonlyMap<ModelTag, LocalEngine>, engine: LocalEngine): OperatorFunction<Task, RolloutOutput> {
    const { config } = this;
    const { episodes } = config;
    const { maxTokens, temperature, topP, seed, ignoreEos } = m.sampling;
    const sampling = { maxTokens, temperature, topP, seed, ignoreEos: ignoreEos === true };
    if (episodes) {
      return rolloutEpisodes(engines, {
        environment: episodes.environment,
        agents: episodes.agents,
        samplesPerTask: m.samples,
        concurrency: m.samples,
        ...sampling,
        ...(episodes.granularity ? { granularity: episodes.granularity } : {}),
        ...(config.sampleTimeoutMs === undefined ? {} : { episodeTimeoutMs: config.sampleTimeoutMs }),
      });
    }
    return rollout(engine, {
      samplesPerTask: m.samples,
      concurrency: m.samples,
      evaluator: config.evaluator as Evaluator,
      ...sampling,
      modelTag: engine.modelTag,
      ...(config.worker ? { worker: config.worker } : {}),
      ...(config.sampleTimeoutMs === undefined ? {} : { sampleTimeoutMs: config.sampleTimeoutMs }),
    });
  }
}

/** The policies of a multi-agent run, in the order its agents name them. */
export function policyTags(episodes: Pick<KafkaEpisodes, 'agents'>): ModelTag[] {
  return [...new Set(episodes.agents.map((agent) => agent.policy))];
}

/**
 * The record of a rollout output: stamped with the time it is written and, for a trajectory, when it was generated
 * and scored (its `timing`, from this process's clock to the wall clock).
 */
function trajectoryMessageOf(run: string, output: RolloutOutput): TrajectoryMessage {
  const producedAt = Date.now();
  if (isSampleFailure(output) || output.timing === undefined) return { run, output, producedAt };
  const origin = performance.timeOrigin;
  const { generate, reward } = output.timing;
  const times = {
    generateStart: origin + generate[0],
    generateEnd: origin + generate[1],
    rewardEnd: origin + Math.max(generate[1], reward[1]),
  };
  return { run, output, producedAt, times };
}
