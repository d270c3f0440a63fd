/**
 * `npm run bench -- parity [--steps N] [--seed S]`
 *
 * Learning parity across staleness modes: trains the bundled task from the same seed for the same number of
 * steps in `sync`, `batch-async` (η = 1, 2) and `fully-async` with truncated importance correction, and prints
 * the held-out reward per mode (one JSON line each), plus the largest staleness seen in the last step.
 */
import type { StalenessMode } from '../lib/sync/gate.js';
import type { GrpoTrainerOptions } from '../lib/train/grpoTrainer.js';
import { EMBEDDED_TRAINER, runEmbedded } from '../pipelines/embedded.js';

function option(args: readonly string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

export async function main(args: readonly string[]): Promise<void> {
  const steps = option(args, 'steps', 300);
  const seed = option(args, 'seed', 1);
  const runs: { label: string; mode: StalenessMode; eta?: number; trainer?: GrpoTrainerOptions }[] = [
    { label: 'sync', mode: 'sync' },
    { label: 'batch-async-1', mode: 'batch-async', eta: 1 },
    { label: 'batch-async-2', mode: 'batch-async', eta: 2 },
    { label: 'fully-async+is', mode: 'fully-async', trainer: { ...EMBEDDED_TRAINER, importanceCap: 2 } },
  ];
  for (const run of runs) {
    let maxStaleness = 0;
    const summary = await runEmbedded({
      steps,
      seed,
      mode: run.mode,
      ...(run.eta === undefined ? {} : { stalenessThreshold: run.eta }),
      ...(run.trainer ? { trainer: run.trainer } : {}),
      onStep: (step) => {
        maxStaleness = Math.max(maxStaleness, step.metrics['rollout/staleness_max'] ?? 0);
      },
    });
    console.log(
      JSON.stringify({
        bench: 'parity',
        run: run.label,
        steps: summary.steps,
        seed,
        seconds: summary.seconds,
        maxStaleness,
        valRewardInitial: summary.valRewardInitial,
        valRewardFinal: summary.valRewardFinal,
        valAccuracyFinal: summary.valAccuracyFinal,
      }),
    );
  }
}
