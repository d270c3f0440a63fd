import { describe, expect, it } from 'vitest';

import { EvaluationError, StepFailedError } from '../../lib/core/errors.js';
import type { RolloutOutput } from '../../lib/core/types.js';
import { KEPT_BATCHES, StepOutcomes } from '../../pipelines/parts/failedSteps.js';

const ok = (groupId: string, runId: number): RolloutOutput => ({ groupId, runId, id: `${groupId}/${runId}` }) as unknown as RolloutOutput;
const failed = (groupId: string, runId: number, skipped = false): RolloutOutput => ({
  kind: 'sample-failure',
  id: `${groupId}/${runId}`,
  taskId: groupId,
  groupId,
  runId,
  modelTag: 'policy',
  error: new EvaluationError(`judge down on ${groupId}`),
  ...(skipped ? { skipped } : {}),
});

describe('StepOutcomes: a step is judged once its samples have all ended', () => {
  it('says nothing until the last sample of a full batch; a batch with a success is no failed step', () => {
    const outcomes = new StepOutcomes(2, 2);
    outcomes.admitted('a', 0);
    expect(outcomes.ended(failed('a', 0))).toBeUndefined(); // the batch is not full yet
    outcomes.admitted('b', 1);
    outcomes.admitted('c', 2);
    expect(outcomes.ended(failed('a', 1))).toBeUndefined();
    expect(outcomes.ended(ok('b', 0))).toBeUndefined();
    const verdict = outcomes.ended(ok('b', 1));
    expect(verdict?.batch).toBe(0);
    expect(verdict?.failures.map((f) => f.id)).toEqual(['a/0', 'a/1']);
    expect(verdict?.failedStep).toBeUndefined();
    expect(outcomes.pending()).toEqual([]);
  });

  it('calls a batch whose every sample failed a failed step, with the first failure as its cause; skipped samples count as ended', () => {
    const outcomes = new StepOutcomes(1, 3);
    outcomes.admitted('a', 0);
    outcomes.ended(failed('a', 0));
    outcomes.ended(failed('a', 1, true));
    const verdict = outcomes.ended(failed('a', 2));
    expect(verdict?.failedStep).toBeInstanceOf(StepFailedError);
    expect(verdict?.failedStep?.cause).toBe((verdict?.failures[0] as { error: unknown }).error);
    expect(verdict?.failedStep?.context).toEqual({ batch: 0, failed: 2 });
  });

  it('gives back the failures of batches that never completed, and forgets old batches without failures only', () => {
    const outcomes = new StepOutcomes(1, 2);
    outcomes.admitted('hung', 0);
    outcomes.ended(failed('hung', 0)); // its other sample never ends
    for (let i = 1; i <= KEPT_BATCHES + 4; i++) {
      outcomes.admitted(`t${i}`, i);
      outcomes.ended(ok(`t${i}`, 0));
    }
    outcomes.admitted('late', KEPT_BATCHES + 5);
    outcomes.ended(failed('late', 0));
    expect(outcomes.pending().map((f) => f.id)).toEqual(['hung/0', 'late/0']);
    expect(outcomes.ended(ok('t1', 1))).toBeUndefined(); // forgotten
  });
});
