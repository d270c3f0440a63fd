/**
 * `npm run bench -- trl [--steps 50] [--seed 1 | --seeds 1,2,3] [--recipe recipes/smollm2-arithmetic.yaml]
 * [--out runs/bench-trl] [--threads 2] [--only rxrl|trl] [--backend tensorflow] [--val-every 10] [--target 0.75]
 * [--paired [--sampling-seed N]] [--equal-work] [--set key=value ...]`
 *
 * rxrl beside TRL on the same GRPO run. From one recipe (by default SmolLM2-135M-Instruct learning arithmetic with
 * a LoRA adapter; build the model first with `npm run model:smollm2`):
 *
 * 1. exports the task as JSONL (`<out>/data`: each prompt rendered in the model's chat template, its token ids and
 *    the answer); TRL's side checks that its tokenizer gives the same ids;
 * 2. trains it with `rxrl run` on the native backend (`--backend`), in `<out>/rxrl`, validating before training and
 *    every `--val-every` steps (`validation.every`);
 * 3. trains it with TRL's `GRPOTrainer` (`bench/trl_grpo.py`: PyTorch CPU, `--threads` threads, the reward ported
 *    to Python in `bench/trl_reward.py`, the same greedy validation every `--val-every` steps) with the recipe's
 *    settings mapped to `GRPOConfig`: prompts per step and
 *    group size (the batch of completions, in the trainer's micro-batches), learning rate (constant, Adam, no
 *    weight decay), LoRA rank, alpha and target modules, max new tokens, temperature and top-p, KL coefficient,
 *    clip range (low and high), PPO epochs, gradient clipping, advantage scaling by the group's standard deviation,
 *    and token-mean loss aggregation as `loss_type` `dapo` (a recipe TRL cannot match, say a dual clip or a
 *    population std, is refused; rxrl's side takes TRL's advantage epsilon, 1e-4; spec/train/trlParity.spec.ts
 *    checks on one batch that both sides then compute the same step);
 * 4. prints, for each side, one JSON line per step (seconds, the rollout and training parts, completion tokens per
 *    second, reward, and the finer parts the side measures: rxrl's `generate_s`, `reward_s`, `wait_s`, `prepare_s`,
 *    `trainer_s`, `forward_backward_s`, `optimizer_s`, `sync_s` from its metrics file; TRL's `generate_s` and
 *    `reward_s`) and one summary (medians of each, tokens per second, held-out reward before and after, the
 *    held-out curve, and `time_to_target_s` / `time_to_target_steps`: the training seconds, and steps, until the
 *    held-out reward first reached `--target`, null if it never did). A step's seconds leave validation out on both
 *    sides: TRL's clock restarts after it; rxrl's validation between steps delays the next step's wait, and its
 *    `timing/val_s` is taken back out of that step's wait and total;
 * 5. measures, in this process on rxrl's backend, an sgemm rate and a memory bandwidth (`bench/_rates.ts`), and
 *    prints the bounds they give one step of this model and shape with each side's measured medians over them
 *    (`{"bench":"trl-bounds",…}`, formulas in `bench/_bounds.ts`); with `--equal-work`, also the `trl-equal-work`
 *    line (below);
 * 6. prints `{"bench":"trl-missed","rxrl":[…],"trl":[…],"both":[…]}`: the held-out task ids each side's last
 *    validation answered wrong (rxrl's from its `validation.generations` file, TRL's from its validation), and those
 *    both did;
 * 7. writes both curves to `<out>/metrics.jsonl` (metrics prefixed `rxrl/` and `trl/`, held-out scores at each
 *    validation) with their page `<out>/report.html` (as `rxrl report <out>` draws it), and ends with one line:
 *    `{"bench":"trl-summary","steps":N,"rxrl_gain":…,"trl_gain":…,"work":"learning-run","step_time_ratio":…,"target":…,
 *    "rxrl_time_to_target_s":…,"trl_time_to_target_s":…,"time_to_target_ratio":…}`: each side's held-out reward
 *    after minus before, TRL's median seconds per step over rxrl's, and TRL's seconds to the target over rxrl's
 *    (above 1: rxrl is faster; null where a side never reached the target, or rxrl needed no step).
 *
 * The step ratio of a learning run compares the two runs as their recipes train: rxrl's dynamic sampling
 * (`rxrl_only`) may generate more rows than TRL and train fewer, and its completions stop at their own lengths.
 * With `--equal-work` both sides do the same work instead (`bench/_equalWork.ts`): every completion runs to
 * `rollout.maxTokens` (rxrl's `rollout.ignoreEos`, TRL's `min_new_tokens`), dynamic sampling is off, every row trains;
 * the summary's `work` is `equal` and its ratio `equal_work_step_ratio`, and a `trl-equal-work` line gives each side's
 * median step in parts (sampling, forward/backward, optimizer, the rest) beside their bounds.
 *
 * With `--paired` rxrl's side starts from what TRL's run starts from: TRL's trainer, built as its run builds it,
 * gives the order its sampler visits the prompts in and (LoRA) the adapter as PEFT initialized it; rxrl reads the
 * tasks in that order and starts from that adapter (`policies[0].adapterPath`), so a seed's two runs differ by their
 * algorithms and their sampling draws only (arithmetic recipes; needs TRL installed). `--sampling-seed N` then
 * changes those draws alone, on both sides: each run keeps the seed's prompt order, initial adapter and held-out
 * questions, and seeds its sampling with `N` (TRL's side reseeds its RNGs once its trainer is built; rxrl's side,
 * whose order and adapter then come from files, runs with `run.seed` N). It measures how far one seed's result
 * moves with its sampling draws only, on either side.
 *
 * With `--seeds 1,2,3` it does all of that for each seed in turn (in `<out>/seed-<S>`, each summary naming its
 * `seed`), then prints the table in one line: `{"bench":"trl-seeds","seeds":[{seed, rxrl_gain, trl_gain, diff,
 * step_time_ratio, time_to_target_ratio}, …],"rxrl_gain_mean":…,"trl_gain_mean":…,"diff_mean":…,"diff_se":…,
 * "rxrl_at_least_trl":"k/n","step_time_ratio_min":…}`.
 *
 * The two sides run one after the other, never at once, on the same machine.
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { ConfigError } from '../lib/core/errors.js';
import { loadChatTemplate } from '../lib/chat/jinjaTemplate.js';
import type { JinjaChatTemplate } from '../lib/chat/jinjaTemplate.js';
import { loadConfig, resolvedLora, type RxrlConfig } from '../lib/config/schema.js';
import { BACKEND_KINDS, type BackendKind } from '../lib/model/backend.js';
import { policyConfigFromHf } from '../lib/model/modelDir.js';
import { readRunMetrics, type MetricsRecord } from '../lib/observe/metricsFile.js';
import { writeReport } from '../lib/observe/report.js';
import type { Task } from '../lib/core/types.js';
import { loadRollout, recipeDir } from '../pipelines/parts/data.js';
import type { GenerationLine } from '../pipelines/parts/generations.js';
import { benchArgs } from './_args.js';
import { modelSizes, stepBounds, type StepBounds } from './_bounds.js';
import { EQUAL_WORK_SET, equalWorkLine } from './_equalWork.js';
import { measureRates } from './_rates.js';
import { median } from './_stats.js';

/**
 * One step of either side: its seconds (validation left out), split into the rollout (generating and scoring) and
 * training, and the finer parts where the side measures them.
 */
export interface StepRow {
  readonly step: number;
  readonly total_s: number;
  readonly rollout_s: number;
  readonly train_s: number;
  readonly reward_mean: number;
  readonly tokens_per_s: number;
  readonly pg_loss: number;
  readonly clipfrac: number;
  /** Rows (completions) the step trained. */
  readonly rows?: number;
  /** Mean completion tokens of those rows. */
  readonly mean_length?: number;
  /** Generating the batch's completions (rxrl: the union of its samples' spans; TRL: its generate calls). */
  readonly generate_s?: number;
  /** Scoring them (rxrl: the union of the evaluator's spans; TRL: its reward functions). */
  readonly reward_s?: number;
  /** rxrl: the trainer waiting for its batch (generation, scoring, grouping). */
  readonly wait_s?: number;
  /** rxrl: advantages and the batch's tensors (`grpoPrepare`). */
  readonly prepare_s?: number;
  /** rxrl: the trainer's step, of which the next two. */
  readonly trainer_s?: number;
  /** Micro-batch losses and gradients, accumulation included (TRL: its training less the optimizer's part). */
  readonly forward_backward_s?: number;
  /** The gradient norm, clip and Adam's update. */
  readonly optimizer_s?: number;
  /** rxrl: publishing the weights to the engine. */
  readonly sync_s?: number;
}

/** The parts of a step a summary gives the median of, where a side has them. */
const STEP_PARTS = ['generate_s', 'reward_s', 'wait_s', 'prepare_s', 'trainer_s', 'forward_backward_s', 'optimizer_s', 'sync_s'] as const;

/** One held-out score: the mean reward after `step` (0-based; −1 before training). */
export interface ValPoint {
  readonly step: number;
  readonly reward: number;
}

/** Held-out scores: mean reward, and the arithmetic evaluator's format and right-result rates where it has them. */
interface ValScores {
  readonly reward: number;
  readonly format?: number;
  readonly correct?: number;
}

/** What each side reports. */
export interface SideResult {
  readonly steps: readonly StepRow[];
  /** Every held-out score, before training and every `--val-every` steps, in order. */
  readonly vals: readonly ValPoint[];
  readonly before: ValScores | null;
  readonly after: ValScores | null;
  /** Held-out task ids the last validation answered wrong (`correct` 0), when the side reports them. */
  readonly missed?: readonly string[];
  readonly extra: Readonly<Record<string, unknown>>;
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
export async function exportData(
  config: RxrlConfig,
  baseDir: string,
  out: string,
): Promise<{
  modelDir: string;
  rows: number;
  promptTokens: number;
  train: readonly Task[];
  validation: readonly Task[];
  maxTokens: number;
}> {
  const { data, modelDir, tokenizer } = await loadRollout(config, baseDir);
  if (modelDir === undefined || !Array.isArray(data.train)) {
    throw new ConfigError('bench trl needs a recipe with model.path and generated data (data.source arithmetic or task)');
  }
  const template = (await loadChatTemplate(modelDir, tokenizer)) as JinjaChatTemplate | undefined;
  if (template === undefined || config.rollout.chatTemplate !== 'model') {
    throw new ConfigError('bench trl needs rollout.chatTemplate: model and a model directory with a chat template');
  }
  const system = config.rollout.system;
  let promptTokens = 0;
  const line = (task: Task): string => {
    const messages = [
      ...(system === null ? [] : [{ role: 'system' as const, content: system }]),
      { role: 'user' as const, content: task.prompt },
    ];
    const prompt = template.renderText(messages, [], { addGenerationPrompt: true });
    const ids = template.render(messages, [], { addGenerationPrompt: true });
    promptTokens += ids.length;
    return JSON.stringify({ id: task.id, prompt, prompt_ids: ids, answer: task.answer });
  };
  await mkdir(out, { recursive: true });
  const train = data.train as readonly Task[];
  await writeFile(join(out, 'train.jsonl'), `${train.map(line).join('\n')}\n`);
  const meanPromptTokens = promptTokens / Math.max(1, train.length);
  const validation = data.validation as readonly Task[];
  await writeFile(join(out, 'validation.jsonl'), `${validation.map(line).join('\n')}\n`);
  return { modelDir, rows: train.length, promptTokens: meanPromptTokens, train, validation, maxTokens: data.maxTokens };
}

/**
 * `--paired`: what TRL's run starts from, given to rxrl's side too, so that a seed's two runs differ by their
 * algorithms and their sampling draws only. TRL's side (`bench/trl_grpo.py --prepare`) builds its trainer as its run
 * will and writes the order its sampler visits the prompts in (one epoch) and, for a LoRA recipe, the adapter as PEFT
 * initialized it; rxrl's side then reads the tasks in that order from a JSONL file (passing over it again in the same
 * order, where TRL's next epoch would reshuffle; 50 steps of the LoRA recipe take TRL through 200 of its 224) and
 * starts from that adapter (`policies[0].adapterPath`).
 *
 * @returns the `--set` assignments of rxrl's side.
 * @throws {@link ConfigError} when TRL is not installed, or the recipe's data is not the arithmetic task (its
 *   evaluator is the one rxrl's side must name).
 */
async function pairedSet(
  config: RxrlConfig,
  exported: {
    readonly modelDir: string;
    readonly data: string;
    readonly train: readonly Task[];
    readonly validation: readonly Task[];
    readonly maxTokens: number;
  },
  trl: { readonly settings: Record<string, unknown>; readonly out: string; readonly seed: number; readonly threads: number },
): Promise<string[]> {
  if (config.data.source !== 'arithmetic') throw new ConfigError('bench trl --paired: the recipe must use data.source arithmetic');
  const { train, validation } = exported;
  const argv = ['--model', exported.modelDir, '--data', exported.data, '--settings', JSON.stringify(trl.settings), '--out', trl.out];
  const events = await trlScript([
    ...argv,
    '--seed',
    String(trl.seed),
    '--threads',
    String(trl.threads),
    '--prepare',
    String(train.length),
  ]);
  const skipped = events.find((e) => e.event === 'skipped');
  if (skipped) throw new ConfigError(`bench trl --paired needs TRL's side: ${String(skipped.reason)}`);
  const order = JSON.parse(await readFile(join(trl.out, 'order.json'), 'utf8')) as string[];
  const byId = new Map(train.map((t) => [t.id, t]));
  const row = (task: Task): string => JSON.stringify({ id: task.id, prompt: task.prompt, answer: task.answer });
  await writeFile(join(trl.out, 'train.jsonl'), `${order.map((id) => row(byId.get(id) as Task)).join('\n')}\n`);
  await writeFile(join(trl.out, 'validation.jsonl'), `${validation.map(row).join('\n')}\n`);
  const set = [
    'data.source=jsonl',
    `data.trainFile=${join(trl.out, 'train.jsonl')}`,
    `data.validationFile=${join(trl.out, 'validation.jsonl')}`,
    'data.shuffle=false',
    'data.epochs=0',
    'rollout.evaluator.module=rxrl/recipes',
    'rollout.evaluator.export=equationEvaluator',
    `rollout.maxTokens=${exported.maxTokens}`,
  ];
  const policy = config.policies[0];
  if (policy?.specialization === 'lora') {
    set.push(`policies=${JSON.stringify([{ ...policy, adapterPath: join(trl.out, 'initial-adapter') }])}`);
  }
  return set;
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
  if (trainer.lossAggregation !== 'token-mean')
    throw new ConfigError(`bench trl maps trainer.lossAggregation token-mean only, got ${trainer.lossAggregation}`);
  if (algorithm.klInReward.coef !== 0)
    throw new ConfigError('bench trl: TRL has no KL penalty in the reward (algorithm.klInReward.coef must be 0)');
  const unmatched = trlUnmatched(config);
  if (unmatched.length > 0)
    throw new ConfigError(`bench trl: TRL would not run this recipe the same way:\n${unmatched.join('\n')}`, {
      context: { keys: unmatched.map((u) => u.split(':')[0]) },
    });
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
    // Every completion runs to maxTokens (TRL's side: EOS kept out until then).
    ignoreEos: rollout.ignoreEos,
  };
}

/**
 * The recipe's settings that rxrl runs and TRL has no counterpart of, so TRL's side runs without them: DAPO's
 * dynamic sampling (`algorithm.filterZeroVariance`, `sync.generationBatchSize`; TRL 1.16's `GRPOTrainer` trains
 * every group of its batch). Printed beside the settings and in the summary, so a table never hides them.
 */
export function rxrlOnly(config: RxrlConfig): Record<string, unknown> {
  const own: Record<string, unknown> = {};
  if (config.algorithm.filterZeroVariance) own['algorithm.filterZeroVariance'] = true;
  const perStep = config.sync.generationBatchSize;
  if (perStep !== null && perStep !== config.sync.batchSize) own['sync.generationBatchSize'] = perStep;
  return own;
}

/** TRL's advantages are `(r − mean) / (std + 1e-4)`, a constant of `GRPOTrainer`; the bench sets rxrl's to it. */
export const TRL_STD_EPSILON = 1e-4;

/** Settings of the recipe that TRL's `GRPOTrainer` has no way to match, each as `key: why`. */
function trlUnmatched(config: RxrlConfig): string[] {
  const { trainer, rollout, algorithm, sync } = config;
  const checks: [boolean, string][] = [
    [algorithm.std !== 'sample', "algorithm.std: must be 'sample' (TRL's group std is Bessel-corrected)"],
    [algorithm.stdEpsilon !== TRL_STD_EPSILON, `algorithm.stdEpsilon: must be ${TRL_STD_EPSILON} (TRL's constant)`],
    [trainer.clipRatioC !== null, 'trainer.clipRatioC: must be null (TRL has no dual clip)'],
    [trainer.miniBatches !== 1, 'trainer.miniBatches: must be 1 (TRL makes one update per generation batch)'],
    [trainer.entropyCoef !== 0, 'trainer.entropyCoef: must be 0 (not mapped)'],
    [trainer.importanceCap !== null, 'trainer.importanceCap: must be null (not mapped)'],
    [trainer.maxStaleness !== null, 'trainer.maxStaleness: must be null (TRL trains on-policy)'],
    [sync.mode !== 'sync', "sync.mode: must be 'sync' (TRL trains on-policy)"],
    [
      trainer.klLoss.coef > 0 && !['k3', 'low_var_kl'].includes(trainer.klLoss.estimator),
      "trainer.klLoss.estimator: must be 'k3' or 'low_var_kl' (TRL's KL estimator)",
    ],
    [
      rollout.temperature !== 1,
      "rollout.temperature: must be 1 (TRL's loss divides the logits by the sampling temperature; rxrl's does not)",
    ],
  ];
  return checks.filter(([bad]) => bad).map(([, why]) => why);
}

/** rxrl's side: `rxrl run` of the recipe, read back from its metrics file. */
async function runRxrl(recipe: string, set: readonly string[], runDir: string): Promise<SideResult> {
  const cli = fileURLToPath(new URL('../cli/main.js', import.meta.url));
  // `rxrl run` ends its stdout with one JSON line, the run's summary.
  let lastLine = '';
  await runProcess(process.execPath, [cli, 'run', recipe, ...set.flatMap((s) => ['--set', s])], (line) => (lastLine = line));
  const last = JSON.parse(lastLine) as Record<string, unknown>;
  const { records } = await readRunMetrics(runDir);
  // A validation's line may also carry its step's sync and wall time: those go to the step, the scores to `vals`.
  const byStep = new Map<number, Record<string, number>>();
  const vals: MetricsRecord[] = [];
  for (const record of records) {
    if ('val/reward_mean' in record.metrics) vals.push(record);
    const own = Object.entries(record.metrics).filter(([key]) => !key.startsWith('val/') && key !== 'timing/val_s');
    if (own.length > 0) byStep.set(record.step, { ...byStep.get(record.step), ...Object.fromEntries(own) });
  }
  // The validation before training ran before the first step's clock started; those between steps did not.
  const valSeconds = new Map(vals.filter((v) => v.step >= 0).map((v) => [v.step, v.metrics['timing/val_s'] ?? 0]));
  const steps = [...byStep.entries()].sort(([a], [b]) => a - b).map(([step, m]) => rxrlStep(step, m, valSeconds.get(step - 1) ?? 0));
  const final = vals.at(-1);
  return {
    steps,
    vals: vals.map((v) => ({ step: v.step, reward: v.metrics['val/reward_mean'] })),
    before: vals.length > 0 ? rxrlScores(vals[0]) : null,
    after: vals.length > 1 ? rxrlScores(vals.at(-1)!) : null,
    ...(final === undefined ? {} : { missed: await missedOf(join(runDir, 'validation', `${final.version}.jsonl`)) }),
    extra: { backend: last.backend, seconds: last.seconds },
  };
}

/**
 * One rxrl step from its metrics. Generating and scoring is the wait for the batch and its preparation; the rest (the
 * trainer's step and the weight sync) is training, as TRL's side counts it. A validation after the previous step
 * (`valSeconds`) ran before this step's batch was admitted, inside its wait: it leaves the wait and the total.
 */
function rxrlStep(step: number, m: Record<string, number>, valSeconds: number): StepRow {
  const total = m['timing/total_s'] - valSeconds;
  const wait = m['timing/wait_s'] - valSeconds;
  const rollout = wait + m['timing/prepare_s'];
  return {
    step,
    total_s: total,
    rollout_s: rollout,
    train_s: total - rollout,
    // Over every sample of the step, as TRL's side reports it (dynamic sampling trains only some of them).
    reward_mean: m['critic/score_mean'] ?? m['rollout/reward_mean'],
    tokens_per_s: (m['response_length/mean'] * m['batch/rows']) / total,
    pg_loss: m['actor/pg_loss'],
    clipfrac: m['actor/pg_clipfrac'],
    rows: m['batch/rows'],
    mean_length: m['response_length/mean'],
    generate_s: m['timing/generate_s'],
    reward_s: m['timing/reward_s'],
    wait_s: wait,
    prepare_s: m['timing/prepare_s'],
    trainer_s: m['timing/step_s'],
    forward_backward_s: m['timing/forward_backward_s'],
    optimizer_s: m['timing/optimizer_s'],
    sync_s: m['timing/sync_s'],
  };
}

/** Runs `bench/trl_grpo.py` with these arguments; its JSON lines, in order. */
export async function trlScript(argv: readonly string[]): Promise<Record<string, unknown>[]> {
  const script = fileURLToPath(new URL('../../bench/trl_grpo.py', import.meta.url));
  const events: Record<string, unknown>[] = [];
  await runProcess('python3', [script, ...argv], (line) => events.push(JSON.parse(line) as Record<string, unknown>));
  return events;
}

/** TRL's side: `bench/trl_grpo.py`, read from its JSON lines. */
export async function runTrl(args: {
  modelDir: string;
  data: string;
  settings: Record<string, unknown>;
  out: string;
  steps: number;
  seed: number;
  /** Reseeds TRL's RNGs once its trainer is built (its prompt order and adapter stay the seed's). */
  samplingSeed: number | undefined;
  threads: number;
  valEvery: number;
  /** `bench/trl_grpo.py --record`: writes `<out>/record` (the adapter before and after, every step's rollouts). */
  record: boolean;
}): Promise<SideResult | { skipped: string }> {
  const argv = ['--model', args.modelDir, '--data', args.data, '--settings', JSON.stringify(args.settings), '--out', args.out];
  argv.push(
    '--steps',
    String(args.steps),
    '--seed',
    String(args.seed),
    '--threads',
    String(args.threads),
    '--val-every',
    String(args.valEvery),
    ...(args.samplingSeed === undefined ? [] : ['--sampling-seed', String(args.samplingSeed)]),
    ...(args.record ? ['--record'] : []),
  );
  const events = await trlScript(argv);
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
        rows: Number(e.samples),
        mean_length: Number(e.mean_length),
        generate_s: Number(e.generate_s),
        reward_s: Number(e.reward_s),
        forward_backward_s: Number(e.forward_backward_s),
        optimizer_s: Number(e.optimizer_s),
      };
    });
  const first = vals[0] ?? {};
  const scores = (e: Record<string, unknown>): ValScores => ({
    reward: Number(e.reward_mean),
    format: Number(e.format_mean),
    correct: Number(e.correct_mean),
  });
  return {
    steps,
    vals: vals.map((e) => ({ step: Number(e.step), reward: Number(e.reward_mean) })),
    before: vals.length > 0 ? scores(first) : null,
    after: vals.length > 1 ? scores(vals.at(-1)!) : null,
    ...(Array.isArray(vals.at(-1)?.missed) ? { missed: vals.at(-1)!.missed as string[] } : {}),
    extra: { trl: first.trl, torch: first.torch },
  };
}

/** Task ids of a `validation.generations` file whose sample was not correct (`correct` 0, else reward below 1). */
async function missedOf(path: string): Promise<string[]> {
  const lines = (await readFile(path, 'utf8')).split('\n').filter((l) => l.trim() !== '');
  return lines
    .map((l) => JSON.parse(l) as GenerationLine)
    .filter((g) => (g.metrics?.correct ?? (g.reward !== undefined && g.reward >= 1 ? 1 : 0)) === 0)
    .map((g) => g.taskId)
    .sort();
}

function rxrlScores(record: MetricsRecord): ValScores {
  const m = record.metrics;
  return {
    reward: m['val/reward_mean'],
    ...(m['val/format_mean'] === undefined ? {} : { format: m['val/format_mean'], correct: m['val/correct_mean'] }),
  };
}

/** Held-out reward after training minus before, or null when a side has not both. */
function gain(s: SideResult | undefined): number | null {
  return s === undefined || s.before === null || s.after === null ? null : round(s.after.reward - s.before.reward);
}

/**
 * Training seconds until the held-out reward first reaches `target`: the steps' seconds (validation left out) up to
 * and including the step after which that validation ran, and how many steps that is (0 when the model met it before
 * training). Null when no validation reached it.
 */
export function timeToTarget(result: Pick<SideResult, 'steps' | 'vals'>, target: number): { seconds: number; steps: number } | null {
  const hit = [...result.vals].sort((a, b) => a.step - b.step).find((v) => v.reward >= target);
  if (hit === undefined) return null;
  const seconds = result.steps.filter((s) => s.step <= hit.step).reduce((a, s) => a + s.total_s, 0);
  return { seconds: round(seconds), steps: hit.step + 1 };
}

/** Medians of the finer parts of a side's steps, `<part>_median`, for the parts it measures. */
function partMedians(steps: readonly StepRow[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const part of STEP_PARTS) {
    const values = steps.map((s) => s[part]).filter((v): v is number => v !== undefined && Number.isFinite(v));
    if (values.length > 0) out[`${part}_median`] = round(median(values), 4);
  }
  return out;
}

/** One side's summary line. */
function sideSummary(side: string, result: SideResult, target: number): Record<string, unknown> {
  const { steps } = result;
  const col = (key: 'total_s' | 'rollout_s' | 'train_s' | 'tokens_per_s'): number => round(median(steps.map((s) => s[key])));
  const reached = timeToTarget(result, target);
  return {
    bench: 'trl',
    side,
    ...result.extra,
    steps: steps.length,
    step_s_median: col('total_s'),
    rollout_s_median: col('rollout_s'),
    train_s_median: col('train_s'),
    ...partMedians(steps),
    tokens_per_s_median: col('tokens_per_s'),
    val_before: result.before,
    val_after: result.after,
    gain: gain(result),
    target,
    time_to_target_s: reached?.seconds ?? null,
    time_to_target_steps: reached?.steps ?? null,
    val_curve: result.vals.map((v) => [v.step, round(v.reward)]),
    reward_curve: steps.map((s) => round(s.reward_mean)),
  };
}

/**
 * The last line: each side's held-out gain, TRL's median step seconds over rxrl's, and each side's seconds to the
 * target with TRL's over rxrl's (null where a side never reached it, or rxrl needed no training to).
 *
 * `work` says what the step ratio measures. `learning-run`: `step_time_ratio`, the median steps of the two runs as
 * their recipes train (rxrl's dynamic sampling may generate more rows and train fewer than TRL's). `equal` (`bench
 * trl --equal-work`, `equalWorkRatio` given): `equal_work_step_ratio`, the same rows and tokens on both sides (null
 * unless they were).
 */
export function summaryLine(
  steps: number,
  target: number,
  sides: Readonly<Record<string, SideResult | undefined>>,
  equalWorkRatio?: number | null,
): Record<string, unknown> {
  const stepTime = (s: SideResult | undefined): number => (s === undefined ? Number.NaN : median(s.steps.map((r) => r.total_s)));
  const ratio = stepTime(sides.trl) / stepTime(sides.rxrl);
  const reached = (s: SideResult | undefined): number | null => (s === undefined ? null : (timeToTarget(s, target)?.seconds ?? null));
  const rxrlSeconds = reached(sides.rxrl);
  const trlSeconds = reached(sides.trl);
  return {
    bench: 'trl-summary',
    steps,
    rxrl_gain: gain(sides.rxrl),
    trl_gain: gain(sides.trl),
    work: equalWorkRatio === undefined ? 'learning-run' : 'equal',
    ...(equalWorkRatio === undefined
      ? { step_time_ratio: Number.isFinite(ratio) ? round(ratio) : null }
      : { equal_work_step_ratio: equalWorkRatio }),
    target,
    rxrl_time_to_target_s: rxrlSeconds,
    trl_time_to_target_s: trlSeconds,
    time_to_target_ratio: rxrlSeconds !== null && trlSeconds !== null && rxrlSeconds > 0 ? round(trlSeconds / rxrlSeconds) : null,
  };
}

/** Both curves in one metrics file, each side's keys under its name, so `rxrl report` draws them together. */
function comparisonLines(sides: Readonly<Record<string, SideResult>>): string {
  const lines: string[] = [];
  for (const [side, result] of Object.entries(sides)) {
    // Each held-out score once per step.
    const vals = new Map(result.vals.map((v) => [v.step, v.reward]));
    for (const [step, reward] of vals)
      lines.push(JSON.stringify({ step, version: step + 1, time: 0, [`${side}/val/reward_mean`]: reward }));
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
          ...Object.fromEntries(STEP_PARTS.filter((part) => s[part] !== undefined).map((part) => [`${side}/timing/${part}`, s[part]])),
        }),
      );
    }
  }
  return `${lines.join('\n')}\n`;
}

/**
 * The `trl-bounds` line: the machine's rates, the step's bounds, and each side's measured medians over them. rxrl's
 * generation is held to the bound of the rows it generates (`rxrlRows`: more than TRL's under dynamic sampling).
 */
async function boundsLine(
  backend: BackendKind,
  modelDir: string,
  shape: { readonly settings: Record<string, unknown>; readonly promptTokens: number; readonly rxrlRows: number },
  sides: Readonly<Record<string, SideResult>>,
): Promise<{ line: Record<string, unknown>; bounds: StepBounds }> {
  const { settings, promptTokens } = shape;
  const rates = await measureRates(backend);
  const config = policyConfigFromHf(JSON.parse(await readFile(join(modelDir, 'config.json'), 'utf8')));
  const sizes = modelSizes(config);
  const boundsOf = (rows: number): ReturnType<typeof stepBounds> =>
    stepBounds({
      sizes,
      gflops: rates.gflops,
      bandwidthGBs: rates.bandwidthGBs,
      rows,
      groupSize: Number(settings.groupSize),
      promptTokens,
      maxTokens: Number(settings.maxTokens),
      ppoEpochs: Number(settings.ppoEpochs),
      lora: settings.lora !== null,
      referenceForward: Number(settings.klCoef) > 0,
    });
  const bounds = boundsOf(Number(settings.rows));
  const rxrlGenerateBound = boundsOf(shape.rxrlRows).generate_bound_s;
  const measured: Record<string, unknown> = {};
  for (const [side, result] of Object.entries(sides)) {
    const med = (key: 'generate_s' | 'trainer_s' | 'train_s'): number =>
      median(result.steps.map((s) => s[key] ?? Number.NaN).filter(Number.isFinite));
    // rxrl's training is its trainer's step; TRL's, the step less its generation and scoring.
    const generate = med('generate_s');
    const train = med(side === 'rxrl' ? 'trainer_s' : 'train_s');
    measured[side] = {
      generate_s: Number.isFinite(generate) ? round(generate) : null,
      generate_ratio: Number.isFinite(generate)
        ? round(generate / (side === 'rxrl' ? rxrlGenerateBound : bounds.generate_bound_s), 2)
        : null,
      train_s: Number.isFinite(train) ? round(train) : null,
      train_ratio: Number.isFinite(train) ? round(train / bounds.train_bound_s, 2) : null,
    };
  }
  const r = (x: number): number => Number(x.toPrecision(4));
  const line = {
    bench: 'trl-bounds',
    ...rates,
    params: sizes.params,
    body_params: sizes.bodyParams,
    head_params: sizes.headParams,
    prompt_tokens_mean: round(promptTokens, 1),
    ...Object.fromEntries(Object.entries(bounds).map(([key, value]) => [key, r(value)])),
    ...(shape.rxrlRows === Number(settings.rows)
      ? {}
      : { rxrl_generate_rows: shape.rxrlRows, rxrl_generate_bound_s: r(rxrlGenerateBound) }),
    measured,
  };
  return { line, bounds };
}

/** What one seed's comparison needs, read from the command line. */
interface BenchOptions {
  readonly steps: number;
  readonly threads: number;
  readonly target: number;
  readonly valEvery: number;
  readonly only: string;
  readonly backend: BackendKind;
  readonly recipe: string;
  readonly overrides: readonly string[];
  /** `--paired`: rxrl's side starts from what TRL's does (its prompt order and initial adapter; see `pairedSet`). */
  readonly paired: boolean;
  /** `--sampling-seed`: both sides' sampling draws seeded with it, all else the seed's (needs `--paired`). */
  readonly samplingSeed?: number | undefined;
  /** `--equal-work`: both sides generate and train the same rows and tokens (see `bench/_equalWork.ts`). */
  readonly equalWork: boolean;
}

/**
 * The bench's flags, checked: a malformed number, seed list, side or backend is a {@link ConfigError} naming the
 * flag, before anything runs.
 */
export function trlBenchOptions(argv: readonly string[]): BenchOptions & { readonly seeds: readonly number[]; readonly out: string } {
  const args = benchArgs(argv);
  const { int } = args;
  const seedsText = args.value('seeds') ?? args.value('seed') ?? '1';
  const seeds = seedsText.split(',').map((s) => (s.trim() === '' ? Number.NaN : Number(s)));
  if (!seeds.every((seed) => Number.isInteger(seed) && seed >= 0))
    throw new ConfigError(`bench trl: --seeds must list integers >= 0, got ${seedsText}`);
  const target = Number(args.value('target') ?? '0.75');
  if (!Number.isFinite(target)) throw new ConfigError(`bench trl: --target must be a held-out reward, got ${args.value('target')}`);
  const only = args.value('only') ?? '';
  if (!['', 'rxrl', 'trl'].includes(only)) throw new ConfigError(`bench trl: --only must be rxrl or trl, got ${only}`);
  const backend = args.value('backend') ?? 'tensorflow';
  if (!BACKEND_KINDS.includes(backend as BackendKind))
    throw new ConfigError(`bench trl: --backend must be one of ${BACKEND_KINDS.join(', ')}, got ${backend}`);
  const recipe = resolve(args.value('recipe') ?? 'recipes/smollm2-arithmetic.yaml');
  const samplingText = args.value('sampling-seed');
  const samplingSeed = samplingText === undefined ? undefined : Number(samplingText);
  if (samplingSeed !== undefined && !(Number.isInteger(samplingSeed) && samplingSeed >= 0))
    throw new ConfigError(`bench trl: --sampling-seed must be an integer >= 0, got ${samplingText}`);
  // Without --paired rxrl's run.seed also draws its prompt order, adapter and held-out questions.
  if (samplingSeed !== undefined && !args.flag('paired'))
    throw new ConfigError('bench trl: --sampling-seed needs --paired (it changes the sampling draws alone)');
  return {
    steps: int('steps', 50),
    threads: int('threads', 2),
    target,
    valEvery: int('val-every', 10),
    only,
    backend: backend as BackendKind,
    recipe,
    // --set key=value (repeatable) changes the recipe for both sides, as `rxrl run --set` does; the bench's own keys win.
    overrides: argv.flatMap((a, i) => (a === '--set' && argv[i + 1] !== undefined ? [argv[i + 1]] : [])),
    paired: args.flag('paired'),
    equalWork: args.flag('equal-work'),
    ...(samplingSeed === undefined ? {} : { samplingSeed }),
    seeds,
    out: resolve(args.value('out') ?? join('runs', `bench-trl-${basename(recipe, extname(recipe))}`)),
  };
}

export async function main(args: readonly string[]): Promise<void> {
  const { seeds, out, ...options } = trlBenchOptions(args);
  const summaries: Record<string, unknown>[] = [];
  for (const seed of seeds) summaries.push(await benchSeed(options, seed, seeds.length === 1 ? out : join(out, `seed-${seed}`)));
  if (seeds.length > 1) console.log(JSON.stringify(seedsLine(summaries)));
}

/** One seed's comparison in `out`: both sides, their bounds and misses; returns (and prints last) its summary line. */
async function benchSeed(options: BenchOptions, seed: number, out: string): Promise<Record<string, unknown>> {
  const { steps, threads, target, valEvery, only, backend, recipe } = options;
  // rxrl's run: validation before training and every --val-every steps, no checkpoint but the last.
  // TRL's advantage epsilon is a constant: rxrl's side takes it too.
  const set = [
    ...options.overrides,
    ...(options.equalWork ? EQUAL_WORK_SET : []),
    `run.steps=${steps}`,
    `run.seed=${seed}`,
    `run.dir=${join(out, 'rxrl')}`,
    `run.backend=${backend}`,
    `validation.every=${valEvery}`,
    'validation.beforeTrain=true',
    'checkpoint.every=0',
    `algorithm.stdEpsilon=${TRL_STD_EPSILON}`,
    'validation.generations=true',
  ];
  const config = loadConfig({ file: recipe, set });
  const settings = trlSettings(config);
  // The bench's own subdirectories start empty (a left-over rxrl run would be resumed).
  for (const dir of ['data', 'rxrl', 'trl', 'paired']) await rm(join(out, dir), { recursive: true, force: true });
  const exported = await exportData(config, recipeDir(recipe), join(out, 'data'));
  const { modelDir, rows, promptTokens } = exported;
  const { samplingSeed } = options;
  const work = options.equalWork ? 'equal' : 'learning-run';
  const header = { bench: 'trl', recipe, steps, seed, threads, target, val_every: valEvery, model: modelDir, train_prompts: rows, work };
  const paired = options.paired && only !== 'trl';
  const marks = { ...(paired ? { paired: true } : {}), ...(samplingSeed === undefined ? {} : { sampling_seed: samplingSeed }) };
  console.log(JSON.stringify({ ...header, settings, rxrl_only: rxrlOnly(config), ...marks }));

  const sides: Record<string, SideResult> = {};
  if (only !== 'trl') {
    const own = paired
      ? await pairedSet(config, { ...exported, data: join(out, 'data') }, { settings, out: join(out, 'paired'), seed, threads })
      : [];
    // Order, adapter and held-out questions now come from files: the run's seed draws its samples only.
    const sampling = samplingSeed === undefined ? [] : [`run.seed=${samplingSeed}`];
    sides.rxrl = await runRxrl(recipe, [...set, ...own, ...sampling], join(out, 'rxrl'));
    for (const s of sides.rxrl.steps) console.log(JSON.stringify({ bench: 'trl', side: 'rxrl', ...s }));
    console.log(JSON.stringify(sideSummary('rxrl', sides.rxrl, target)));
  }
  if (only !== 'rxrl') {
    const trl = await runTrl({
      modelDir,
      data: join(out, 'data'),
      settings,
      out: join(out, 'trl'),
      steps,
      seed,
      samplingSeed,
      threads,
      valEvery,
      record: false,
    });
    if ('skipped' in trl) console.log(JSON.stringify({ bench: 'trl', side: 'trl', skipped: trl.skipped }));
    else {
      sides.trl = trl;
      for (const s of trl.steps) console.log(JSON.stringify({ bench: 'trl', side: 'trl', ...s }));
      console.log(JSON.stringify(sideSummary('trl', trl, target)));
    }
  }
  await writeFile(join(out, 'metrics.jsonl'), comparisonLines(sides));
  await writeReport(out, { title: `rxrl and TRL: ${basename(recipe)}, ${steps} steps, seed ${seed}` });
  // Measured after both sides, never beside them.
  const rxrlRows = (config.sync.generationBatchSize ?? config.sync.batchSize) * config.rollout.groupSize;
  const bounds = await boundsLine(backend, modelDir, { settings, promptTokens, rxrlRows }, sides);
  console.log(JSON.stringify(bounds.line));
  const equal = options.equalWork ? equalWorkLine({ rxrl: sides.rxrl?.steps, trl: sides.trl?.steps }, bounds.bounds) : undefined;
  if (equal) console.log(JSON.stringify(equal));
  const missed = missedLine(sides);
  if (missed) console.log(JSON.stringify(missed));
  const summary = {
    ...summaryLine(steps, target, sides, equal === undefined ? undefined : (equal.equal_work_step_ratio as number | null)),
    seed,
    rxrl_only: rxrlOnly(config),
    ...marks,
  };
  console.log(JSON.stringify(summary));
  return summary;
}

/**
 * The seeds' table in one line (`--seeds`): each seed's gains, their difference and both ratios, then the mean gain
 * of each side, the mean paired difference (rxrl − TRL, paired by seed number; with `--paired` also by prompt order
 * and initial adapter) with its standard error, on how many seeds rxrl gained at least as much, and the smallest
 * step-time ratio.
 */
export function seedsLine(summaries: readonly Record<string, unknown>[]): Record<string, unknown> {
  const num = (x: unknown): number | null => (typeof x === 'number' && Number.isFinite(x) ? x : null);
  const rows = summaries.map((s) => {
    const [rxrl, trl] = [num(s.rxrl_gain), num(s.trl_gain)];
    const diff = rxrl !== null && trl !== null ? round(rxrl - trl) : null;
    return {
      seed: s.seed,
      // `--sampling-seed`: the draws the seed's runs sampled with.
      ...(s.sampling_seed === undefined ? {} : { sampling_seed: s.sampling_seed }),
      rxrl_gain: rxrl,
      trl_gain: trl,
      diff,
      ...(s.work === 'equal' ? { equal_work_step_ratio: num(s.equal_work_step_ratio) } : { step_time_ratio: num(s.step_time_ratio) }),
      time_to_target_ratio: num(s.time_to_target_ratio),
    };
  });
  const present = (values: (number | null)[]): number[] => values.filter((v): v is number => v !== null);
  const mean = (values: number[]): number | null => (values.length === 0 ? null : round(values.reduce((a, b) => a + b, 0) / values.length));
  const diffs = present(rows.map((r) => r.diff));
  const diffMean = mean(diffs);
  const se =
    diffs.length < 2 || diffMean === null
      ? null
      : round(Math.sqrt(diffs.reduce((sum, d) => sum + (d - diffMean) ** 2, 0) / (diffs.length - 1) / diffs.length));
  const equal = summaries.some((s) => s.work === 'equal');
  const ratioKey = equal ? 'equal_work_step_ratio' : 'step_time_ratio';
  const ratios = present(rows.map((r) => (ratioKey in r ? (r as Record<string, number | null>)[ratioKey] : null)));
  return {
    bench: 'trl-seeds',
    seeds: rows,
    rxrl_gain_mean: mean(present(rows.map((r) => r.rxrl_gain))),
    trl_gain_mean: mean(present(rows.map((r) => r.trl_gain))),
    diff_mean: diffMean,
    diff_se: se,
    rxrl_at_least_trl: `${diffs.filter((d) => d >= 0).length}/${diffs.length}`,
    [`${ratioKey}_min`]: ratios.length === 0 ? null : Math.min(...ratios),
  };
}

/**
 * The held-out questions each side's last validation got wrong, and those both did: where two runs with the same
 * score differ. Undefined unless both sides report them.
 */
export function missedLine(sides: Readonly<Record<string, SideResult>>): Record<string, unknown> | undefined {
  const { rxrl, trl } = sides;
  if (rxrl?.missed === undefined || trl?.missed === undefined) return undefined;
  const theirs = new Set(trl.missed);
  return { bench: 'trl-missed', rxrl: rxrl.missed, trl: trl.missed, both: rxrl.missed.filter((id) => theirs.has(id)) };
}
