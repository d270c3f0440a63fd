import { join, resolve } from 'node:path';
import type { Kafka } from 'kafkajs';
import { lastValueFrom, tap, type Observable } from 'rxjs';

import { loadCheckpoint, pruneCheckpoints, resumeCheckpoint, saveCheckpoint, type Checkpoint } from '../lib/checkpoint/checkpoint.js';
import { withRunLock } from '../lib/checkpoint/runLock.js';
import { configWarnings } from '../lib/config/configWarnings.js';
import type { RxrlConfig } from '../lib/config/schema.js';
import { checkPrompts } from '../lib/data/checkPrompts.js';
import { LocalEngine } from '../lib/engine/local.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { Tokenizer } from '../lib/model/types.js';
import { ConfigError, asStorageError, type StepFailedError } from '../lib/core/errors.js';
import { parseShardSize } from '../lib/core/sizes.js';
import { tinkerServiceLost } from '../lib/tinker/client.js';
import type { KafkaEvent, KafkaTopics, RecordEncoders } from '../lib/kafka/types.js';
import { initBackend } from '../lib/model/backend.js';
import { saveModelDir, specialIdsOf } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { ErrorReporter } from '../lib/observe/errorReporter.js';
import { moduleLogger, silentLogger } from '../lib/observe/logger.js';
import { disposeEach, releaseAfter, releasing } from '../lib/core/release.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { StepResult } from '../lib/train/types.js';
import { isSampleFailure, type Metrics, type SampleFailure, type Task } from '../lib/core/types.js';
import { closeWorker, singleTurnWorker, type RolloutWorker } from '../lib/engine/worker.js';
import { groupIdOf } from '../operators/rollout.js';
import { grpoPipeline } from './grpoPipeline.js';
import { kafkaRolloutWorker, type WorkerTaskResult } from './kafkaRolloutWorker.js';
import { kafkaTrainer } from './kafkaTrainer.js';
import { loadAgentsRecipe } from './parts/agentsRecipe.js';
import { loadRollout } from './parts/data.js';
import { StepOutcomes } from './parts/failedSteps.js';
import { SkippedSteps } from './parts/skippedSteps.js';
import { openLedger, type SaveCheckpoint } from './parts/ledger.js';
import { initialModel, policyModels, readStartingAdapter, remoteContextLength } from '../lib/model/policies.js';
import type { NamedWeights } from '../lib/model/types.js';
import { SINGLE_POLICY } from './parts/policy.js';
import { tinkerParts, waitForTinker } from './parts/tinker.js';
import { damagedCheckpointWarning, resumeOf, runDirWarnings, warnIfNarrow } from './parts/runDir.js';
import { loadTeacher } from './parts/teacher.js';
import { servedEngine } from './parts/served.js';
import { activityTracker, watchRun, type RunWatch } from './parts/stalls.js';
import { grpoTrainerOptions, kafkaSettings, klInRewardOf, loopSettings, samplesInFlight, tasksPerStep } from './parts/settings.js';
import { validate } from './validate.js';
import { generationLine, writeGenerations, type GenerationLine } from './parts/generations.js';

export type { KafkaTransport } from './parts/settings.js';
export { activityTracker } from './parts/stalls.js';
import type { EngineContext, RunParts, RunSetup, RunSummary, RunTrainingOptions, SavedCheckpoint } from './parts/contracts.js';

export type { EngineContext, RunParts, RunSetup, RunSummary, RunTrainingOptions, SavedCheckpoint } from './parts/contracts.js';

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
  // One tracker for every attempt (a status server shows the whole run).
  const tracked = { ...options, activity: options.activity ?? activityTracker(config) };
  // Failed samples go to the error reporter: counted always, and under stop_on_error they end the run gracefully.
  const reporter = new ErrorReporter({
    policy: config.run.errorPolicy,
    logger: moduleLogger(options.logger ?? silentLogger, 'rollout'),
    ...(options.signal ? { parentSignal: options.signal } : {}),
  });
  const memo: RunMemo = { recoveries: 0 };
  let attempt = config;
  let inARow = 0;
  for (;;) {
    const savedBefore = memo.saved;
    try {
      const summary = await trainOnce(attempt, tracked, baseDir, runDir, reporter, memo);
      return memo.recoveries > 0 ? { ...summary, recoveries: memo.recoveries } : summary;
    } catch (error) {
      // A Tinker-backed run under `continue` outlives its service: it waits for the service to answer again and
      // restarts from its last checkpoint (the service's saved state), so no step is trained twice on the policy.
      const recoverable =
        config.trainer.backend === 'tinker' &&
        config.run.errorPolicy === 'continue' &&
        runDir !== undefined &&
        config.checkpoint.every > 0 &&
        !reporter.signal.aborted &&
        tinkerServiceLost(error);
      inARow = memo.saved === savedBefore ? inARow + 1 : 1;
      if (!recoverable || inARow > config.tinker.maxRecoveries) throw error;
      const log = moduleLogger(options.logger ?? silentLogger, 'tinker');
      log.warn(
        { err: error, from: memo.saved ?? 'the start', attempt: inARow },
        'the Tinker service was lost; restarting from the last checkpoint once it answers',
      );
      options.log?.(`tinker service lost (${(error as Error).message}); restarting from ${memo.saved ?? 'the start'} once it answers`);
      await waitForTinker(config, reporter.signal, error);
      memo.recoveries++;
      attempt = memo.saved === undefined ? config : { ...config, resume: { mode: 'from_path', path: memo.saved } };
    }
  }
}

/** What outlives one attempt of a run (a Tinker-backed run restarts after its service was lost). */
interface RunMemo {
  /** The checkpoint this process saved last. */
  saved?: string | undefined;
  /** Validation before training (the first attempt's). */
  before?: Metrics | undefined;
  /** The checkpoint the first attempt resumed from. */
  resumedFrom?: string | undefined;
  recoveries: number;
}

/** One attempt: set up, build the parts, train, release. */
async function trainOnce(
  config: RxrlConfig,
  options: RunTrainingOptions,
  baseDir: string,
  runDir: string | undefined,
  reporter: ErrorReporter,
  memo: RunMemo,
): Promise<RunSummary> {
  const setup = await setUp(config, options, baseDir, runDir, reporter.signal);
  if (memo.recoveries === 0) memo.resumedFrom = setup.checkpoint?.path;
  const parts = await buildParts(config, options, setup, runDir, memo).catch((error: unknown) =>
    releaseAfter(
      error,
      async () => {
        await closeWorker(setup.worker);
        setup.teacher?.dispose();
      },
      releaseWarning(options),
    ),
  );
  // Each stall is a warning and a metrics line; under stop_on_error a long one ends the attempt, naming the module.
  const watch = watchRun(config, setup.activity, {
    logger: options.logger,
    log: options.log,
    onStall: (module, idle) =>
      parts.ledger.writeMetrics(parts.trainer.step - 1, parts.trainer.step, { [`activity/stalled_s/${module}`]: idle }),
  });
  // A release that fails after the run failed (a backend that crashed with a step cannot dispose the model either)
  // is a warning: the run's own error is the one reported.
  return releasing(
    () => trainLoop(config, options, setup, parts, reporter, memo, watch),
    async (failed) => {
      watch.stop();
      await closeWorker(setup.worker);
      setup.teacher?.dispose();
      await parts.dispose(failed);
    },
    releaseWarning(options),
  );
}

/** Logs a release that failed after the run's own error (which is what propagates). */
function releaseWarning(options: RunTrainingOptions): (error: unknown, first: unknown) => void {
  return (error, first) => {
    moduleLogger(options.logger ?? silentLogger, 'run').warn({ err: error, after: first }, 'releasing the run failed after its error');
    options.log?.(`warning: releasing the run failed after its error: ${error instanceof Error ? error.message : String(error)}`);
  };
}

/**
 * Picks the backend, loads the recipe's data, tokenizer and checkpoint, builds the initial model and refuses what
 * cannot run: a tokenizer larger than the model's vocabulary, prompts that do not encode or leave no room.
 */
async function setUp(
  config: RxrlConfig,
  options: RunTrainingOptions,
  baseDir: string,
  runDir: string | undefined,
  signal: AbortSignal,
): Promise<RunSetup> {
  const log = (line: string): void => options.log?.(line);
  const backend = await initBackend(config.run.backend, { logger: { info: (_obj, msg) => log(msg) } });
  const { data, evaluator, worker, sampler, modelDir, tokenizer } = await loadRollout(config, baseDir, log, signal);
  const checkpoint = await resumeCheckpoint(
    resumeOf(config, baseDir),
    runDir,
    loadCheckpoint,
    damagedCheckpointWarning(runDirWarnings(options)),
  );
  warnIfNarrow(checkpoint, runDirWarnings(options));
  if (checkpoint) {
    moduleLogger(options.logger ?? silentLogger, 'checkpoint').info(
      { path: checkpoint.path, step: checkpoint.state.step, pending: checkpoint.state.pendingTasks.length },
      'resuming',
    );
    log(`resuming from ${checkpoint.path} (step ${checkpoint.state.step})`);
  }
  // A Tinker-backed run's policy lives on the service: only its context length is needed here.
  const { model: initial, contextLength } =
    config.trainer.backend === 'tinker'
      ? { model: undefined, contextLength: await remoteContextLength(config.model, modelDir, tokenizer.vocabSize) }
      : await initialModel(config.model, modelDir, tokenizer.vocabSize, config.run.seed);
  let trainTasks: number | undefined;
  let startingAdapter: NamedWeights | undefined;
  try {
    if (initial && tokenizer.vocabSize > initial.config.vocabSize) {
      throw new ConfigError(
        `model.path: the tokenizer has ${tokenizer.vocabSize} token ids but the model's vocabulary has ${initial.config.vocabSize}`,
      );
    }
    // A resumed run starts from its checkpoint: the starting adapter (adapterPath) is read for a new run only.
    const entry = config.policies[0] ?? SINGLE_POLICY;
    if (initial && !checkpoint) {
      startingAdapter = await readStartingAdapter(entry, initial.config, { key: 'policies[0].adapterPath', baseDir });
    }
    // Prompts that do not encode, or leave no room for the response, are refused now, naming file and line (a
    // custom worker builds its own prompts, so it is trusted with them).
    if (!sampler) {
      const budget = { tokenizer, maxSeqLen: contextLength, maxTokens: data.maxTokens, signal };
      const validationSource = config.data.validationFile ? { jsonl: resolve(baseDir, config.data.validationFile) } : data.validation;
      // Supervised fine-tuning on the dataset's outputs trains on them: each sequence must fit the context too.
      const references = config.trainer.algorithm === 'sft' && config.sft.source === 'dataset';
      trainTasks = (await checkPrompts(data.train, { ...budget, references, source: 'data.train' })).tasks;
      await checkPrompts(validationSource, { ...budget, source: 'validation' });
    }
  } catch (error) {
    return releaseAfter(error, () => initial?.dispose(), releaseWarning(options));
  }
  for (const warning of configWarnings(config, trainTasks === undefined ? {} : { trainTasks })) {
    moduleLogger(options.logger ?? silentLogger, 'config').warn(warning);
    log(`warning: ${warning}`);
  }
  const teacher = await loadTeacher(config, baseDir, tokenizer, signal).catch((error: unknown) =>
    releaseAfter(error, () => initial?.dispose(), releaseWarning(options)),
  );
  const activity = options.activity ?? activityTracker(config);
  const initialDir = initial ? modelDir : undefined;
  return {
    ...{ backend, data, evaluator, worker, sampler, tokenizer, checkpoint, initial, initialDir, startingAdapter, contextLength },
    ...{ runDir, teacher, activity },
  };
}

/**
 * Builds the run's policy (`policies[0]`, a full model unless the recipe names a LoRA one), resumed from the
 * checkpoint; its engine (the in-process one, or the caller's); its trainer; and the ledger that checkpoints it.
 * Whatever is built is released if a later part fails.
 */
async function buildParts(
  config: RxrlConfig,
  options: RunTrainingOptions,
  setup: RunSetup,
  runDir: string | undefined,
  memo: RunMemo,
): Promise<RunParts> {
  const onSaved: SavedCheckpoint = async (path, step, pending) => {
    if (runDir) await pruneCheckpoints(runDir, config.checkpoint.keepLast);
    memo.saved = path;
    moduleLogger(options.logger ?? silentLogger, 'checkpoint').info({ path, step, pending }, 'checkpoint saved');
    options.log?.(`checkpoint ${path}`);
  };
  if (config.trainer.backend === 'tinker') return tinkerParts(config, options, setup, runDir, onSaved);
  const { checkpoint, tokenizer } = setup;
  const initial = setup.initial as PolicyModel;
  const entry = config.policies[0] ?? SINGLE_POLICY;
  const owned: { dispose(): unknown }[] = [initial];
  const release = async (engine?: RolloutEngine): Promise<void> => {
    disposeEach(owned.reverse().map((item) => () => void item.dispose()));
    await engine?.dispose?.();
  };
  let engine: RolloutEngine | undefined;
  try {
    checkCheckpointKind(checkpoint, entry.specialization === 'lora');
    // Over Kafka the workers roll out and the versions go to them by the weights topic, never to a server.
    if (options.kafka && config.openai.baseUrl !== null)
      throw new ConfigError('openai.baseUrl: a run over Kafka rolls out on its rxrl worker processes; leave it unset', {
        context: { key: 'openai.baseUrl' },
      });
    const needsReference = config.trainer.klLoss.coef > 0 || config.algorithm.klInReward.coef > 0;
    // A full policy keeps a copy of its start as the reference; a LoRA policy's frozen base is its start.
    const reference =
      needsReference && entry.specialization !== 'lora' ? PolicyModel.fromWeights(initial.config, initial.getWeights()) : undefined;
    if (reference) owned.push(reference);
    const lora = entry.specialization === 'lora';
    // A caller's engine or a server (openai.baseUrl) samples and validates. Over Kafka the in-process engine only
    // validates, between steps: a full policy's reads the policy's own weights; a LoRA policy's, its adapter copy.
    const external = options.createEngine !== undefined || config.openai.baseUrl !== null;
    const inProcess = !external && (lora || !options.kafka);
    // In sync mode in one process, rollouts and training take turns: the engine samples from the trainer's model.
    const sampled = inProcess && !(config.sync.mode === 'sync' && !options.kafka);
    const sampleBase = lora && sampled ? PolicyModel.fromWeights(initial.config, initial.getWeights()) : undefined;
    if (sampleBase) owned.push(sampleBase);
    const models = policyModels(entry, 0, initial, sampleBase, config.run.seed, {
      copyTrain: false,
      sampled,
      adapterWeights: setup.startingAdapter,
    });
    owned.push(...models.adapters, models.sample, models.train);
    if (checkpoint) {
      models.train.setWeights(checkpoint.weights);
      if (models.sample !== models.train) models.sample.setWeights(checkpoint.weights);
    }
    const policy = models.train;
    const adapter = models.adapter ? { config: models.adapter.lora, name: entry.name } : undefined;
    engine = await buildEngine(config, options, setup, { policy, sample: models.sample, lora: adapter, runDir });
    const ref = reference ?? (lora && needsReference ? initial : undefined);
    const trainer = new GrpoTrainer(policy, { ...grpoTrainerOptions(config), ...(ref ? { reference: ref } : {}) });
    owned.push(trainer);
    if (checkpoint) await trainer.restore({ step: checkpoint.state.step, optimizer: checkpoint.optimizer });
    const loraParts = models.adapter ? { adapter: models.adapter, base: initial } : undefined;
    const save = await checkpointWriter(config, {
      runDir,
      policy,
      lora: loraParts,
      baseFrom: setup.initialDir,
      trainer,
      tokenizer,
      onSaved,
    });
    const ledger = await openLedger(config, { ...setup, warn: options.log, signal: options.signal }, save);
    const built = engine;
    return {
      policy,
      lora: loraParts,
      reference: ref,
      engine: built,
      trainer,
      ledger,
      dispose: async (failed) => {
        await ledger.close(failed);
        await release(built);
      },
    };
  } catch (error) {
    return releaseAfter(error, () => release(engine), releaseWarning(options));
  }
}

/** A checkpoint of a full model cannot resume a LoRA policy, nor the other way round; a Tinker one neither. */
function checkCheckpointKind(checkpoint: Checkpoint | undefined, lora: boolean): void {
  if (checkpoint?.tinker !== undefined) {
    throw new ConfigError(
      `resume: checkpoint ${checkpoint.path} holds a state on a Tinker service; resume it with trainer.backend 'tinker'`,
      {
        context: { key: 'trainer.backend', path: checkpoint.path },
      },
    );
  }
  if (checkpoint === undefined || (checkpoint.lora !== undefined) === lora) return;
  const holds = checkpoint.lora ? 'a LoRA adapter' : 'a full model';
  throw new ConfigError(
    `resume: checkpoint ${checkpoint.path} holds ${holds}, but policies[0] is ${lora ? "a 'lora' policy" : 'a full model'}`,
    {
      context: { key: 'policies', path: checkpoint.path },
    },
  );
}

/**
 * The rollout engine: the caller's (`createEngine`), an OpenAI-compatible server's (`openai.baseUrl`), or an
 * in-process one sampling from `sample`.
 */
async function buildEngine(
  config: RxrlConfig,
  options: RunTrainingOptions,
  setup: RunSetup,
  models: { policy: PolicyModel; sample: PolicyModel; lora: EngineContext['lora']; runDir: string | undefined },
): Promise<RolloutEngine> {
  const { policy, sample } = models;
  const version = setup.checkpoint?.state.version ?? 0;
  const createEngine = options.createEngine ?? (config.openai.baseUrl !== null ? servedEngine(config, models.runDir) : undefined);
  if (createEngine) {
    return createEngine({
      policy,
      tokenizer: setup.tokenizer,
      version,
      backend: setup.backend,
      samplesPerStep: tasksPerStep(config) * config.rollout.groupSize,
      lora: models.lora,
      signal: options.signal,
    });
  }
  return new LocalEngine(sample, {
    tokenizer: setup.tokenizer,
    maxBatchSize: samplesInFlight(config),
    weightSync: config.rollout.weightSync,
    version,
    sharesTrainerWeights: sample === policy,
  });
}

/**
 * Writes a checkpoint of the policy: a Hugging Face model directory, or for a LoRA policy a PEFT adapter whose
 * base is saved once under `<run-dir>/base/` (written here, before the first step; its weight files hard-linked
 * from the directory the base was read from, `baseFrom`, where they can be).
 */
async function checkpointWriter(
  config: RxrlConfig,
  parts: {
    runDir: string | undefined;
    policy: PolicyModel;
    lora: RunParts['lora'];
    /** The model directory a LoRA policy's base was read from (its weight files are linked into base/). */
    baseFrom: string | undefined;
    trainer: GrpoTrainer;
    tokenizer: Tokenizer;
    onSaved: SavedCheckpoint;
  },
): Promise<SaveCheckpoint> {
  const { runDir, policy, lora, trainer, tokenizer } = parts;
  const files = { tokenizerFiles: tokenizer.files(), special: specialIdsOf(tokenizer) };
  const baseDir = runDir && lora ? join(runDir, 'base') : undefined;
  if (baseDir && lora) {
    await saveModelDir(baseDir, lora.base, { ...files, sameWeightsAs: parts.baseFrom }).catch((error: unknown) => {
      throw asStorageError(error, baseDir);
    });
  }
  return async (pendingTasks, loader, buffered) => {
    if (!runDir) return;
    const path = await saveCheckpoint(runDir, {
      state: { step: trainer.step, version: trainer.step, seed: config.run.seed, loader, pendingTasks },
      buffered,
      model: lora
        ? { lora: lora.adapter.lora, weights: policy.getWeights(), baseDir: baseDir ?? null }
        : {
            config: policy.config,
            weights: policy.getWeights(),
            ...files,
            dtype: config.checkpoint.dtype,
            maxShardBytes: parseShardSize(config.checkpoint.maxShardSize),
          },
      optimizer: await trainer.optimizerState(),
    });
    await parts.onSaved(path, trainer.step, pendingTasks.length);
  };
}

/**
 * The held-out scoring of a run. Each validation's scores carry its seconds (`timing/val_s`); one between steps also
 * counts in the next step's `timing/wait_s` and `timing/total_s`, which it delays. With `validation.generations` its
 * samples go to `<run-dir>/validation/<version>.jsonl`. `current()` gives the last scores while the trainer and the
 * engine are still at the version they were taken at (validation samples are seeded: scoring again would repeat them).
 */
function scorer(config: RxrlConfig, setup: RunSetup, parts: RunParts, signal: AbortSignal): Scorer {
  const { data, evaluator, activity } = setup;
  const { engine, trainer } = parts;
  const at = (): string => `${trainer.step}@${engine.version}`;
  let last: { at: string; scores: Metrics } | undefined;
  const score = (): Promise<Metrics> =>
    activity.track('validation', async () => {
      const started = performance.now();
      const version = trainer.step;
      const taken = at();
      const lines: GenerationLine[] = [];
      const keep = config.validation.generations ? setup.runDir : undefined;
      const scores = await validate(engine, data.validation, evaluator, {
        maxTokens: data.maxTokens,
        temperature: config.validation.temperature,
        seed: config.run.seed,
        signal,
        worker: setup.sampler ?? singleTurnWorker,
        ...(keep === undefined ? {} : { onSample: (output) => lines.push(generationLine(output, setup.tokenizer)) }),
      });
      if (keep !== undefined) await writeGenerations(keep, version, lines);
      last = { at: taken, scores: { ...scores, 'timing/val_s': (performance.now() - started) / 1000 } };
      return last.scores;
    });
  return Object.assign(score, { current: () => (last?.at === at() ? last.scores : undefined) });
}

/** A run's validation: scores the policy now; `current()` is the last scores if the policy has not moved since. */
interface Scorer {
  (): Promise<Metrics>;
  current(): Metrics | undefined;
}

/**
 * The loop: validates before, trains `run.steps` steps (the embedded pipeline, or the Kafka trainer), validates
 * every `validation.every` versions and after, and reports — under the stall watch, which ends it when a module
 * stalls past `activity.stallFailSeconds`.
 */
async function trainLoop(
  config: RxrlConfig,
  options: RunTrainingOptions,
  setup: RunSetup,
  parts: RunParts,
  reporter: ErrorReporter,
  memo: RunMemo,
  watch: RunWatch,
): Promise<RunSummary> {
  const { data } = setup;
  const { trainer, ledger } = parts;
  // The attempt ends when the reporter stops the run, when the trainer's service is lost (a Tinker-backed run), or
  // when a module stalls past activity.stallFailSeconds.
  const lostService = new AbortController();
  const signal = AbortSignal.any([reporter.signal, lostService.signal, watch.signal]);
  const lost: { error?: unknown } = {};
  const noticeLost = (error: unknown): boolean => {
    if (!parts.serviceLost?.(error)) return false;
    lost.error ??= error;
    lostService.abort(error);
    return true;
  };
  const baseWorker = setup.worker ?? singleTurnWorker;
  const score = scorer(config, setup, parts, signal);
  // A restarted attempt keeps the first attempt's validation before training.
  const before =
    memo.recoveries > 0 ? memo.before : config.validation.beforeTrain && data.validation.length > 0 ? await score() : undefined;
  // Validation lines carry the step they follow (−1 before the first).
  if (before && memo.recoveries === 0) ledger.writeMetrics(trainer.step - 1, trainer.step, before);
  memo.before = before;
  const started = performance.now();
  let last: StepResult | undefined;
  // Under stop_on_error a failed sample stops the run once its step's samples have all ended; a step whose every
  // sample failed fails the run.
  const outcomes = new StepOutcomes(tasksPerStep(config), config.rollout.groupSize);
  const failed: { step?: StepFailedError | undefined } = {};
  // Under stop_on_error a step of no rows fails the run, and so does a run whose every update was skipped.
  const skipped = SkippedSteps.of(reporter.policy);
  // `run.steps` counts from the start of the run: a resumed run trains what is left, and one already finished
  // trains nothing (0 remaining must not reach the pipeline, where it means "until the data ends").
  const remaining = config.run.steps === 0 ? undefined : Math.max(0, config.run.steps - trainer.step);
  if (remaining === 0) options.log?.(`run already finished: ${trainer.step} of ${config.run.steps} steps trained`);
  else {
    const steps$ = stepsOf(config, options, setup, parts, {
      remaining,
      score,
      worker: ledger.recording(baseWorker),
      reporter,
      signal,
      noticeLost,
      outcomes,
      failed,
      skipped,
    });
    try {
      await lastValueFrom(
        steps$.pipe(
          tap((step) => {
            last = step;
            options.onStep?.(step, (performance.now() - started) / 1000);
          }),
        ),
        { defaultValue: undefined },
      );
    } catch (error) {
      if (lost.error === undefined) noticeLost(error);
      throw lost.error ?? error;
    } finally {
      // Under stop_on_error, failures of steps that never completed (the data ended mid-step, the run was cancelled)
      // are reported all the same.
      if (reporter.policy === 'stop_on_error')
        for (const failure of outcomes.pending())
          reporter.report(failure.error, { module: 'rollout', taskId: failure.taskId, trajectoryId: failure.id });
    }
  }
  // A lost service ends the attempt with its error: nothing more can be saved there.
  if (lost.error !== undefined) throw lost.error;
  await throwIfStalled(config, parts, watch);
  // A step of nothing but failures is no result: the run fails, without a checkpoint of its end.
  if (failed.step !== undefined) throw failed.step;
  const nothingTrained = skipped.verdict();
  if (nothingTrained !== undefined) throw nothingTrained;
  // Every run ends with a checkpoint of its last step (a run shorter than checkpoint.every too), unless stopped
  // early with checkpoint.onStop off.
  await ledger.finish(trainer.step, !signal.aborted || config.checkpoint.onStop);
  const seconds = (performance.now() - started) / 1000;
  // A run whose last step was validated already (validation.every divides it) reports those scores again.
  const validated = score.current();
  const after = data.validation.length > 0 && !signal.aborted ? (validated ?? (await score())) : undefined;
  if (after && after !== validated) ledger.writeMetrics(trainer.step - 1, trainer.step, after);
  return summary(config, setup, { steps: trainer.step, seconds, before, after, last, reporter, resumedFrom: memo.resumedFrom });
}

/** Ends an attempt that stalled: what was trained is kept, unless the hang is in the trainer or the checkpoint itself. */
async function throwIfStalled(config: RxrlConfig, parts: RunParts, watch: RunWatch): Promise<void> {
  const stalled = watch.failure();
  if (stalled === undefined) return;
  if (config.checkpoint.onStop && !/^(trainer|checkpoint)\b/.test(String(stalled.context.module)))
    await parts.ledger.finish(parts.trainer.step, true);
  throw stalled;
}

/** The steps of the run: the embedded GRPO pipeline, or the Kafka trainer when the run has a transport. */
function stepsOf(
  config: RxrlConfig,
  options: RunTrainingOptions,
  setup: RunSetup,
  parts: RunParts,
  loop: {
    remaining: number | undefined;
    score: () => Promise<Metrics>;
    worker: RolloutWorker;
    reporter: ErrorReporter;
    signal: AbortSignal;
    /** Ends the attempt when a sample's error says the trainer's service is lost (then it is no sample's failure). */
    noticeLost: (error: unknown) => boolean;
    /** Each admission batch's sample outcomes. */
    outcomes: StepOutcomes;
    /** Set when a step whose every sample failed stopped the run. */
    failed: { step?: StepFailedError | undefined };
    /** Counts the steps that trained nothing (and refuses a step of no rows under stop_on_error). */
    skipped: SkippedSteps;
  },
): Observable<StepResult> {
  const { trainer, ledger, policy, reference } = parts;
  // What the embedded and the Kafka loops share: the data, the trainer, the staleness mode, the algorithm.
  const common = {
    ...loopSettings(config),
    tasks: ledger.tasks(),
    trainer: loop.skipped.counting(ledger.checkpointing(trainer)),
    maxTokens: setup.data.maxTokens,
    // Every path (a chat template's reference outputs, a custom worker, a served rollout) is bounded where batches are made.
    maxSeqLen: setup.contextLength,
    ...(loop.remaining === undefined ? {} : { steps: loop.remaining }),
    ...klInRewardOf(config, reference),
    ...(setup.teacher ? { distill: { teacher: setup.teacher.scorer, rewardCoef: config.distill.rewardCoef } } : {}),
    activity: setup.activity,
    onAdmit: (task: Task, index: number) => {
      ledger.admit(task);
      loop.outcomes.admitted(groupIdOf(task), index);
    },
    afterStep: async (step: StepResult) => {
      const every = config.validation.every;
      const val = every > 0 && step.version % every === 0 && setup.data.validation.length > 0 ? await loop.score() : undefined;
      // The step's line was written inside the step, before its checkpoint; its sync and wall time (and validation
      // scores, like those before and after training) get a line of their own.
      const timing = Object.entries(step.metrics).filter(([key]) => /^timing\/(sync|total|wait)_s$/.test(key));
      const after = { ...Object.fromEntries(timing), ...val };
      if (Object.keys(after).length > 0) ledger.writeMetrics(step.step, step.version, after);
      return val;
    },
    signal: loop.signal,
  };
  const transport = options.kafka;
  if (transport) {
    if (policy === undefined)
      throw new ConfigError('kafka: a run trained on a Tinker service samples through it, not through Kafka workers', {
        context: { key: 'trainer.backend' },
      });
    const checkpointed = config.run.dir !== null && config.checkpoint.every > 0;
    return kafkaTrainer({
      ...common,
      ...kafkaSettings(transport, setup.tokenizer, config.kafka),
      ...(parts.lora
        ? { policies: [{ trainer: common.trainer, policy, adapter: { lora: parts.lora.adapter.lora, base: parts.lora.base } }] }
        : { policy }),
      // Trajectory offsets are committed once a checkpoint holds their step (the trainer may be a step ahead by then).
      ...(checkpointed
        ? { checkpointed: (step: StepResult) => ledger.checkpointed(step.version), stepsPerCheckpoint: config.checkpoint.every }
        : {}),
    });
  }
  return grpoPipeline({
    ...common,
    engines: [parts.engine],
    evaluator: setup.evaluator,
    worker: loop.worker,
    ...(config.rollout.concurrency > 0 ? { concurrency: config.rollout.concurrency } : {}),
    ...(config.rollout.sampleTimeoutMs === null ? {} : { sampleTimeoutMs: config.rollout.sampleTimeoutMs }),
    onSample: (output) => {
      if (isSampleFailure(output) && loop.noticeLost(output.error)) return;
      const report = (failure: SampleFailure): unknown =>
        loop.reporter.report(failure.error, { module: 'rollout', taskId: failure.taskId, trajectoryId: failure.id });
      // Under continue each failure is reported as it comes; under stop_on_error once its step's samples have ended.
      if (isSampleFailure(output) && output.skipped !== true && loop.reporter.policy === 'continue') report(output);
      const verdict = loop.outcomes.ended(output);
      if (verdict === undefined || loop.reporter.policy === 'continue') return;
      loop.failed.step ??= verdict.failedStep;
      verdict.failures.forEach(report);
    },
  });
}

/** The run's summary line. */
function summary(
  config: RxrlConfig,
  setup: RunSetup,
  run: {
    steps: number;
    seconds: number;
    before: Metrics | undefined;
    after: Metrics | undefined;
    last: StepResult | undefined;
    reporter: ErrorReporter;
    resumedFrom: string | undefined;
  },
): RunSummary {
  const { data } = setup;
  const { before, after, reporter } = run;
  const runDir = setup.runDir;
  return {
    recipe: data.name,
    mode: config.sync.mode,
    backend: setup.backend,
    steps: run.steps,
    seconds: round(run.seconds, 1),
    seed: config.run.seed,
    ...(runDir ? { runDir } : {}),
    ...(run.resumedFrom ? { resumedFrom: run.resumedFrom } : {}),
    ...(setup.checkpoint?.narrowDtype ? { resumedPrecision: setup.checkpoint.narrowDtype } : {}),
    ...(data.randomPolicyReward === undefined ? {} : { randomPolicyReward: round(data.randomPolicyReward, 4) }),
    ...(before ? { valRewardInitial: round(before['val/reward_mean'] ?? 0, 4) } : {}),
    valRewardFinal: after ? round(after['val/reward_mean'] ?? 0, 4) : null,
    ...(before && before['val/accuracy_mean'] !== undefined ? { valAccuracyInitial: round(before['val/accuracy_mean'], 4) } : {}),
    ...(after && after['val/accuracy_mean'] !== undefined ? { valAccuracyFinal: round(after['val/accuracy_mean'], 4) } : {}),
    lastStep: run.last?.metrics ?? {},
    failedSamples: reporter.total,
    ...(reporter.stopped ? { stoppedBy: describeStop(reporter.stopCause) } : {}),
  };
}

/** Options of {@link runWorker}. */
export interface RunWorkerOptions {
  /** Directory that relative paths of the configuration are resolved against (the recipe's). Default cwd. */
  readonly baseDir?: string;
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
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
  const agents = config.agents.environment === 'none' ? undefined : await loadAgentsRecipe(config, baseDir, options.signal);
  const { evaluator, worker, tokenizer } = agents
    ? { evaluator: undefined, worker: undefined, tokenizer: agents.tokenizer }
    : await loadRollout(config, baseDir, undefined, options.signal);
  const started = performance.now();
  const counts = { tasks: 0, trajectories: 0, failures: 0, skipped: 0 };
  try {
    // The trainer's weights directory (as rxrl trainer picks it), unless the recipe names a root; a recipe without a
    // run directory (a library caller) confines nothing unless it says so.
    const { weightsRoot, weightsDir } = config.kafka;
    const root = weightsRoot ?? weightsDir ?? (config.run.dir === null ? undefined : join(config.run.dir, 'weights'));
    await lastValueFrom(
      kafkaRolloutWorker({
        kafka: options.kafka,
        topics: options.topics,
        ...(options.encoders ? { encoders: options.encoders } : {}),
        tokenizer,
        ...(evaluator ? { evaluator } : {}),
        ...(worker ? { worker } : {}),
        ...(agents ? { episodes: agents.episodes } : {}),
        concurrency: config.kafka.workerConcurrency,
        rolloutDelayMs: config.kafka.rolloutDelayMs,
        heartbeatMs: config.kafka.heartbeatMs,
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
  } finally {
    await closeWorker(worker);
  }
  return { ...counts, seconds: round((performance.now() - started) / 1000, 1) };
}

function describeStop(cause: unknown): string {
  return cause instanceof Error ? `${cause.name}: ${cause.message}` : String(cause ?? 'signal');
}

function round(x: number, digits: number): number {
  return Number(x.toFixed(digits));
}
