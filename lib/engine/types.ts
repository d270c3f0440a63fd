/**
 * The rollout engine interface every rollout goes through, local or remote.
 *
 * @packageDocumentation
 */
import type { FinishReason, ModelTag, PolicyVersion } from '../types.js';

/** A weight array in plain memory: row-major data and its shape. */
export interface WeightArray {
  readonly shape: readonly number[];
  readonly data: Float32Array;
}

/** Named model weights in plain memory (no tensors), the unit of weight sync. */
export type NamedWeights = ReadonlyMap<string, WeightArray>;

/** Maps text to token ids and back. */
export interface Tokenizer {
  /** Number of token ids, including special tokens. */
  readonly vocabSize: number;
  /** Id of the padding token. */
  readonly padId: number;
  /** Id of the beginning-of-sequence token, prepended by `encode` when asked. */
  readonly bosId: number;
  /** Id of the end-of-sequence (stop) token. */
  readonly eosId: number;
  /** Token ids of a text (no special tokens unless `addBos`). */
  encode(text: string, options?: { addBos?: boolean }): number[];
  /** Text of token ids; special tokens are dropped. */
  decode(ids: readonly number[]): string;
}

/** One generation request. */
export interface GenerateRequest {
  /** Prompt token ids, `[P]` (non-empty). */
  readonly promptTokens: readonly number[];
  /** Largest number of new tokens. */
  readonly maxTokens: number;
  /** Sampling temperature; 0 means greedy. Defaults to 1. */
  readonly temperature?: number;
  /** Nucleus sampling mass in (0, 1]. Defaults to 1. */
  readonly topP?: number;
  /** Token ids that end generation (kept in the output). Defaults to the tokenizer's `eosId`. */
  readonly stopTokens?: readonly number[];
  /** Seed of this request's sampling stream; equal seeds give equal samples under equal weights. */
  readonly seed?: number;
}

/** One generation result. */
export interface GenerateResponse {
  /** New token ids, `[R]`. */
  readonly tokens: number[];
  /** Log-probability of each new token under the sampling distribution's policy, `[R]`. */
  readonly logprobs: number[];
  /** Why generation ended. */
  readonly finishReason: FinishReason;
  /** Oldest policy version whose weights produced any token of this response. */
  readonly policyVersion: PolicyVersion;
}

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
  /** Replaces the weights; later generations are tagged with `version`. */
  loadWeights(version: PolicyVersion, weights: NamedWeights): Promise<void>;
  /** Releases resources (tensors, sockets). */
  dispose?(): void | Promise<void>;
}
