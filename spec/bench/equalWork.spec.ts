import { describe, expect, it } from 'vitest';

import { EQUAL_WORK_SET, equalWorkLine, stepParts, type WorkStep } from '../../bench/_equalWork.js';
import { seedsLine, summaryLine, trlBenchOptions, type SideResult } from '../../bench/trl.js';

const step = (total: number, parts: Partial<WorkStep> = {}): WorkStep => ({
  total_s: total,
  rows: 16,
  mean_length: 16,
  generate_s: total / 2,
  forward_backward_s: total / 4,
  optimizer_s: 0.1,
  ...parts,
});
const bounds = { generate_bound_s: 1, train_bound_s: 2, decode_memory_bound_s: 0.5, generate_flops_bound_s: 1 };

describe('bench trl --equal-work', () => {
  it('turns dynamic sampling off and every completion to its length on rxrl’s side', () => {
    expect(trlBenchOptions(['--equal-work']).equalWork).toBe(true);
    expect(trlBenchOptions([]).equalWork).toBe(false);
    expect(EQUAL_WORK_SET).toEqual([
      'rollout.ignoreEos=true',
      'algorithm.filterZeroVariance=false',
      'sync.generationBatchSize=null',
      'trainer.skipZeroAdvantage=false',
    ]);
  });

  it('splits a side’s median step into sampling, forward/backward, optimizer and the rest', () => {
    expect(stepParts([step(4), step(8), step(6)])).toEqual({
      step_s: 6,
      sampling_s: 3,
      forward_backward_s: 1.5,
      optimizer_s: 0.1,
      other_s: 1.4,
    });
    expect(stepParts([{ total_s: 2 }])).toEqual({
      step_s: 2,
      sampling_s: null,
      forward_backward_s: null,
      optimizer_s: null,
      other_s: null,
    });
  });

  it('gives TRL’s seconds over rxrl’s, part by part, and each part over its bound', () => {
    const line = equalWorkLine({ rxrl: [step(4), step(4)], trl: [step(10), step(10)] }, bounds);
    expect(line).toMatchObject({
      bench: 'trl-equal-work',
      same_work: true,
      work: { rxrl: { rows: [16], tokens_per_row: [16] }, trl: { rows: [16], tokens_per_row: [16] } },
      bounds: { sampling_s: 1, sampling_memory_s: 0.5, forward_backward_s: 2 },
      over_bound: {
        rxrl: { sampling: 2, sampling_memory: 4, forward_backward: 0.5 },
        trl: { sampling: 5, sampling_memory: 10, forward_backward: 1.25 },
      },
      arithmetic_over_memory: 2,
      trl_over_rxrl: { step_s: 2.5, sampling_s: 2.5, forward_backward_s: 2.5, optimizer_s: 1 },
      equal_work_step_ratio: 2.5,
    });
  });

  it('has no ratio unless both sides trained the same rows of the same length on every step', () => {
    const shorter = equalWorkLine({ rxrl: [step(4), step(4, { mean_length: 9.5 })], trl: [step(10), step(10)] }, bounds);
    expect(shorter).toMatchObject({ same_work: false, work: { rxrl: { tokens_per_row: [9.5, 16] } }, equal_work_step_ratio: null });
    const fewer = equalWorkLine({ rxrl: [step(4, { rows: 8 })], trl: [step(10)] }, bounds);
    expect(fewer).toMatchObject({ same_work: false, equal_work_step_ratio: null });
    expect(equalWorkLine({ rxrl: [step(4)] }, bounds)).toMatchObject({ same_work: false, equal_work_step_ratio: null });
  });

  it('labels what the summary’s step ratio measures, and the seeds’ table follows it', () => {
    const side = (total: number): SideResult => ({ steps: [], vals: [], before: null, after: null, extra: { total } });
    const learning = summaryLine(2, 0.75, { rxrl: side(1), trl: side(2) });
    expect(learning).toMatchObject({ work: 'learning-run' });
    expect(learning).toHaveProperty('step_time_ratio');
    const equal = summaryLine(2, 0.75, { rxrl: side(1), trl: side(2) }, 2.14);
    expect(equal).toMatchObject({ work: 'equal', equal_work_step_ratio: 2.14 });
    expect(equal).not.toHaveProperty('step_time_ratio');
    const table = seedsLine([
      { seed: 1, work: 'equal', rxrl_gain: 0, trl_gain: 0, equal_work_step_ratio: 2.1 },
      { seed: 2, work: 'equal', rxrl_gain: 0, trl_gain: 0, equal_work_step_ratio: 1.9 },
    ]);
    expect(table).toMatchObject({
      seeds: [{ equal_work_step_ratio: 2.1 }, { equal_work_step_ratio: 1.9 }],
      equal_work_step_ratio_min: 1.9,
    });
    expect(table).not.toHaveProperty('step_time_ratio_min');
  });
});
