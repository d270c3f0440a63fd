/**
 * Core vocabulary of rxrl: tasks, trajectories, groups, batches and policy versions.
 *
 * These are plain data: no tensors, so they can cross an `await`, a worker boundary or a Kafka topic without
 * anyone having to dispose of them. Tensors live only inside the model, the trainer and the pure math in
 * `lib/algos/`.
 *
 * @packageDocumentation
 */

/** Names the model (policy) a trajectory was sampled from; trajectory stores are kept per tag. */
export type ModelTag = string;

/**
 * The number of train steps whose weights the rollout engines have received. Version 0 is the initial
 * checkpoint; the train step `s` (0-based) produces version `s + 1`.
 */
export type PolicyVersion = number;

/** Why a generation ended. */
export type FinishReason =
  /** The stop token was sampled. */
  | 'stop'
  /** `maxTokens` was reached. */
  | 'length'
  /** The request was cancelled (an `AbortSignal` fired); the response holds what was generated so far. */
  | 'abort';

/** One data item. A task is repeated `groupSize` times to form a GRPO group. */
export interface Task {
  /** Stable, unique id of the data item (dedup and checkpoint key). */
  readonly id: string;
  /** The prompt as text. Engines tokenize it with their own tokenizer. */
  readonly prompt: string;
  /** Reference answer the evaluator scores against, when the task has one. */
  readonly answer?: string;
  /**
   * The reference output to imitate (`trainer.algorithm: sft` from a dataset): the completion of `prompt` (or of
   * the conversation in `metadata.messages`) the policy is trained to write. Default for imitation: `answer`.
   */
  readonly response?: string;
  /** Free-form, JSON-serializable data for evaluators and recipes. */
  readonly metadata?: Readonly<Record<string, unknown>>;
  /** Pass over the data this task was loaded in (set by the loader; 0 when absent). */
  readonly epoch?: number;
}

/** One sampled response to a task, with everything the trainer needs to score and train on it. */
export interface Trajectory {
  /** Unique id of this trajectory (`${groupId}/${runId}` unless the rollout worker says otherwise). */
  readonly id: string;
  /** Id of the task this trajectory answers. */
  readonly taskId: string;
  /** Id of the GRPO group: every sample of one task in one epoch shares it. */
  readonly groupId: string;
  /** Index of this sample inside its group, `0 .. groupSize-1`. */
  readonly runId: number;
  /** Model that produced it. */
  readonly modelTag: ModelTag;
  /** The oldest policy version whose weights produced any of its tokens. */
  readonly policyVersion: PolicyVersion;
  /** Prompt token ids, `[P]`. */
  readonly promptTokens: readonly number[];
  /** Response token ids, `[R]`, including the stop token when one was sampled. */
  readonly responseTokens: readonly number[];
  /** Rollout-time log-probability of each response token under the sampling policy, `[R]`. */
  readonly logprobs: readonly number[];
  /** 1 where a response token is the policy's own and should be trained on, 0 otherwise, `[R]`. */
  readonly lossMask: readonly number[];
  /** Scalar reward from the evaluator. */
  readonly reward: number;
  /** Why generation ended. */
  readonly finishReason: FinishReason;
  /** Scalar evaluator metrics (for example `accuracy`, `format`). */
  readonly metrics: Readonly<Record<string, number>>;
  /** The task this trajectory answers (kept so evaluators and logs can see it). */
  readonly task: Task;
  /**
   * The response as text, as the evaluator scored it: for a single completion, the tokenizer's decoding of
   * `responseTokens` with special tokens skipped; for a multi-turn agent, its last reply. Absent for a multi-agent slot.
   */
  readonly responseText?: string;
  /** When it was generated and scored, in the process that rolled it out (not carried over Kafka). */
  readonly timing?: RolloutTiming;
}

/** A time span, `[start, end]` in milliseconds of `performance.now()` of one process. */
export type TimeSpan = readonly [number, number];

/** When one sample was generated and scored (the `rollout` operator's clock). */
export interface RolloutTiming {
  /** The worker's call: encoding the prompt and generating (for a multi-turn worker, all its turns). */
  readonly generate: TimeSpan;
  /** The evaluator's call (empty where the worker gave the reward itself). */
  readonly reward: TimeSpan;
}

/** The trajectories of one prompt: the unit GRPO normalizes over. */
export interface Group {
  /** Group key: one element per grouping level (for example `[taskId]` or `[taskId, groupId]`). */
  readonly key: readonly string[];
  /** Model that produced every trajectory in the group. */
  readonly modelTag: ModelTag;
  /** Trajectories of the group, ordered by `runId`. */
  readonly trajectories: readonly Trajectory[];
  /** Why an incomplete group was released: its timeout fired, or the source completed. Absent when complete. */
  readonly closedBy?: 'timeout' | 'source-complete';
  /** Trajectories discarded because the group timed out under the `drop` policy (the group is then empty). */
  readonly dropped?: number;
  /** Samples of the group that failed (engine or evaluator errors); the group shrank by this many. */
  readonly failed?: number;
}

/**
 * A columnar, padded training batch (row-major typed arrays). `B` rows, `P` prompt columns (prompts are
 * left-padded), `R` response columns (responses are right-padded), `T = P + R`.
 *
 * Arrays aligned with the response (`[B, R]`) describe response tokens only, as verl does; `inputIds`,
 * `attentionMask` and `positionIds` (`[B, T]`) describe the whole sequence.
 */
export interface Batch {
  /** Number of rows `B`. */
  readonly size: number;
  /** Prompt width `P` (columns `0 .. P-1` of the full sequence). */
  readonly promptLength: number;
  /** Response width `R` (columns `P .. T-1` of the full sequence). */
  readonly responseLength: number;
  /** Token ids `[B, T]`, pad id where `attentionMask` is 0. */
  readonly inputIds: Int32Array;
  /** 1 for real tokens, 0 for padding, `[B, T]`. */
  readonly attentionMask: Float32Array;
  /** Position of each token counted from the first real token of its row, `[B, T]` (0 on padding). */
  readonly positionIds: Int32Array;
  /** 1 for real response tokens, `[B, R]`. */
  readonly responseMask: Float32Array;
  /** 1 for response tokens that enter the loss (`responseMask` ∧ trajectory loss mask), `[B, R]`. */
  readonly lossMask: Float32Array;
  /** Rollout-time log-probs of the response tokens, `[B, R]` (0 on padding). */
  readonly oldLogprobs: Float32Array;
  /** Reference-policy log-probs of the response tokens, `[B, R]`, when a reference policy is used. */
  readonly refLogprobs?: Float32Array;
  /** Per-token advantages, `[B, R]`. */
  readonly advantages: Float32Array;
  /** Per-token rewards (scalar reward on the last response token, minus any KL penalty), `[B, R]`. */
  readonly tokenRewards: Float32Array;
  /** Per-row metadata. */
  readonly meta: BatchMeta;
  /** Metrics gathered while preparing the batch (`critic/*`, `batch/*`), merged into the step's metrics. */
  readonly metrics?: Metrics;
}

/** Per-row and per-batch metadata of a {@link Batch}. */
export interface BatchMeta {
  /** Trajectory id of each row, `[B]`. */
  readonly trajectoryIds: readonly string[];
  /** Task id of each row, `[B]`. */
  readonly taskIds: readonly string[];
  /** Group id of each row, `[B]`. */
  readonly groupIds: readonly string[];
  /** Policy version that produced each row, `[B]`. */
  readonly policyVersions: readonly PolicyVersion[];
  /** Scalar reward of each row, `[B]`. */
  readonly rewards: readonly number[];
  /** Why each row's generation ended, `[B]` (absent on batches built before it was recorded). */
  readonly finishReasons?: readonly FinishReason[];
  /** Model that produced the rows. */
  readonly modelTag: ModelTag;
  /** Ids of every group the batch was made from, including groups left with no rows (failed, dropped, filtered). */
  readonly groups?: readonly string[];
}

/** Scalar metrics keyed by namespaced names such as `actor/pg_clipfrac` or `rollout/staleness_max`. */
export type Metrics = Record<string, number>;

/** A sample that failed (engine error, evaluator error, non-finite reward). Its group shrinks by one. */
export interface SampleFailure {
  readonly kind: 'sample-failure';
  /** Id the trajectory would have had. */
  readonly id: string;
  readonly taskId: string;
  readonly groupId: string;
  readonly runId: number;
  readonly modelTag: ModelTag;
  /** What went wrong. */
  readonly error: Error;
  /**
   * True when the sample was never taken: a multi-agent episode ended before this turn. Its group shrinks as for
   * a failure, but nothing went wrong, so it is not reported.
   */
  readonly skipped?: boolean | undefined;
}

/** What a rollout emits: a trajectory, or the report of a sample that failed. */
export type RolloutOutput = Trajectory | SampleFailure;

/** True when a rollout output reports a failed sample. */
export function isSampleFailure(output: RolloutOutput): output is SampleFailure {
  return (output as Partial<SampleFailure>).kind === 'sample-failure';
}

/**
 * `T` with every property required and `undefined` taken out of its type: what an options object becomes once its
 * defaults are filled in (`Required<T>` keeps an explicit `| undefined`).
 */
export type Defined<T> = { [K in keyof T]-?: Exclude<T[K], undefined> };

/**
 * A frozen policy that scores a batch's response tokens — the reference of a KL penalty, or the teacher of
 * on-policy distillation.
 */
export interface ReferencePolicy {
  /** Log-probs of the response tokens of `batch` under this policy, `[B, R]` row-major (0 on padding). */
  responseLogprobs(batch: Batch, signal?: AbortSignal): Promise<Float32Array>;
}
