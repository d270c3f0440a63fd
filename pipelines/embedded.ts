import { loadConfig, type RxrlConfig } from '../lib/config/schema.js';
import { ConfigError } from '../lib/core/errors.js';
import type { BackendKind } from '../lib/model/backend.js';
import type { PolicyConfig } from '../lib/model/transformer.js';
import type { StalenessMode } from '../lib/sync/gate.js';
import type { GrpoTrainerOptions } from '../lib/train/grpoTrainer.js';
import type { StepResult } from '../lib/train/types.js';
import type { Metrics } from '../lib/core/types.js';
import type { StringTransformOptions } from '../recipes/stringTransform.js';
import { tinyModelConfig } from '../lib/model/policies.js';
import { runTraining, type RunSummary } from './run.js';

/** Options of {@link runEmbedded}; every field has a default tuned for a 2-core CPU. */
export interface EmbeddedRunOptions {
  /** TF.js backend. Default `auto`. */
  readonly backend?: BackendKind;
  /** The bundled task. Default: reverse 4 letters over `abcde`. */
  readonly task?: StringTransformOptions;
  /** Policy architecture (the vocabulary comes from the task). */
  readonly model?: Partial<RxrlConfig['model']>;
  /** Trainer settings. Default: Adam at 1e-3, DAPO clip-higher (`clipLow` 0.2, `clipHigh` 0.28). */
  readonly trainer?: GrpoTrainerOptions;
  /** Staleness mode. Default `sync`. */
  readonly mode?: StalenessMode;
  /** η of `batch-async`. */
  readonly stalenessThreshold?: number;
  /** `fully-async`: most tasks admitted but untrained. Default 4 batches. */
  readonly capacity?: number;
  /** Train steps. Default {@link EMBEDDED_STEPS}. */
  readonly steps?: number;
  /** Tasks per step. Default 32. */
  readonly batchSize?: number;
  /** Samples per task. Default 8. */
  readonly groupSize?: number;
  /** Sampling temperature. Default 1. */
  readonly temperature?: number;
  /** Seed of the model, the shuffle and the sampling. Default 1. */
  readonly seed?: number;
  /** Called after every step (progress display). */
  readonly onStep?: (step: StepResult, elapsedSeconds: number) => void;
  /** Cancels the run. */
  readonly signal?: AbortSignal;
}

/** What {@link runEmbedded} reports. */
export interface EmbeddedRunSummary {
  readonly recipe: string;
  readonly mode: StalenessMode;
  readonly backend: string;
  readonly steps: number;
  readonly seconds: number;
  readonly seed: number;
  readonly randomPolicyReward: number;
  readonly valRewardInitial: number;
  /** `null` when no final validation ran (stopped early). */
  readonly valRewardFinal: number | null;
  readonly valAccuracyInitial: number;
  readonly valAccuracyFinal: number;
  /** Metrics of the last step. */
  readonly lastStep: Metrics;
}

/** The schema's defaults: the single source of the embedded run's settings. */
const DEFAULTS = loadConfig({ env: {} });

/** Default policy architecture of the embedded run (≈ 0.1 M parameters; the schema's `model.*` defaults). */
export const EMBEDDED_MODEL: Omit<PolicyConfig, 'vocabSize'> = tinyModelConfig(DEFAULTS.model);

/**
 * Default trainer settings of the embedded run: Adam at 5e-4 (half the schema's default) and DAPO clip-higher.
 * Measured on the bundled reverse task (issue "Prove it learns", `npm run bench -- seeds`): at 1e-3 the policy's
 * entropy collapsed within about 150 steps onto a wrong copy position on some seeds (one answer letter taken from
 * the neighbouring prompt letter, 0.78 held-out), and clip-higher keeps the stop token alive early on.
 */
export const EMBEDDED_TRAINER: GrpoTrainerOptions = {
  learningRate: 5e-4,
  clipLow: DEFAULTS.trainer.clipLow,
  clipHigh: DEFAULTS.trainer.clipHigh,
};

/** Default step budget of the embedded run (the lower learning rate needs more steps than the schema's 300). */
export const EMBEDDED_STEPS = 800;

/**
 * The main job: trains a freshly initialized policy on a bundled task with GRPO, RL only, in this process (a
 * local engine and a trainer, no server, no GPU), and scores the held-out split before and after. It is
 * {@link runTraining} with the default configuration, no run directory and no checkpoints.
 *
 * @param options - task, model, trainer and loop settings.
 * @returns the summary, including held-out reward before and after training.
 */
export async function runEmbedded(options: EmbeddedRunOptions = {}): Promise<EmbeddedRunSummary> {
  const summary = await runTraining(embeddedConfig(options), { signal: options.signal, onStep: options.onStep });
  return embeddedSummary(summary);
}

/**
 * The configuration of an embedded run: the schema's defaults with `options` applied, no run directory, no
 * checkpoints, validation before and after.
 */
export function embeddedConfig(options: EmbeddedRunOptions = {}): RxrlConfig {
  const steps = options.steps ?? EMBEDDED_STEPS;
  if (!(Number.isInteger(steps) && steps >= 1)) throw new ConfigError(`steps must be an integer >= 1, got ${steps}`);
  const trainer = { ...EMBEDDED_TRAINER, ...options.trainer };
  const values = {
    run: { dir: null, seed: options.seed ?? 1, steps, backend: options.backend ?? 'auto' },
    data: { source: 'bundled', task: { ...options.task }, epochs: 0, shuffle: true },
    model: { ...options.model },
    rollout: { groupSize: options.groupSize ?? 8, temperature: options.temperature ?? 1 },
    trainer: {
      ...pick(trainer, [
        'learningRate',
        'clipLow',
        'clipHigh',
        'clipRatioC',
        'lossAggregation',
        'microBatchSize',
        'ppoEpochs',
        'miniBatches',
        'maxGradNorm',
        'entropyCoef',
        'maxStaleness',
        'importanceCap',
      ]),
    },
    sync: {
      mode: options.mode ?? 'sync',
      batchSize: options.batchSize ?? 32,
      ...(options.stalenessThreshold === undefined ? {} : { stalenessThreshold: options.stalenessThreshold }),
      ...(options.capacity === undefined ? {} : { capacity: options.capacity }),
    },
    checkpoint: { every: 0, onStop: false },
    resume: { mode: 'disable' },
    validation: { beforeTrain: true, every: 0 },
  };
  return loadConfig({ values: values as Record<string, unknown>, env: {} });
}

/** The embedded run's summary from a {@link runTraining} summary. */
export function embeddedSummary(summary: RunSummary): EmbeddedRunSummary {
  return {
    recipe: summary.recipe,
    mode: summary.mode,
    backend: summary.backend,
    steps: summary.steps,
    seconds: summary.seconds,
    seed: summary.seed,
    randomPolicyReward: summary.randomPolicyReward ?? 0,
    valRewardInitial: summary.valRewardInitial ?? 0,
    valRewardFinal: summary.valRewardFinal,
    valAccuracyInitial: summary.valAccuracyInitial ?? 0,
    valAccuracyFinal: summary.valAccuracyFinal ?? 0,
    lastStep: summary.lastStep,
  };
}

function pick<T extends object, K extends keyof T>(from: T, keys: readonly K[]): Partial<Pick<T, K>> {
  const out: Partial<Pick<T, K>> = {};
  for (const key of keys) if (from[key] !== undefined) out[key] = from[key];
  return out;
}
