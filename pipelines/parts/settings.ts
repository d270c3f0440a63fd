/**
 * The settings a run takes from its recipe, shared by every kind of run (embedded, Kafka, multi-agent): the
 * trainer's, the loop's, the Kafka transport's and the KL penalty in the reward.
 *
 * @packageDocumentation
 */
import type { Kafka } from 'kafkajs';

import type { RxrlConfig } from '../../lib/config/schema.js';
import type { Tokenizer } from '../../lib/model/types.js';
import type { KafkaEvent, KafkaTopics, RecordEncoders } from '../../lib/kafka/types.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import type { GrpoTrainerOptions, TrainerLoss } from '../../lib/train/grpoTrainer.js';
import { modelScorer } from '../../lib/engine/teacher.js';
import type { KlInRewardOptions } from '../../operators/grpoPrepare.js';

/** The trainer settings of a recipe's `trainer` section (a reference policy, when KL is on, is the caller's). */
export function grpoTrainerOptions(config: Pick<RxrlConfig, 'run' | 'trainer'>): GrpoTrainerOptions {
  const t = config.trainer;
  return {
    loss: lossOf(t.algorithm),
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
    skipZeroAdvantage: t.skipZeroAdvantage,
    ...(t.maxStaleness === null ? {} : { maxStaleness: t.maxStaleness }),
    ...(t.importanceCap === null ? {} : { importanceCap: t.importanceCap }),
    ...(t.klLoss.coef > 0 ? { klLoss: { coef: t.klLoss.coef, estimator: t.klLoss.estimator } } : {}),
    seed: config.run.seed,
  };
}

/** The trainer's loss for a recipe's `trainer.algorithm`: SFT's cross-entropy, else the policy gradient. */
export function lossOf(algorithm: RxrlConfig['trainer']['algorithm']): TrainerLoss {
  return algorithm === 'sft' ? 'cross-entropy' : 'policy-gradient';
}

/** Tasks a run admits per train step: `sync.generationBatchSize`, else `sync.batchSize`. */
export function tasksPerStep(config: Pick<RxrlConfig, 'sync'>): number {
  return config.sync.generationBatchSize ?? config.sync.batchSize;
}

/** Most samples of one sampling slot the staleness mode lets in flight (an engine's batch limit). */
export function samplesInFlight(config: Pick<RxrlConfig, 'sync' | 'rollout'>): number {
  const { mode, stalenessThreshold } = config.sync;
  const batches = mode === 'batch-async' ? stalenessThreshold + 1 : mode === 'fully-async' ? 4 : 1;
  return tasksPerStep(config) * config.rollout.groupSize * batches;
}

/**
 * The loop settings of a recipe that every training loop shares (embedded, Kafka, multi-agent): staleness mode,
 * sizes, sampling, seed, advantages and the group store's timeout.
 *
 * @internal
 */
export function loopSettings(config: Pick<RxrlConfig, 'algorithm' | 'rollout' | 'run' | 'sft' | 'store' | 'sync' | 'trainer'>) {
  return {
    mode: config.sync.mode,
    stalenessThreshold: config.sync.stalenessThreshold,
    ...(config.sync.capacity > 0 ? { capacity: config.sync.capacity } : {}),
    batchSize: config.sync.batchSize,
    ...(config.sync.generationBatchSize === null ? {} : { generationBatchSize: config.sync.generationBatchSize }),
    groupSize: config.rollout.groupSize,
    temperature: config.rollout.temperature,
    topP: config.rollout.topP,
    ignoreEos: config.rollout.ignoreEos,
    seed: config.run.seed,
    advantage: {
      normalizeByStd: config.algorithm.normalizeByStd,
      std: config.algorithm.std,
      epsilon: config.algorithm.stdEpsilon,
      filterZeroVariance: config.algorithm.filterZeroVariance,
    },
    ...(config.store.groupTimeoutMs === null ? {} : { groupTimeoutMs: config.store.groupTimeoutMs }),
    onGroupTimeout: config.store.onGroupTimeout,
    ...(config.trainer.algorithm === 'sft'
      ? { sft: { minReward: config.sft.source === 'rollouts' ? config.sft.minReward : undefined } }
      : {}),
  };
}

/** Where a run finds its rollout workers when it trains over Kafka (`rxrl trainer`). */
export interface KafkaTransport {
  /** The kafkajs client (`createKafka`). */
  readonly kafka: Kafka;
  /** Topics of the deployment (`kafkaTopics(prefix)`). */
  readonly topics: KafkaTopics;
  /** Directory shared with the workers where each version's weights are written. */
  readonly weightsDir: string;
  /** How records are written: plain Protocol Buffers (default), or framed for a schema registry (`registerRecordSchemas`). */
  readonly encoders?: RecordEncoders | undefined;
  /** Instrumentation: consumer and `trainer.*` events. */
  readonly onEvent?: (event: KafkaEvent) => void;
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
    ...(transport.encoders ? { encoders: transport.encoders } : {}),
  };
}

/**
 * The KL penalty in the reward of a recipe (`algorithm.klInReward`), scored against `reference`; none when its
 * coefficient is 0 or there is no reference.
 *
 * @internal
 */
export function klInRewardOf(
  config: Pick<RxrlConfig, 'algorithm'>,
  reference: PolicyModel | undefined,
): { klInReward?: KlInRewardOptions } {
  if (reference === undefined || config.algorithm.klInReward.coef <= 0) return {};
  return {
    klInReward: {
      reference: modelScorer(reference),
      controller: { type: 'fixed', coef: config.algorithm.klInReward.coef },
      estimator: config.algorithm.klInReward.estimator,
    },
  };
}
