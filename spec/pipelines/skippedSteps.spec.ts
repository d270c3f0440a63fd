import { beforeAll, describe, expect, it } from 'vitest';

import { StepFailedError } from '../../lib/core/errors.js';
import { collate } from '../../lib/data/collate.js';
import { initBackend } from '../../lib/model/backend.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import { SkippedSteps } from '../../pipelines/parts/skippedSteps.js';
import { traj } from '../helpers/fixtures.js';

const config: PolicyConfig = { vocabSize: 9, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

/** Two samples of one prompt, with the given advantages (their log-probs 0: the ratio is off, the loss finite). */
function batch(advantages: number[]) {
  const rows = [0, 1].map((i) =>
    traj('g@0', i, { promptTokens: [1, 3], responseTokens: [5, 2], reward: i, logprobs: [-1, -1], lossMask: [1, 1] }),
  );
  return collate(rows, { padId: 0, modelTag: 'policy', advantages });
}

/** A real trainer on a one-layer model, counted; disposed after `body`. */
async function withTrainer(stopOnError: boolean, body: (steps: SkippedSteps, trainer: GrpoTrainer) => Promise<void>): Promise<void> {
  const model = PolicyModel.create(config, 1);
  const trainer = new GrpoTrainer(model, { learningRate: 1e-3 });
  try {
    await body(new SkippedSteps(stopOnError), trainer);
  } finally {
    trainer.dispose();
    model.dispose();
  }
}

describe('SkippedSteps: steps that trained nothing, under stop_on_error', () => {
  it('refuses a step of no rows before it is taken, naming the step; a batch emptied by a filter is no failure', async () => {
    await withTrainer(true, async (steps, trainer) => {
      const counted = steps.counting(trainer);
      await counted.trainStep(batch([1, -1]));
      const empty = collate([], { padId: 0, modelTag: 'policy' });
      const error = await counted.trainStep(empty).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(StepFailedError);
      expect((error as StepFailedError).context).toEqual({ step: 1, rows: 0 });
      expect(trainer.step).toBe(1);
      // Rejection sampling that no sample passed: the algorithm filtered the rows out.
      const filtered = { ...empty, metrics: { 'batch/rows_filtered': 4 } };
      expect((await counted.trainStep(filtered)).skipped).toBe(true);
      expect(steps.verdict()).toBeUndefined();
    });
  });

  it('fails a run whose every update was skipped, naming how many steps; one trained update is enough', async () => {
    await withTrainer(true, async (steps, trainer) => {
      const counted = steps.counting(trainer);
      expect(steps.verdict()).toBeUndefined();
      for (let i = 0; i < 3; i++) expect((await counted.trainStep(batch([Infinity, -Infinity]))).skipped).toBe(true);
      expect(steps.verdict()).toBeInstanceOf(StepFailedError);
      expect(steps.verdict()?.context).toEqual({ steps: 3, skipped: 3, modelTag: 'policy' });
      expect((await counted.trainStep(batch([1, -1]))).skipped).toBe(false);
      expect(steps.verdict()).toBeUndefined();
    });
  });

  it('counts each policy apart: the run fails when one policy skipped every update, naming it', async () => {
    const models = [PolicyModel.create(config, 1), PolicyModel.create(config, 2)];
    const trainers = models.map((model, i) => new GrpoTrainer(model, { learningRate: 1e-3, modelTag: ['writer', 'editor'][i] }));
    try {
      const steps = SkippedSteps.of('stop_on_error');
      const [writer, editor] = trainers.map((trainer) => steps.counting(trainer));
      expect((await writer.trainStep(batch([1, -1]))).skipped).toBe(false);
      for (let i = 0; i < 2; i++) expect((await editor.trainStep(batch([Infinity, -Infinity]))).skipped).toBe(true);
      const verdict = steps.verdict();
      expect(verdict).toBeInstanceOf(StepFailedError);
      expect(verdict?.context).toEqual({ steps: 2, skipped: 2, modelTag: 'editor' });
      expect(verdict?.message).toMatch(/^all 2 steps of policy 'editor' skipped their update/);
      expect(SkippedSteps.of('continue').verdict()).toBeUndefined();
    } finally {
      trainers.forEach((trainer) => trainer.dispose());
      models.forEach((model) => model.dispose());
    }
  });

  it('under continue refuses nothing', async () => {
    await withTrainer(false, async (steps, trainer) => {
      const counted = steps.counting(trainer);
      expect((await counted.trainStep(collate([], { padId: 0, modelTag: 'policy' }))).skipped).toBe(true);
      expect((await counted.trainStep(batch([Infinity, -Infinity]))).skipped).toBe(true);
      expect(steps.verdict()).toBeUndefined();
    });
  });
});
