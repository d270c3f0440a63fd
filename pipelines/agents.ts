import { mkdir } from 'node:fs/promises';
import { join, resolve } from 'node:path';
import { EMPTY, lastValueFrom, tap } from 'rxjs';

import type { AgentSpec } from '../lib/agent/environment.js';
import { pruneCheckpoints, resumeCheckpoint } from '../lib/checkpoint/checkpoint.js';
import { loadPoliciesCheckpoint, savePoliciesCheckpoint, type PolicyCheckpoint } from '../lib/checkpoint/policiesCheckpoint.js';
import { withRunLock } from '../lib/checkpoint/runLock.js';
import { resolvedLora, type RxrlConfig, type Specialization } from '../lib/config/schema.js';
import { loadTasks } from '../lib/data/loader.js';
import { LocalEngine } from '../lib/engine/local.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import { ConfigError, asStorageError } from '../lib/errors.js';
import { initBackend } from '../lib/model/backend.js';
import { LoraAdapter, validateLoraConfig } from '../lib/model/lora.js';
import { saveModelDir, specialIdsOf } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { MetricsWriter, metricsPath } from '../lib/observe/metricsFile.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { Metrics, ModelTag } from '../lib/types.js';
import type { PolicyStepResult } from './grpoPipeline.js';
import { kafkaTrainer } from './kafkaTrainer.js';
import { multiAgentPipeline } from './multiAgentPipeline.js';
import { loadAgentsRecipe } from './parts/agentsRecipe.js';
import { initialModel, type BuiltPolicy } from './parts/policy.js';
import { damagedCheckpointWarning, dropStepsFrom, resumeOf, runDirWarnings, savePolicies } from './parts/runDir.js';
import { grpoTrainerOptions, kafkaSettings, klInRewardOf, loopSettings } from './parts/settings.js';
import type { RunTrainingOptions } from './run.js';
import { validateAgents } from './validate.js';

export type { AgentsRecipe, AgentsTask } from './parts/agentsRecipe.js';
export { loadAgentsRecipe } from './parts/agentsRecipe.js';

/**
 * Options of {@link runAgents}: those of `runTraining` that apply (base directory, cancellation, progress lines, a
 * Kafka transport: then `rxrl worker` processes of the same recipe play the episodes and the in-process engines
 * only validate), with every policy's steps.
 */
export interface AgentsRunOptions extends Pick<RunTrainingOptions, 'baseDir' | 'signal' | 'log' | 'kafka'> {
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
  // One writer per run directory: held from before the first write to after the last.
  return withRunLock(runDir, () => trainAgents(config, options, baseDir, runDir), { warn: runDirWarnings(options) });
}

async function trainAgents(config: RxrlConfig, options: AgentsRunOptions, baseDir: string, runDir: string | undefined): Promise<AgentsRunSummary> {
  const log = (line: string): void => options.log?.(line);
  const seed = config.run.seed;
  const { task, tokenizer, agents, episodes, maxTokens, modelDir } = await loadAgentsRecipe(config, baseDir);
  const backend = await initBackend(config.run.backend, { logger: { info: (_obj, msg) => log(msg) } });
  const base = (await initialModel(config.model, modelDir, tokenizer.vocabSize, seed)).model;
  const { batchSize, mode } = config.sync;
  const groupSize = config.rollout.groupSize;
  const inFlightBatches = mode === 'batch-async' ? config.sync.stalenessThreshold + 1 : mode === 'fully-async' ? 4 : 1;

  // Everything built from here on is released in `finally`, whatever fails.
  const usesLora = config.policies.some((p) => p.specialization === 'lora');
  let sampleBase: PolicyModel | undefined;
  const built: BuiltPolicy[] = [];
  let metricsFile: MetricsWriter | undefined;
  try {
    // Every lora policy adapts one frozen base; sampling reads a second copy (the engines run beside training).
    const baseWeights = base.getWeights();
    sampleBase = usesLora ? PolicyModel.fromWeights(base.config, baseWeights) : undefined;
    for (const [i, entry] of config.policies.entries()) {
      let train: PolicyModel;
      let sample: PolicyModel;
      // The training adapter and its copy the engine samples from (views do not free their adapters).
      const adapters: LoraAdapter[] = [];
      if (entry.specialization === 'lora') {
        const lora = validateLoraConfig(resolvedLora(entry), `policies[${i}].lora`);
        const adapter = LoraAdapter.create(base.config, lora, seed + 1 + i);
        adapters.push(adapter, LoraAdapter.fromWeights(base.config, lora, adapter.getWeights()));
        train = PolicyModel.withAdapter(base, adapters[0]);
        sample = PolicyModel.withAdapter(sampleBase as PolicyModel, adapters[1]);
      } else {
        train = PolicyModel.fromWeights(base.config, baseWeights);
        sample = PolicyModel.fromWeights(base.config, baseWeights);
      }
      const adapter: LoraAdapter | undefined = adapters[0];
      const engine = new LocalEngine(sample, {
        tokenizer,
        modelTag: entry.name,
        maxBatchSize: batchSize * groupSize * inFlightBatches * agents.filter((a) => a.policy === entry.name).length,
        weightSync: config.rollout.weightSync,
      });
      // The reference of the KL terms is the initial policy, which is the base for every policy: frozen under the
      // adapters, copied by the full models.
      const trainer = new GrpoTrainer(train, { ...grpoTrainerOptions(config), modelTag: entry.name, seed: seed + i, ...(config.trainer.klLoss.coef > 0 ? { reference: base } : {}) });
      let syncBytes = 0;
      for (const w of train.getWeights().values()) syncBytes += w.data.byteLength;
      const trainableParameters = train.trainableVariables().reduce((n, v) => n + v.size, 0);
      built.push({ entry, train, sample, adapter, adapters, engine, trainer, syncBytes, trainableParameters });
    }
    const engines = new Map<ModelTag, RolloutEngine>(built.map((b) => [b.entry.name, b.engine]));
    const score = (): Promise<Metrics> =>
      validateAgents(engines, task.validation, {
        environment: task.environment,
        agents,
        maxTokens,
        temperature: config.validation.temperature,
        seed,
      });

    const files = { tokenizerFiles: tokenizer.files(), special: specialIdsOf(tokenizer) };
    // PEFT directories (checkpoints, final weights) name the base they adapt: written once per run directory.
    const loraBase = runDir && usesLora ? join(runDir, 'base') : undefined;
    const resumed = await resumeCheckpoint(resumeOf(config, baseDir), runDir, loadPoliciesCheckpoint, damagedCheckpointWarning(runDirWarnings(options)));
    const startStep = resumed?.state.step ?? 0;
    if (resumed) {
      for (const b of built) {
        const saved = resumed.policies.get(b.entry.name);
        if (saved === undefined) {
          throw new ConfigError(`resume: checkpoint ${resumed.path} has no policy '${b.entry.name}' (it has ${[...resumed.policies.keys()].join(', ')})`, {
            context: { key: 'policies', path: resumed.path },
          });
        }
        b.train.setWeights(saved.weights);
        await b.engine.loadWeights(startStep, saved.weights);
        await b.trainer.restore({ step: startStep, optimizer: saved.optimizer });
      }
      log(`resuming from ${resumed.path} (step ${startStep})`);
    }
    if (runDir) {
      await mkdir(runDir, { recursive: true });
      // Each step appears once: lines of steps at or past the checkpoint (all of them on a fresh start) go.
      await dropStepsFrom(metricsPath(runDir), resumed ? startStep : -Infinity);
      if (loraBase) {
        await saveModelDir(loraBase, base, files).catch((error: unknown) => {
          throw asStorageError(error, loraBase);
        });
      }
    }
    const every = runDir ? config.checkpoint.every : 0;
    if (every > 0 && mode !== 'sync') log(`checkpoint.every: a ${mode} multi-agent run checkpoints at its end only (mid-run checkpoints need sync mode)`);
    const loader = loadTasks(task.train, {
      epochs: config.data.epochs === 0 ? Infinity : config.data.epochs,
      shuffle: config.data.shuffle,
      seed,
      ...(resumed ? { start: resumed.state.loader } : {}),
    });
    let lastSaved = startStep;
    const checkpoint = async (step: number): Promise<void> => {
      if (!runDir || step <= lastSaved) return;
      // Claimed before the first await: two policies' hooks may both find every policy at this step.
      lastSaved = step;
      const policies: PolicyCheckpoint[] = [];
      for (const b of built) {
        const optimizer = await b.trainer.optimizerState();
        policies.push({ name: b.entry.name, weights: b.train.getWeights(), optimizer, ...(b.adapter ? { lora: b.adapter.lora } : { config: b.train.config }) });
      }
      const path = await savePoliciesCheckpoint(runDir, { step, seed, loader: loader.position, policies, ...(loraBase ? { baseDir: loraBase } : {}), ...files });
      await pruneCheckpoints(runDir, config.checkpoint.keepLast);
      log(`checkpoint ${path}`);
    };
    // A checkpoint needs every policy at one step. In sync mode, once every trainer has taken step n nothing more is
    // admitted until the last gate is credited (after its hook): the policies and the loader position are one state.
    const checkpointIfLevel = async (atEnd: boolean): Promise<void> => {
      const [step] = built.map((b) => b.trainer.step);
      if (every === 0 || built.some((b) => b.trainer.step !== step)) return;
      if (atEnd || (mode === 'sync' && step % every === 0)) await checkpoint(step);
    };
    const afterStep = (): Promise<void> => checkpointIfLevel(false);
    const remaining = config.run.steps === 0 ? 0 : config.run.steps - startStep;
    const finished = config.run.steps > 0 && remaining <= 0;
    if (finished) log(`run already finished: ${startStep} of ${config.run.steps} steps trained`);

    metricsFile = runDir ? MetricsWriter.open(runDir) : undefined;
    const valInitial = config.validation.beforeTrain ? await score() : null;
    if (valInitial) log(`held-out before training: ${agentRewards(valInitial, agents)}`);
    const started = performance.now();
    const common = {
      ...loopSettings(config),
      tasks: loader,
      maxTokens,
      steps: remaining,
      ...klInRewardOf(config, base),
      afterStep,
      ...(options.signal ? { signal: options.signal } : {}),
    };
    const transport = options.kafka;
    const steps$ = transport
      ? kafkaTrainer({
          ...common,
          ...kafkaSettings(transport, tokenizer, config.kafka),
          // A LoRA policy ships its adapter alone; its base is written once for the workers.
          policies: built.map((b) => ({ trainer: b.trainer, policy: b.train, ...(b.adapter ? { adapter: { lora: b.adapter.lora, base } } : {}) })),
          episodes,
        })
      : multiAgentPipeline({
          ...common,
          environment: task.environment,
          agents,
          granularity: config.agents.granularity,
          policies: built.map((b) => ({ trainer: b.trainer, engines: [b.engine] })),
          ...(config.rollout.concurrency > 0 ? { concurrency: config.rollout.concurrency } : {}),
          ...(config.rollout.sampleTimeoutMs === null ? {} : { episodeTimeoutMs: config.rollout.sampleTimeoutMs }),
        });
    await lastValueFrom(
      (finished ? EMPTY : steps$).pipe(
        tap((step) => {
          metricsFile?.write({ step: step.step, version: step.version, metrics: step.metrics });
          options.onStep?.(step, (performance.now() - started) / 1000);
        }),
      ),
      { defaultValue: undefined },
    );
    // Over Kafka the in-process engines were not synced: give them the trained weights to validate.
    if (transport) for (const b of built) await b.engine.loadWeights(b.trainer.step, b.train.getWeights());
    const seconds = (performance.now() - started) / 1000;
    const valFinal = await score();
    log(`held-out after training: ${agentRewards(valFinal, agents)}`);
    // Every run ends with a checkpoint of its last step (when its policies stand at one step) and its final weights.
    await checkpointIfLevel(true);
    const saved = runDir ? await savePolicies(runDir, built, files, loraBase) : new Map<string, string>();
    return {
      recipe: task.name,
      mode,
      backend,
      seconds,
      policies: built.map((b) => ({
        name: b.entry.name,
        specialization: b.entry.specialization,
        agents: agents.filter((a) => a.policy === b.entry.name).map((a) => a.name),
        trainableParameters: b.trainableParameters,
        syncBytes: b.syncBytes,
        steps: b.trainer.step,
        savedTo: saved.get(b.entry.name) ?? null,
      })),
      valInitial,
      valFinal,
    };
  } finally {
    metricsFile?.close();
    for (const b of built) {
      b.trainer.dispose();
      b.train.dispose();
      b.sample.dispose();
      for (const adapter of b.adapters) adapter.dispose();
    }
    sampleBase?.dispose();
    base.dispose();
  }
}



function agentRewards(metrics: Metrics, agents: readonly AgentSpec[]): string {
  return agents.map((a) => `${a.name} ${(metrics[`val/${a.name}/reward_mean`] ?? 0).toFixed(3)}`).join(', ');
}
