/**
 * `bench trl --equal-work`: rxrl's and TRL's steps compared on the same work. Both sides generate the same rows to
 * the same length (`rollout.ignoreEos` on rxrl's side, `min_new_tokens` on TRL's, so no completion stops early) and
 * train every one of them (no dynamic sampling, no zero-variance filtering, and every micro-batch differentiated,
 * `trainer.skipZeroAdvantage` false, as TRL's trainer differentiates its rows whatever their advantages), so a step's seconds on each side buy
 * the same rows and tokens. The `trl-equal-work` line gives each side's median step and its parts (sampling,
 * forward/backward, optimizer, the rest), the same parts' lower bounds on this machine (`bench/_bounds.ts`), each
 * part over its bound, and TRL's seconds over rxrl's: `equal_work_step_ratio` for the whole step. Sampling is also
 * set beside reading every weight once a token alone (`sampling_memory`), with `arithmetic_over_memory`: the
 * generation's FLOPs at the measured sgemm rate over that read, the least any sampler on this machine is over it.
 *
 * @packageDocumentation
 */
import type { StepBounds } from './_bounds.js';
import { median } from './_stats.js';

/**
 * The `--set` assignments that make rxrl's side do the work TRL's does: every completion to `rollout.maxTokens`,
 * one rollout batch of `sync.batchSize` prompts a step, every row trained through a backward pass.
 */
export const EQUAL_WORK_SET: readonly string[] = [
  'rollout.ignoreEos=true',
  'algorithm.filterZeroVariance=false',
  'sync.generationBatchSize=null',
  'trainer.skipZeroAdvantage=false',
];

/** What an equal-work comparison reads of one step of either side. */
export interface WorkStep {
  readonly total_s: number;
  /** Rows trained. */
  readonly rows?: number | undefined;
  /** Mean completion tokens of the step's rows. */
  readonly mean_length?: number | undefined;
  readonly generate_s?: number | undefined;
  readonly forward_backward_s?: number | undefined;
  readonly optimizer_s?: number | undefined;
}

/** The parts of a step the line compares, in order; `other_s` is the step less the three others. */
const PARTS = ['step_s', 'sampling_s', 'forward_backward_s', 'optimizer_s', 'other_s'] as const;
type Part = (typeof PARTS)[number];

const round = (x: number, digits = 3): number => Number(x.toFixed(digits));

/** Median of the finite values, or null when there are none. */
function medianOf(values: readonly (number | undefined)[]): number | null {
  const finite = values.filter((v): v is number => v !== undefined && Number.isFinite(v));
  return finite.length === 0 ? null : median(finite);
}

/** One side's median step split into the compared parts (null where the side does not measure a part). */
export function stepParts(steps: readonly WorkStep[]): Record<Part, number | null> {
  const step = medianOf(steps.map((s) => s.total_s));
  const sampling = medianOf(steps.map((s) => s.generate_s));
  const forwardBackward = medianOf(steps.map((s) => s.forward_backward_s));
  const optimizer = medianOf(steps.map((s) => s.optimizer_s));
  const known = [step, sampling, forwardBackward, optimizer];
  const other = known.every((v) => v !== null) ? step! - sampling! - forwardBackward! - optimizer! : null;
  const parts = { step_s: step, sampling_s: sampling, forward_backward_s: forwardBackward, optimizer_s: optimizer, other_s: other };
  return Object.fromEntries(PARTS.map((p) => [p, parts[p] === null ? null : round(parts[p]!)])) as Record<Part, number | null>;
}

/** The rows and completion tokens a side's steps did: the same on every step, or the spread where they differ. */
function workOf(steps: readonly WorkStep[]): { rows: number[]; tokens_per_row: number[] } {
  const distinct = (values: (number | undefined)[]): number[] =>
    [...new Set(values.filter((v): v is number => v !== undefined && Number.isFinite(v)).map((v) => round(v, 2)))].sort((a, b) => a - b);
  return { rows: distinct(steps.map((s) => s.rows)), tokens_per_row: distinct(steps.map((s) => s.mean_length)) };
}

/**
 * The `trl-equal-work` line. `equal_work_step_ratio` (TRL's median step over rxrl's) is null unless both sides
 * trained the same rows of the same length on every step (`same_work`), which the line shows per side.
 */
export function equalWorkLine(
  sides: { readonly rxrl?: readonly WorkStep[] | undefined; readonly trl?: readonly WorkStep[] | undefined },
  bounds: Pick<StepBounds, 'generate_bound_s' | 'train_bound_s' | 'decode_memory_bound_s' | 'generate_flops_bound_s'>,
): Record<string, unknown> {
  const rxrl = sides.rxrl === undefined ? undefined : stepParts(sides.rxrl);
  const trl = sides.trl === undefined ? undefined : stepParts(sides.trl);
  const work = { rxrl: sides.rxrl && workOf(sides.rxrl), trl: sides.trl && workOf(sides.trl) };
  const same =
    work.rxrl !== undefined &&
    work.trl !== undefined &&
    work.rxrl.rows.length === 1 &&
    work.rxrl.tokens_per_row.length === 1 &&
    JSON.stringify(work.rxrl) === JSON.stringify(work.trl);
  const ratio = (a: number | null | undefined, b: number | null | undefined): number | null =>
    a === null || a === undefined || b === null || b === undefined || b <= 0 ? null : round(a / b, 2);
  const overBound = (parts: Record<Part, number | null> | undefined): Record<string, number | null> | undefined =>
    parts && {
      sampling: ratio(parts.sampling_s, bounds.generate_bound_s),
      sampling_memory: ratio(parts.sampling_s, bounds.decode_memory_bound_s),
      forward_backward: ratio(parts.forward_backward_s, bounds.train_bound_s),
    };
  return {
    bench: 'trl-equal-work',
    same_work: same,
    work,
    rxrl,
    trl,
    bounds: {
      sampling_s: round(bounds.generate_bound_s),
      sampling_memory_s: round(bounds.decode_memory_bound_s),
      forward_backward_s: round(bounds.train_bound_s),
    },
    over_bound: { rxrl: overBound(rxrl), trl: overBound(trl) },
    // The least any sampler can be over the memory bound here: the generation's arithmetic at the sgemm rate.
    arithmetic_over_memory: ratio(bounds.generate_flops_bound_s, bounds.decode_memory_bound_s),
    // TRL's seconds over rxrl's, part by part (above 1: rxrl is faster).
    trl_over_rxrl: Object.fromEntries(PARTS.map((p) => [p, ratio(trl?.[p], rxrl?.[p])])),
    equal_work_step_ratio: same ? ratio(trl?.step_s, rxrl?.step_s) : null,
  };
}
