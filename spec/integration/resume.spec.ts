import { spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, readdirSync, rmSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it } from 'vitest';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { runDirProgress, trainedLines } from '../helpers/runDir.js';
import { waitFor } from '../helpers/waitFor.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const TASK = { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 4 } as const;

/** A spawned `rxrl run`: its exit (`result` once it exited), and what it wrote so far, as progress. */
interface Run {
  readonly child: ChildProcess;
  readonly done: Promise<RunResult>;
  result?: RunResult;
  readonly progress: () => string;
}

interface RunResult {
  readonly code: number | null;
  readonly stdout: string;
  readonly stderr: string;
}

function start(recipe: string): Run {
  const child = spawn(process.execPath, [cli, 'run', recipe], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
  const runDir = join(dirname(recipe), 'run');
  runs.push(child);
  const run: Run = {
    child,
    done: new Promise((resolve) => child.on('exit', (code) => resolve((run.result = { code, stdout, stderr })))),
    progress: () => `${runDirProgress(runDir)}|${stdout.length + stderr.length}`,
  };
  return run;
}

/** Waits until `check` holds, failing loudly only when `run` writes nothing for two minutes (not after a total). */
async function until(run: Run, check: () => boolean, what: string): Promise<void> {
  await waitFor(check, { progress: run.progress, intervalMs: 50, what });
}

/** The run's exit, waited for as {@link until} waits. */
async function finished(run: Run): Promise<RunResult> {
  await until(run, () => run.result !== undefined, 'the run to exit');
  return run.result!;
}

/** The running test's processes and temporary directories, ended and removed after it, passed or failed. */
const runs: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(async () => {
  await Promise.all(
    runs
      .splice(0)
      .map((child) =>
        child.exitCode !== null || child.signalCode !== null ? undefined : new Promise((r) => child.once('exit', r).kill('SIGKILL')),
      ),
  );
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

async function tempDir(prefix: string): Promise<string> {
  const dir = await mkdtemp(join(tmpdir(), prefix));
  dirs.push(dir);
  return dir;
}

describe.each([
  { mode: 'sync', extra: {} },
  { mode: 'batch-async', extra: { stalenessThreshold: 2 } },
  { mode: 'fully-async', extra: { capacity: 6 } },
])('SIGKILL and resume ($mode)', ({ mode, extra }) => {
  it('loses nothing, trains nothing twice, and continues the step counter and the loader', async () => {
    const dir = await tempDir(`rxrl-resume-${mode}-`);
    const runDir = join(dir, 'run');
    const recipe = join(dir, 'recipe.json');
    await writeFile(
      recipe,
      JSON.stringify({
        run: { dir: 'run', seed: 3, steps: 0, backend: 'cpu' },
        data: { source: 'bundled', task: TASK, epochs: 1, shuffle: true },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
        rollout: { groupSize: 3 },
        sync: { mode, batchSize: 2, ...extra },
        checkpoint: { every: 1, keepLast: 0 },
        resume: { mode: 'auto' },
        validation: { beforeTrain: false },
      }),
    );
    const all = stringTransformTask({ ...TASK, seed: 3 }).train.map((t) => t.id);
    const totalSteps = all.length / 2;

    const first = start(recipe);
    await until(first, () => trainedLines(runDir).length >= 4, 'four trained steps');
    first.child.kill('SIGKILL');
    const killed = await first.done;
    expect(killed.code).toBeNull();
    const beforeKill = trainedLines(runDir);
    expect(beforeKill.length).toBeLessThan(totalSteps);
    if (mode !== 'sync') {
      // Resume from the newest checkpoint that has tasks in flight (as if the kill had come right after it), so
      // that re-admitting them is exercised every time; newer checkpoints go, their steps are rolled back.
      const steps = readdirSync(runDir)
        .map((name) => /^global_step_(\d+)$/.exec(name))
        .filter((m): m is RegExpExecArray => m !== null)
        .map((m) => Number(m[1]))
        .sort((a, b) => b - a);
      const inFlight = (step: number): boolean => {
        const s = JSON.parse(readFileSync(join(runDir, `global_step_${step}`, 'state.json'), 'utf8')) as {
          pendingTasks: unknown[];
          bufferedSamples?: number;
        };
        return s.pendingTasks.length > 0 && (s.bufferedSamples ?? 0) > 0;
      };
      const keep = steps.find((step) => step >= 2 && inFlight(step));
      expect(keep, 'a checkpoint with tasks in flight and samples buffered').toBeDefined();
      for (const step of steps.filter((step) => step > keep!)) rmSync(join(runDir, `global_step_${step}`), { recursive: true });
    }

    const second = start(recipe);
    const resumed = await finished(second);
    expect(resumed.code, resumed.stderr).toBe(0);
    const summary = JSON.parse(resumed.stdout.trim().split('\n').at(-1)!) as { steps: number; resumedFrom: string };
    const from = Number(/global_step_(\d+)$/.exec(summary.resumedFrom)![1]);
    expect(from).toBeGreaterThanOrEqual(2);
    // In the async modes tasks are in flight at every checkpoint: the resumed run must admit them first.
    const state = JSON.parse(readFileSync(join(summary.resumedFrom, 'state.json'), 'utf8')) as {
      pendingTasks: unknown[];
      bufferedSamples?: number;
    };
    if (mode === 'sync') expect(state.pendingTasks).toHaveLength(0);
    else expect(state.pendingTasks.length).toBeGreaterThan(0);

    // trained.jsonl lists each step once: the killed run's lines past the checkpoint were dropped on resume, and
    // the lines before it are the killed run's own.
    const effective = trainedLines(runDir);
    expect(effective.filter((l) => l.step < from)).toEqual(beforeKill.filter((l) => l.step < from));
    const afterResume = effective.filter((l) => l.step >= from);
    // The step counter continues where the checkpoint stopped; steps past it in the killed run are rolled back.
    expect(afterResume[0].step).toBe(from);
    // metrics.jsonl likewise holds one train record per step.
    const metricSteps = readFileSync(join(runDir, 'metrics.jsonl'), 'utf8')
      .split('\n')
      .filter((line) => line.trim() !== '')
      .map((line) => JSON.parse(line) as Record<string, unknown>)
      .filter((r) => 'actor/pg_loss' in r)
      .map((r) => r.step);
    expect(metricSteps).toEqual(Array.from({ length: totalSteps }, (_, i) => i));
    // The staleness bound holds on every step after resuming (the gate counts batches from the checkpoint's
    // version, not from 0): 0 in sync, η in batch-async, capacity / batchSize batches in fully-async.
    const bound = mode === 'sync' ? 0 : mode === 'batch-async' ? 2 : 6 / 2;
    for (const line of afterResume) {
      const staleness = Math.max(...line.policyVersions.map((v) => line.version - 1 - v));
      expect(staleness, `step ${line.step}`).toBeLessThanOrEqual(bound);
    }
    expect(effective.map((l) => l.step)).toEqual(Array.from({ length: totalSteps }, (_, i) => i));
    expect(summary.steps).toBe(totalSteps);
    // Every task trained exactly once, and every trajectory id once.
    const tasks = effective.flatMap((l) => l.taskIds);
    expect([...tasks].sort()).toEqual([...all].sort());
    const trajectories = effective.flatMap((l) => l.trajectoryIds);
    expect(new Set(trajectories).size).toBe(trajectories.length);
    expect(trajectories).toHaveLength(all.length * 3);
    // Samples generated before the checkpoint were trained as saved (their old version), not generated again.
    const buffered = readFileSync(join(summary.resumedFrom, 'buffered.jsonl'), 'utf8')
      .split('\n')
      .filter((line) => line.trim() !== '')
      .map((line) => JSON.parse(line) as { id: string; sample: { policyVersion: number } });
    const trainedVersion = new Map(afterResume.flatMap((l) => l.trajectoryIds.map((id, i) => [id, l.policyVersions[i]] as const)));
    for (const b of buffered) {
      expect(b.sample.policyVersion).toBeLessThan(from);
      expect(trainedVersion.get(b.id)).toBe(b.sample.policyVersion);
    }
    if (mode !== 'sync') {
      expect(buffered.length).toBeGreaterThan(0);
      expect(state.bufferedSamples).toBe(buffered.length);
    }
  }, 0); // no total bound: each wait fails when the run stops moving
});

describe('extending a finished run', () => {
  it('continues from its last checkpoint with every new step on-policy in sync mode', async () => {
    const dir = await tempDir('rxrl-extend-');
    const runDir = join(dir, 'run');
    const recipe = join(dir, 'recipe.json');
    const write = (steps: number, resume: 'auto' | 'disable' = 'auto'): Promise<void> =>
      writeFile(
        recipe,
        JSON.stringify({
          run: { dir: 'run', seed: 4, steps, backend: 'cpu' },
          data: { source: 'bundled', task: TASK, epochs: 0, shuffle: true },
          model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
          rollout: { groupSize: 2 },
          sync: { mode: 'sync', batchSize: 2 },
          checkpoint: { every: 1, keepLast: 0 },
          resume: { mode: resume },
          validation: { beforeTrain: false },
        }),
      );
    await write(3);
    const first = await finished(start(recipe));
    expect(first.code, first.stderr).toBe(0);
    expect(trainedLines(runDir)).toHaveLength(3);
    await write(8);
    const second = await finished(start(recipe));
    expect(second.code, second.stderr).toBe(0);
    const lines = trainedLines(runDir);
    expect(lines.map((l) => l.step)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    for (const line of lines) {
      expect(Math.max(...line.policyVersions.map((v) => line.version - 1 - v)), `step ${line.step}`).toBe(0);
    }
    // The same command once more: the run is finished, nothing is trained or appended.
    const third = await finished(start(recipe));
    expect(third.code, third.stderr).toBe(0);
    expect(trainedLines(runDir).map((l) => l.step)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    // A fresh start over the same directory supersedes the old lines instead of appending a second step 0.
    await write(2, 'disable');
    const fresh = await finished(start(recipe));
    expect(fresh.code, fresh.stderr).toBe(0);
    expect(trainedLines(runDir).map((l) => l.step)).toEqual([0, 1]);
  }, 0); // no total bound: each wait fails when the run stops moving
});
