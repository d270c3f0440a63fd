/**
 * Evaluators score a response to a task. Rule-based evaluators are plain functions; model-based or remote ones
 * may be async and should honour the signal.
 *
 * @packageDocumentation
 */
import type { Task } from './types.js';

/** What an evaluator says of one response. */
export interface EvaluationResult {
  /** Scalar reward; must be finite. */
  readonly reward: number;
  /** The answer the response was checked against, when there is one. */
  readonly groundTruth?: string;
  /** Scalar metrics (for example `accuracy`, `format`). */
  readonly metrics?: Readonly<Record<string, number>>;
  /** Anything else worth keeping with the trajectory (JSON-serializable). */
  readonly extraInfo?: Readonly<Record<string, unknown>>;
}

/** Scores responses to tasks. */
export interface Evaluator {
  /**
   * Scores `response` (decoded text) as an answer to `task`.
   * Throwing, or returning a non-finite reward, fails that one sample; the rest of its group goes on.
   */
  evaluate(task: Task, response: string, signal?: AbortSignal): EvaluationResult | Promise<EvaluationResult>;
}
