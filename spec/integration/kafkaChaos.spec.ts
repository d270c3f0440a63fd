/**
 * Chaos test of a Kafka run: `rxrl trainer` and three `rxrl worker` processes on the real broker, 60 steps in each
 * staleness mode, with SIGKILLs at seeded random moments — workers (restarted at once) and the trainer (restarted
 * from its checkpoint). Asserted by ids on the trainer's own records (`trained.jsonl`, `metrics.jsonl`): every task
 * the loader admits is trained exactly once across the restarts, no trajectory twice, what the mode guarantees about
 * staleness holds on every step, and the step and metric records continue where the checkpoint left off.
 *
 * What each mode guarantees (DESIGN.md, "Staleness modes"): `sync` and `batch-async` bound the staleness of every
 * trained trajectory by η through admission (0 and 1 here). `fully-async` bounds nothing but the capacity: a task
 * whose worker is killed is redelivered while later tasks overtake it, so its staleness depends on timing. What it
 * guarantees is that staleness is recorded (never negative: no trajectory from a rolled-back version) and that
 * `trainer.maxStaleness` is enforced at train time — every row staler than it, and only those, is masked from the
 * loss (`rollout/dropped_stale`). That is what the spec asserts, so it does not depend on the machine's load.
 *
 * To diagnose a failure, set `RXRL_CHAOS_DIAG=<dir>`: every process logs at `debug` (each Kafka event: admissions,
 * trained steps, pauses, commits) into `<dir>/<trainer|worker>-<n>.log`, the run's directory is kept, and progress is
 * what the run writes alone (the debug lines never stop, so they cannot count as progress).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { appendFileSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { loadTasks } from '../../lib/data/loader.js';
import { createRng } from '../../lib/core/random.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import { groupIdOf } from '../../operators/rollout.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { brokers, uniqueName } from '../kafka/helpers.js';
import { jsonLines, runDirProgress, type TrainedLine } from '../helpers/runDir.js';
import { waitFor } from '../helpers/waitFor.js';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const cli = join(root, 'dist/cli/main.js');
const STEPS = 60;
const BATCH = 2;
const SEED = 11;
const TASK = { transform: 'reverse', alphabet: 'abcd', minLength: 2, maxLength: 3, validationSize: 4 } as const;

interface Proc {
  readonly child: ChildProcess;
  readonly exited: Promise<number | null>;
  /** The exit code once it exited (`null`: by a signal). */
  code?: number | null;
  stderr: string;
  /** Bytes written to stdout and stderr so far: progress. */
  output: number;
}

/** Where each process's whole output goes, and the run is kept (see the module comment). */
const DIAG = process.env.RXRL_CHAOS_DIAG;
let launched = 0;

function launch(command: 'trainer' | 'worker', recipe: string): Proc {
  const log = DIAG ? join(DIAG, `${command}-${launched++}.log`) : undefined;
  const child = spawn(process.execPath, [cli, command, recipe], { stdio: ['ignore', 'pipe', 'pipe'] });
  const proc: Proc = { child, exited: new Promise((done) => child.on('exit', (code) => done((proc.code = code)))), stderr: '', output: 0 };
  child.stdout!.on('data', (d: Buffer) => (proc.output += d.length));
  child.stderr!.on('data', (d: Buffer) => {
    proc.output += d.length;
    proc.stderr = (proc.stderr + d.toString()).slice(-4000);
    if (log) appendFileSync(log, d);
  });
  return proc;
}

/**
 * What says the run is moving: what it wrote (trained steps, metrics, checkpoints) and the processes' output. The
 * waits below fail only when none of it changed for two minutes, however long it all takes.
 */
function progress(runDir: string, all: readonly Proc[]): string {
  return DIAG ? runDirProgress(runDir) : `${runDirProgress(runDir)}|${all.reduce((n, p) => n + p.output, 0)}`;
}

async function kill(proc: Proc): Promise<void> {
  proc.child.kill('SIGKILL');
  await proc.exited;
}

/** The trainer's and each worker's stderr (their last 4,000 characters), for a failure's message. */
function stderrs(trainer: Proc, workers: readonly Proc[]): string {
  return [`trainer: ${trainer.stderr}`, ...workers.map((w, i) => `worker ${i}: ${w.stderr}`)].join('\n');
}

/** The groups the loader hands out for a run of STEPS steps: what must be trained, each exactly once. */
async function expectedGroups(): Promise<string[]> {
  const task = stringTransformTask({ ...TASK, seed: SEED });
  const out: string[] = [];
  for await (const t of loadTasks(task.train, { epochs: Infinity, shuffle: true, seed: SEED })) {
    out.push(groupIdOf(t));
    if (out.length === STEPS * BATCH) break;
  }
  return out;
}

interface ChaosFigures {
  mode: StalenessMode;
  kills: { worker: number; trainer: number };
  tasks: number;
  duplicates: number;
  stalenessMax: number;
  /** Rows masked for staleness (fully-async). */
  dropped: number;
  seconds: number;
}

/** What a mode guarantees: staleness ≤ η by admission, or rows staler than `trainer.maxStaleness` masked. */
type Guarantee = { readonly admission: number } | { readonly maxStaleness: number };

async function chaosRun(mode: StalenessMode, guarantee: Guarantee): Promise<ChaosFigures> {
  const dir = mkdtempSync(join(tmpdir(), `rxrl-chaos-${mode}-`));
  try {
    const started = performance.now();
    const recipe = writeRecipe(dir, mode, guarantee);
    const kills = await killAndRestart(mode, recipe, join(dir, 'run'));
    expect(kills.worker + kills.trainer).toBeGreaterThanOrEqual(3);
    return {
      mode,
      kills,
      ...(await checkRecords(mode, guarantee, join(dir, 'run'))),
      seconds: Math.round((performance.now() - started) / 1000),
    };
  } finally {
    // Passed or failed, nothing is left behind (a failure's message carries the processes' stderr), unless diagnosing.
    if (DIAG === undefined) rmSync(dir, { recursive: true, force: true });
    else process.stderr.write(`chaos: run kept in ${dir}, logs in ${DIAG}\n`);
  }
}

/** The run's recipe, written into `dir`; returns its path. */
function writeRecipe(dir: string, mode: StalenessMode, guarantee: Guarantee): string {
  const recipe = join(dir, 'recipe.json');
  writeFileSync(
    recipe,
    JSON.stringify({
      run: { dir: 'run', seed: SEED, steps: STEPS, backend: 'cpu' },
      data: { source: 'bundled', task: TASK, epochs: 0, shuffle: true },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
      rollout: { groupSize: 2 },
      ...('maxStaleness' in guarantee ? { trainer: { maxStaleness: guarantee.maxStaleness } } : {}),
      sync: { mode, batchSize: BATCH, stalenessThreshold: 1, capacity: 2 * BATCH },
      checkpoint: { every: 3, keepLast: 2 },
      validation: { beforeTrain: false },
      logging: { level: DIAG ? 'debug' : 'warn' },
      kafka: { brokers: brokers(), topicPrefix: uniqueName(`chaos-${mode}`), workerConcurrency: 2, rolloutDelayMs: 60 },
    }),
  );
  return recipe;
}

/** Runs the trainer and three workers to the end, killing one of them at four seeded steps; every process ends. */
async function killAndRestart(mode: StalenessMode, recipe: string, runDir: string): Promise<ChaosFigures['kills']> {
  const trainedFile = join(runDir, 'trained.jsonl');
  const rng = createRng(SEED, mode);
  // Four kills at random steps, alternating worker and trainer, each after the previous one has taken effect.
  const killAt = [0, 1, 2, 3].map((i) => 6 + i * 12 + Math.floor(rng.next() * 8));
  const kills = { worker: 0, trainer: 0 };
  const workers = [0, 1, 2].map(() => launch('worker', recipe));
  let trainer = launch('trainer', recipe);
  const all: Proc[] = [...workers, trainer];
  const moving = { progress: () => progress(runDir, all), intervalMs: 100 };
  try {
    for (let i = 0; i < killAt.length; i++) {
      await waitFor(() => jsonLines<TrainedLine>(trainedFile).length >= killAt[i], {
        ...moving,
        what: () => `${mode}: step ${killAt[i]} not reached\n${stderrs(trainer, workers)}`,
      });
      if (i % 2 === 0) {
        const which = Math.floor(rng.next() * workers.length);
        await kill(workers[which]);
        workers[which] = launch('worker', recipe);
        all.push(workers[which]);
        kills.worker++;
      } else {
        await kill(trainer);
        const checkpoints = readdirSync(runDir).filter((name) => name.startsWith('global_step_'));
        expect(checkpoints.length, 'a checkpoint to resume from').toBeGreaterThan(0);
        trainer = launch('trainer', recipe);
        all.push(trainer);
        kills.trainer++;
      }
    }
    await waitFor(() => trainer.code !== undefined, { ...moving, what: () => `${mode}: the trainer's exit\n${stderrs(trainer, workers)}` });
    expect(trainer.code, trainer.stderr).toBe(0);
    // Workers follow the run to its end and exit.
    await waitFor(() => workers.every((w) => w.code !== undefined), {
      ...moving,
      what: () => `${mode}: the workers' exits\n${stderrs(trainer, workers)}`,
    });
    expect(
      workers.map((w) => w.code),
      workers.map((w, i) => `worker ${i}: ${w.stderr}`).join('\n'),
    ).toEqual([0, 0, 0]);
    return kills;
  } finally {
    for (const proc of all) proc.child.kill('SIGKILL');
    await Promise.all(all.map((proc) => proc.exited));
  }
}

/** Checks the trainer's records: each step once, each admitted task and trajectory trained once, the staleness. */
async function checkRecords(
  mode: StalenessMode,
  guarantee: Guarantee,
  runDir: string,
): Promise<Pick<ChaosFigures, 'tasks' | 'duplicates' | 'stalenessMax' | 'dropped'>> {
  const lines = jsonLines<TrainedLine>(join(runDir, 'trained.jsonl'));
  // One record per step, in order: the killed trainers' steps past their checkpoint were rolled back and redone.
  expect(lines.map((l) => l.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));
  const stepMetrics = jsonLines<Record<string, unknown>>(join(runDir, 'metrics.jsonl')).filter((r) => 'actor/pg_loss' in r);
  expect(stepMetrics.map((r) => r.step)).toEqual(Array.from({ length: STEPS }, (_, i) => i));
  // Every task the loader admitted trained exactly once; every trajectory once.
  const groups = lines.flatMap((l) => l.groups);
  expect([...groups].sort()).toEqual((await expectedGroups()).sort());
  const trajectories = lines.flatMap((l) => l.trajectoryIds);
  const duplicates = trajectories.length - new Set(trajectories).size;
  expect(duplicates).toBe(0);
  expect(trajectories).toHaveLength(STEPS * BATCH * 2);
  // What the mode guarantees about staleness, on every step.
  let stalenessMax = 0;
  let dropped = 0;
  for (const [i, line] of lines.entries()) {
    const staleness = line.policyVersions.map((v) => line.version - 1 - v);
    expect(Math.min(...staleness), `${mode} step ${line.step}: a trajectory from a rolled-back version`).toBeGreaterThanOrEqual(0);
    if ('admission' in guarantee) {
      expect(Math.max(...staleness), `${mode} step ${line.step}`).toBeLessThanOrEqual(guarantee.admission);
    } else {
      const stale = staleness.filter((s) => s > guarantee.maxStaleness).length;
      expect(stepMetrics[i]['rollout/dropped_stale'], `${mode} step ${line.step}: rows staler than ${guarantee.maxStaleness} masked`).toBe(
        stale,
      );
      dropped += stale;
    }
    stalenessMax = Math.max(stalenessMax, ...staleness);
  }
  return { tasks: groups.length, duplicates, stalenessMax, dropped };
}

describe('a Kafka run under SIGKILLs (trainer + 3 workers, separate processes)', () => {
  const cases: [StalenessMode, Guarantee, string][] = [
    ['sync', { admission: 0 }, 'staleness 0'],
    ['batch-async', { admission: 1 }, 'staleness ≤ 1'],
    ['fully-async', { maxStaleness: 0 }, 'rows staler than trainer.maxStaleness 0 masked'],
  ];
  for (const [mode, guarantee, what] of cases) {
    it(`${mode}: every admitted task trained once, ${what}, records continue across restarts`, async () => {
      const figures = await chaosRun(mode, guarantee);
      process.stderr.write(`chaos ${JSON.stringify(figures)}\n`);
      // No total bound: the waits inside fail when the run stops moving for two minutes, however slow the machine.
    }, 0);
  }
});
