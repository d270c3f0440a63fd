import { appendFile } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import type { Kafka } from 'kafkajs';
import { lastValueFrom, tap } from 'rxjs';

import { loadCheckpoint, pruneCheckpoints, resumeCheckpoint, saveCheckpoint, type BufferedSample } from '../lib/checkpoint/checkpoint.js';
import { withRunLock } from '../lib/checkpoint/runLock.js';
import { configWarnings } from '../lib/config/configWarnings.js';
import type { RxrlConfig } from '../lib/config/schema.js';
import { checkPrompts } from '../lib/data/checkPrompts.js';
import { loadTasks, type LoaderPosition } from '../lib/data/loader.js';
import { LocalEngine } from '../lib/engine/local.js';
import type { RolloutEngine, Tokenizer } from '../lib/engine/types.js';
import { ConfigError, asStorageError } from '../lib/errors.js';
import type { KafkaEvent, KafkaTopics } from '../lib/kafka/types.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { specialIdsOf } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { ErrorReporter } from '../lib/observe/errorReporter.js';
import { moduleLogger, silentLogger, type Logger } from '../lib/observe/logger.js';
import { MetricsWriter, metricsPath } from '../lib/observe/metricsFile.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Batch, Metrics, PolicyVersion, Task } from '../lib/types.js';
import { singleTurnWorker, type RolloutWorker } from '../lib/worker.js';
import { groupIdOf } from '../operators/rollout.js';
import { grpoPipeline } from './grpoPipeline.js';
import { kafkaRolloutWorker, type WorkerTaskResult } from './kafkaRolloutWorker.js';
import { kafkaTrainer } from './kafkaTrainer.js';
import { loadAgentsRecipe } from './parts/agentsRecipe.js';
import { loadRollout } from './parts/data.js';
import { initialModel } from './parts/policy.js';
import { damagedCheckpointWarning, dropStepsFrom, resumeOf, runDirWarnings } from './parts/runDir.js';
import { grpoTrainerOptions, kafkaSettings, klInRewardOf, loopSettings, type KafkaTransport } from './parts/settings.js';
import { validate } from './validate.js';

export type { KafkaTransport } from './parts/settings.js';

/** Options of {@link runTraining}. */
export interface RunTrainingOptions {
  /** Directory that relative paths of the configuration are resolved against (the recipe's). Default cwd. */
  readonly baseDir?: string;
  /** Cancels the run gracefully: the stream completes and, with `checkpoint.onStop`, a checkpoint is saved. */
  readonly signal?: AbortSignal;
  /** Called after every step (progress display). */
  readonly onStep?: (step: StepResult, elapsedSeconds: number) => void;
  /** Informational lines (resume, checkpoints). Default: none. */
  readonly log?: (line: string) => void;
  /** Structured logger for error reports. Default: silent. */
  readonly logger?: Logger;
  /**
   * Builds the rollout engine in place of the in-process `LocalEngine` — for example an `OpenAIEngine` over an
   * OpenAI-compatible server. The engine must serve the weights of `context.policy` as `context.version`; its
   * `dispose()` is awaited when the run ends.
   */
  readonly createEngine?: (context: EngineContext) => Promise<RolloutEngine>;
  /**
   * Trains over Kafka (`rxrl trainer`): tasks go to the topics' rollout workers and trajectories come back from
   * them (see `kafkaTrainer`); the in-process engine only validates. Checkpoints and resume work as in an
   * embedded run; each process start is a new run id, so workers drop what a killed trainer had handed out and
   * the resumed trainer hands out again every task its checkpoint had not trained.
   */
  readonly kafka?: KafkaTransport;
}


/** What {@link RunTrainingOptions.createEngine} is given. */
export interface EngineContext {
  /** The policy the trainer starts from (do not dispose it). */
  readonly policy: PolicyModel;
  /** The policy's tokenizer (the character tokenizer, or the model directory's). */
  readonly tokenizer: Tokenizer;
  /** Policy version of `policy`'s weights. */
  readonly version: PolicyVersion;
  /** The TF.js backend this process chose. */
  readonly backend: BackendName;
  /** Samples per train step (`batchSize · groupSize`). */
  readonly samplesPerStep: number;
}

/** What {@link runTraining} reports. */
export interface RunSummary {
  readonly recipe: string;
  readonly mode: RxrlConfig['sync']['mode'];
  readonly backend: string;
  /** Train steps taken in total (including those before a resume). */
  readonly steps: number;
  /** Wall time of the training loop of this process. */
  readonly seconds: number;
  readonly seed: number;
  readonly runDir?: string;
  /** The checkpoint this run resumed from. */
  readonly resumedFrom?: string;
  /** Expected reward of a uniform policy on the bundled task. */
  readonly randomPolicyReward?: number;
  readonly valRewardInitial?: number;
  /** Held-out reward after training; `null` when no final validation ran (no held-out tasks, or stopped early). */
  readonly valRewardFinal: number | null;
  readonly valAccuracyInitial?: number;
  readonly valAccuracyFinal?: number;
  /** Metrics of the last step. */
  readonly lastStep: Metrics;
  /** Samples that failed over the run (each one reported to the error reporter). */
  readonly failedSamples: number;
  /** Why the run stopped early (`stop_on_error`, or the caller's signal). */
  readonly stoppedBy?: string;
}


/**
 * Runs a GRPO training job from a validated configuration: resume from a checkpoint, train with the configured
 * staleness mode, log every trained step to `<run-dir>/trained.jsonl` and its metrics to `metrics.jsonl`,
 * validate before, every N versions and after, and checkpoint every K steps and on a graceful stop.
 *
 * Lossless resume: a checkpoint is written after a step is trained and before new tasks are admitted on its
 * credit; it holds the loader position after the last admitted task and the tasks admitted but not yet trained,
 * which a resumed run admits first. Sampling seeds derive from the run seed and the task and sample ids, so a
 * re-admitted task produces the same trajectory ids.
 */
export async function runTraining(config: RxrlConfig, options: RunTrainingOptions = {}): Promise<RunSummary> {
  const baseDir = options.baseDir ?? process.cwd();
  const runDir = config.run.dir === null ? undefined : resolve(baseDir, config.run.dir);
  // One writer per run directory: held from before the first write to after the last.
  return withRunLock(runDir, () => train(config, options, baseDir, runDir), { warn: runDirWarnings(options) });
}


async function train(config: RxrlConfig, options: RunTrainingOptions, baseDir: string, runDir: string | undefined): Promise<RunSummary> {
  const logger = options.logger ?? silentLogger;
  const checkpointLog = moduleLogger(logger, 'checkpoint');
  const log = (line: string): void => {
    options.log?.(line);
  };
  // Failed samples go to the error reporter: counted always, and under stop_on_error they end the run gracefully.
  const reporter = new ErrorReporter({
    policy: config.run.errorPolicy,
    logger: moduleLogger(logger, 'rollout'),
    ...(options.signal ? { parentSignal: options.signal } : {}),
  });
  const signal = reporter.signal;
  const seed = config.run.seed;
  const backend = await initBackend(config.run.backend, { logger: { info: (_obj, msg) => log(msg) } });
  const { data, evaluator, worker, modelDir, tokenizer } = await loadRollout(config, baseDir);
  const checkpoint = await resumeCheckpoint(resumeOf(config, baseDir), runDir, loadCheckpoint, damagedCheckpointWarning(runDirWarnings(options)));
  if (checkpoint) {
    checkpointLog.info({ path: checkpoint.path, step: checkpoint.state.step, pending: checkpoint.state.pendingTasks.length }, 'resuming');
    log(`resuming from ${checkpoint.path} (step ${checkpoint.state.step})`);
  }

  const { model: initial, contextLength } = await initialModel(config.model, modelDir, tokenizer.vocabSize, seed);
  if (tokenizer.vocabSize > initial.config.vocabSize) {
    initial.dispose();
    throw new ConfigError(`model.path: the tokenizer has ${tokenizer.vocabSize} token ids but the model's vocabulary has ${initial.config.vocabSize}`);
  }
  // Prompts that do not encode, or leave no room for the response, are refused now, naming file and line (a
  // custom worker builds its own prompts, so it is trusted with them).
  let trainTasks: number | undefined;
  if (!worker) {
    const budget = { tokenizer, maxSeqLen: contextLength, maxTokens: data.maxTokens, signal };
    const validationSource = config.data.validationFile ? { jsonl: resolve(baseDir, config.data.validationFile) } : data.validation;
    try {
      trainTasks = (await checkPrompts(data.train, { ...budget, source: 'data.train' })).tasks;
      await checkPrompts(validationSource, { ...budget, source: 'validation' });
    } catch (error) {
      initial.dispose();
      throw error;
    }
  }
  for (const warning of configWarnings(config, trainTasks === undefined ? {} : { trainTasks })) {
    moduleLogger(logger, 'config').warn(warning);
    log(`warning: ${warning}`);
  }
  const needsReference = config.trainer.klLoss.coef > 0 || config.algorithm.klInReward.coef > 0;
  const reference = needsReference ? PolicyModel.fromWeights(initial.config, initial.getWeights()) : undefined;
  const policy = checkpoint ? PolicyModel.fromWeights(initial.config, checkpoint.weights) : initial;
  if (checkpoint) initial.dispose();
  // Over Kafka the in-process engine only validates, between steps: it reads the policy's own weights.
  const rolloutModel = options.createEngine || options.kafka ? undefined : PolicyModel.fromWeights(policy.config, policy.getWeights());
  const { batchSize, mode } = config.sync;
  const groupSize = config.rollout.groupSize;
  const inFlightBatches = mode === 'batch-async' ? config.sync.stalenessThreshold + 1 : mode === 'fully-async' ? 4 : 1;
  const engine: RolloutEngine = options.createEngine
    ? await options.createEngine({
        policy,
        tokenizer,
        version: checkpoint?.state.version ?? 0,
        backend,
        samplesPerStep: batchSize * groupSize,
      })
    : new LocalEngine(rolloutModel ?? policy, {
        tokenizer,
        maxBatchSize: batchSize * groupSize * inFlightBatches,
        weightSync: config.rollout.weightSync,
        version: checkpoint?.state.version ?? 0,
      });
  const trainer = new GrpoTrainer(policy, { ...grpoTrainerOptions(config), ...(reference ? { reference } : {}) });
  if (checkpoint) await trainer.restore({ step: checkpoint.state.step, optimizer: checkpoint.optimizer });

  // Lossless-resume bookkeeping: admitted tasks not yet trained, and the loader position after the last one.
  const loader = loadTasks(data.train, {
    epochs: config.data.epochs === 0 ? Infinity : config.data.epochs,
    shuffle: config.data.shuffle,
    seed,
    ...(checkpoint ? { start: checkpoint.state.loader } : {}),
  });
  const pendingFirst = checkpoint?.state.pendingTasks ?? [];
  const tasks = (async function* (): AsyncGenerator<Task> {
    yield* pendingFirst;
    yield* loader;
  })();
  const admitted = new Map<string, Task>();
  // Samples generated for groups not yet trained (kept in checkpoints), and those a checkpoint handed back.
  const generated = new Map<string, BufferedSample>();
  const restored = new Map((checkpoint?.buffered ?? []).map((b) => [b.id, b] as const));
  const baseWorker = worker ?? singleTurnWorker;
  const recordingWorker: RolloutWorker = async (input, workerSignal) => {
    const saved = restored.get(input.id);
    restored.delete(input.id);
    const sample = saved ? saved.sample : await baseWorker(input, workerSignal);
    generated.set(input.id, { id: input.id, groupId: input.groupId, sample });
    return sample;
  };
  let position: LoaderPosition = loader.position;
  let lastCheckpointStep = checkpoint?.state.step ?? -1;
  const files = runDir ? { trained: resolve(runDir, 'trained.jsonl') } : undefined;
  if (runDir) {
    // Lines of steps past the checkpoint (a killed run's, or a fresh start's over an old directory) are
    // superseded by this run: drop them, so each step appears once in each file.
    const keepBelow = checkpoint?.state.step ?? -Infinity;
    await dropStepsFrom(resolve(runDir, 'trained.jsonl'), keepBelow);
    await dropStepsFrom(metricsPath(runDir), keepBelow);
  }
  const metricsWriter = runDir ? MetricsWriter.open(runDir) : undefined;

  const special = specialIdsOf(tokenizer);
  const save = async (pendingTasks: readonly Task[], loaderPosition: LoaderPosition, buffered: readonly BufferedSample[]): Promise<void> => {
    if (!runDir) return;
    const path = await saveCheckpoint(runDir, {
      state: { step: trainer.step, version: trainer.step, seed, loader: loaderPosition, pendingTasks },
      buffered,
      model: { config: policy.config, weights: policy.getWeights(), tokenizerFiles: tokenizer.files(), special },
      optimizer: await trainer.optimizerState(),
    });
    lastCheckpointStep = trainer.step;
    await pruneCheckpoints(runDir, config.checkpoint.keepLast);
    checkpointLog.info({ path, step: trainer.step, pending: pendingTasks.length }, 'checkpoint saved');
    log(`checkpoint ${path}`);
  };

  // The trainer as the pipeline sees it: each step is logged and checkpointed before the next can start.
  let training: Promise<unknown> = Promise.resolve();
  const checkpointing: Trainer = {
    modelTag: trainer.modelTag,
    get step() {
      return trainer.step;
    },
    trainStep: (batch: Batch, signal?: AbortSignal) => {
      const run = (async () => {
        const result = await trainer.trainStep(batch, signal);
        // Snapshot synchronously: admissions may continue while files are written.
        const trainedGroups = new Set(batch.meta.groups ?? []);
        for (const group of trainedGroups) admitted.delete(group);
        for (const [id, b] of generated) if (trainedGroups.has(b.groupId)) generated.delete(id);
        const pending = [...admitted.values()];
        const buffered = [...generated.values()];
        const at = position;
        if (files) {
          const line = {
            step: result.step,
            version: result.version,
            groups: batch.meta.groups ?? [],
            taskIds: [...new Set(batch.meta.taskIds)],
            trajectoryIds: batch.meta.trajectoryIds,
            policyVersions: batch.meta.policyVersions,
          };
          await appendFile(files.trained, `${JSON.stringify(line)}\n`).catch((error: unknown) => {
            throw asStorageError(error, files.trained);
          });
        }
        // The step's metrics line goes out before its checkpoint: a process killed between the two resumes past
        // this step, so a line written after the checkpoint could be lost for good.
        metricsWriter?.write({ step: result.step, version: result.version, metrics: result.metrics });
        // The last step of the budget is saved here too, inside the step, so a Kafka trainer can still commit the
        // offsets of its trajectories before it ends.
        const due = config.checkpoint.every > 0 && (result.version % config.checkpoint.every === 0 || trainer.step === config.run.steps);
        if (due) await save(pending, at, buffered);
        return result;
      })();
      training = run.catch(() => undefined);
      return run;
    },
  };

  const maxTokens = data.maxTokens;
  const score = (): Promise<Metrics> =>
    validate(engine, data.validation, evaluator, { maxTokens, temperature: config.validation.temperature, seed, signal, worker: baseWorker });
  try {
    const before = config.validation.beforeTrain && data.validation.length > 0 ? await score() : undefined;
    // Validation lines carry the step they follow (−1 before the first).
    if (before) metricsWriter?.write({ step: trainer.step - 1, version: trainer.step, metrics: before });

    const started = performance.now();
    let last: StepResult | undefined;
    // `run.steps` counts from the start of the run: a resumed run trains what is left, and one already finished
    // trains nothing (0 remaining must not reach the pipeline, where it means "until the data ends").
    const remaining = config.run.steps === 0 ? undefined : Math.max(0, config.run.steps - trainer.step);
    if (remaining === 0) log(`run already finished: ${trainer.step} of ${config.run.steps} steps trained`);
    else {
      // What the embedded and the Kafka loops share: the data, the trainer, the staleness mode, the algorithm.
      const common = {
        ...loopSettings(config),
        tasks,
        trainer: checkpointing,
        maxTokens,
        ...(remaining === undefined ? {} : { steps: remaining }),
        ...klInRewardOf(config, reference),
        onAdmit: (task: Task) => {
          admitted.set(groupIdOf(task), task);
          position = loader.position;
        },
        afterStep: async (step: StepResult) => {
          const every = config.validation.every;
          const val = every > 0 && step.version % every === 0 && data.validation.length > 0 ? await score() : undefined;
          // Validation scores get a line of their own, like those before and after training.
          if (val) metricsWriter?.write({ step: step.step, version: step.version, metrics: val });
          return val;
        },
        signal,
      };
      const transport = options.kafka;
      const steps$ = transport
        ? kafkaTrainer({
            ...common,
            ...kafkaSettings(transport, tokenizer, config.kafka),
            policy,
            // Trajectory offsets are committed once a checkpoint holds their step.
            ...(runDir && config.checkpoint.every > 0
              ? { checkpointed: () => lastCheckpointStep === trainer.step, stepsPerCheckpoint: config.checkpoint.every }
              : {}),
          })
        : grpoPipeline({
            ...common,
            engines: [engine],
            evaluator,
            worker: recordingWorker,
            ...(config.rollout.concurrency > 0 ? { concurrency: config.rollout.concurrency } : {}),
            ...(config.rollout.sampleTimeoutMs === null ? {} : { sampleTimeoutMs: config.rollout.sampleTimeoutMs }),
            onSampleFailure: (failure) => {
              reporter.report(failure.error, { module: 'rollout', taskId: failure.taskId, trajectoryId: failure.id });
            },
          });
      await lastValueFrom(
        steps$.pipe(
          tap((step) => {
            last = step;
            options.onStep?.(step, (performance.now() - started) / 1000);
          }),
        ),
        { defaultValue: undefined },
      );
    }
    await training;
    // Every run ends with a checkpoint of its last step (a run shorter than checkpoint.every too), unless stopped
    // early with checkpoint.onStop off.
    if ((!signal.aborted || config.checkpoint.onStop) && trainer.step > lastCheckpointStep) {
      await save([...admitted.values()], position, [...generated.values()]);
    }
    const seconds = (performance.now() - started) / 1000;
    const after = data.validation.length > 0 && !signal.aborted ? await score() : undefined;
    if (after) metricsWriter?.write({ step: trainer.step - 1, version: trainer.step, metrics: after });
    return {
      recipe: data.name,
      mode,
      backend,
      steps: trainer.step,
      seconds: round(seconds, 1),
      seed,
      ...(runDir ? { runDir } : {}),
      ...(checkpoint ? { resumedFrom: checkpoint.path } : {}),
      ...(data.randomPolicyReward === undefined ? {} : { randomPolicyReward: round(data.randomPolicyReward, 4) }),
      ...(before ? { valRewardInitial: round(before['val/reward_mean'] ?? 0, 4) } : {}),
      valRewardFinal: after ? round(after['val/reward_mean'] ?? 0, 4) : null,
      ...(before && before['val/accuracy_mean'] !== undefined ? { valAccuracyInitial: round(before['val/accuracy_mean'], 4) } : {}),
      ...(after && after['val/accuracy_mean'] !== undefined ? { valAccuracyFinal: round(after['val/accuracy_mean'], 4) } : {}),
      lastStep: last?.metrics ?? {},
      failedSamples: reporter.total,
      ...(reporter.stopped ? { stoppedBy: describeStop(reporter.stopCause) } : {}),
    };
  } finally {
    metricsWriter?.close();
    trainer.dispose();
    policy.dispose();
    rolloutModel?.dispose();
    await engine.dispose?.();
    reference?.dispose();
  }
}

/** Options of {@link runWorker}. */
export interface RunWorkerOptions {
  /** Directory that relative paths of the configuration are resolved against (the recipe's). Default cwd. */
  readonly baseDir?: string;
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** Stops the worker: rollouts are cancelled and it leaves its consumer groups. */
  readonly signal?: AbortSignal;
  /** Name of this worker. Default `<host>-<pid>-<random>`. */
  readonly workerId?: string;
  /** Called as each task is done. */
  readonly onTask?: (result: WorkerTaskResult) => void;
  /** Instrumentation: consumer and `worker.*` events. */
  readonly onEvent?: (event: KafkaEvent) => void;
}

/** What {@link runWorker} reports. */
export interface WorkerSummary {
  /** Tasks rolled out. */
  readonly tasks: number;
  readonly trajectories: number;
  /** Samples that failed (published as failures; the trainer counts them). */
  readonly failures: number;
  /** Tasks of runs that were over when they arrived (a killed trainer's), acknowledged without rolling out. */
  readonly skipped: number;
  readonly seconds: number;
}

/**
 * The rollout-worker half of a Kafka run (`rxrl worker`), from the same recipe as the trainer's: the recipe gives
 * the tokenizer, the evaluator and the rollout worker; the weights come from the trainer's announcements. Runs
 * until the trainer's run ends (a resumed trainer is a new run, which the worker follows) or `signal` fires.
 */
export async function runWorker(config: RxrlConfig, options: RunWorkerOptions): Promise<WorkerSummary> {
  const baseDir = options.baseDir ?? process.cwd();
  await initBackend(config.run.backend, { logger: { info: () => undefined } });
  // A multi-agent recipe plays episodes of its environment (which scores them) with one engine per policy.
  const agents = config.agents.environment === 'none' ? undefined : await loadAgentsRecipe(config, baseDir);
  const { evaluator, worker, tokenizer } = agents ? { evaluator: undefined, worker: undefined, tokenizer: agents.tokenizer } : await loadRollout(config, baseDir);
  const started = performance.now();
  const counts = { tasks: 0, trajectories: 0, failures: 0, skipped: 0 };
  // The trainer's weights directory (as rxrl trainer picks it), unless the recipe names a root; a recipe without a
  // run directory (a library caller) confines nothing unless it says so.
  const { weightsRoot, weightsDir } = config.kafka;
  const root = weightsRoot ?? weightsDir ?? (config.run.dir === null ? undefined : join(config.run.dir, 'weights'));
  await lastValueFrom(
    kafkaRolloutWorker({
      kafka: options.kafka,
      topics: options.topics,
      tokenizer,
      ...(evaluator ? { evaluator } : {}),
      ...(worker ? { worker } : {}),
      ...(agents ? { episodes: agents.episodes } : {}),
      concurrency: config.kafka.workerConcurrency,
      rolloutDelayMs: config.kafka.rolloutDelayMs,
      ...(config.rollout.sampleTimeoutMs === null ? {} : { sampleTimeoutMs: config.rollout.sampleTimeoutMs }),
      engine: { weightSync: config.rollout.weightSync },
      ...(root === undefined ? {} : { weightsRoot: resolve(baseDir, root) }),
      ...(options.workerId ? { workerId: options.workerId } : {}),
      ...(options.signal ? { signal: options.signal } : {}),
      ...(options.onEvent ? { onEvent: options.onEvent } : {}),
    }).pipe(
      tap((result) => {
        if (result.outcome === 'rolled-out') counts.tasks++;
        if (result.outcome === 'skipped') counts.skipped++;
        counts.trajectories += result.trajectories;
        counts.failures += result.failures;
        options.onTask?.(result);
      }),
    ),
    { defaultValue: undefined },
  );
  return { ...counts, seconds: round((performance.now() - started) / 1000, 1) };
}


function describeStop(cause: unknown): string {
  return cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause ?? 'signal');
}

function round(x: number, digits: number): number {
  return Number(x.toFixed(digits));
}







