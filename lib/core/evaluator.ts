/**
 * Evaluators score a response to a task. Rule-based evaluators are plain functions; model-based or remote ones
 * may be async and should honour the signal.
 *
 * @packageDocumentation
 */
import type { FinishReason, Task } from './types.js';

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

/**
 * How the scored response was generated, beside its text (TRL passes the same to reward functions as
 * `completion_ids`): whether the policy ended it or the token budget cut it off, and its token ids.
 */
export interface ResponseInfo {
  /** `stop`: the policy sampled a stop token; `length`: the budget ran out first. */
  readonly finishReason: FinishReason;
  /** The response's token ids, the stop token included when one was sampled. */
  readonly tokens: readonly number[];
}

/** Scores responses to tasks. */
export interface Evaluator {
  /**
   * Scores `response` (decoded text, special tokens skipped) as an answer to `task`; `info` says how it ended.
   * Throwing, or returning a non-finite reward, fails that one sample; the rest of its group goes on.
   */
  evaluate(task: Task, response: string, signal?: AbortSignal, info?: ResponseInfo): EvaluationResult | Promise<EvaluationResult>;
}
