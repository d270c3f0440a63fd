/**
 * Whether a run learns as well on a distributed engine as in process: the same recipe trained by `runTraining`
 * embedded (`trainer.backend: local`, a LoRA policy on TF.js) and on SkyRL's Tinker server (`trainer.backend: tinker`,
 * JAX) with one and with two server processes (fully-sharded data parallel over `jax.distributed`). The recipe: a
 * random tiny Qwen3 (the float32 fixture), LoRA rank 4 with alpha 32 on every linear layer (what SkyRL makes), no
 * gradient clipping (SkyRL does not clip), the bundled reverse task's prompts scored by recipes/letters.ts (the share
 * of the response's characters that are the answer's letters), held-out reward measured before and after on the
 * task's validation prompts. Seed s is run on each engine in turn; a fresh SkyRL server per sharded run (SkyRL 0.4.0's
 * sharded backend cannot make a client after one was unloaded). Prints a JSON line per run and a summary
 * (`bench: "engines-summary"`): each engine's mean held-out gain over the seeds, its ratio to the embedded mean, and
 * median seconds per step side by side.
 *
 * Needs SkyRL installed (`npm test`'s setup does it; its path in `.cache/skyrl-home`, or `--skyrl-home DIR`).
 *
 * Run: `npm run bench -- engines [--steps 20] [--seeds 3] [--lr 0.02] [--processes 1,2] [--backend auto]`.
 *
 * @packageDocumentation
 */
import { readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { loadConfig } from '../lib/config/schema.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { startSkyrl, type SkyrlServer } from '../lib/tinker/skyrlServer.js';
import { runTraining } from '../pipelines/run.js';
import { median } from './_stats.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const MODEL = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen3-f32');
const EVALUATOR = { module: fileURLToPath(new URL('../recipes/letters.js', import.meta.url)), export: 'letterShareEvaluator' };
const TASK = { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 16 } as const;
const RANK = 4;
const ALPHA = 32;

function flag(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

/** One run's outcome. */
interface RunRow {
  readonly engine: string;
  readonly seed: number;
  readonly before: number;
  readonly after: number;
  readonly secondsPerStep: number;
}

/** Runs the benchmark. */
export async function main(args: readonly string[]): Promise<void> {
  const steps = Number(flag(args, 'steps', '20'));
  const seeds = Number(flag(args, 'seeds', '3'));
  const learningRate = Number(flag(args, 'lr', '0.02'));
  const processes = flag(args, 'processes', '1,2')
    .split(',')
    .map((p) => Number(p) as 1 | 2);
  const home = flag(args, 'skyrl-home', '') || readFileSync(join(root, '.cache', 'skyrl-home'), 'utf8').trim();
  const backend = await initBackend(flag(args, 'backend', 'auto') as BackendName, { logger: { info: () => undefined } });
  const work = await mkdtemp(join(tmpdir(), 'rxrl-bench-engines-'));
  const rows: RunRow[] = [];
  const common = (seed: number) => ({
    run: { dir: null, seed, steps, backend },
    data: { source: 'bundled', task: TASK },
    model: { path: MODEL },
    rollout: { groupSize: 8, maxTokens: 4, evaluator: EVALUATOR },
    sync: { mode: 'sync', batchSize: 4 },
    checkpoint: { every: 0 },
    validation: { beforeTrain: true },
  });
  const record = async (engine: string, seed: number, values: Record<string, unknown>) => {
    const summary = await runTraining(loadConfig({ env: {}, values }));
    const row = {
      engine,
      seed,
      before: summary.valRewardInitial ?? Number.NaN,
      after: summary.valRewardFinal ?? Number.NaN,
      secondsPerStep: summary.seconds / summary.steps,
    };
    rows.push(row);
    console.log(JSON.stringify({ bench: 'engines', backend, steps, ...row, secondsPerStep: Number(row.secondsPerStep.toFixed(3)) }));
  };
  // One-process server: one for all seeds (each run frees its client on close).
  let single: SkyrlServer | undefined;
  try {
    for (let seed = 1; seed <= seeds; seed++) {
      await record('embedded', seed, {
        ...common(seed),
        trainer: { learningRate, maxGradNorm: 1e9 },
        policies: [{ name: 'policy', specialization: 'lora', lora: { rank: RANK, alpha: ALPHA } }],
      });
      for (const p of processes) {
        const server =
          p === 1
            ? (single ??= await startSkyrl({ home, model: MODEL, dir: join(work, 'skyrl-1') }))
            : await startSkyrl({ home, model: MODEL, dir: join(work, `skyrl-2-seed-${seed}`), processes: 2 });
        try {
          await record(`skyrl-${p}`, seed, {
            ...common(seed),
            trainer: { backend: 'tinker', learningRate, maxGradNorm: 1e9 },
            tinker: { baseUrl: server.url, baseModel: MODEL, rank: RANK, futureTimeoutMs: 600_000 },
          });
        } finally {
          if (p === 2) await server.stop();
        }
      }
    }
  } finally {
    await single?.stop();
  }
  console.log(JSON.stringify(summarize(rows, { backend, steps, seeds, learningRate })));
}

/** Each engine's mean gain and median seconds per step, and their ratios to the embedded run's. */
function summarize(rows: readonly RunRow[], settings: Record<string, unknown>): Record<string, unknown> {
  const engines = [...new Set(rows.map((r) => r.engine))];
  const mean = (xs: readonly number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const of = (engine: string) => rows.filter((r) => r.engine === engine);
  const gain = (engine: string) => mean(of(engine).map((r) => r.after - r.before));
  const pace = (engine: string) => median(of(engine).map((r) => r.secondsPerStep));
  const round = (x: number) => Number(x.toFixed(3));
  return {
    bench: 'engines-summary',
    ...settings,
    engines: Object.fromEntries(
      engines.map((e) => [
        e,
        {
          rewardBefore: round(mean(of(e).map((r) => r.before))),
          rewardAfter: round(mean(of(e).map((r) => r.after))),
          meanGain: round(gain(e)),
          gainOverEmbedded: round(gain(e) / gain('embedded')),
          secondsPerStep: round(pace(e)),
          stepTimeOverEmbedded: round(pace(e) / pace('embedded')),
        },
      ]),
    ),
  };
}
