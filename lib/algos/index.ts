/**
 * GRPO math: pure functions over TF.js tensors (and plain arrays where simpler). Every tensor argument's shape
 * is documented; every function disposes its intermediates.
 *
 * @packageDocumentation
 */

// ── advantages ─────────────────────────────────────────────────────────────────
export {
  ADVANTAGE_EPSILON,
  GROUP_ADVANTAGE_METRIC_KEYS,
  STD_KINDS,
  broadcastAdvantages,
  computeGroupAdvantages,
  computeGroupAdvantagesTensor,
  indexGroups,
} from './advantages.js';
export type {
  AdvantageKey,
  GroupAdvantageArrayOptions,
  GroupAdvantageOptions,
  GroupAdvantageResult,
  GroupAdvantageStats,
  GroupAdvantageTensorOptions,
  GroupAdvantageTensorResult,
  GroupIndex,
  GroupKind,
  StdKind,
} from './advantages.js';

// ── token-level rewards ────────────────────────────────────────────────────────
export { tokenLevelRewards } from './rewards.js';

// ── KL estimators, penalty and loss ────────────────────────────────────────────
export {
  KL_ESTIMATOR_NAMES,
  LOW_VAR_KL_CLAMP,
  LOW_VAR_KL_LOG_RATIO_CLAMP,
  applyKlPenalty,
  getKlEstimator,
  isKlEstimatorName,
  klAbs,
  klK1,
  klLoss,
  klLowVar,
  klMse,
} from './kl.js';
export type { KlEstimator, KlEstimatorName, KlLossInput, KlLossOptions, KlPenaltyInput, KlPenaltyOptions, KlPenaltyResult } from './kl.js';

// ── KL controllers ─────────────────────────────────────────────────────────────
export { ADAPTIVE_KL_ERROR_CLIP, KL_CONTROLLER_TYPES, createKlController, updateKlController } from './klController.js';
export type { AdaptiveKlController, FixedKlController, KlController, KlControllerType } from './klController.js';

// ── policy loss ────────────────────────────────────────────────────────────────
export { DEFAULT_CLIP_RATIO, ppoClipLoss } from './policyLoss.js';
export type { PolicyLossInput, PpoClipOptions } from './policyLoss.js';

// ── loss aggregation ───────────────────────────────────────────────────────────
export { LOSS_AGG_MODES, aggregateLoss, isLossAggMode, parseLossAggMode } from './aggregate.js';
export type { AggregateLossOptions, LossAggMode } from './aggregate.js';

// ── importance correction ──────────────────────────────────────────────────────
export { DEFAULT_IS_WEIGHT_CAP, truncatedImportanceWeights } from './importance.js';
export type { TruncatedImportanceOptions, TruncatedImportanceResult } from './importance.js';
export { LOG_RATIO_CLAMP, importanceRatio } from './ratio.js';

// ── masked reductions and gradients ────────────────────────────────────────────
export { MASK_EPSILON, applyMask, maskToBool, maskedMean, maskedSum } from './masked.js';
export { stopGradient } from './stopGradient.js';

// ── metrics ────────────────────────────────────────────────────────────────────
export { disposeMetrics, keepMetrics, readMetrics, readMetricsSync } from './metrics.js';
export type { LossOutput, ScalarMetrics } from './metrics.js';
