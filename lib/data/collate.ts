/**
 * Collation: trajectories → a columnar, padded {@link Batch}. Prompts are left-padded and responses
 * right-padded to the longest of the batch (no padding beyond what the batch needs).
 *
 * @packageDocumentation
 */
import { ContextLengthError, ShapeError } from '../core/errors.js';
import type { Batch, ModelTag, Trajectory } from '../core/types.js';

/** Options of {@link collate}. */
export interface CollateOptions {
  /** Token id written on padding. */
  readonly padId: number;
  /** Model tag of the batch. */
  readonly modelTag: ModelTag;
  /** Per-row scalar advantage, `[B]`; broadcast over each row's loss mask. Default all 0. */
  readonly advantages?: ArrayLike<number>;
  /** Per-row reference log-probs of the response tokens (`[B][R_b]`), when a reference policy is used. */
  readonly refLogprobs?: readonly ArrayLike<number>[];
  /** Pad the response columns to at least this width (for fixed-shape kernels). Default 0. */
  readonly minResponseLength?: number;
  /**
   * The trained model's context length: a row whose prompt and response together are longer is refused with a
   * {@link ContextLengthError} before anything is allocated. Default: no bound.
   */
  readonly maxSeqLen?: number | undefined;
}

/**
 * Builds a padded, columnar batch from trajectories.
 *
 * Layout per row `b` with prompt length `p_b` and response length `r_b`, `P = max p_b`, `R = max r_b`:
 * `inputIds[b] = [pad × (P − p_b), prompt…, response…, pad × (R − r_b)]`; positions count from the first real
 * token; `tokenRewards[b, r_b − 1] = reward_b` (the scalar reward on the last response token).
 *
 * @param rows - trajectories, in batch order (may be empty: a batch of size 0, which trains nothing).
 * @param options - pad id, model tag, per-row advantages and the model's context length.
 * @returns the batch; its typed arrays are fresh (no tensors to dispose).
 * @throws {@link ContextLengthError} for the first row longer than `options.maxSeqLen` (`context`: `taskId`,
 *   `trajectoryId`, `tokens`, `limit`); {@link ShapeError} for a row whose per-token arrays differ in length.
 */
export function collate(rows: readonly Trajectory[], options: CollateOptions): Batch {
  const B = rows.length;
  const { padId } = options;
  let P = 0;
  let R = options.minResponseLength ?? 0;
  for (const t of rows) {
    if (t.logprobs.length !== t.responseTokens.length || t.lossMask.length !== t.responseTokens.length) {
      throw new ShapeError(`trajectory ${t.id}: responseTokens, logprobs and lossMask differ in length`, {
        context: { id: t.id, tokens: t.responseTokens.length, logprobs: t.logprobs.length, mask: t.lossMask.length },
      });
    }
    refuseOverContext(t, options.maxSeqLen);
    P = Math.max(P, t.promptTokens.length);
    R = Math.max(R, t.responseTokens.length);
  }
  const T = P + R;
  const inputIds = new Int32Array(B * T).fill(padId); // [B, T]
  const attentionMask = new Float32Array(B * T); // [B, T]
  const positionIds = new Int32Array(B * T); // [B, T]
  const responseMask = new Float32Array(B * R); // [B, R]
  const lossMask = new Float32Array(B * R); // [B, R]
  const oldLogprobs = new Float32Array(B * R); // [B, R]
  const tokenRewards = new Float32Array(B * R); // [B, R]
  const refLogprobs = options.refLogprobs ? new Float32Array(B * R) : undefined; // [B, R]

  rows.forEach((t, b) => {
    const p = t.promptTokens.length;
    const r = t.responseTokens.length;
    const start = b * T + (P - p);
    for (let i = 0; i < p; i++) {
      inputIds[start + i] = t.promptTokens[i];
      attentionMask[start + i] = 1;
      positionIds[start + i] = i;
    }
    const ref = options.refLogprobs?.[b];
    for (let i = 0; i < r; i++) {
      const full = b * T + P + i;
      inputIds[full] = t.responseTokens[i];
      attentionMask[full] = 1;
      positionIds[full] = p + i;
      const cell = b * R + i;
      responseMask[cell] = 1;
      lossMask[cell] = t.lossMask[i] ? 1 : 0;
      oldLogprobs[cell] = t.logprobs[i];
      if (refLogprobs && ref) refLogprobs[cell] = ref[i];
    }
    if (r > 0) tokenRewards[b * R + r - 1] = t.reward;
  });

  return {
    size: B,
    promptLength: P,
    responseLength: R,
    inputIds,
    attentionMask,
    positionIds,
    responseMask,
    lossMask,
    oldLogprobs,
    ...(refLogprobs ? { refLogprobs } : {}),
    advantages: options.advantages ? broadcastAdvantages(lossMask, R, options.advantages) : new Float32Array(B * R),
    tokenRewards,
    meta: {
      trajectoryIds: rows.map((t) => t.id),
      taskIds: rows.map((t) => t.taskId),
      groupIds: rows.map((t) => t.groupId),
      policyVersions: rows.map((t) => t.policyVersion),
      rewards: rows.map((t) => t.reward),
      finishReasons: rows.map((t) => t.finishReason),
      modelTag: options.modelTag,
    },
  };
}

/** A {@link ContextLengthError} when `t`'s prompt and response are together longer than `maxSeqLen`. */
function refuseOverContext(t: Trajectory, maxSeqLen: number | undefined): void {
  const tokens = t.promptTokens.length + t.responseTokens.length;
  if (maxSeqLen === undefined || tokens <= maxSeqLen) return;
  throw new ContextLengthError(
    `task ${t.taskId}: trajectory ${t.id} is ${tokens} tokens (a ${t.promptTokens.length}-token prompt and a ` +
      `${t.responseTokens.length}-token response), longer than the model's context of ${maxSeqLen}: it cannot be trained on`,
    { context: { taskId: t.taskId, trajectoryId: t.id, tokens, limit: maxSeqLen } },
  );
}

/**
 * Per-token advantages `[B, R]`: each row's scalar advantage on its loss-masked tokens, 0 elsewhere.
 *
 * @param lossMask - `[B, R]` row-major.
 * @param width - `R`.
 * @param rowAdvantages - `[B]`.
 */
export function broadcastAdvantages(lossMask: Float32Array, width: number, rowAdvantages: ArrayLike<number>): Float32Array {
  const out = new Float32Array(lossMask.length); // [B, R]
  for (let cell = 0; cell < lossMask.length; cell++) out[cell] = lossMask[cell] * rowAdvantages[Math.floor(cell / width)];
  return out;
}
