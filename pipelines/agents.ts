import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { EMPTY, lastValueFrom, tap, type Observable } from 'rxjs';

import type { AgentSpec } from '../lib/agent/environment.js';
import { pruneCheckpoints, resumeCheckpoint } from '../lib/checkpoint/checkpoint.js';
import {
  loadPoliciesCheckpoint,
  savePoliciesCheckpoint,
  type PoliciesCheckpoint,
  type PolicyCheckpoint,
} from '../lib/checkpoint/policiesCheckpoint.js';
import { activityTracker, watchRun } from './parts/stalls.js';
import { openTrackers, type MetricsSink } from './parts/trackers.js';
import { withRunLock } from '../lib/checkpoint/runLock.js';
import type { RxrlConfig, Specialization } from '../lib/config/schema.js';
import { loadTasks, type LoaderPosition } from '../lib/data/loader.js';
import { LocalEngine } from '../lib/engine/local.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import { ConfigError, asStorageError } from '../lib/core/errors.js';
import { initBackend } from '../lib/model/backend.js';
import { saveModelDir, specialIdsOf, type SaveModelDirOptions } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { MetricsWriter, metricsPath } from '../lib/observe/metricsFile.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { Metrics, ModelTag, Task } from '../lib/core/types.js';
import type { PolicyStepResult } from './grpoPipeline.js';
import { kafkaTrainer } from './kafkaTrainer.js';
import { multiAgentPipeline } from './multiAgentPipeline.js';
import { loadAgentsRecipe, type AgentsRecipe } from './parts/agentsRecipe.js';
import { loggingTrainer } from './parts/ledger.js';
import { SkippedSteps } from './parts/skippedSteps.js';
import { initialModel, policyModels, readStartingAdapter } from '../lib/model/policies.js';
import type { NamedWeights } from '../lib/model/types.js';
import type { BuiltPolicy } from './parts/policy.js';
import { damagedCheckpointWarning, dropStepsFrom, resumeOf, runDirWarnings, savePolicies } from './parts/runDir.js';
import { grpoTrainerOptions, kafkaSettings, klInRewardOf, loopSettings, samplesInFlight } from './parts/settings.js';
import type { RunTrainingOptions } from './run.js';
import { validateAgents } from './validate.js';

export type { AgentsRecipe, AgentsTask } from './parts/agentsRecipe.js';
export { loadAgentsRecipe } from './parts/agentsRecipe.js';

/**
 * Options of {@link runAgents}: those of `runTraining` that apply (base directory, cancellation, progress lines, a
 * Kafka transport: then `rxrl worker` processes of the same recipe play the episodes and the in-process engines
 * only validate), with every policy's steps.
 */
export interface AgentsRunOptions extends Pick<RunTrainingOptions, 'baseDir' | 'signal' | 'log' | 'kafka' | 'activity'> {
  /** Sees every policy's steps. */
  readonly onStep?: (step: PolicyStepResult, elapsedSeconds: number) => void;
}

/** One policy of a multi-agent run, as {@link runAgents} reports it. */
export interface PolicyRunSummary {
  readonly name: ModelTag;
  readonly specialization: Specialization;
  /** Agents that sample from it. */
  readonly agents: readonly string[];
  /** Parameters that receive gradients (adapter only for `lora`). */
  readonly trainableParameters: number;
  /** Bytes each weight sync ships to its engines (adapter only for `lora`). */
  readonly syncBytes: number;
  /** Train steps taken. */
  readonly steps: number;
  /** Where its final weights were saved (a model directory, or a PEFT adapter directory); null without `run.dir`. */
  readonly savedTo: string | null;
}

/** What {@link runAgents} reports. */
export interface AgentsRunSummary {
  readonly recipe: string;
  readonly mode: RxrlConfig['sync']['mode'];
  readonly backend: string;
  readonly seconds: number;
  readonly policies: readonly PolicyRunSummary[];
  /** Held-out metrics before training (`val/<agent>/reward_mean`, …); null when `validation.beforeTrain` is off. */
  readonly valInitial: Metrics | null;
  /** Held-out metrics after training. */
  readonly valFinal: Metrics;
}

/**
 * A multi-agent recipe run (`agents.environment` set): builds one policy per `policies` entry from one base model (the
 * seeded tiny model, or `model.path`) — `prompt` and `full` as full copies, `lora` as adapters sharing one frozen
 * base in memory (one more base for sampling) — trains them with {@link multiAgentPipeline} for `run.steps` steps
 * each, and scores every agent on the held-out split before and after. With `run.dir`, each policy's final weights
 * are saved under `policies/<name>/` (a Hugging Face model directory, or a PEFT adapter whose base is saved once
 * under `base/`), and every step's metrics go to `metrics.jsonl`.
 *
 * @param config - a validated configuration whose `agents.environment` is not `none`.
 * @param options - base directory, cancellation and progress hooks.
 * @returns the summary: per-policy sizes and held-out reward per agent.
 */
export async function runAgents(config: RxrlConfig, options: AgentsRunOptions = {}): Promise<AgentsRunSummary> {
  const baseDir = options.baseDir ?? process.cwd();
  const runDir = config.run.dir === null ? undefined : resolve(baseDir, config.run.dir);
  // Every policy's modules report to one tracker; a module stalled activity.stallFailSeconds (stop_on_error) ends the run.
  const activity = options.activity ?? activityTracker(config);
  const watch = watchRun(config, activity, { log: options.log });
  const signal = options.signal ? AbortSignal.any([options.signal, watch.signal]) : watch.signal;
  try {
    // One writer per run directory: held from before the first write to after the last.
    const summary = await withRunLock(runDir, () => trainAgents(config, { ...options, activity, signal }, baseDir, runDir), {
      warn: runDirWarnings(options),
    });
    const stalled = watch.failure();
    if (stalled) throw stalled;
    return summary;
  } finally {
    watch.stop();
  }
}

async function trainAgents(
  config: RxrlConfig,
  options: AgentsRunOptions,
  baseDir: string,
  runDir: string | undefined,
): Promise<AgentsRunSummary> {
  const log = (line: string): void => options.log?.(line);
  const recipe = await loadAgentsRecipe(config, baseDir, options.signal);
  const backend = await initBackend(config.run.backend, { logger: { info: (_obj, msg) => log(msg) } });
  const { model: base, contextLength } = await initialModel(config.model, recipe.modelDir, recipe.tokenizer.vocabSize, config.run.seed);
  // Everything built from here on is released in `finally`, whatever fails.
  const built: BuiltPolicy[] = [];
  const owned: { dispose(): unknown }[] = [base];
  let metricsFile: MetricsWriter | undefined;
  let trackers: MetricsSink[] = [];
  let failed = true;
  try {
    const resumed = await buildResumed(config, { recipe, base, built, owned }, options, { baseDir, runDir });
    const files = { tokenizerFiles: recipe.tokenizer.files(), special: specialIdsOf(recipe.tokenizer) };
    // PEFT directories (checkpoints, final weights) name the base they adapt: written once per run directory.
    const loraBase = runDir && built.some((b) => b.adapter) ? join(runDir, 'base') : undefined;
    const startStep = resumed?.state.step ?? 0;
    // A LoRA base read from a model directory links that directory's weight files rather than writing them again.
    if (runDir) await prepareRunDir(runDir, resumed ? startStep : -Infinity, loraBase, base, { ...files, sameWeightsAs: recipe.modelDir });
    const loader = loadTasks(recipe.task.train, {
      epochs: config.data.epochs === 0 ? Infinity : config.data.epochs,
      shuffle: config.data.shuffle,
      seed: config.run.seed,
      ...(resumed ? { start: resumed.state.loader } : {}),
    });
    const checkpointIfLevel = levelCheckpoints(config, runDir, built, startStep, (step) =>
      saveLevelCheckpoint(config, runDir as string, built, { step, loader: loader.position, loraBase, files, log }),
    );
    if (runDir && config.checkpoint.every > 0 && config.sync.mode !== 'sync') {
      log(`checkpoint.every: a ${config.sync.mode} multi-agent run checkpoints at its end only (mid-run checkpoints need sync mode)`);
    }
    const remaining = config.run.steps === 0 ? 0 : config.run.steps - startStep;
    const finished = config.run.steps > 0 && remaining <= 0;
    if (finished) log(`run already finished: ${startStep} of ${config.run.steps} steps trained`);

    metricsFile = runDir ? MetricsWriter.open(runDir) : undefined;
    trackers = await openTrackers(config, runDir, {
      resumeVersion: resumed ? startStep + 1 : undefined,
      warn: log,
      signal: options.signal,
    });
    const engines = new Map<ModelTag, RolloutEngine>(built.map((b) => [b.entry.name, b.engine]));
    const validation = (): Promise<Metrics> =>
      validateAgents(engines, recipe.task.validation, {
        environment: recipe.task.environment,
        agents: recipe.agents,
        maxTokens: recipe.maxTokens,
        temperature: config.validation.temperature,
        seed: config.run.seed,
      });
    const score = (): Promise<Metrics> => options.activity?.track('validation', validation) ?? validation();
    const valInitial = config.validation.beforeTrain ? await score() : null;
    if (valInitial) log(`held-out before training: ${agentRewards(valInitial, recipe.agents)}`);
    const started = performance.now();
    // Under stop_on_error a step of no rows fails the run, and so does a policy whose every update was skipped.
    const skipped = SkippedSteps.of(config.run.errorPolicy);
    const steps$ = finished
      ? EMPTY
      : agentSteps(config, options, recipe, {
          ...{ built, base, contextLength, loader, remaining, runDir, skipped },
          afterStep: () => checkpointIfLevel(false),
        });
    const writer = metricsFile;
    await lastValueFrom(
      steps$.pipe(
        tap((step) => {
          const entry = { step: step.step, version: step.version, metrics: step.metrics };
          writer?.write(entry);
          for (const tracker of trackers) tracker.write(entry);
          options.onStep?.(step, (performance.now() - started) / 1000);
        }),
      ),
      { defaultValue: undefined },
    );
    // A policy that trained nothing is no result: the run fails, without validating or saving its end.
    const nothingTrained = skipped.verdict();
    if (nothingTrained !== undefined) throw nothingTrained;
    // Over Kafka the in-process engines were not synced: give them the trained weights to validate.
    if (options.kafka) for (const b of built) await b.engine.loadWeights(b.trainer.step, b.train.getWeights(), options.signal);
    const seconds = (performance.now() - started) / 1000;
    const valFinal = await score();
    log(`held-out after training: ${agentRewards(valFinal, recipe.agents)}`);
    // Every run ends with a checkpoint of its last step (when its policies stand at one step) and its final weights.
    await checkpointIfLevel(true);
    const saved = runDir ? await savePolicies(runDir, built, files, loraBase) : new Map<string, string>();
    failed = false;
    return agentsSummary(config, recipe, { backend, seconds, built, saved, valInitial, valFinal });
  } finally {
    metricsFile?.close();
    for (const tracker of trackers) await tracker.close(failed);
    releasePolicies(built, owned);
  }
}

/** Releases every policy built (trainer, models, adapters), then what else the run owns, in reverse order. */
function releasePolicies(built: readonly BuiltPolicy[], owned: { dispose(): unknown }[]): void {
  for (const b of built) {
    b.trainer.dispose();
    b.train.dispose();
    b.sample.dispose();
    for (const adapter of b.adapters) adapter.dispose();
  }
  for (const item of owned.reverse()) item.dispose();
}

/**
 * Builds every policy of `policies` on `base`: `prompt` and `full` as full copies, `lora` as adapters sharing the
 * frozen base (sampled through a second copy of it), each with its engine and trainer. What is built goes to
 * `built` (and `owned`) as it is, so a failure part-way leaves nothing behind.
 */
function buildPolicies(
  config: RxrlConfig,
  recipe: AgentsRecipe,
  base: PolicyModel,
  into: {
    readonly built: BuiltPolicy[];
    readonly owned: { dispose(): unknown }[];
    /** Per policy, the weights its adapter starts from (`adapterPath`), if any. */
    readonly starting: readonly (NamedWeights | undefined)[];
  },
): void {
  const { built, owned } = into;
  const sampleBase = config.policies.some((p) => p.specialization === 'lora')
    ? PolicyModel.fromWeights(base.config, base.getWeights())
    : undefined;
  if (sampleBase) owned.push(sampleBase);
  for (const [i, entry] of config.policies.entries()) {
    const models = policyModels(entry, i, base, sampleBase, config.run.seed, { adapterWeights: into.starting[i] });
    const engine = new LocalEngine(models.sample, {
      tokenizer: recipe.tokenizer,
      modelTag: entry.name,
      maxBatchSize: samplesInFlight(config) * recipe.agents.filter((a) => a.policy === entry.name).length,
      weightSync: config.rollout.weightSync,
    });
    // The reference of the KL terms is the initial policy, which is the base for every policy: frozen under the
    // adapters, copied by the full models.
    const trainer = new GrpoTrainer(models.train, {
      ...grpoTrainerOptions(config),
      modelTag: entry.name,
      seed: config.run.seed + i,
      ...(config.trainer.klLoss.coef > 0 ? { reference: base } : {}),
    });
    let syncBytes = 0;
    for (const w of models.train.getWeights().values()) syncBytes += w.data.byteLength;
    const trainableParameters = models.train.trainableVariables().reduce((n, v) => n + v.size, 0);
    built.push({ entry, ...models, engine, trainer, syncBytes, trainableParameters });
  }
}

/**
 * Builds the policies (into `parts.built`) as the run's checkpoint left them, or, for a new run, from their starting
 * adapters (`adapterPath`) or fresh ones; returns the checkpoint resumed, if any.
 */
async function buildResumed(
  config: RxrlConfig,
  parts: { recipe: AgentsRecipe; base: PolicyModel; built: BuiltPolicy[]; owned: { dispose(): unknown }[] },
  options: AgentsRunOptions,
  dirs: { baseDir: string; runDir: string | undefined },
): Promise<PoliciesCheckpoint | undefined> {
  const { recipe, base, built, owned } = parts;
  const resumed = await resumeCheckpoint(
    resumeOf(config, dirs.baseDir),
    dirs.runDir,
    loadPoliciesCheckpoint,
    damagedCheckpointWarning(runDirWarnings(options)),
  );
  // A resumed run starts from its checkpoint: the starting adapters are read for a new run only.
  const starting = await Promise.all(
    config.policies.map((p, i) =>
      resumed ? undefined : readStartingAdapter(p, base.config, { key: `policies[${i}].adapterPath`, baseDir: dirs.baseDir }),
    ),
  );
  buildPolicies(config, recipe, base, { built, owned, starting });
  if (resumed) await restorePolicies(resumed, built, options);
  return resumed;
}

/** Puts every policy (weights, engine, optimizer) back as the checkpoint `resumed` holds it. */
async function restorePolicies(resumed: PoliciesCheckpoint, built: readonly BuiltPolicy[], options: AgentsRunOptions): Promise<void> {
  const step = resumed.state.step;
  for (const b of built) {
    const saved = resumed.policies.get(b.entry.name);
    if (saved === undefined) {
      throw new ConfigError(
        `resume: checkpoint ${resumed.path} has no policy '${b.entry.name}' (it has ${[...resumed.policies.keys()].join(', ')})`,
        {
          context: { key: 'policies', path: resumed.path },
        },
      );
    }
    b.train.setWeights(saved.weights);
    await b.engine.loadWeights(step, saved.weights, options.signal);
    await b.trainer.restore({ step, optimizer: saved.optimizer });
  }
  options.log?.(`resuming from ${resumed.path} (step ${step})`);
}

/** The run directory before the first step: each step appears once, and a LoRA run's base is written. */
async function prepareRunDir(
  runDir: string,
  fromStep: number,
  loraBase: string | undefined,
  base: PolicyModel,
  files: Pick<SaveModelDirOptions, 'tokenizerFiles' | 'special' | 'sameWeightsAs'>,
): Promise<void> {
  await mkdir(runDir, { recursive: true });
  // Lines of steps at or past the checkpoint (all of them on a fresh start) go.
  await dropStepsFrom(metricsPath(runDir), fromStep);
  await dropStepsFrom(join(runDir, 'trained.jsonl'), fromStep);
  if (loraBase) {
    await saveModelDir(loraBase, base, files).catch((error: unknown) => {
      throw asStorageError(error, loraBase);
    });
  }
}

/**
 * When a multi-policy run checkpoints: every policy must stand at one step. In sync mode, once every trainer has
 * taken step n nothing more is admitted until the last gate is credited (after its hook), so the policies and the
 * loader position are one state; other modes checkpoint at the end only.
 *
 * @returns `checkpointIfLevel(atEnd)`, which saves when the rule allows (once per step).
 */
function levelCheckpoints(
  config: RxrlConfig,
  runDir: string | undefined,
  built: readonly BuiltPolicy[],
  startStep: number,
  save: (step: number) => Promise<void>,
): (atEnd: boolean) => Promise<void> {
  const every = runDir ? config.checkpoint.every : 0;
  const mode = config.sync.mode;
  let lastSaved = startStep;
  return async (atEnd) => {
    const [step] = built.map((b) => b.trainer.step);
    if (every === 0 || built.some((b) => b.trainer.step !== step)) return;
    if (!(atEnd || (mode === 'sync' && step % every === 0)) || step <= lastSaved) return;
    // Claimed before the first await: two policies' hooks may both find every policy at this step.
    lastSaved = step;
    await save(step);
  };
}

/** Writes the multi-policy checkpoint of `step` and prunes old ones. */
async function saveLevelCheckpoint(
  config: RxrlConfig,
  runDir: string,
  built: readonly BuiltPolicy[],
  at: {
    step: number;
    loader: LoaderPosition;
    loraBase: string | undefined;
    files: Pick<SaveModelDirOptions, 'tokenizerFiles' | 'special'>;
    log: (line: string) => void;
  },
): Promise<void> {
  const policies: PolicyCheckpoint[] = [];
  for (const b of built) {
    const optimizer = await b.trainer.optimizerState();
    policies.push({
      name: b.entry.name,
      weights: b.train.getWeights(),
      optimizer,
      ...(b.adapter ? { lora: b.adapter.lora } : { config: b.train.config }),
    });
  }
  const path = await savePoliciesCheckpoint(runDir, {
    step: at.step,
    seed: config.run.seed,
    loader: at.loader,
    policies,
    ...(at.loraBase ? { baseDir: at.loraBase } : {}),
    ...at.files,
  });
  await pruneCheckpoints(runDir, config.checkpoint.keepLast);
  at.log(`checkpoint ${path}`);
}

/** The steps of every policy: the multi-agent pipeline, or the Kafka trainer when the run has a transport. */
function agentSteps(
  config: RxrlConfig,
  options: AgentsRunOptions,
  recipe: AgentsRecipe,
  run: {
    built: readonly BuiltPolicy[];
    base: PolicyModel;
    /** The policies' context length: no trained row may be longer. */
    contextLength: number;
    loader: AsyncIterable<Task>;
    remaining: number;
    runDir: string | undefined;
    /** Counts each policy's steps that trained nothing (and refuses a step of no rows under stop_on_error). */
    skipped: SkippedSteps;
    afterStep: () => Promise<void>;
  },
): Observable<PolicyStepResult> {
  const { built, base, runDir } = run;
  // Each trained step of each policy gets its trained.jsonl line; a step of no rows is refused before it is logged.
  const trainers = built.map((b) => run.skipped.counting(runDir ? loggingTrainer(b.trainer, runDir, b.entry.name) : b.trainer));
  const common = {
    ...loopSettings(config),
    tasks: run.loader,
    maxTokens: recipe.maxTokens,
    maxSeqLen: run.contextLength,
    steps: run.remaining,
    ...klInRewardOf(config, base),
    afterStep: run.afterStep,
    activity: options.activity,
    ...(options.signal ? { signal: options.signal } : {}),
  };
  const transport = options.kafka;
  if (transport) {
    return kafkaTrainer({
      ...common,
      ...kafkaSettings(transport, recipe.tokenizer, config.kafka),
      // A LoRA policy ships its adapter alone; its base is written once for the workers.
      policies: built.map((b, i) => ({
        trainer: trainers[i],
        policy: b.train,
        ...(b.adapter ? { adapter: { lora: b.adapter.lora, base } } : {}),
      })),
      episodes: recipe.episodes,
    });
  }
  return multiAgentPipeline({
    ...common,
    environment: recipe.task.environment,
    agents: recipe.agents,
    granularity: config.agents.granularity,
    policies: built.map((b, i) => ({ trainer: trainers[i], engines: [b.engine] })),
    ...(config.rollout.concurrency > 0 ? { concurrency: config.rollout.concurrency } : {}),
    ...(config.rollout.sampleTimeoutMs === null ? {} : { episodeTimeoutMs: config.rollout.sampleTimeoutMs }),
  });
}

/** The run's summary: per-policy sizes and held-out reward per agent. */
function agentsSummary(
  config: RxrlConfig,
  recipe: AgentsRecipe,
  run: {
    backend: string;
    seconds: number;
    built: readonly BuiltPolicy[];
    saved: ReadonlyMap<string, string>;
    valInitial: Metrics | null;
    valFinal: Metrics;
  },
): AgentsRunSummary {
  return {
    recipe: recipe.task.name,
    mode: config.sync.mode,
    backend: run.backend,
    seconds: run.seconds,
    policies: run.built.map((b) => ({
      name: b.entry.name,
      specialization: b.entry.specialization,
      agents: recipe.agents.filter((a) => a.policy === b.entry.name).map((a) => a.name),
      trainableParameters: b.trainableParameters,
      syncBytes: b.syncBytes,
      steps: b.trainer.step,
      savedTo: run.saved.get(b.entry.name) ?? null,
    })),
    valInitial: run.valInitial,
    valFinal: run.valFinal,
  };
}

function agentRewards(metrics: Metrics, agents: readonly AgentSpec[]): string {
  return agents.map((a) => `${a.name} ${(metrics[`val/${a.name}/reward_mean`] ?? 0).toFixed(3)}`).join(', ');
}
