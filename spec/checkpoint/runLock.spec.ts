import { spawn, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { RUN_LOCK_FILE, acquireRunLock, withRunLock } from '../../lib/checkpoint/runLock.js';
import { ConfigError, RunLockedError } from '../../lib/core/errors.js';
import { runAgents } from '../../pipelines/agents.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from './tinyRun.js';

/** The pid of a process that has exited (so no process runs under it, until the system reuses it). */
function deadPid(): number {
  const child = spawnSync(process.execPath, ['-e', 'process.stdout.write(String(process.pid))'], { encoding: 'utf8' });
  return Number(child.stdout);
}

function stepsOf(file: string): number[] {
  return readFileSync(file, 'utf8')
    .trim()
    .split('\n')
    .map((line) => (JSON.parse(line) as { step: number }).step);
}

describe('a run directory has one writer', () => {
  it('two runs on one directory at once: one trains, the other is refused with a RunLockedError naming the holder; each step logged once', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lock-')), 'run');
    const results = await Promise.allSettled([runTraining(tinyRun(dir, 4)), runTraining(tinyRun(dir, 4))]);
    const refused = results.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect(results.filter((r) => r.status === 'fulfilled')).toHaveLength(1);
    expect(refused).toHaveLength(1);
    const error = refused[0].reason as RunLockedError;
    expect(error).toBeInstanceOf(RunLockedError);
    expect(error.retriable).toBe(false);
    expect(error.context).toMatchObject({ path: join(dir, RUN_LOCK_FILE), pid: process.pid, host: hostname() });
    expect(error.message).toContain(`pid ${process.pid} on ${hostname()} since `);
    expect(error.message).toContain(join(dir, RUN_LOCK_FILE));
    expect(error.message).not.toContain('\n');
    expect(stepsOf(join(dir, 'trained.jsonl'))).toEqual([0, 1, 2, 3]);
    // Four steps, each with its timing line, and the final validation (the step it follows: 3).
    expect(stepsOf(join(dir, 'metrics.jsonl'))).toEqual([0, 0, 1, 1, 2, 2, 3, 3, 3]);
    // Released at the end: the directory is free again.
    expect(existsSync(join(dir, RUN_LOCK_FILE))).toBe(false);
  }, 120_000);

  it('a run held by another live process is refused before it writes anything; a multi-agent run too', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lock-')), 'run');
    await mkdir(dir);
    // A live process of this host holds the directory: its lock file names it.
    const holder = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1 << 30)'], { stdio: 'ignore' });
    try {
      await writeFile(
        join(dir, RUN_LOCK_FILE),
        JSON.stringify({ pid: holder.pid, host: hostname(), startedAt: '2020-01-01T00:00:00.000Z' }),
      );
      const before = await readdir(dir);
      const error = await runTraining(tinyRun(dir, 2)).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RunLockedError);
      expect((error as RunLockedError).context).toMatchObject({ pid: holder.pid, host: hostname(), startedAt: '2020-01-01T00:00:00.000Z' });
      expect((error as Error).message).toBe(
        `run directory ${dir} is in use by pid ${holder.pid} on ${hostname()} since 2020-01-01T00:00:00.000Z: lock ${join(dir, RUN_LOCK_FILE)}`,
      );
      const agents = tinyRun(dir, 1, {
        agents: {
          environment: 'writer-editor',
          roles: [
            { name: 'writer', policy: 'p' },
            { name: 'editor', policy: 'p' },
          ],
        },
        policies: [{ name: 'p', specialization: 'full' }],
      });
      await expect(runAgents(agents)).rejects.toBeInstanceOf(RunLockedError);
      expect(await readdir(dir)).toEqual(before);
    } finally {
      holder.kill();
    }
  }, 120_000);

  it('a stale lock (this host, a pid no longer running) is taken over with a warning, and the run goes on', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lock-')), 'run');
    await mkdir(dir);
    const pid = deadPid();
    await writeFile(join(dir, RUN_LOCK_FILE), JSON.stringify({ pid, host: hostname(), startedAt: '2020-01-01T00:00:00.000Z' }));
    const lines: string[] = [];
    const summary = await runTraining(tinyRun(dir, 2), { log: (line) => lines.push(line) });
    expect(summary.steps).toBe(2);
    expect(lines).toContain(
      `warning: taking over the stale lock ${join(dir, RUN_LOCK_FILE)} of pid ${pid} (started 2020-01-01T00:00:00.000Z), which is no longer running`,
    );
    expect(existsSync(join(dir, RUN_LOCK_FILE))).toBe(false);
  }, 120_000);

  it('a lock of another host, or one that names no holder, is never taken over', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lock-')), 'run');
    await mkdir(dir);
    const lock = join(dir, RUN_LOCK_FILE);
    await writeFile(lock, JSON.stringify({ pid: deadPid(), host: `not-${hostname()}`, startedAt: '2020-01-01T00:00:00.000Z' }));
    const error = await acquireRunLock(dir).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunLockedError);
    expect((error as Error).message).toMatch(
      /on not-.* since 2020-01-01T00:00:00.000Z \(another host: remove the lock if that run is over\): lock /,
    );
    await writeFile(lock, '');
    await expect(acquireRunLock(dir)).rejects.toThrow(`run directory ${dir} is locked by ${lock}, which names no holder`);
    expect(await readdir(dir)).toEqual([RUN_LOCK_FILE]);
  });

  it('is released however the run ends: a failed set-up frees the directory for the next run', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lock-')), 'run');
    const bad = tinyRun(dir, 2, { rollout: { groupSize: 2, evaluator: { module: './missing.mjs', export: 'x' } } });
    await expect(runTraining(bad)).rejects.toBeInstanceOf(ConfigError);
    expect(existsSync(join(dir, RUN_LOCK_FILE))).toBe(false);
    await expect(withRunLock(dir, () => Promise.reject(new Error('boom')))).rejects.toThrow('boom');
    const lock = await acquireRunLock(dir);
    expect(JSON.parse(readFileSync(lock.path, 'utf8'))).toEqual(lock.holder);
    await lock.release();
    expect(existsSync(lock.path)).toBe(false);
  });
});
