import { lastValueFrom, tap } from 'rxjs';
import { LocalEngine } from '../lib/engine/local.js';
import { ConfigError } from '../lib/errors.js';
import { initBackend, type BackendKind } from '../lib/model/backend.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';
import type { StalenessMode } from '../lib/sync/gate.js';
import { GrpoTrainer, type GrpoTrainerOptions } from '../lib/train/grpoTrainer.js';
import type { StepResult } from '../lib/train/types.js';
import type { Metrics } from '../lib/types.js';
import { stringTransformTask, type StringTransformOptions } from '../recipes/stringTransform.js';
import { grpoPipeline } from './grpoPipeline.js';
import { validate } from './validate.js';

/** Options of {@link runEmbedded}; every field has a default tuned for a 2-core CPU. */
export interface EmbeddedRunOptions {
  /** TF.js backend. Default `auto`. */
  readonly backend?: BackendKind;
  /** The bundled task. Default: reverse 4 letters over `abcde`. */
  readonly task?: StringTransformOptions;
  /** Policy architecture (the vocabulary comes from the task). */
  readonly model?: Partial<Omit<PolicyConfig, 'vocabSize'>>;
  /** Trainer settings. Default: Adam at 1e-3, DAPO clip-higher (`clipLow` 0.2, `clipHigh` 0.28). */
  readonly trainer?: GrpoTrainerOptions;
  /** Staleness mode. Default `sync`. */
  readonly mode?: StalenessMode;
  /** η of `batch-async`. */
  readonly stalenessThreshold?: number;
  /** `fully-async`: most tasks admitted but untrained. Default 4 batches. */
  readonly capacity?: number;
  /** Train steps. Default 300. */
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
  readonly valRewardFinal: number;
  readonly valAccuracyInitial: number;
  readonly valAccuracyFinal: number;
  /** Metrics of the last step. */
  readonly lastStep: Metrics;
}

/** Default policy architecture of the embedded run (≈ 0.1 M parameters). */
export const EMBEDDED_MODEL: Omit<PolicyConfig, 'vocabSize'> = {
  dModel: 64,
  nLayers: 2,
  nHeads: 4,
  dFF: 256,
  maxSeqLen: 24,
};

/**
 * Default trainer settings of the embedded run. Clip-higher keeps the policy's entropy from collapsing before
 * it has learned to stop (measured: with `clipHigh` = `clipLow` and lr 3e-3 the policy locked into
 * "right letters, one too many" at 0.8 reward).
 */
export const EMBEDDED_TRAINER: GrpoTrainerOptions = { learningRate: 1e-3, clipLow: 0.2, clipHigh: 0.28 };

/**
 * The main job: trains a freshly initialized policy on a bundled task with GRPO, RL only, in this process (a
 * local engine and a trainer, no server, no GPU), and scores the held-out split before and after.
 *
 * @param options - task, model, trainer and loop settings.
 * @returns the summary, including held-out reward before and after training.
 */
export async function runEmbedded(options: EmbeddedRunOptions = {}): Promise<EmbeddedRunSummary> {
  const seed = options.seed ?? 1;
  const steps = options.steps ?? 300;
  const batchSize = options.batchSize ?? 32;
  const groupSize = options.groupSize ?? 8;
  const mode = options.mode ?? 'sync';
  if (!(Number.isInteger(steps) && steps >= 0)) throw new ConfigError(`steps must be an integer >= 0, got ${steps}`);
  const backend = await initBackend(options.backend ?? 'auto');
  const task = stringTransformTask({ seed, ...options.task });
  const tokenizer = new CharTokenizer(task.characters);
  const config: PolicyConfig = { ...EMBEDDED_MODEL, ...options.model, vocabSize: tokenizer.vocabSize };
  const maxTokens = task.maxAnswerLength + 1;
  const promptLength = task.maxAnswerLength + 2;
  if (promptLength + maxTokens > config.maxSeqLen) {
    throw new ConfigError(`model.maxSeqLen ${config.maxSeqLen} is shorter than prompt + response (${promptLength + maxTokens})`);
  }

  const trainerModel = PolicyModel.create(config, seed);
  const rolloutModel = PolicyModel.fromWeights(config, trainerModel.getWeights());
  const engine = new LocalEngine(rolloutModel, { tokenizer, maxBatchSize: batchSize * groupSize });
  const trainer = new GrpoTrainer(trainerModel, { ...EMBEDDED_TRAINER, seed, ...options.trainer });
  try {
    const score = async (): Promise<Metrics> =>
      validate(engine, task.validation, task.evaluator, { maxTokens, temperature: 0, signal: options.signal });
    const before = await score();
    const started = performance.now();
    let last: StepResult | undefined;
    await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: Infinity, shuffle: true, seed },
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        mode,
        stalenessThreshold: options.stalenessThreshold,
        capacity: options.capacity,
        batchSize,
        groupSize,
        maxTokens,
        temperature: options.temperature ?? 1,
        steps,
        seed,
        signal: options.signal,
      }).pipe(
        tap((step) => {
          last = step;
          options.onStep?.(step, (performance.now() - started) / 1000);
        }),
      ),
      { defaultValue: undefined },
    );
    const seconds = (performance.now() - started) / 1000;
    const after = await score();
    return {
      recipe: task.name,
      mode,
      backend,
      steps: trainer.step,
      seconds: Number(seconds.toFixed(1)),
      seed,
      randomPolicyReward: Number(task.randomPolicyReward.toFixed(4)),
      valRewardInitial: Number(before['val/reward_mean'].toFixed(4)),
      valRewardFinal: Number(after['val/reward_mean'].toFixed(4)),
      valAccuracyInitial: Number((before['val/accuracy_mean'] ?? 0).toFixed(4)),
      valAccuracyFinal: Number((after['val/accuracy_mean'] ?? 0).toFixed(4)),
      lastStep: last?.metrics ?? {},
    };
  } finally {
    trainer.dispose();
    trainerModel.dispose();
    rolloutModel.dispose();
  }
}
