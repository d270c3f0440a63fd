/**
 * `npm run bench -- trl [--steps 50] [--seed 1] [--recipe recipes/smollm2-arithmetic.yaml] [--out runs/bench-trl]
 * [--threads 2] [--only rxrl|trl] [--backend tensorflow]`
 *
 * rxrl beside TRL on the same GRPO run. From one recipe (by default SmolLM2-135M-Instruct learning arithmetic with
 * a LoRA adapter; build the model first with `npm run model:smollm2`):
 *
 * 1. exports the task as JSONL (`<out>/data`: each prompt rendered in the model's chat template, its token ids and
 *    the answer); TRL's side checks that its tokenizer gives the same ids;
 * 2. trains it with `rxrl run` on the native backend (`--backend`), in `<out>/rxrl`, validating before and after only;
 * 3. trains it with TRL's `GRPOTrainer` (`bench/trl_grpo.py`: PyTorch CPU, `--threads` threads, the reward ported
 *    to Python in `bench/trl_reward.py`) with the recipe's settings mapped to `GRPOConfig`: prompts per step and
 *    group size (the batch of completions, in the trainer's micro-batches), learning rate (constant, Adam, no
 *    weight decay), LoRA rank, alpha and target modules, max new tokens, temperature and top-p, KL coefficient,
 *    clip range (low and high), PPO epochs, gradient clipping, advantage scaling by the group's standard deviation,
 *    and token-mean loss aggregation as `loss_type` `dapo` (a recipe TRL cannot match, say a dual clip or a
 *    population std, is refused; rxrl's side takes TRL's advantage epsilon, 1e-4; spec/train/trlParity.spec.ts
 *    checks on one batch that both sides then compute the same step);
 * 4. prints, for each side, one JSON line per step (seconds, the rollout and training parts, completion tokens per
 *    second, reward) and one summary (median seconds per step, tokens per second, held-out reward before and after),
 *    writes both curves to `<out>/metrics.jsonl` (metrics prefixed `rxrl/` and `trl/`) with their page
 *    `<out>/report.html` (as `rxrl report <out>` draws it), and ends with one line:
 *    `{"bench":"trl-summary","steps":N,"rxrl_gain":…,"trl_gain":…,"step_time_ratio":…}`: each side's held-out
 *    reward after minus before, and TRL's median seconds per step over rxrl's (above 1: rxrl is faster).
 *
 * The two sides run one after the other, never at once, on the same machine.
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { basename, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ConfigError } from '../lib/errors.js';
import { loadChatTemplate } from '../lib/chat/jinjaTemplate.js';
import type { JinjaChatTemplate } from '../lib/chat/jinjaTemplate.js';
import { loadConfig, resolvedLora, type RxrlConfig } from '../lib/config/schema.js';
import { readRunMetrics, type MetricsRecord } from '../lib/observe/metricsFile.js';
import { writeReport } from '../lib/observe/report.js';
import type { Task } from '../lib/types.js';
import { loadRollout, recipeDir } from '../pipelines/parts/data.js';
import { median } from './_stats.js';

/** One step of either side. */
interface StepRow {
  readonly step: number;
  readonly total_s: number;
  readonly rollout_s: number;
  readonly train_s: number;
  readonly reward_mean: number;
  readonly tokens_per_s: number;
  readonly pg_loss: number;
  readonly clipfrac: number;
}

/** Held-out scores: mean reward, and the arithmetic evaluator's format and right-result rates where it has them. */
interface ValScores {
  readonly reward: number;
  readonly format?: number;
  readonly correct?: number;
}

/** What each side reports. */
interface SideResult {
  readonly steps: readonly StepRow[];
  readonly before: ValScores | null;
  readonly after: ValScores | null;
  readonly extra: Readonly<Record<string, unknown>>;
}

function option(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

const round = (x: number, digits = 3): number => Number(x.toFixed(digits));

/** Runs a command to its end, stderr passed through, stdout lines handed to `onLine`; rejects on a non-zero exit. */
function runProcess(command: string, args: readonly string[], onLine: (line: string) => void): Promise<void> {
  return new Promise((done, fail) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'inherit'] });
    let buffered = '';
    child.stdout.on('data', (chunk: Buffer) => {
      buffered += chunk.toString();
      const lines = buffered.split('\n');
      buffered = lines.pop() ?? '';
      lines.filter((l) => l.trim() !== '').forEach(onLine);
    });
    child.on('error', fail);
    child.on('exit', (code) => {
      if (buffered.trim() !== '') onLine(buffered);
      if (code === 0) done();
      else fail(new Error(`${command} ${args[0]} exited with ${code}`));
    });
  });
}

/** The recipe's task as JSONL, each prompt as the model's chat template renders it and its token ids. */
async function exportData(config: RxrlConfig, baseDir: string, out: string): Promise<{ modelDir: string; rows: number }> {
  const { data, modelDir, tokenizer } = await loadRollout(config, baseDir);
  if (modelDir === undefined || !Array.isArray(data.train)) {
    throw new ConfigError('bench trl needs a recipe with model.path and generated data (data.source arithmetic or task)');
  }
  const template = (await loadChatTemplate(modelDir, tokenizer)) as JinjaChatTemplate | undefined;
  if (template === undefined || config.rollout.chatTemplate !== 'model') {
    throw new ConfigError('bench trl needs rollout.chatTemplate: model and a model directory with a chat template');
  }
  const system = config.rollout.system;
  const line = (task: Task): string => {
    const messages = [...(system === null ? [] : [{ role: 'system' as const, content: system }]), { role: 'user' as const, content: task.prompt }];
    const prompt = template.renderText(messages, [], { addGenerationPrompt: true });
    return JSON.stringify({ id: task.id, prompt, prompt_ids: template.render(messages, [], { addGenerationPrompt: true }), answer: task.answer });
  };
  await mkdir(out, { recursive: true });
  await writeFile(join(out, 'train.jsonl'), `${(data.train as readonly Task[]).map(line).join('\n')}\n`);
  await writeFile(join(out, 'validation.jsonl'), `${data.validation.map(line).join('\n')}\n`);
  return { modelDir, rows: data.train.length };
}

/**
 * The recipe's settings as TRL's side reads them (bench/trl_grpo.py turns them into a `GRPOConfig`);
 * spec/train/trlParity.spec.ts checks the mapping against one batch through TRL.
 *
 * @throws {@link ConfigError} for a recipe TRL cannot run the same way.
 */
export function trlSettings(config: RxrlConfig): Record<string, unknown> {
  const { trainer, rollout, algorithm, sync } = config;
  if (config.policies.length > 1) throw new ConfigError('bench trl compares single-policy recipes');
  if (trainer.lossAggregation !== 'token-mean') throw new ConfigError(`bench trl maps trainer.lossAggregation token-mean only, got ${trainer.lossAggregation}`);
  if (algorithm.klInReward.coef !== 0) throw new ConfigError('bench trl: TRL has no KL penalty in the reward (algorithm.klInReward.coef must be 0)');
  const unmatched = trlUnmatched(config);
  if (unmatched.length > 0) throw new ConfigError(`bench trl: TRL would not run this recipe the same way:\n${unmatched.join('\n')}`, { context: { keys: unmatched.map((u) => u.split(':')[0]) } });
  const rows = sync.batchSize * rollout.groupSize;
  const micro = Math.min(trainer.microBatchSize, rows);
  if (rows % micro !== 0) throw new ConfigError(`bench trl: trainer.microBatchSize ${micro} must divide the batch of ${rows} completions`);
  const policy = config.policies[0];
  return {
    rows,
    microBatchSize: micro,
    groupSize: rollout.groupSize,
    maxTokens: rollout.maxTokens,
    temperature: rollout.temperature,
    topP: rollout.topP,
    learningRate: trainer.learningRate,
    maxGradNorm: trainer.maxGradNorm,
    klCoef: trainer.klLoss.coef,
    clipLow: trainer.clipLow,
    clipHigh: trainer.clipHigh,
    ppoEpochs: trainer.ppoEpochs,
    lossType: 'dapo',
    scaleRewards: algorithm.normalizeByStd ? 'group' : 'none',
    lora: policy?.specialization === 'lora' ? resolvedLora(policy) : null,
  };
}

/** TRL's advantages are `(r − mean) / (std + 1e-4)`, a constant of `GRPOTrainer`; the bench sets rxrl's to it. */
export const TRL_STD_EPSILON = 1e-4;

/** Settings of the recipe that TRL's `GRPOTrainer` has no way to match, each as `key: why`. */
function trlUnmatched(config: RxrlConfig): string[] {
  const { trainer, rollout, algorithm, sync } = config;
  const checks: [boolean, string][] = [
    [algorithm.std !== 'sample', "algorithm.std: must be 'sample' (TRL's group std is Bessel-corrected)"],
    [algorithm.stdEpsilon !== TRL_STD_EPSILON, `algorithm.stdEpsilon: must be ${TRL_STD_EPSILON} (TRL's constant)`],
    [algorithm.filterZeroVariance, 'algorithm.filterZeroVariance: must be false (TRL keeps zero-variance groups)'],
    [trainer.clipRatioC !== null, 'trainer.clipRatioC: must be null (TRL has no dual clip)'],
    [trainer.miniBatches !== 1, 'trainer.miniBatches: must be 1 (TRL makes one update per generation batch)'],
    [trainer.entropyCoef !== 0, 'trainer.entropyCoef: must be 0 (not mapped)'],
    [trainer.importanceCap !== null, 'trainer.importanceCap: must be null (not mapped)'],
    [trainer.maxStaleness !== null, 'trainer.maxStaleness: must be null (TRL trains on-policy)'],
    [sync.mode !== 'sync', "sync.mode: must be 'sync' (TRL trains on-policy)"],
    [trainer.klLoss.coef > 0 && !['k3', 'low_var_kl'].includes(trainer.klLoss.estimator), "trainer.klLoss.estimator: must be 'k3' or 'low_var_kl' (TRL's KL estimator)"],
    [rollout.temperature !== 1, "rollout.temperature: must be 1 (TRL's loss divides the logits by the sampling temperature; rxrl's does not)"],
  ];
  return checks.filter(([bad]) => bad).map(([, why]) => why);
}

/** rxrl's side: `rxrl run` of the recipe, read back from its metrics file. */
async function runRxrl(recipe: string, set: readonly string[], runDir: string): Promise<SideResult> {
  const cli = fileURLToPath(new URL('../lib/cli.js', import.meta.url));
  // `rxrl run` ends its stdout with one JSON line, the run's summary.
  let lastLine = '';
  await runProcess(process.execPath, [cli, 'run', recipe, ...set.flatMap((s) => ['--set', s])], (line) => (lastLine = line));
  const last = JSON.parse(lastLine) as Record<string, unknown>;
  const { records } = await readRunMetrics(runDir);
  const byStep = new Map<number, Record<string, number>>();
  const vals: MetricsRecord[] = [];
  for (const record of records) {
    if ('val/reward_mean' in record.metrics) vals.push(record);
    else byStep.set(record.step, { ...byStep.get(record.step), ...record.metrics });
  }
  const steps = [...byStep.entries()]
    .sort(([a], [b]) => a - b)
    .map(([step, m]): StepRow => {
      // Generating and scoring is the wait for the batch and its preparation; the rest (the trainer's step and the
      // weight sync) is training, as TRL's side counts it.
      const total = m['timing/total_s'];
      const rollout = m['timing/wait_s'] + m['timing/prepare_s'];
      return {
        step,
        total_s: total,
        rollout_s: rollout,
        train_s: total - rollout,
        reward_mean: m['rollout/reward_mean'],
        tokens_per_s: (m['response_length/mean'] * m['batch/rows']) / total,
        pg_loss: m['actor/pg_loss'],
        clipfrac: m['actor/pg_clipfrac'],
      };
    });
  return {
    steps,
    before: vals.length > 0 ? rxrlScores(vals[0]) : null,
    after: vals.length > 1 ? rxrlScores(vals.at(-1)!) : null,
    extra: { backend: last.backend, seconds: last.seconds },
  };
}

/** TRL's side: `bench/trl_grpo.py`, read from its JSON lines. */
async function runTrl(args: { modelDir: string; data: string; settings: Record<string, unknown>; out: string; steps: number; seed: number; threads: number }): Promise<SideResult | { skipped: string }> {
  const script = fileURLToPath(new URL('../../bench/trl_grpo.py', import.meta.url));
  const events: Record<string, unknown>[] = [];
  const argv = [script, '--model', args.modelDir, '--data', args.data, '--settings', JSON.stringify(args.settings), '--out', args.out];
  argv.push('--steps', String(args.steps), '--seed', String(args.seed), '--threads', String(args.threads));
  await runProcess('python3', argv, (line) => events.push(JSON.parse(line) as Record<string, unknown>));
  const skipped = events.find((e) => e.event === 'skipped');
  if (skipped) return { skipped: String(skipped.reason) };
  const vals = events.filter((e) => e.event === 'val');
  const steps = events
    .filter((e) => e.event === 'step')
    .map((e): StepRow => {
      const total = Number(e.total_s);
      return {
        step: Number(e.step),
        total_s: total,
        rollout_s: Number(e.rollout_s),
        train_s: Number(e.train_s),
        reward_mean: Number(e.reward_mean),
        tokens_per_s: (Number(e.mean_length) * Number(e.samples)) / total,
        pg_loss: Number(e.pg_loss),
        clipfrac: Number(e.clipfrac),
      };
    });
  const first = vals[0] ?? {};
  const scores = (e: Record<string, unknown>): ValScores => ({ reward: Number(e.reward_mean), format: Number(e.format_mean), correct: Number(e.correct_mean) });
  return { steps, before: vals.length > 0 ? scores(first) : null, after: vals.length > 1 ? scores(vals.at(-1)!) : null, extra: { trl: first.trl, torch: first.torch } };
}

function rxrlScores(record: MetricsRecord): ValScores {
  const m = record.metrics;
  return { reward: m['val/reward_mean'], ...(m['val/format_mean'] === undefined ? {} : { format: m['val/format_mean'], correct: m['val/correct_mean'] }) };
}

/** Held-out reward after training minus before, or null when a side has not both. */
function gain(s: SideResult | undefined): number | null {
  return s === undefined || s.before === null || s.after === null ? null : round(s.after.reward - s.before.reward);
}

/** One side's summary line. */
function sideSummary(side: string, result: SideResult): Record<string, unknown> {
  const { steps } = result;
  const col = (key: keyof StepRow): number => round(median(steps.map((s) => s[key])));
  return {
    bench: 'trl',
    side,
    ...result.extra,
    steps: steps.length,
    step_s_median: col('total_s'),
    rollout_s_median: col('rollout_s'),
    train_s_median: col('train_s'),
    tokens_per_s_median: col('tokens_per_s'),
    val_before: result.before,
    val_after: result.after,
    gain: gain(result),
    reward_curve: steps.map((s) => round(s.reward_mean)),
  };
}

/** Both curves in one metrics file, each side's keys under its name, so `rxrl report` draws them together. */
function comparisonLines(sides: Readonly<Record<string, SideResult>>): string {
  const lines: string[] = [];
  for (const [side, result] of Object.entries(sides)) {
    if (result.before !== null) lines.push(JSON.stringify({ step: -1, version: 0, time: 0, [`${side}/val/reward_mean`]: result.before.reward }));
    for (const s of result.steps) {
      lines.push(
        JSON.stringify({
          step: s.step,
          version: s.step + 1,
          time: 0,
          [`${side}/rollout/reward_mean`]: s.reward_mean,
          [`${side}/perf/tokens_per_s`]: s.tokens_per_s,
          [`${side}/timing/total_s`]: s.total_s,
          [`${side}/actor/pg_loss`]: s.pg_loss,
          [`${side}/actor/pg_clipfrac`]: s.clipfrac,
        }),
      );
    }
    const last = result.steps.at(-1);
    if (result.after !== null && last) lines.push(JSON.stringify({ step: last.step, version: last.step + 1, time: 0, [`${side}/val/reward_mean`]: result.after.reward }));
  }
  return `${lines.join('\n')}\n`;
}

export async function main(args: readonly string[]): Promise<void> {
  const steps = Number(option(args, 'steps', '50'));
  const seed = Number(option(args, 'seed', '1'));
  const threads = Number(option(args, 'threads', '2'));
  const only = option(args, 'only', '');
  const backend = option(args, 'backend', 'tensorflow');
  const recipe = resolve(option(args, 'recipe', 'recipes/smollm2-arithmetic.yaml'));
  const out = resolve(option(args, 'out', join('runs', `bench-trl-${basename(recipe, extname(recipe))}`)));
  // rxrl's run: validation before and after only, no checkpoint but the last.
  // TRL's advantage epsilon is a constant: rxrl's side takes it too.
  const set = [`run.steps=${steps}`, `run.seed=${seed}`, `run.dir=${join(out, 'rxrl')}`, `run.backend=${backend}`, 'validation.every=0', 'validation.beforeTrain=true', 'checkpoint.every=0', `algorithm.stdEpsilon=${TRL_STD_EPSILON}`];
  const config = loadConfig({ file: recipe, set });
  const settings = trlSettings(config);
  // The bench's own subdirectories start empty (a left-over rxrl run would be resumed).
  for (const dir of ['data', 'rxrl', 'trl']) await rm(join(out, dir), { recursive: true, force: true });
  const { modelDir, rows } = await exportData(config, recipeDir(recipe), join(out, 'data'));
  console.log(JSON.stringify({ bench: 'trl', recipe, steps, seed, threads, model: modelDir, train_prompts: rows, settings }));

  const sides: Record<string, SideResult> = {};
  if (only !== 'trl') {
    sides.rxrl = await runRxrl(recipe, set, join(out, 'rxrl'));
    for (const s of sides.rxrl.steps) console.log(JSON.stringify({ bench: 'trl', side: 'rxrl', ...s }));
    console.log(JSON.stringify(sideSummary('rxrl', sides.rxrl)));
  }
  if (only !== 'rxrl') {
    const trl = await runTrl({ modelDir, data: join(out, 'data'), settings, out: join(out, 'trl'), steps, seed, threads });
    if ('skipped' in trl) console.log(JSON.stringify({ bench: 'trl', side: 'trl', skipped: trl.skipped }));
    else {
      sides.trl = trl;
      for (const s of trl.steps) console.log(JSON.stringify({ bench: 'trl', side: 'trl', ...s }));
      console.log(JSON.stringify(sideSummary('trl', trl)));
    }
  }
  await writeFile(join(out, 'metrics.jsonl'), comparisonLines(sides));
  await writeReport(out, { title: `rxrl and TRL: ${basename(recipe)}, ${steps} steps, seed ${seed}` });
  const stepTime = (s: SideResult | undefined): number => (s === undefined ? Number.NaN : median(s.steps.map((r) => r.total_s)));
  const ratio = stepTime(sides.trl) / stepTime(sides.rxrl);
  console.log(JSON.stringify({ bench: 'trl-summary', steps, rxrl_gain: gain(sides.rxrl), trl_gain: gain(sides.trl), step_time_ratio: Number.isFinite(ratio) ? round(ratio) : null }));
}
