/**
 * `npm run bench -- seeds [--seeds 1,2,3,4,5] [--backends wasm,tensorflow] [--steps 500] [--jobs 2]
 * [--trainer '{"entropyCoef":0.005}'] [--model '{"nLayers":3}']`
 *
 * Does the embedded main job learn on every seed and backend? Runs `npm start`'s configuration (the embedded GRPO
 * run) once per seed and backend, each in a process of its own (`--jobs` at a time), with optional trainer and
 * model overrides, and prints one JSON line per run, then one line with the per-seed table of held-out reward and
 * how many runs reach 0.95.
 *
 * @packageDocumentation
 */
import { fork } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import type { BackendKind } from '../lib/model/backend.js';
import type { GrpoTrainerOptions } from '../lib/train/grpoTrainer.js';
import { EMBEDDED_STEPS, runEmbedded, type EmbeddedRunOptions } from '../pipelines/embedded.js';

/** Held-out reward a run must reach to count as learned. */
const TARGET = 0.95;

interface SeedRun {
  readonly backend: BackendKind;
  readonly seed: number;
  readonly steps: number;
  readonly trainer: GrpoTrainerOptions;
  readonly model: EmbeddedRunOptions['model'];
}

interface SeedResult {
  /** The backend asked for, and the one `auto` resolved to. */
  readonly backend: string;
  readonly resolved: string;
  readonly seed: number;
  readonly valRewardInitial: number;
  readonly valRewardFinal: number | null;
  readonly valAccuracyFinal: number;
  readonly entropyLast: number | null;
  readonly seconds: number;
}

function option(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

/** One run in this process (the child's side). */
async function runOne(run: SeedRun): Promise<SeedResult> {
  const summary = await runEmbedded({
    backend: run.backend,
    seed: run.seed,
    steps: run.steps,
    trainer: run.trainer,
    model: run.model ?? {},
  });
  return {
    backend: run.backend,
    resolved: summary.backend,
    seed: run.seed,
    valRewardInitial: summary.valRewardInitial,
    valRewardFinal: summary.valRewardFinal,
    valAccuracyFinal: summary.valAccuracyFinal,
    entropyLast: summary.lastStep['actor/entropy'] ?? null,
    seconds: summary.seconds,
  };
}

/** One run in a child process: a clean backend and heap per run, and runs side by side on several cores. */
function runChild(run: SeedRun): Promise<SeedResult> {
  return new Promise((resolve, reject) => {
    const child = fork(fileURLToPath(new URL('./run.js', import.meta.url)), ['seeds', '--one', JSON.stringify(run)], {
      stdio: ['ignore', 'pipe', 'inherit', 'ipc'],
    });
    let out = '';
    child.stdout?.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.on('error', reject);
    child.on('exit', (code) => {
      const line = out.trim().split('\n').pop() ?? '';
      if (code !== 0) return reject(new Error(`seed ${run.seed} on ${run.backend} exited with ${code}`));
      resolve(JSON.parse(line) as SeedResult);
    });
  });
}

export async function main(args: readonly string[]): Promise<void> {
  const one = option(args, 'one', '');
  if (one !== '') {
    console.log(JSON.stringify(await runOne(JSON.parse(one) as SeedRun)));
    return;
  }
  const seeds = option(args, 'seeds', '1,2,3,4,5').split(',').map(Number);
  const backends = option(args, 'backends', 'wasm').split(',') as BackendKind[];
  const steps = Number(option(args, 'steps', String(EMBEDDED_STEPS)));
  const jobs = Math.max(1, Number(option(args, 'jobs', '2')));
  const trainer = JSON.parse(option(args, 'trainer', '{}')) as GrpoTrainerOptions;
  const model = JSON.parse(option(args, 'model', '{}')) as EmbeddedRunOptions['model'];
  const queue: SeedRun[] = backends.flatMap((backend) => seeds.map((seed) => ({ backend, seed, steps, trainer, model })));
  const results: SeedResult[] = [];
  const lane = async (): Promise<void> => {
    for (let run = queue.shift(); run !== undefined; run = queue.shift()) {
      const result = await runChild(run);
      console.log(JSON.stringify({ bench: 'seeds', ...result }));
      results.push(result);
    }
  };
  await Promise.all(Array.from({ length: jobs }, lane));
  const table = Object.fromEntries(
    backends.map((backend) => {
      const rows = results.filter((r) => r.backend === backend).sort((a, b) => a.seed - b.seed);
      const finals = rows.map((r) => r.valRewardFinal ?? 0);
      return [
        backend,
        {
          bySeed: Object.fromEntries(rows.map((r) => [r.seed, r.valRewardFinal])),
          mean: Number((finals.reduce((a, b) => a + b, 0) / finals.length).toFixed(3)),
          reached: `${finals.filter((x) => x >= TARGET).length}/${finals.length}`,
        },
      ];
    }),
  );
  console.log(JSON.stringify({ bench: 'seeds', steps, trainer, model, target: TARGET, table }));
}
