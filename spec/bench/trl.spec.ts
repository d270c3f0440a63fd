import { spawn } from 'node:child_process';
import { mkdtemp, readFile, readdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

import { missedLine, seedsLine, summaryLine, timeToTarget, trlBenchOptions, type SideResult, type StepRow } from '../../bench/trl.js';
import { ConfigError } from '../../lib/core/errors.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';

const root = resolve(import.meta.dirname, '..', '..');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

function bench(args: readonly string[]): Promise<{ code: number | null; lines: Record<string, unknown>[]; stderr: string }> {
  const child = spawn(process.execPath, [join(root, 'dist', 'bench', 'run.js'), 'trl', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((done) =>
    child.on('exit', (code) =>
      done({
        code,
        stderr,
        lines: stdout
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>),
      }),
    ),
  );
}

const row = (step: number, total_s: number): StepRow => ({
  step,
  total_s,
  rollout_s: total_s / 2,
  train_s: total_s / 2,
  reward_mean: 0,
  tokens_per_s: 1,
  pg_loss: 0,
  clipfrac: 0,
});
const side = (totals: number[], vals: [number, number][]): SideResult => ({
  steps: totals.map((t, i) => row(i, t)),
  vals: vals.map(([step, reward]) => ({ step, reward })),
  before: null,
  after: null,
  extra: {},
});

describe('bench trl: time to the target', () => {
  it('sums the seconds of the steps up to the validation that first reaches the target', () => {
    const s = side(
      [1, 2, 3, 4],
      [
        [-1, 0.1],
        [1, 0.5],
        [3, 0.8],
      ],
    );
    expect(timeToTarget(s, 0.5)).toEqual({ seconds: 3, steps: 2 });
    expect(timeToTarget(s, 0.75)).toEqual({ seconds: 10, steps: 4 });
    expect(timeToTarget(s, 0.05)).toEqual({ seconds: 0, steps: 0 });
    expect(timeToTarget(s, 0.9)).toBeNull();
  });

  it("gives TRL's seconds over rxrl's, or null where a side never reaches the target or rxrl needed no step", () => {
    const rxrl = side(
      [1, 1, 1, 1],
      [
        [-1, 0.1],
        [1, 0.8],
      ],
    );
    const trl = side(
      [3, 3, 3, 3],
      [
        [-1, 0.1],
        [1, 0.5],
        [3, 0.8],
      ],
    );
    expect(summaryLine(4, 0.75, { rxrl, trl })).toMatchObject({
      rxrl_time_to_target_s: 2,
      trl_time_to_target_s: 12,
      time_to_target_ratio: 6,
      step_time_ratio: 3,
    });
    expect(summaryLine(4, 0.85, { rxrl, trl })).toMatchObject({
      rxrl_time_to_target_s: null,
      trl_time_to_target_s: null,
      time_to_target_ratio: null,
    });
    expect(summaryLine(4, 0.75, { rxrl: side([1], [[-1, 0.1]]), trl })).toMatchObject({
      rxrl_time_to_target_s: null,
      trl_time_to_target_s: 12,
      time_to_target_ratio: null,
    });
    expect(summaryLine(4, 0.05, { rxrl, trl })).toMatchObject({
      rxrl_time_to_target_s: 0,
      trl_time_to_target_s: 0,
      time_to_target_ratio: null,
    });
    expect(summaryLine(4, 0.75, { rxrl })).toMatchObject({ trl_time_to_target_s: null, time_to_target_ratio: null, step_time_ratio: null });
  });
});

describe('bench trl: the questions each side misses', () => {
  it("lists both sides' misses and those they share, only when both reported them", () => {
    const rxrl = { ...side([1], [[-1, 0.1]]), missed: ['q1', 'q4', 'q7'] };
    const trl = { ...side([1], [[-1, 0.1]]), missed: ['q2', 'q4', 'q7', 'q9'] };
    expect(missedLine({ rxrl, trl })).toEqual({
      bench: 'trl-missed',
      rxrl: ['q1', 'q4', 'q7'],
      trl: ['q2', 'q4', 'q7', 'q9'],
      both: ['q4', 'q7'],
    });
    expect(missedLine({ rxrl })).toBeUndefined();
    expect(missedLine({ rxrl: side([1], []), trl })).toBeUndefined();
  });
});

describe('the seeds line', () => {
  it('tabulates each seed, the mean gains, the mean paired difference with its standard error, and the slowest ratio', () => {
    const line = seedsLine([
      { seed: 1, rxrl_gain: 0.8, trl_gain: 0.85, step_time_ratio: 3.4, time_to_target_ratio: 4.6 },
      { seed: 2, rxrl_gain: 0.9, trl_gain: 0.85, step_time_ratio: 3.1, time_to_target_ratio: null },
      { seed: 3, rxrl_gain: 0.7, trl_gain: 0.6, step_time_ratio: 3.3, time_to_target_ratio: 2 },
    ]);
    expect(line).toMatchObject({
      bench: 'trl-seeds',
      rxrl_gain_mean: 0.8,
      trl_gain_mean: 0.767,
      diff_mean: 0.033,
      rxrl_at_least_trl: '2/3',
      step_time_ratio_min: 3.1,
    });
    // Differences -0.05, 0.05, 0.1: sample SD 0.0764, over √3.
    expect(line.diff_se).toBeCloseTo(0.044, 3);
    expect((line.seeds as Record<string, unknown>[])[1]).toEqual({
      seed: 2,
      rxrl_gain: 0.9,
      trl_gain: 0.85,
      diff: 0.05,
      step_time_ratio: 3.1,
      time_to_target_ratio: null,
    });
  });

  it('leaves out what a side did not measure (TRL not run), and has no error for one difference', () => {
    const line = seedsLine([
      { seed: 1, rxrl_gain: 0.5, trl_gain: null, step_time_ratio: null },
      { seed: 2, rxrl_gain: 0.7, trl_gain: 0.6, step_time_ratio: 2 },
    ]);
    expect(line).toMatchObject({ rxrl_gain_mean: 0.6, trl_gain_mean: 0.6, diff_mean: 0.1, diff_se: null, rxrl_at_least_trl: '1/1' });
  });

  it('names the sampling seed of each seed that had one (--sampling-seed)', () => {
    const line = seedsLine([{ seed: 3, sampling_seed: 101, rxrl_gain: 0.6, trl_gain: 0.75 }]);
    expect((line.seeds as Record<string, unknown>[])[0]).toMatchObject({ seed: 3, sampling_seed: 101, diff: -0.15 });
  });
});

describe("bench trl's flags", () => {
  it('defaults to 50 steps of the LoRA recipe on seed 1, and reads a seed list, the side, the backend and --set', () => {
    const defaults = trlBenchOptions([]);
    expect(defaults).toMatchObject({
      steps: 50,
      threads: 2,
      target: 0.75,
      valEvery: 10,
      only: '',
      backend: 'tensorflow',
      seeds: [1],
      overrides: [],
    });
    expect(defaults.recipe).toBe(resolve('recipes/smollm2-arithmetic.yaml'));
    expect(defaults.out).toBe(resolve('runs/bench-trl-smollm2-arithmetic'));
    const set = trlBenchOptions([
      '--seeds',
      '1,2,3',
      '--only',
      'rxrl',
      '--backend',
      'wasm',
      '--steps',
      '4',
      '--set',
      'a=1',
      '--set',
      'b=2',
    ]);
    expect(set).toMatchObject({ seeds: [1, 2, 3], only: 'rxrl', backend: 'wasm', steps: 4, overrides: ['a=1', 'b=2'] });
    expect(trlBenchOptions(['--seed', '0']).seeds).toEqual([0]);
    expect(trlBenchOptions(['--paired', '--sampling-seed', '0'])).toMatchObject({ paired: true, samplingSeed: 0 });
    expect(defaults.samplingSeed).toBeUndefined();
  });

  it('refuses a malformed flag with a ConfigError naming it, before anything runs', () => {
    const cases: [string[], RegExp][] = [
      [['--steps', 'ten'], /--steps must be an integer >= 1, got ten/],
      [['--steps', '0'], /--steps must be an integer >= 1/],
      [['--threads', '1.5'], /--threads must be an integer >= 1/],
      [['--val-every', '-1'], /--val-every must be an integer >= 1/],
      [['--seeds', '1,,3'], /--seeds must list integers >= 0, got 1,,3/],
      [['--seed', 'x'], /--seeds must list integers >= 0/],
      [['--target', 'high'], /--target must be a held-out reward, got high/],
      [['--only', 'both'], /--only must be rxrl or trl, got both/],
      [['--backend', 'webgpu'], /--backend must be one of auto, tensorflow, wasm, cpu, got webgpu/],
      [['--paired', '--sampling-seed', '1.5'], /--sampling-seed must be an integer >= 0, got 1.5/],
      // Without --paired rxrl's run.seed draws its prompt order, adapter and held-out questions too.
      [['--sampling-seed', '7'], /--sampling-seed needs --paired/],
    ];
    for (const [args, message] of cases) {
      expect(() => trlBenchOptions(args), args.join(' ')).toThrow(ConfigError);
      expect(() => trlBenchOptions(args), args.join(' ')).toThrow(message);
    }
  });
});

describe('npm run bench -- trl', () => {
  it("exports the recipe's task with rxrl's prompt ids, runs rxrl's side and writes the comparison and its report", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-bench-trl-'));
    const recipe = join(dir, 'tiny.yaml');
    // The SmolLM2 recipe on the tiny Qwen2 fixture.
    const text = await readFile(join(root, 'recipes', 'smollm2-arithmetic.yaml'), 'utf8');
    await writeFile(recipe, text.replace(/path: .*SmolLM2-135M-Instruct/, `path: ${fixture}`));
    const out = join(dir, 'out');
    // The tiny model scores 0 everywhere: without the recipe's dynamic sampling every step trains (and has parts).
    const plain = ['--set', 'algorithm.filterZeroVariance=false', '--set', 'sync.generationBatchSize=4'];
    // rxrl's side only, on wasm, validating after every step.
    const rxrlSide = (steps: number, to: string, more: readonly string[]) =>
      bench([
        ...more,
        '--steps',
        String(steps),
        '--val-every',
        '1',
        '--only',
        'rxrl',
        '--backend',
        'wasm',
        '--recipe',
        recipe,
        '--out',
        to,
      ]);
    const { code, lines, stderr } = await rxrlSide(2, out, [...plain, '--target', '0']);
    expect(code, stderr).toBe(0);

    const [header] = lines;
    expect(header).toMatchObject({
      bench: 'trl',
      steps: 2,
      settings: { rows: 16, microBatchSize: 8, groupSize: 4, maxTokens: 16, lossType: 'dapo', scaleRewards: 'group' },
    });
    expect((header.settings as { lora: { rank: number } }).lora.rank).toBe(16);
    expect(header.rxrl_only).toEqual({});
    expect(lines.at(-1)!.rxrl_only).toEqual({});
    const steps = lines.filter((l) => l.side === 'rxrl' && typeof l.step === 'number');
    expect(steps.map((s) => s.step)).toEqual([0, 1]);
    for (const s of steps) {
      expect(Number(s.rollout_s) + Number(s.train_s)).toBeCloseTo(Number(s.total_s), 6);
      // rxrl's own parts: the trainer's inside its step; generating and scoring inside the wait for the batch.
      expect(Number(s.forward_backward_s) + Number(s.optimizer_s)).toBeLessThanOrEqual(Number(s.trainer_s));
      expect(Number(s.generate_s)).toBeGreaterThan(0);
      expect(Number(s.generate_s)).toBeLessThanOrEqual(Number(s.wait_s));
    }
    const summary = lines.find((l) => l.side === 'rxrl' && 'step_s_median' in l);
    expect(summary).toMatchObject({ backend: 'wasm', steps: 2, val_before: { reward: expect.any(Number), format: expect.any(Number) } });
    for (const part of ['generate_s', 'reward_s', 'forward_backward_s', 'optimizer_s', 'trainer_s', 'sync_s'])
      expect(summary![`${part}_median`]).toEqual(expect.any(Number));
    // Scored before training and after each step; the run's end reuses the last step's scores.
    expect((summary!.val_curve as number[][]).map(([step]) => step)).toEqual([-1, 0, 1]);
    // A target of 0 is met before any training: no seconds, no steps.
    expect(summary).toMatchObject({ target: 0, time_to_target_s: 0, time_to_target_steps: 0 });
    const bounds = lines.find((l) => l.bench === 'trl-bounds')!;
    expect(bounds).toMatchObject({
      backend: 'wasm',
      gflops: expect.any(Number),
      bandwidthGBs: expect.any(Number),
      measured: { rxrl: { generate_s: expect.any(Number), train_s: expect.any(Number) } },
    });
    expect(Number(bounds.train_bound_s)).toBeGreaterThan(0);
    // TRL did not run: no ratio of times to the target.
    expect(lines.at(-1)).toMatchObject({
      bench: 'trl-summary',
      steps: 2,
      trl_gain: null,
      step_time_ratio: null,
      target: 0,
      rxrl_time_to_target_s: 0,
      trl_time_to_target_s: null,
      time_to_target_ratio: null,
    });
    expect(typeof lines.at(-1)!.rxrl_gain).toBe('number');
    // rxrl's held-out samples of its last validation are kept as text; without TRL's there is no comparison line.
    const kept = (await readFile(join(out, 'rxrl', 'validation', '2.jsonl'), 'utf8')).trim().split('\n');
    expect(kept).toHaveLength(64);
    expect(lines.some((l) => l.bench === 'trl-missed')).toBe(false);

    // Each exported prompt is its rendered text and the ids rxrl sampled from: the tokenizer gives the one from the other.
    const tokenizer = await loadTokenizer(fixture);
    const rows = (await readFile(join(out, 'data', 'validation.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { prompt: string; prompt_ids: number[]; answer: string });
    expect(rows).toHaveLength(64);
    for (const row of rows.slice(0, 8)) {
      expect(row.prompt).toContain('Answer with the equation only');
      expect(tokenizer.encode(row.prompt)).toEqual(row.prompt_ids);
    }
    const metrics = await readFile(join(out, 'metrics.jsonl'), 'utf8');
    expect(metrics).toContain('"rxrl/rollout/reward_mean"');
    expect(metrics).toContain('"rxrl/timing/generate_s"');
    // Held-out scores once per step they follow: before training, after step 0 and after step 1.
    const valSteps = metrics
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>)
      .filter((l) => 'rxrl/val/reward_mean' in l)
      .map((l) => l.step);
    expect(valSteps).toEqual([-1, 0, 1]);
    expect(await readFile(join(out, 'report.html'), 'utf8')).toContain('rxrl and TRL');

    // The recipe as it is: its dynamic sampling runs on rxrl's side only, and the header and the summary say so. Here
    // every group is filtered, so the step trains nothing; its reward is still that of every sample, as TRL's is.
    const own = await rxrlSide(1, join(dir, 'own'), []);
    expect(own.code, own.stderr).toBe(0);
    expect(own.lines[0].rxrl_only).toEqual({ 'algorithm.filterZeroVariance': true, 'sync.generationBatchSize': 8 });
    expect(own.lines.at(-1)!.rxrl_only).toEqual(own.lines[0].rxrl_only);
    expect(own.lines.find((l) => l.side === 'rxrl' && l.step === 0)).toMatchObject({ reward_mean: 0 });

    // --seeds: each seed's comparison in its own directory, each summary naming its seed, then the table.
    const seeds = await rxrlSide(1, join(dir, 'seeds'), [...plain, '--seeds', '1,2']);
    expect(seeds.code, seeds.stderr).toBe(0);
    expect(seeds.lines.filter((l) => l.bench === 'trl-summary').map((l) => l.seed)).toEqual([1, 2]);
    expect((await readdir(join(dir, 'seeds'))).sort()).toEqual(['seed-1', 'seed-2']);
    const table = seeds.lines.at(-1)!;
    expect(table).toMatchObject({ bench: 'trl-seeds', trl_gain_mean: null, diff_mean: null, rxrl_at_least_trl: '0/0' });
    expect((table.seeds as { seed: number }[]).map((r) => r.seed)).toEqual([1, 2]);

    // --paired hands rxrl TRL's prompt order as arithmetic tasks in a JSONL file: other data is refused before either
    // side runs (the order and the adapter themselves come from TRL's own trainer, which tests do not install).
    const bundled = await rxrlSide(1, join(dir, 'paired'), [...plain, '--paired', '--set', 'data.source=bundled']);
    expect(bundled.code).not.toBe(0);
    expect(bundled.stderr).toContain('bench trl --paired: the recipe must use data.source arithmetic');
    expect(bundled.lines.some((l) => l.side === 'rxrl')).toBe(false);
  }, 180_000);
});
