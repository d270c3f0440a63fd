/**
 * Stopping a real `rxrl` process (the built CLI) while it waits on something, for the specs that check that every
 * wait yields to SIGTERM/SIGINT: start it, wait until the spec says it is blocked, signal it, and see how it ended.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { expect } from 'vitest';

import { latestCheckpoint, verifyCheckpoint } from '../../lib/checkpoint/checkpoint.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The built CLI (`npm test` builds it in its pretest). */
export const CLI = join(root, 'dist', 'cli', 'main.js');

/** How a signalled process ended. */
export interface StoppedRun {
  /** Its exit code (`null` when a signal ended it). */
  readonly code: number | null;
  /** The signal that ended it, when one did (it did not handle the signal itself). */
  readonly signal: NodeJS.Signals | null;
  readonly stdout: string;
  readonly stderr: string;
  /** Seconds from the signal to the exit, as measured (reported by the spec, not asserted against the clock). */
  readonly secondsToExit: number;
}

/** What {@link stopWhenBlocked} starts and when it signals. */
export interface StopWhenBlockedOptions {
  /** The CLI's arguments, e.g. `['run', recipeFile, '--set', 'run.steps=3']`. */
  readonly args: readonly string[];
  /** What the process is blocked on, for the line that reports the measured seconds (`teacher held`). */
  readonly what: string;
  /** Added to the environment (`HOME` and `PATH` are inherited unless given). */
  readonly env?: Readonly<Record<string, string>>;
  /**
   * Resolves once the process is blocked on the wait under test (the spec's hostile server has received the
   * request, a FIFO was opened, a stderr line appeared). Receives the child and its stderr so far.
   */
  readonly blocked: (child: ChildProcess, stderr: () => string) => Promise<unknown>;
  /** The signal to send. Default SIGTERM. */
  readonly signal?: 'SIGTERM' | 'SIGINT';
  /**
   * How long the process may take to exit after the signal before the spec fails (the process is then killed).
   * Not a speed check: keep it far below the wait's own deadline, so that only the signal can explain an exit.
   * Default 30 s.
   */
  readonly exitBoundMs?: number;
}

/**
 * Starts the built CLI, waits until `blocked` resolves, sends the signal and resolves when the process has
 * exited. Rejects (and kills the process group) when it exits before being blocked or does not exit in time.
 */
export async function stopWhenBlocked(options: StopWhenBlockedOptions): Promise<StoppedRun> {
  if (!existsSync(CLI)) throw new Error('dist/ is not built: run `npm run build` first (`npm test` does it in pretest)');
  const child = spawn(process.execPath, [CLI, ...options.args], {
    env: { ...process.env, ...options.env },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let stdout = '';
  let stderr = '';
  child.stdout?.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr?.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('exit', (code, signal) => resolve({ code, signal })),
  );
  const killGroup = (): void => {
    try {
      if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
    } catch {
      // already gone
    }
  };
  try {
    const early = await Promise.race([options.blocked(child, () => stderr).then(() => undefined), exited.then((end) => end)]);
    if (early !== undefined) {
      throw new Error(`rxrl exited (code ${early.code}, signal ${early.signal}) before it was blocked; stderr:\n${stderr}`);
    }
    const signalledAt = performance.now();
    child.kill(options.signal ?? 'SIGTERM');
    const bound = options.exitBoundMs ?? 30_000;
    let timer: NodeJS.Timeout | undefined;
    const end = await Promise.race([
      exited,
      new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), bound))),
    ]).finally(() => clearTimeout(timer));
    if (end === undefined) {
      throw new Error(`rxrl did not exit within ${bound} ms of ${options.signal ?? 'SIGTERM'}; stderr:\n${stderr}`);
    }
    const secondsToExit = (performance.now() - signalledAt) / 1000;
    // Measured and reported, not asserted against the clock beyond `exitBoundMs`.
    console.log(`${options.what}: exited ${secondsToExit.toFixed(2)} s after ${options.signal ?? 'SIGTERM'} (code ${end.code})`);
    return { ...end, stdout, stderr, secondsToExit };
  } finally {
    killGroup();
  }
}

/** Checks that the process handled the signal itself (no signal ended it) and printed no stack trace. */
export function expectHandledStop(stopped: StoppedRun): void {
  expect(stopped.signal, stopped.stderr).toBeNull();
  expect(stopped.stderr).not.toMatch(/^\s+at /m);
}

/** Resolves once `runDir` holds an intact checkpoint (polled every 50 ms; the spec's own timeout bounds it). */
export async function checkpointWritten(runDir: string): Promise<void> {
  while ((await intactCheckpoint(runDir).catch(() => undefined)) === undefined) await new Promise((resolve) => setTimeout(resolve, 50));
}

/** Resolves once `stderr()` matches `pattern` (polled every 50 ms; the spec's own timeout bounds it). */
export async function stderrMatches(stderr: () => string, pattern: RegExp): Promise<void> {
  while (!pattern.test(stderr())) await new Promise((resolve) => setTimeout(resolve, 50));
}

/**
 * The path of the newest checkpoint in `runDir`, checked intact (every file's size and sha256 as recorded);
 * rejects when there is none or it is damaged.
 */
export async function intactCheckpoint(runDir: string): Promise<string> {
  const latest = await latestCheckpoint(runDir);
  if (latest === undefined) throw new Error(`no checkpoint in ${runDir}`);
  await verifyCheckpoint(latest);
  return latest;
}
