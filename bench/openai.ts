/**
 * GRPO on the bundled task through `rxrl serve` (OpenAIEngine over HTTP, a separate server process) vs the
 * in-process engine, with the same seed and step budget. Prints one JSON line per run and one comparison line.
 *
 * Run: `npm run bench -- openai [--steps 300] [--seeds 1,2]`.
 *
 * @packageDocumentation
 */
import { runEmbedded, runServed } from '../pipelines/index.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

/** Runs both variants for every seed. */
export async function main(args: readonly string[]): Promise<void> {
  const steps = Number(flag(args, 'steps', '300'));
  const seeds = flag(args, 'seeds', '1').split(',').map(Number);
  const progress = (label: string) => (step: { step: number; metrics: Record<string, number> }, elapsed: number) => {
    if ((step.step + 1) % 25 === 0) {
      process.stderr.write(
        `${label} step ${step.step + 1} reward ${step.metrics['rollout/reward_mean'].toFixed(3)} ${elapsed.toFixed(0)}s\n`,
      );
    }
  };
  const rows: { seed: number; engine: string; valRewardFinal: number | null; seconds: number }[] = [];
  for (const seed of seeds) {
    const local = await runEmbedded({ steps, seed, onStep: progress(`local  seed ${seed}`) });
    const { lastStep: _a, ...localRow } = local;
    console.log(JSON.stringify({ bench: 'openai', variant: 'in-process', ...localRow }));
    rows.push({ seed, engine: 'local', valRewardFinal: local.valRewardFinal, seconds: local.seconds });
    const served = await runServed({ steps, seed, onStep: progress(`served seed ${seed}`) });
    const { lastStep: _b, ...servedRow } = served;
    console.log(JSON.stringify({ bench: 'openai', variant: 'openai+rxrl-serve', ...servedRow }));
    rows.push({ seed, engine: 'openai', valRewardFinal: served.valRewardFinal, seconds: served.seconds });
  }
  const mean = (engine: string, key: 'valRewardFinal' | 'seconds'): number => {
    const xs = rows.filter((r) => r.engine === engine).map((r) => r[key] ?? NaN);
    return xs.reduce((a, b) => a + b, 0) / xs.length;
  };
  console.log(
    JSON.stringify({
      bench: 'openai',
      steps,
      seeds,
      valRewardFinalLocal: Number(mean('local', 'valRewardFinal').toFixed(4)),
      valRewardFinalServed: Number(mean('openai', 'valRewardFinal').toFixed(4)),
      secondsLocal: Number(mean('local', 'seconds').toFixed(1)),
      secondsServed: Number(mean('openai', 'seconds').toFixed(1)),
      servedOverLocalTime: Number((mean('openai', 'seconds') / mean('local', 'seconds')).toFixed(2)),
    }),
  );
}
