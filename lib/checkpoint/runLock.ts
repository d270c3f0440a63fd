/**
 * One writer per run directory: `<run-dir>/rxrl.lock` names the run that holds it (pid, host, start time). A run
 * takes it before it writes anything into the directory and removes it when it ends, however it ends
 * ({@link withRunLock}). A second run on the directory is refused with a {@link RunLockedError} naming the
 * holder. A lock left by a killed run (same host, its pid no longer alive) is taken over with a warning; a lock of
 * another host is never judged stale, since its pid cannot be checked from here.
 *
 * The lock file is written complete beside the lock and hard-linked into place, which fails when a lock already
 * exists: two runs that start at once cannot both succeed, and no run ever reads half a lock.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { link, mkdir, readFile, rename, rm } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { RunLockedError, asStorageError } from '../core/errors.js';
import { writeFileAtomic } from '../model/safetensors.js';
import { removeUnfinishedCheckpoints } from './checkpoint.js';

/** File name of the lock inside a run directory. */
export const RUN_LOCK_FILE = 'rxrl.lock';

/** Who holds a run directory: what its lock file records. */
export interface RunLockHolder {
  readonly pid: number;
  readonly host: string;
  /** When the holder took the lock (ISO 8601). */
  readonly startedAt: string;
}

/** A held run-directory lock. */
export interface RunLock {
  /** The lock file. */
  readonly path: string;
  readonly holder: RunLockHolder;
  /** Removes the lock file (when it is still this lock). Idempotent. */
  release(): Promise<void>;
}

/** Options of {@link acquireRunLock} and {@link withRunLock}. */
export interface RunLockOptions {
  /** Told about a stale lock taken over, and (by {@link withRunLock}) unfinished checkpoints removed. */
  readonly warn?: (message: string, context: Readonly<Record<string, unknown>>) => void;
}

/** Lock files this process holds (a lock naming this pid but not listed here is a previous process's). */
const held = new Set<string>();

/** Attempts at taking over a stale lock before giving up (another run is taking it over at the same moment). */
const TAKEOVER_ATTEMPTS = 3;

/**
 * Takes the lock of `runDir` (creating the directory when needed).
 *
 * @throws {@link RunLockedError} naming the holder and the lock file when another run holds it.
 */
export async function acquireRunLock(runDir: string, options: RunLockOptions = {}): Promise<RunLock> {
  const path = join(runDir, RUN_LOCK_FILE);
  const holder: RunLockHolder = { pid: process.pid, host: hostname(), startedAt: new Date().toISOString() };
  const mine = `${path}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
  try {
    await mkdir(runDir, { recursive: true });
    await writeFileAtomic(mine, `${JSON.stringify(holder)}\n`);
    for (let attempt = 0; ; attempt++) {
      try {
        await link(mine, path);
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error;
      }
      const current = await readHolder(path);
      if (current === 'gone') continue;
      if (current === 'unreadable' || !isStale(current, path) || attempt >= TAKEOVER_ATTEMPTS) throw locked(runDir, path, current);
      // Move the stale lock aside, then make sure it is the one judged stale (another run may have replaced it).
      const aside = `${path}.${process.pid}.stale`;
      if (
        !(await rename(path, aside).then(
          () => true,
          () => false,
        ))
      )
        continue;
      const moved = await readHolder(aside);
      if (typeof moved === 'object' && sameHolder(moved, current)) {
        options.warn?.(
          `taking over the stale lock ${path} of pid ${current.pid} (started ${current.startedAt}), which is no longer running`,
          { path, ...current },
        );
      } else {
        await link(aside, path).catch(() => undefined);
      }
      await rm(aside, { force: true });
    }
  } catch (error) {
    throw asStorageError(error, path);
  } finally {
    await rm(mine, { force: true });
  }
  held.add(path);
  let released = false;
  return {
    path,
    holder,
    release: async () => {
      if (released) return;
      released = true;
      held.delete(path);
      const current = await readHolder(path);
      if (typeof current === 'object' && sameHolder(current, holder)) await rm(path, { force: true });
    },
  };
}

/**
 * Runs `body` holding the lock of `runDir` (no lock when `runDir` is undefined): takes it, removes what killed or
 * failed runs left unfinished (`.tmp-global_step_*`), runs `body`, and releases the lock however `body` ends.
 *
 * @throws {@link RunLockedError} when another run holds the directory (then `body` never runs).
 */
export async function withRunLock<T>(runDir: string | undefined, body: () => Promise<T>, options: RunLockOptions = {}): Promise<T> {
  if (runDir === undefined) return body();
  const lock = await acquireRunLock(runDir, options);
  try {
    for (const path of await removeUnfinishedCheckpoints(runDir))
      options.warn?.(`removed ${path}, left by a checkpoint write that never finished`, { path });
    return await body();
  } finally {
    await lock.release();
  }
}

/** The holder a lock file names, `gone` when there is none, `unreadable` when it names none. */
async function readHolder(path: string): Promise<RunLockHolder | 'gone' | 'unreadable'> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return 'gone';
    throw error;
  }
  try {
    const value = JSON.parse(text) as Partial<RunLockHolder>;
    if (Number.isInteger(value.pid) && typeof value.host === 'string' && typeof value.startedAt === 'string') return value as RunLockHolder;
  } catch {
    // not JSON
  }
  return 'unreadable';
}

/** A lock is stale when its holder ran on this host and is no longer running (or is an earlier process of this pid). */
function isStale(holder: RunLockHolder, path: string): boolean {
  if (holder.pid === process.pid && holder.host === hostname()) return !held.has(path);
  return processGone(holder);
}

/**
 * True when the process `pid` of `host` has certainly ended: it ran on this host and no process has that pid now.
 * A process of another host is never judged gone (its pid cannot be checked from here).
 */
export function processGone(holder: { readonly pid: number; readonly host: string }): boolean {
  if (holder.host !== hostname() || holder.pid === process.pid) return false;
  try {
    process.kill(holder.pid, 0);
    return false;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'ESRCH';
  }
}

function sameHolder(a: RunLockHolder, b: RunLockHolder): boolean {
  return a.pid === b.pid && a.host === b.host && a.startedAt === b.startedAt;
}

function locked(runDir: string, path: string, holder: RunLockHolder | 'unreadable'): RunLockedError {
  if (holder === 'unreadable') {
    return new RunLockedError(
      `run directory ${runDir} is locked by ${path}, which names no holder; remove it if no run uses the directory`,
      { context: { path } },
    );
  }
  const where = holder.host === hostname() ? '' : ' (another host: remove the lock if that run is over)';
  return new RunLockedError(
    `run directory ${runDir} is in use by pid ${holder.pid} on ${holder.host} since ${holder.startedAt}${where}: lock ${path}`,
    {
      context: { path, ...holder },
    },
  );
}
