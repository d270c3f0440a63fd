/**
 * `npm run bench -- trlReplay [--steps 50] [--seed 1 | --seeds 1,2,3] [--recipe recipes/smollm2-arithmetic.yaml]
 * [--out runs/bench-trl-replay] [--threads 2] [--backend tensorflow] [--val-every 10] [--set key=value ...]`
 *
 * Does rxrl's trainer learn what TRL's learns from the same samples? `bench trl` compares two runs that draw their
 * own samples, so a seed's gains differ by the draws as much as by the trainers; the one-batch parity spec
 * (spec/train/trlParity.spec.ts) checks a single step. This bench takes TRL's whole run and trains rxrl on it,
 * for a LoRA recipe:
 *
 * 1. TRL's side runs as in `bench trl --only trl` (`bench/trl_grpo.py --record`) and records the adapter PEFT
 *    initialized, every step's rows as it trained them (prompt and completion token ids, rewards, advantages),
 *    every step's gradient norm before clipping, and its last adapter;
 * 2. rxrl's `GrpoTrainer`, built from the recipe as `rxrl run` builds it (TRL's algorithm: no zero-variance filter,
 *    one generation batch a step), starts from TRL's initial adapter and trains on those rows, step after step:
 *    `grpoPrepare` makes each batch (its advantages are compared with TRL's) and the rollout log-probs are the
 *    current policy's (TRL's ratio is 1 with one PPO epoch);
 * 3. TRL's validation scores rxrl's last adapter (`bench/trl_grpo.py --score-adapter`) as it scored its own.
 *
 * Prints a line per step (`{"bench":"trlReplay","step",…,"rxrl_grad_norm","trl_grad_norm","advantage_error"}`)
 * and a summary per seed: `{"bench":"trlReplay-summary","seed","steps","grad_norm_rel_diff_median",
 * "grad_norm_rel_diff_max","adapter_rel_diff","trl_heldout","rxrl_heldout","trl_missed","rxrl_missed"}`
 * (relative differences over the steps whose TRL norm is not 0; the adapters' difference is `‖a − b‖ / ‖b‖` over
 * all their tensors). Equal held-out scores and misses say the two trainers end where each other would from the
 * same samples.
 *
 * @packageDocumentation
 */
import { readFile, rm } from 'node:fs/promises';
import { basename, extname, join, resolve } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';
import { firstValueFrom, of } from 'rxjs';

import { ConfigError } from '../lib/core/errors.js';
import { loadConfig, type RxrlConfig } from '../lib/config/schema.js';
import type { Group, Trajectory } from '../lib/core/types.js';
import { initBackend, type BackendKind } from '../lib/model/backend.js';
import { LoraAdapter, readPeftAdapterConfig, readPeftWeights, savePeftAdapter } from '../lib/model/lora.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import type { PolicyConfig } from '../lib/model/config.js';
import type { NamedWeights } from '../lib/model/types.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import { grpoPrepare } from '../operators/grpoPrepare.js';
import { prepareOptions } from '../pipelines/grpoPipeline.js';
import { recipeDir } from '../pipelines/parts/data.js';
import { grpoTrainerOptions, loopSettings } from '../pipelines/parts/settings.js';
import { median } from './_stats.js';
import { TRL_STD_EPSILON, exportData, runTrl, trlBenchOptions, trlScript, trlSettings } from './trl.js';

/** One generation batch as `bench/trl_grpo.py --record` writes it (a line of `rollouts.jsonl`). */
interface RecordedBatch {
  readonly prompt_ids: number[][];
  readonly completion_ids: number[][];
  readonly rewards: number[];
  readonly advantages: number[];
}

/** One replayed step. */
export interface ReplayStep {
  readonly step: number;
  readonly rxrl_grad_norm: number;
  readonly trl_grad_norm: number | null;
  /** Largest |rxrl's advantage − TRL's| over the batch's rows. */
  readonly advantage_error: number;
  readonly reward_mean: number;
}

/** Log-probs of `completion` after `prompt` under `model`, one forward pass. */
function completionLogprobs(model: PolicyModel, prompt: readonly number[], completion: readonly number[]): number[] {
  const ids = [...prompt, ...completion];
  const T = ids.length;
  const logprobs = tf.tidy(
    () =>
      model.tokenLogprobs(
        tf.tensor2d([ids], [1, T], 'int32'),
        tf.ones([1, T], 'int32'),
        tf.tensor2d([ids.map((_, i) => i)], [1, T], 'int32'),
        prompt.length - 1,
      ).logprobs,
  );
  try {
    return Array.from(logprobs.dataSync());
  } finally {
    logprobs.dispose();
  }
}

/** TRL's rows of one step as groups of `groupSize` consecutive rows (its sampler repeats a prompt in a row). */
function groupsOf(batch: RecordedBatch, step: number, groupSize: number, stopIds: readonly number[], model: PolicyModel): Group[] {
  const groups: Group[] = [];
  for (let first = 0; first < batch.prompt_ids.length; first += groupSize) {
    const id = `${step}/${first / groupSize}`;
    const trajectories: Trajectory[] = [];
    for (let k = first; k < first + groupSize; k++) {
      const [prompt, response] = [batch.prompt_ids[k], batch.completion_ids[k]];
      if (prompt.join() !== batch.prompt_ids[first].join())
        throw new ConfigError(`trlReplay: step ${step}: row ${k} is not its group's prompt (group size ${groupSize}?)`);
      trajectories.push({
        id: `${id}/${k - first}`,
        taskId: id,
        groupId: id,
        runId: k - first,
        modelTag: 'policy',
        policyVersion: step,
        promptTokens: prompt,
        responseTokens: response,
        logprobs: completionLogprobs(model, prompt, response),
        lossMask: response.map(() => 1),
        reward: batch.rewards[k],
        finishReason: stopIds.includes(response.at(-1) ?? -1) ? 'stop' : 'length',
        metrics: {},
        task: { id, prompt: '' },
      });
    }
    groups.push({ key: [id], modelTag: 'policy', trajectories });
  }
  return groups;
}

/**
 * Trains a LoRA policy of `config` from TRL's recorded initial adapter on TRL's recorded batches, in order, and
 * saves its last adapter (PEFT) in `adapterOut`.
 *
 * @param record - `<TRL's out>/record`.
 * @returns one row per step, and the base model's architecture.
 */
export async function replayRollouts(options: {
  readonly config: RxrlConfig;
  readonly modelDir: string;
  readonly record: string;
  readonly adapterOut: string;
  readonly backend: BackendKind;
}): Promise<{ rows: ReplayStep[]; policy: PolicyConfig }> {
  const { config, record } = options;
  await initBackend(options.backend, { logger: { info: () => undefined } });
  const { model: base, contents } = await loadModelDir(options.modelDir);
  const initial = join(record, 'initial-adapter');
  const { lora } = await readPeftAdapterConfig(initial);
  const adapter = LoraAdapter.fromWeights(base.config, lora, await readPeftWeights(initial, base.config, lora));
  const model = PolicyModel.withAdapter(base, adapter);
  const trainer = new GrpoTrainer(model, grpoTrainerOptions(config));
  const { eosTokenId, padTokenId } = contents.special;
  const stopIds = eosTokenId === undefined ? [] : typeof eosTokenId === 'number' ? [eosTokenId] : [...eosTokenId];
  const prepare = prepareOptions({ advantage: loopSettings(config).advantage }, padTokenId ?? stopIds[0] ?? 0, 'policy', undefined);
  const lines = async (file: string): Promise<Record<string, unknown>[]> =>
    (await readFile(join(record, file), 'utf8'))
      .split('\n')
      .filter((l) => l.trim() !== '')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  const trlNorms = new Map((await lines('steps.jsonl')).map((s) => [Number(s.step), Number(s.grad_norm)]));
  const rows: ReplayStep[] = [];
  for (const [step, line] of (await lines('rollouts.jsonl')).entries()) {
    const recorded = line as unknown as RecordedBatch;
    const groups = groupsOf(recorded, step, config.rollout.groupSize, stopIds, model);
    const batch = await firstValueFrom(of(groups).pipe(grpoPrepare(prepare)));
    const width = batch.advantages.length / batch.size;
    const advantageError = Math.max(...recorded.advantages.map((a, b) => Math.abs(batch.advantages[b * width] - a)));
    const { metrics } = await trainer.trainStep(batch);
    rows.push({
      step,
      rxrl_grad_norm: metrics['actor/grad_norm'],
      trl_grad_norm: trlNorms.get(step) ?? null,
      advantage_error: advantageError,
      reward_mean: recorded.rewards.reduce((a, b) => a + b, 0) / recorded.rewards.length,
    });
  }
  await savePeftAdapter(options.adapterOut, adapter);
  model.dispose();
  adapter.dispose();
  base.dispose();
  return { rows, policy: base.config };
}

/** `‖a − b‖ / ‖b‖` over every tensor of two adapters (same names). */
function relativeDifference(a: NamedWeights, b: NamedWeights): number {
  let [diff, norm] = [0, 0];
  for (const [name, w] of b) {
    const other = a.get(name);
    if (other === undefined) throw new ConfigError(`trlReplay: rxrl's adapter has no ${name}`);
    w.data.forEach((x, i) => {
      diff += (other.data[i] - x) ** 2;
      norm += x * x;
    });
  }
  return Math.sqrt(diff / norm);
}

async function replaySeed(options: ReturnType<typeof trlBenchOptions>, seed: number, out: string): Promise<void> {
  const { steps, threads, valEvery, recipe, backend } = options;
  const config = loadConfig({
    file: recipe,
    set: [
      ...options.overrides,
      `run.steps=${steps}`,
      `run.seed=${seed}`,
      `algorithm.stdEpsilon=${TRL_STD_EPSILON}`,
      // TRL trains every group it sampled: its algorithm, not the recipe's dynamic sampling.
      'algorithm.filterZeroVariance=false',
      'sync.generationBatchSize=null',
    ],
  });
  if (config.policies[0]?.specialization !== 'lora') throw new ConfigError('bench trlReplay needs a recipe whose policy is lora');
  const settings = trlSettings(config);
  for (const dir of ['data', 'trl', 'rxrl']) await rm(join(out, dir), { recursive: true, force: true });
  const exported = await exportData(config, recipeDir(recipe), join(out, 'data'));
  const { modelDir } = exported;
  console.log(JSON.stringify({ bench: 'trlReplay', recipe, steps, seed, threads, model: modelDir, settings }));
  const trlOut = join(out, 'trl');
  const run = { modelDir, data: join(out, 'data'), settings, out: trlOut, steps, seed, threads, valEvery };
  const trl = await runTrl({ ...run, samplingSeed: undefined, record: true });
  if ('skipped' in trl) throw new ConfigError(`bench trlReplay needs TRL's side: ${trl.skipped}`);
  const record = join(trlOut, 'record');
  const adapterOut = join(out, 'rxrl', 'final-adapter');
  const { rows, policy } = await replayRollouts({ config, modelDir, record, adapterOut, backend });
  for (const row of rows) console.log(JSON.stringify({ bench: 'trlReplay', ...row }));
  const scoring = ['--model', modelDir, '--data', run.data, '--settings', JSON.stringify(settings), '--out', join(out, 'score')];
  scoring.push('--steps', String(steps), '--seed', String(seed), '--threads', String(threads), '--score-adapter', adapterOut);
  const [scored] = (await trlScript(scoring)).filter((e) => e.event === 'val');
  const diffs = rows
    .filter((r) => r.trl_grad_norm !== null && r.trl_grad_norm > 0)
    .map((r) => Math.abs(r.rxrl_grad_norm / r.trl_grad_norm! - 1));
  const lora = (await readPeftAdapterConfig(adapterOut)).lora;
  const adapters = await Promise.all([adapterOut, join(record, 'final-adapter')].map((dir) => readPeftWeights(dir, policy, lora)));
  console.log(
    JSON.stringify({
      bench: 'trlReplay-summary',
      seed,
      steps: rows.length,
      grad_norm_rel_diff_median: median(diffs),
      grad_norm_rel_diff_max: Math.max(...diffs),
      advantage_error_max: Math.max(...rows.map((r) => r.advantage_error)),
      adapter_rel_diff: relativeDifference(adapters[0], adapters[1]),
      trl_heldout: trl.after?.reward ?? null,
      rxrl_heldout: Number(scored?.reward_mean),
      trl_missed: trl.missed ?? null,
      rxrl_missed: (scored?.missed as string[] | undefined)?.slice().sort() ?? null,
    }),
  );
}

export async function main(args: readonly string[]): Promise<void> {
  const options = trlBenchOptions(args);
  if (options.paired || options.samplingSeed !== undefined || options.only !== '')
    throw new ConfigError('bench trlReplay: --paired, --sampling-seed and --only are bench trl flags');
  const recipeName = basename(options.recipe, extname(options.recipe));
  const out = resolve(args.includes('--out') ? options.out : join('runs', `bench-trl-replay-${recipeName}`));
  for (const seed of options.seeds) await replaySeed(options, seed, options.seeds.length === 1 ? out : join(out, `seed-${seed}`));
}
