/**
 * The contracts of a training run, apart from the orchestrator that runs it (`pipelines/run.ts`): what a caller
 * passes and gets back, what a run reads before it builds anything, and the parts it trains with. The parts of a
 * run (`tinker.ts`, `agentsRecipe.ts`, ...) build against these, so they need nothing from the orchestrator.
 *
 * @packageDocumentation
 */
import type { ActivityTracker } from '../../lib/observe/activity.js';
import type { AgentSpec, MultiAgentEnvironment, TrajectoryGranularity } from '../../lib/agent/environment.js';
import type { Checkpoint } from '../../lib/checkpoint/checkpoint.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { NamedWeights, Tokenizer } from '../../lib/model/types.js';
import type { Evaluator } from '../../lib/core/evaluator.js';
import type { BackendName } from '../../lib/model/backend.js';
import type { LoraAdapter } from '../../lib/model/lora.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import type { Logger } from '../../lib/observe/logger.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Metrics, PolicyVersion } from '../../lib/core/types.js';
import type { RolloutWorker } from '../../lib/engine/worker.js';
import type { ResolvedLoraConfig } from '../../lib/model/lora.js';
import type { RunTeacher } from './teacher.js';
import type { Data } from './data.js';
import type { RunLedger } from './ledger.js';
import type { KafkaTransport } from './settings.js';

/** The multi-agent side of a Kafka run: the environment, its agents and the trajectory granularity. */
export interface KafkaEpisodes {
  readonly environment: MultiAgentEnvironment;
  readonly agents: readonly AgentSpec[];
  /** Default `turn`. */
  readonly granularity?: TrajectoryGranularity;
}

/** Options of {@link runTraining}. */
export interface RunTrainingOptions {
  /** Directory that relative paths of the configuration are resolved against (the recipe's). Default cwd. */
  readonly baseDir?: string;
  /** Cancels the run gracefully: the stream completes and, with `checkpoint.onStop`, a checkpoint is saved. */
  readonly signal?: AbortSignal | undefined;
  /** Called after every step (progress display). */
  readonly onStep?: ((step: StepResult, elapsedSeconds: number) => void) | undefined;
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
  /**
   * The run's activity tracker (serve it with `serveStatus` to watch the run): every module reports its work to it,
   * and a module stalled `activity.stallFailSeconds` fails the run. Default: one of the run's own
   * (stalling after `activity.stallSeconds`; a Kafka worker unheard of for three `kafka.heartbeatMs` is gone).
   */
  readonly activity?: ActivityTracker | undefined;
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
  /**
   * A LoRA policy: `policy` is its adapter view, whose weights (`getWeights()`, and every published step's) are the
   * adapter's alone, in PEFT's names; the engine serves them over the base (e.g. vLLM's `load_lora_adapter`).
   */
  readonly lora?: { readonly config: ResolvedLoraConfig; readonly name: string } | undefined;
  /** The run's stop signal: a wait of the engine's setup (publishing the starting weights) ends when it fires. */
  readonly signal?: AbortSignal | undefined;
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
  /**
   * Set when that checkpoint had lost its float32 master weights: the policy went on from its weights rounded to this
   * type (a warning said so).
   */
  readonly resumedPrecision?: 'bfloat16' | 'float16';
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
  /** Times a Tinker-backed run under `continue` restarted from its last checkpoint after the service was lost. */
  readonly recoveries?: number;
}

/** What a single-agent run reads before it builds anything: the recipe's parts, the checkpoint, the initial model. */
export interface RunSetup {
  readonly backend: BackendName;
  readonly data: Data;
  readonly evaluator: Evaluator;
  /** Makes the training samples (default `singleTurnWorker`). */
  readonly worker: RolloutWorker | undefined;
  /** Samples the policy for validation: `worker`, unless that writes reference outputs (SFT). */
  readonly sampler: RolloutWorker | undefined;
  readonly tokenizer: Tokenizer;
  readonly checkpoint: Checkpoint | undefined;
  /** The model the run starts from (owned by the parts built from it); none when it trains on a Tinker service. */
  readonly initial: PolicyModel | undefined;
  /** The policy's context length in tokens (the model's, or a Tinker service's): no trained row may be longer. */
  readonly contextLength: number;
  /** The local model directory `initial` was read from (`model.path`), or none for a seeded model. */
  readonly initialDir?: string | undefined;
  /** The weights a LoRA policy's adapter starts from (`policies[0].adapterPath`), or none for a fresh adapter. */
  readonly startingAdapter?: NamedWeights | undefined;
  /** The run directory, resolved. */
  readonly runDir: string | undefined;
  /** The teacher of a distillation run (`trainer.algorithm: distill`), released with the setup. */
  readonly teacher?: RunTeacher | undefined;
  /** The run's activity tracker. */
  readonly activity: ActivityTracker;
}

/** Called with each checkpoint saved (its path, step and pending tasks): prunes the older ones, logs, records it. */
export type SavedCheckpoint = (path: string, step: number, pending: number) => Promise<void>;

/** What a single-agent run trains with: its policy's models, engine, trainer and ledger. */
export interface RunParts {
  /** The model the trainer updates: the policy, or an adapter view on the frozen base; none on a Tinker service. */
  readonly policy: PolicyModel | undefined;
  /** A LoRA policy's adapter and frozen base. */
  readonly lora: { readonly adapter: LoraAdapter; readonly base: PolicyModel } | undefined;
  readonly reference: PolicyModel | undefined;
  readonly engine: RolloutEngine;
  readonly trainer: Trainer;
  readonly ledger: RunLedger;
  /** Whether an error means the trainer's service lost the policy (a Tinker-backed run): the attempt ends. */
  readonly serviceLost?: (error: unknown) => boolean;
  /** Releases what the parts hold; `failed`: the run ended with an error (an MLflow run is marked FAILED). */
  dispose(failed?: boolean): Promise<void>;
}
