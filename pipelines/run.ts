import * as tf from '@tensorflow/tfjs-core';
import { appendFile, readFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { lastValueFrom, tap } from 'rxjs';
import type { Kafka } from 'kafkajs';
import { loadCheckpoint, pruneCheckpoints, resumeCheckpoint, saveCheckpoint, type BufferedSample } from '../lib/checkpoint/checkpoint.js';
import { withRunLock } from '../lib/checkpoint/runLock.js';
import type { RxrlConfig } from '../lib/config/schema.js';
import { loadTasks, readTaskFile, type LoaderPosition } from '../lib/data/loader.js';
import { checkPrompts } from '../lib/data/checkPrompts.js';
import { configWarnings } from '../lib/config/configWarnings.js';
import { LocalEngine } from '../lib/engine/local.js';
import { specialIdsOf } from '../lib/model/modelDir.js';
import { ConfigError, asStorageError } from '../lib/errors.js';
import type { Evaluator } from '../lib/evaluator.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { loadTokenizer } from '../lib/model/hfTokenizer.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel, validatePolicyConfig, type PolicyConfig } from '../lib/model/transformer.js';
import { checkModelFits } from '../lib/model/capacity.js';
import { GrpoTrainer, type GrpoTrainerOptions } from '../lib/train/grpoTrainer.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Batch, Metrics, PolicyVersion, Task } from '../lib/types.js';
import type { RolloutEngine, Tokenizer } from '../lib/engine/types.js';
import type { KafkaEvent, KafkaTopics } from '../lib/kafka/types.js';
import { singleTurnWorker, type RolloutWorker } from '../lib/worker.js';
import { groupIdOf } from '../operators/rollout.js';
import { ErrorReporter } from '../lib/observe/errorReporter.js';
import { moduleLogger, silentLogger, type Logger } from '../lib/observe/logger.js';
import { MetricsWriter, metricsPath } from '../lib/observe/metricsFile.js';
import { writeFileAtomic } from '../lib/model/safetensors.js';
import { stringTransformTask } from '../recipes/stringTransform.js';
import { grpoPipeline } from './grpoPipeline.js';
import type { KlInRewardOptions } from '../operators/grpoPrepare.js';
import { kafkaRolloutWorker, type WorkerTaskResult } from './kafkaRolloutWorker.js';
import { kafkaTrainer } from './kafkaTrainer.js';
import { validate } from './validate.js';

/**
 * The tiny Llama-family architecture (`model.type`, default Qwen2) of the `model.*` keys, used when `model.path` is
 * unset; the vocabulary comes from the tokenizer.
 */
export function tinyModelConfig(model: RxrlConfig['model']): Omit<PolicyConfig, 'vocabSize'> {
  return {
    modelType: model.type,
    dModel: model.dModel,
    nLayers: model.nLayers,
    nHeads: model.nHeads,
    nKvHeads: model.nKvHeads === 0 ? model.nHeads : model.nKvHeads,
    dFF: model.dFF,
    maxSeqLen: model.maxSeqLen,
    ropeTheta: model.ropeTheta,
  };
}

/**
 * The policy a run starts from: the recipe's model directory, or the seeded tiny model its `model` keys shape.
 * Either is checked against the backend's memory before anything is allocated (errors name `model.*` keys or
 * `config.json` keys), with the context capped by `model.maxModelLen`.
 *
 * @param vocabSize - The tokenizer's, for the tiny model.
 * @returns the model (owned by the caller) and the context length prompts and responses must fit.
 */
export async function initialModel(
  model: RxrlConfig['model'],
  modelDir: string | undefined,
  vocabSize: number,
  seed: number,
): Promise<{ model: PolicyModel; contextLength: number }> {
  const cap = model.maxModelLen === null ? {} : { maxModelLen: model.maxModelLen };
  if (modelDir !== undefined) {
    const { model: loaded, contents } = await loadModelDir(modelDir, cap);
    return { model: loaded, contextLength: contents.contextLength };
  }
  const config = validatePolicyConfig({ ...tinyModelConfig(model), vocabSize });
  const contextLength = checkModelFits(config, { ...cap, keyOf: (field) => `model.${field}`, capHint: 'model.maxModelLen' });
  return { model: PolicyModel.create(config, seed), contextLength };
}

/** The trainer settings of a recipe's `trainer` section (a reference policy, when KL is on, is the caller's). */
export function grpoTrainerOptions(config: RxrlConfig): GrpoTrainerOptions {
  const t = config.trainer;
  return {
    learningRate: t.learningRate,
    clipLow: t.clipLow,
    clipHigh: t.clipHigh,
    ...(t.clipRatioC === null ? {} : { clipRatioC: t.clipRatioC }),
    lossAggregation: t.lossAggregation,
    microBatchSize: t.microBatchSize,
    ppoEpochs: t.ppoEpochs,
    miniBatches: t.miniBatches,
    maxGradNorm: t.maxGradNorm,
    entropyCoef: t.entropyCoef,
    ...(t.maxStaleness === null ? {} : { maxStaleness: t.maxStaleness }),
    ...(t.importanceCap === null ? {} : { importanceCap: t.importanceCap }),
    ...(t.klLoss.coef > 0 ? { klLoss: { coef: t.klLoss.coef, estimator: t.klLoss.estimator } } : {}),
    seed: config.run.seed,
  };
}

/**
 * The loop settings of a recipe that every training loop shares (embedded, Kafka, multi-agent): staleness mode,
 * sizes, sampling, seed, advantages and the group store's timeout.
 *
 * @internal
 */
export function loopSettings(config: RxrlConfig) {
  return {
    mode: config.sync.mode,
    stalenessThreshold: config.sync.stalenessThreshold,
    ...(config.sync.capacity > 0 ? { capacity: config.sync.capacity } : {}),
    batchSize: config.sync.batchSize,
    groupSize: config.rollout.groupSize,
    temperature: config.rollout.temperature,
    topP: config.rollout.topP,
    seed: config.run.seed,
    advantage: { normalizeByStd: config.algorithm.normalizeByStd, std: config.algorithm.std, filterZeroVariance: config.algorithm.filterZeroVariance },
    ...(config.store.groupTimeoutMs === null ? {} : { groupTimeoutMs: config.store.groupTimeoutMs }),
    onGroupTimeout: config.store.onGroupTimeout,
  };
}

/**
 * What a `kafkaTrainer` takes from a transport and the policy's tokenizer.
 *
 * @internal
 */
export function kafkaSettings(transport: KafkaTransport, tokenizer: Tokenizer, kafka: RxrlConfig['kafka']) {
  return {
    kafka: transport.kafka,
    topics: transport.topics,
    weightsDir: transport.weightsDir,
    keepVersions: kafka.keepVersions,
    padId: tokenizer.padId,
    tokenizer,
    ...(transport.onEvent ? { onEvent: transport.onEvent } : {}),
  };
}

/**
 * The KL penalty in the reward of a recipe (`algorithm.klInReward`), scored against `reference`; none when its
 * coefficient is 0 or there is no reference.
 *
 * @internal
 */
export function klInRewardOf(config: RxrlConfig, reference: PolicyModel | undefined): { klInReward?: KlInRewardOptions } {
  if (reference === undefined || config.algorithm.klInReward.coef <= 0) return {};
  return {
    klInReward: {
      reference: { responseLogprobs: async (batch: Batch) => responseLogprobs(reference, batch) },
      controller: { type: 'fixed', coef: config.algorithm.klInReward.coef },
      estimator: config.algorithm.klInReward.estimator,
    },
  };
}

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

/** Where {@link runTraining} finds its rollout workers when it trains over Kafka. */
export interface KafkaTransport {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** Directory shared with the workers where each version's weights are written. */
  readonly weightsDir: string;
  /** Instrumentation: consumer and `trainer.*` events. */
  readonly onEvent?: (event: KafkaEvent) => void;
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

/** A recipe's tasks and what comes with them. */
export interface Data {
  readonly name: string;
  readonly characters: string;
  readonly train: readonly Task[] | { readonly jsonl: string };
  readonly validation: readonly Task[];
  readonly evaluator: Evaluator;
  readonly maxTokens: number;
  readonly randomPolicyReward?: number;
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

/**
 * Where warnings about the run directory go (a stale lock taken over, a damaged checkpoint skipped): the
 * structured logger and the informational lines.
 *
 * @internal
 */
export function runDirWarnings(options: Pick<RunTrainingOptions, 'log' | 'logger'>): (message: string, context: Readonly<Record<string, unknown>>) => void {
  const logger = moduleLogger(options.logger ?? silentLogger, 'checkpoint');
  return (message, context) => {
    logger.warn(context, message);
    options.log?.(`warning: ${message}`);
  };
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
  const agents = config.agents.environment === 'none' ? undefined : await (await import('./agents.js')).loadAgentsRecipe(config, baseDir);
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

/**
 * Rewrites a JSONL file of step records without those whose `step` is `from` or later (a resumed run's validation
 * line after its checkpoint's last step has step `from − 1` and stays; `−Infinity` drops every record), and
 * without lines that do not parse (a line torn by a crash or a full disk), so the file ends with a complete line
 * and the next append starts a line of its own. A missing file is left missing.
 *
 * @throws {@link StorageError} naming the file when the device is full.
 */
export async function dropStepsFrom(path: string, from: number): Promise<void> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch {
    return;
  }
  const lines = text.split('\n').filter((line) => line.trim() !== '');
  const kept = lines.filter((line) => {
    try {
      const step = (JSON.parse(line) as { step?: unknown }).step;
      return !(typeof step === 'number' && step >= from);
    } catch {
      return false;
    }
  });
  if (kept.length === lines.length && (text === '' || text.endsWith('\n'))) return;
  await writeFileAtomic(path, kept.map((line) => `${line}\n`).join('')).catch((error: unknown) => {
    throw asStorageError(error, path);
  });
}

function describeStop(cause: unknown): string {
  return cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause ?? 'signal');
}

function round(x: number, digits: number): number {
  return Number(x.toFixed(digits));
}

/**
 * What both halves of a run build from the recipe: the data, the evaluator and rollout worker it names, and the
 * policy's tokenizer (the model directory's, or a character tokenizer over the data's alphabet).
 */
async function loadRollout(
  config: RxrlConfig,
  baseDir: string,
): Promise<{ data: Data; evaluator: Evaluator; worker: RolloutWorker | undefined; modelDir: string | undefined; tokenizer: Tokenizer }> {
  const data = await loadData(config, baseDir);
  const evaluator = config.rollout.evaluator.module ? await importExport<Evaluator>(config.rollout.evaluator, baseDir, 'rollout.evaluator') : data.evaluator;
  const worker = config.rollout.worker.module ? await importExport<RolloutWorker>(config.rollout.worker, baseDir, 'rollout.worker') : undefined;
  const modelDir = config.model.path === null ? undefined : resolve(baseDir, config.model.path);
  const tokenizer: Tokenizer = modelDir ? await loadTokenizer(modelDir) : new CharTokenizer(data.characters);
  return { data, evaluator, worker, modelDir, tokenizer };
}

/**
 * The recipe's data: the bundled string task, or JSONL files.
 *
 * @internal
 */
export async function loadData(config: RxrlConfig, baseDir: string): Promise<Data> {
  if (config.data.source === 'bundled') {
    const task = stringTransformTask({ ...config.data.task, seed: config.run.seed });
    return {
      name: task.name,
      characters: task.characters,
      train: task.train,
      validation: task.validation,
      evaluator: task.evaluator,
      maxTokens: config.rollout.maxTokens > 0 ? config.rollout.maxTokens : task.maxAnswerLength + 1,
      randomPolicyReward: task.randomPolicyReward,
    };
  }
  if (config.rollout.maxTokens === 0) throw new ConfigError("rollout.maxTokens: required (> 0) when data.source is 'jsonl'");
  const trainFile = resolve(baseDir, config.data.trainFile!);
  const validation = config.data.validationFile ? await readTaskFile(resolve(baseDir, config.data.validationFile)) : [];
  const fallback: Evaluator = {
    evaluate: () => {
      throw new ConfigError('rollout.evaluator.module: an evaluator is required for jsonl data');
    },
  };
  return {
    name: basename(trainFile).replace(/\.jsonl$/, ''),
    characters: config.data.alphabet!,
    train: { jsonl: trainFile },
    validation,
    evaluator: fallback,
    maxTokens: config.rollout.maxTokens,
  };
}

/**
 * The `resume` section with its path resolved against `baseDir`.
 *
 * @internal
 */
export function resumeOf(config: RxrlConfig, baseDir: string): { mode: RxrlConfig['resume']['mode']; path: string | null } {
  return { mode: config.resume.mode, path: config.resume.path === null ? null : resolve(baseDir, config.resume.path) };
}

/**
 * Reports a damaged checkpoint that resume skips, naming its path and what is wrong.
 *
 * @internal
 */
export function damagedCheckpointWarning(warn: (message: string, context: Readonly<Record<string, unknown>>) => void): (path: string, error: Error) => void {
  return (path, error) => warn(`checkpoint ${path} is damaged, falling back to the previous one: ${error.message}`, { path, reason: error.message });
}

/** Loads `spec.export` from the module at `spec.module` (relative to `baseDir`). */
/**
 * Imports `spec.export` of the recipe's module `spec.module` (relative to `baseDir`); errors name the key
 * (`<key>.module`, `<key>.export`).
 *
 * @internal
 */
export async function importExport<T>(spec: { module: string | null; export: string }, baseDir: string, key: string): Promise<T> {
  const file = resolve(baseDir, spec.module!);
  let module: Record<string, unknown>;
  try {
    module = (await import(pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (cause) {
    throw new ConfigError(`${key}.module: cannot import ${file}`, { cause, context: { file, key: `${key}.module` } });
  }
  const value = module[spec.export];
  if (value === undefined) {
    throw new ConfigError(`${key}.export: ${file} has no export '${spec.export}'`, { context: { file, export: spec.export, key: `${key}.export` } });
  }
  return value as T;
}

/** Reference log-probs of a batch's response tokens, `[B, R]`. */
async function responseLogprobs(model: PolicyModel, batch: Batch): Promise<Float32Array> {
  const T = batch.promptLength + batch.responseLength;
  const out = tf.tidy(() => {
    const lp = model.tokenLogprobs(
      tf.tensor2d(batch.inputIds, [batch.size, T], 'int32'),
      tf.tensor2d(batch.attentionMask, [batch.size, T]),
      tf.tensor2d(batch.positionIds, [batch.size, T], 'int32'),
    ).logprobs; // [B, T-1]
    return tf.slice(lp, [0, batch.promptLength - 1], [batch.size, batch.responseLength]); // [B, R]
  });
  const data = (await out.data()) as Float32Array;
  out.dispose();
  return data;
}

/** The directory a recipe file's relative paths are resolved against. */
export function recipeDir(file: string): string {
  return dirname(resolve(file));
}
