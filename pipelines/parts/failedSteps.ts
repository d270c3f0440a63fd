/**
 * The outcomes of each admission batch's samples (one step's tasks), for the `stop_on_error` policy: a failed
 * sample stops the run once its batch's samples have all ended, and then
 *
 * ```
 * some sample of the batch succeeded   → the run stops gracefully (checkpoint, summary with `stoppedBy`)
 * every sample of the batch failed     → the run fails with a StepFailedError (no checkpoint of it, exit ≠ 0)
 * ```
 *
 * Waiting for the batch is what tells the two apart: its samples are in flight together, and the first to fail
 * says nothing of the others. The batch's step is never trained either way (the stop comes before its last sample
 * reaches the groups). A batch that never completes (the loader ended mid-batch, the run was cancelled) has its
 * failures given back by {@link StepOutcomes.pending}.
 *
 * @packageDocumentation
 */
import { StepFailedError } from '../../lib/core/errors.js';
import { isSampleFailure, type RolloutOutput, type SampleFailure } from '../../lib/core/types.js';

/** Admission batches kept behind the newest (older ones are trained, or far past being judged). */
export const KEPT_BATCHES = 16;

/** One admission batch. */
interface BatchOutcomes {
  tasks: number;
  ok: number;
  /** Failures in the order they ended. */
  readonly failures: SampleFailure[];
  /** Samples that ended neither well nor as failures (skipped episodes). */
  skipped: number;
}

/** What a batch whose samples have all ended comes to, when some failed. */
export interface BatchVerdict {
  readonly batch: number;
  /** Its failures, in the order they ended. */
  readonly failures: readonly SampleFailure[];
  /** A {@link StepFailedError} when no sample of the batch succeeded. */
  readonly failedStep: StepFailedError | undefined;
}

/** See the module comment. Fed by the run's admission and rollout hooks; a plain class, without a scheduler. */
export class StepOutcomes {
  private readonly batchOf = new Map<string, number>();
  private readonly batches = new Map<number, BatchOutcomes>();
  private newest = -1;

  /**
   * @param tasksPerBatch - Tasks admitted per step (`sync.generationBatchSize`, else `sync.batchSize`).
   * @param samplesPerTask - Samples of each task (`rollout.groupSize`).
   */
  constructor(
    private readonly tasksPerBatch: number,
    private readonly samplesPerTask: number,
  ) {}

  /** Task group `groupId` was admitted as the run's `index`-th task (0-based). */
  admitted(groupId: string, index: number): void {
    const batch = Math.floor(index / this.tasksPerBatch);
    this.batchOf.set(groupId, batch);
    const outcomes = this.batches.get(batch) ?? { tasks: 0, ok: 0, failures: [], skipped: 0 };
    outcomes.tasks++;
    this.batches.set(batch, outcomes);
    if (batch > this.newest) {
      this.newest = batch;
      this.forget(batch - KEPT_BATCHES);
    }
  }

  /**
   * A sample ended: with a trajectory, as a failure, or skipped (a failure marked `skipped`).
   *
   * @returns The batch's verdict when this sample was the last of a full batch with failures; else `undefined`.
   */
  ended(output: RolloutOutput): BatchVerdict | undefined {
    const batch = this.batchOf.get(output.groupId);
    const outcomes = batch === undefined ? undefined : this.batches.get(batch);
    if (batch === undefined || outcomes === undefined) return undefined;
    if (!isSampleFailure(output)) outcomes.ok++;
    else if (output.skipped === true) outcomes.skipped++;
    else outcomes.failures.push(output);
    const ended = outcomes.ok + outcomes.failures.length + outcomes.skipped;
    if (outcomes.tasks < this.tasksPerBatch || ended < outcomes.tasks * this.samplesPerTask || outcomes.failures.length === 0)
      return undefined;
    this.batches.delete(batch);
    return { batch, failures: outcomes.failures, failedStep: outcomes.ok === 0 ? failedStep(batch, outcomes.failures) : undefined };
  }

  /** The failures of batches not complete yet (a run that ends now): each batch's, oldest batch first. */
  pending(): SampleFailure[] {
    return [...this.batches.entries()].sort(([a], [b]) => a - b).flatMap(([, outcomes]) => outcomes.failures);
  }

  /** Forgets the batches before `before` and their groups, but for those holding failures not yet judged. */
  private forget(before: number): void {
    for (const [batch, outcomes] of this.batches) if (batch < before && outcomes.failures.length === 0) this.batches.delete(batch);
    for (const [groupId, batch] of this.batchOf) if (batch < before && !this.batches.has(batch)) this.batchOf.delete(groupId);
  }
}

function failedStep(batch: number, failures: readonly SampleFailure[]): StepFailedError {
  const first = failures[0].error;
  return new StepFailedError(
    `every sample of step ${batch} failed (${failures.length}): under stop_on_error the run fails; the first: ${first instanceof Error ? first.message : String(first)}`,
    { cause: first, context: { batch, failed: failures.length } },
  );
}
