import type { OperatorFunction } from 'rxjs';
import { collate } from '../lib/data/collate.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Batch, Group, Metrics, ModelTag, ReferencePolicy } from '../lib/core/types.js';
import { preparing, scoreMean } from './internal/batchStats.js';

/** Options of {@link distillPrepare}. */
export interface DistillPrepareOptions {
  /** Token id written on padding. */
  readonly padId: number;
  /** Scores each batch's response tokens under the teacher. */
  readonly teacher: ReferencePolicy;
  /** Weight of the task reward added to every token's advantage. Default 0 (distillation alone). */
  readonly rewardCoef?: number | undefined;
  /** Model tag of the batches. Default: the first group's. */
  readonly modelTag?: ModelTag;
  /**
   * The trained model's context length: a row longer fails the batch with a `ContextLengthError` before anything is
   * allocated for it (see `collate`). Default: no bound.
   */
  readonly maxSeqLen?: number | undefined;
  /** Cancels the teacher's scoring. */
  readonly signal?: AbortSignal | undefined;
}

/**
 * Turns a batch of groups of the student's own samples into a training {@link Batch} for on-policy distillation: the
 * teacher scores every response token, and each token's advantage is the teacher's log-prob minus the student's
 * (its rollout-time log-prob) — the negative of the reverse KL's per-token estimate, so the policy gradient lowers
 * KL(student ‖ teacher) where the student actually goes — plus `rewardCoef` times the sample's reward. The batch
 * carries the teacher's log-probs as `refLogprobs`. Metrics: `distill/reverse_kl` (the mean over trained tokens of
 * student − teacher log-prob), `distill/teacher_logprob_mean`, `critic/score_mean`, and the groups' counts and the
 * rollout's timing as `grpoPrepare` reports them.
 *
 * ```
 * groups:  --[A,B]------[C]--|
 * distillPrepare({ padId: 0, teacher })
 * output:  --x----------y----|      x = Batch of A's and B's rows, per-token advantages from the teacher
 * ```
 *
 * @example
 * ```ts
 * import { batchGroups, distillPrepare } from 'rxrl/operators';
 * groups$.pipe(batchGroups({ batchSize: 8 }), distillPrepare({ padId: tokenizer.padId, teacher: modelScorer(teacherModel) }));
 * ```
 * @param options - padding, the teacher and the reward's weight.
 * @returns an operator from arrays of groups to batches.
 * @see grpoPrepare
 */
export function distillPrepare(options: DistillPrepareOptions): OperatorFunction<readonly Group[], Batch> {
  const coef = options.rewardCoef ?? 0;
  if (!Number.isFinite(coef))
    throw new ConfigError(`distillPrepare rewardCoef must be finite, got ${coef}`, { context: { key: 'rewardCoef' } });
  return preparing(options.modelTag, async (rows, modelTag) => {
    const base = collate(rows, { padId: options.padId, modelTag, maxSeqLen: options.maxSeqLen });
    const teacher = base.size > 0 ? await options.teacher.responseLogprobs(base, options.signal) : new Float32Array(0);
    const R = base.responseLength;
    const advantages = new Float32Array(base.size * R);
    let tokens = 0;
    let kl = 0;
    let teacherSum = 0;
    for (let b = 0; b < base.size; b++) {
      for (let i = 0; i < R; i++) {
        const cell = b * R + i;
        if (base.lossMask[cell] === 0) continue;
        advantages[cell] = teacher[cell] - base.oldLogprobs[cell] + coef * rows[b].reward;
        kl += base.oldLogprobs[cell] - teacher[cell];
        teacherSum += teacher[cell];
        tokens++;
      }
    }
    const metrics: Metrics = {
      ...scoreMean(rows),
      'distill/reverse_kl': tokens === 0 ? 0 : kl / tokens,
      'distill/teacher_logprob_mean': tokens === 0 ? 0 : teacherSum / tokens,
      'batch/rows': base.size,
    };
    return { ...base, advantages, refLogprobs: teacher, metrics };
  });
}
