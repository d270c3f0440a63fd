/**
 * The trainer contract the `train` and `syncWeights` operators drive.
 *
 * @packageDocumentation
 */
import type { NamedWeights } from '../model/types.js';
import type { Batch, Metrics, ModelTag, PolicyVersion } from '../core/types.js';

/** What one train step reports. */
export interface StepResult {
  /** 0-based index of the step just taken. */
  readonly step: number;
  /** Policy version its weights make: `step + 1` (also when the update was skipped). */
  readonly version: PolicyVersion;
  /** Namespaced scalar metrics (`actor/pg_loss`, `rollout/staleness_max`, `timing/step_s`, …). */
  readonly metrics: Metrics;
  /** True when the update was skipped (for example a NaN or infinite loss); weights are then unchanged. */
  readonly skipped: boolean;
  /** Ids of the trajectories trained on, in batch order. */
  readonly trajectoryIds: readonly string[];
  /** Copies the weights after this step, for weight sync. */
  weights(): NamedWeights;
}

/** Takes train steps on prepared batches, one at a time. */
export interface Trainer {
  /** Model this trainer updates. */
  readonly modelTag: ModelTag;
  /** Number of steps taken so far. */
  readonly step: number;
  /** One training step on `batch`. Never called concurrently by the `train` operator. */
  trainStep(batch: Batch, signal?: AbortSignal): Promise<StepResult>;
  /** Releases tensors. */
  dispose?(): void;
}
