/**
 * The rollout engine interface every rollout goes through, local or remote.
 *
 * @packageDocumentation
 */
import type { ModelTag, PolicyVersion } from '../core/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../model/types.js';

/** Something that samples responses from a policy and accepts new weights. */
export interface RolloutEngine {
  /** Model this engine serves. */
  readonly modelTag: ModelTag;
  /** The policy version of the weights the engine currently holds. */
  readonly version: PolicyVersion;
  /** Tokenizer of the served model. */
  readonly tokenizer: Tokenizer;
  /**
   * Generates one response per request, in request order. Rejects with an `AbortError` when `signal` fires
   * before any work started; requests cancelled mid-generation resolve with `finishReason: 'abort'`.
   */
  generate(requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]>;
  /**
   * Replaces the weights; later generations are tagged with `version`. An engine that waits on something (a server's
   * weight update) stops waiting when `signal` fires, rejecting with an `AbortError`.
   */
  loadWeights(version: PolicyVersion, weights: NamedWeights, signal?: AbortSignal): Promise<void>;
  /**
   * True when the engine samples from the trainer's own model (sync mode in one process): a load only moves its
   * version, and the weights it is given are not read, so a publisher need not copy them for it.
   */
  readonly sharesTrainerWeights?: boolean;
  /** Releases resources (tensors, sockets). */
  dispose?(): void | Promise<void>;
}
