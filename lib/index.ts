/**
 * rxrl: reinforcement-learning post-training of language models as a reactive stream.
 *
 * @packageDocumentation
 */

// ── core vocabulary ────────────────────────────────────────────────────────────
export type {
  Batch,
  BatchMeta,
  FinishReason,
  Group,
  Metrics,
  ModelTag,
  PolicyVersion,
  Task,
  Trajectory,
} from './types.js';

// ── errors ─────────────────────────────────────────────────────────────────────
export {
  AbortError,
  BackendUnavailableError,
  ConfigError,
  DecodeError,
  EngineError,
  RxrlError,
  ShapeError,
  assertNever,
  isAbortError,
  isRetriable,
  isRxrlError,
  throwIfAborted,
} from './errors.js';
export type { RxrlErrorOptions } from './errors.js';

// ── engines ────────────────────────────────────────────────────────────────────
export type {
  GenerateRequest,
  GenerateResponse,
  NamedWeights,
  RolloutEngine,
  Tokenizer,
  WeightArray,
} from './engine/types.js';
