/**
 * Steps that trained nothing, for the `stop_on_error` policy:
 *
 * ```
 * a step is given a batch of no rows, none  → the run fails with a StepFailedError before that step trains
 * of them filtered out by the algorithm        (every sample was lost: an engine answering for no model, ...)
 * the run ends and every step of this process skipped its update (non-finite loss or gradient)
 *                                            → the run fails with a StepFailedError naming how many steps
 * ```
 *
 * Each policy is counted apart (a multi-agent run's `modelTag`s): the run fails when one of them skipped every update.
 *
 * A step left with no rows by the algorithm's own filters (`batch/rows_filtered`: rejection sampling that no sample
 * passed, groups of equal rewards) is no failure. Under `continue` nothing is refused: a step of no rows counts
 * `actor/skipped_empty`, a skipped update `actor/skipped_nonfinite`, and the run goes on.
 *
 * @packageDocumentation
 */
import { StepFailedError } from '../../lib/core/errors.js';
import type { ModelTag } from '../../lib/core/types.js';
import type { ErrorPolicy } from '../../lib/observe/errorReporter.js';
import type { Trainer } from '../../lib/train/types.js';

/** See the module comment. One per attempt of a run; a plain class, without a scheduler. */
export class SkippedSteps {
  /** Per policy, the steps taken and those whose update was skipped. */
  private readonly counts = new Map<ModelTag, { trained: number; skipped: number }>();

  /** @param stopOnError - Whether the run's policy is `stop_on_error` (else nothing is refused). */
  constructor(private readonly stopOnError: boolean) {}

  /** The counter of a run whose error policy is `errorPolicy` (`run.errorPolicy`). */
  static of(errorPolicy: ErrorPolicy): SkippedSteps {
    return new SkippedSteps(errorPolicy === 'stop_on_error');
  }

  /**
   * `trainer`, counting its steps and the skipped ones; under `stop_on_error` a batch of no rows, none filtered out,
   * is refused before the step is taken (so no checkpoint holds it).
   */
  counting(trainer: Trainer): Trainer {
    const count = { trained: 0, skipped: 0 };
    this.counts.set(trainer.modelTag, count);
    return {
      modelTag: trainer.modelTag,
      get step() {
        return trainer.step;
      },
      trainStep: async (batch, signal) => {
        if (this.stopOnError && batch.size === 0 && (batch.metrics?.['batch/rows_filtered'] ?? 0) === 0) {
          throw new StepFailedError(
            `step ${trainer.step} has no rows to train on (every sample of it was lost): under stop_on_error the run fails`,
            { context: { step: trainer.step, rows: 0 } },
          );
        }
        const result = await trainer.trainStep(batch, signal);
        count.trained++;
        if (result.skipped) count.skipped++;
        return result;
      },
    };
  }

  /**
   * Under `stop_on_error`, when this process took steps of a policy and skipped every update: the error that fails the
   * run (`context`: `steps`, `skipped`, `modelTag`; the first such policy in the order they were counted).
   */
  verdict(): StepFailedError | undefined {
    if (!this.stopOnError) return undefined;
    for (const [modelTag, { trained, skipped }] of this.counts) {
      if (trained === 0 || skipped < trained) continue;
      const of = this.counts.size > 1 ? `policy '${modelTag}'` : 'the run';
      return new StepFailedError(
        `all ${trained} steps of ${of} skipped their update (a non-finite loss or gradient): nothing was trained, and under stop_on_error the run fails`,
        { context: { steps: trained, skipped, modelTag } },
      );
    }
    return undefined;
  }
}
