/**
 * What training through the Tinker API costs next to training in process: the same recipe (the bundled reverse task,
 * a LoRA adapter of `--rank` on every linear layer with alpha = rank, as the Tinker service makes them) run by
 * `runTraining` with `trainer.backend: local` (GrpoTrainer + LocalEngine on the adapter) and with
 * `trainer.backend: tinker` against rxrl's Tinker service in this process (the same TF.js backend; HTTP, protobuf,
 * futures and sampling sessions between them). Runs alternate, `--rounds` of each, so the machine's noise falls on
 * both alike; round r uses seed r + 1 on both sides (same base, same adapter initialization, same sampling seeds).
 * Prints one JSON line per run (seconds per step, held-out reward before and after) and a summary
 * (`bench: "tinker-summary"`) with the median seconds per step, the ratio and each seed's held-out rewards.
 *
 * Run: `npm run bench -- tinker [--steps 10] [--rounds 3] [--rank 8] [--lr 0.02] [--backend auto]`.
 *
 * @packageDocumentation
 */
import { loadConfig } from '../lib/config/schema.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { tinkerService } from '../lib/tinker/service.js';
import { initialModel } from '../lib/model/policies.js';
import { runTraining } from '../pipelines/run.js';
import { stringTransformTask } from '../recipes/stringTransform.js';
import { median } from './_stats.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

const TASK = { transform: 'reverse', alphabet: 'abc', minLength: 3, maxLength: 3, validationSize: 8 } as const;
const MODEL = { dModel: 64, nLayers: 2, nHeads: 4, dFF: 128, maxSeqLen: 16 };

/** Runs the benchmark. */
export async function main(args: readonly string[]): Promise<void> {
  const steps = Number(flag(args, 'steps', '10'));
  const rounds = Number(flag(args, 'rounds', '3'));
  const rank = Number(flag(args, 'rank', '8'));
  const learningRate = Number(flag(args, 'lr', '0.02'));
  const backend = await initBackend(flag(args, 'backend', 'auto') as BackendName, { logger: { info: () => undefined } });
  const perStep = { local: [] as number[], tinker: [] as number[] };
  const rewards: { seed: number; local: [number, number | null]; tinker: [number, number | null] }[] = [];
  for (let round = 0; round < rounds; round++) {
    // Round r is seed r + 1 on both sides: the same base model, the same adapter initialization (the service
    // seeds its first client's adapter as a run seeds its LoRA policy's), the same sampling seeds.
    const seed = round + 1;
    const tokenizer = new CharTokenizer(stringTransformTask({ ...TASK, seed }).characters);
    const common = {
      run: { dir: null, seed, steps, backend },
      data: { source: 'bundled', task: TASK },
      model: MODEL,
      rollout: { groupSize: 8 },
      sync: { mode: 'sync', batchSize: 8 },
      checkpoint: { every: 0 },
    };
    const { model: base } = await initialModel(loadConfig({ env: {}, values: common }).model, undefined, tokenizer.vocabSize, seed);
    const service = await tinkerService({ model: base, tokenizer, baseModel: 'reverse-base', seed: seed + 1 });
    const recipes = {
      local: { ...common, trainer: { learningRate }, policies: [{ name: 'policy', specialization: 'lora', lora: { rank, alpha: rank } }] },
      tinker: {
        ...common,
        trainer: { backend: 'tinker', learningRate },
        tinker: { baseUrl: service.url, baseModel: 'reverse-base', rank },
      },
    };
    const row = { seed, local: [0, null] as [number, number | null], tinker: [0, null] as [number, number | null] };
    try {
      for (const kind of ['local', 'tinker'] as const) {
        // summary.seconds is the training loop's alone (validation before and after is not counted).
        const summary = await runTraining(loadConfig({ env: {}, values: recipes[kind] }));
        const secondsPerStep = summary.seconds / summary.steps;
        perStep[kind].push(secondsPerStep);
        row[kind] = [summary.valRewardInitial ?? Number.NaN, summary.valRewardFinal];
        console.log(
          JSON.stringify({
            bench: 'tinker',
            seed,
            trainer: kind,
            backend,
            steps: summary.steps,
            seconds: summary.seconds,
            secondsPerStep: Number(secondsPerStep.toFixed(4)),
            valRewardInitial: summary.valRewardInitial,
            valRewardFinal: summary.valRewardFinal,
          }),
        );
      }
    } finally {
      await service.close();
      base.dispose();
    }
    rewards.push(row);
  }
  const local = median(perStep.local);
  const tinker = median(perStep.tinker);
  console.log(
    JSON.stringify({
      bench: 'tinker-summary',
      backend,
      steps,
      rounds,
      rank,
      learningRate,
      samplesPerStep: 64,
      localSecondsPerStep: Number(local.toFixed(4)),
      tinkerSecondsPerStep: Number(tinker.toFixed(4)),
      tinkerOverLocal: Number((tinker / local).toFixed(3)),
      valReward: rewards,
    }),
  );
}
