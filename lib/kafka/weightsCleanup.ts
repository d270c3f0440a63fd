/**
 * Old weights go: every trainer process publishes under a run directory of its own (`<weightsDir>/<run>/`), marked
 * with the process that owns it. Once a new run has announced its first version, workers follow it and no worker
 * can still need an earlier run's files, so the run directories of trainer processes that have ended are removed.
 * Only directories that carry rxrl's marker are touched; links are never followed; a run whose process is still
 * alive, or ran on another host (where its process cannot be checked), is kept.
 *
 * @packageDocumentation
 */
import { mkdir, readdir, rm } from 'node:fs/promises';
import { hostname } from 'node:os';
import { join } from 'node:path';

import { processGone } from '../checkpoint/runLock.js';
import { readJsonObject } from '../model/files.js';
import { writeFileAtomic } from '../model/safetensors.js';

/** File in each run directory of a weights directory that names the trainer process owning it. */
export const WEIGHTS_RUN_MARKER = '.rxrl-run.json';

/** What {@link removeEndedRuns} did. */
export interface WeightsCleanup {
  /** Run directories removed. */
  readonly removed: readonly string[];
  /** Run directories kept, and why (their trainer still runs, or ran on another host). */
  readonly kept: readonly { readonly path: string; readonly reason: string }[];
  /** Run directories that could not be removed, with the error. */
  readonly failed: readonly { readonly path: string; readonly error: string }[];
}

/** Marks `runDir` as the directory of `run`, owned by this process (idempotent). */
export async function markWeightsRun(runDir: string, run: string): Promise<void> {
  await mkdir(runDir, { recursive: true });
  await writeFileAtomic(join(runDir, WEIGHTS_RUN_MARKER), `${JSON.stringify({ run, pid: process.pid, host: hostname() })}\n`);
}

/**
 * Removes the run directories under `dir`, other than `current`, whose trainer process has ended.
 *
 * @param dir - The weights directory shared with the workers.
 * @param current - The directory name of the run being published (kept whatever its marker says).
 */
export async function removeEndedRuns(dir: string, current: string): Promise<WeightsCleanup> {
  const removed: string[] = [];
  const kept: { path: string; reason: string }[] = [];
  const failed: { path: string; error: string }[] = [];
  const entries = await readdir(dir, { withFileTypes: true }).catch(() => []);
  for (const entry of entries) {
    // A link or a file is never ours: only real directories are looked into.
    if (!entry.isDirectory() || entry.name === current) continue;
    const path = join(dir, entry.name);
    let owner: Record<string, unknown>;
    try {
      owner = await readJsonObject(join(path, WEIGHTS_RUN_MARKER), path);
    } catch {
      continue; // no marker (or not one of ours): not rxrl's to remove
    }
    const { pid, host } = owner;
    if (typeof pid !== 'number' || typeof host !== 'string') continue;
    if (!processGone({ pid, host })) {
      kept.push({ path, reason: host === hostname() ? `its trainer (pid ${pid}) is still running` : `its trainer ran on ${host}` });
      continue;
    }
    try {
      await rm(path, { recursive: true, force: true });
      removed.push(path);
    } catch (error) {
      failed.push({ path, error: error instanceof Error ? error.message : String(error) });
    }
  }
  return { removed, kept, failed };
}
