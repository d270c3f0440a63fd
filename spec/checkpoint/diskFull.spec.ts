/**
 * Disk full while a run writes its directory. On a small tmpfs when this process may mount one (root, as in CI);
 * otherwise the kernel's own ENOSPC from /dev/full for the JSONL files, and a size-limited writer handed to the
 * checkpoint writer for checkpoints (`RXRL_SPEC_NO_TMPFS=1` forces these). Each test's name says which one ran.
 */
import { execFileSync } from 'node:child_process';
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readdirSync,
  rmSync,
  statSync,
  statfsSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { checkpointName, verifyCheckpoint, writeCheckpointDir } from '../../lib/checkpoint/checkpoint.js';
import { RUN_LOCK_FILE } from '../../lib/checkpoint/runLock.js';
import { StorageError } from '../../lib/core/errors.js';
import { MetricsWriter, metricsPath } from '../../lib/observe/metricsFile.js';
import { dropStepsFrom } from '../../pipelines/parts/runDir.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from './tinyRun.js';

const PAGE = 4096;
const mountPoint = await mkdtemp(join(tmpdir(), 'rxrl-full-'));
const mounted = (() => {
  if (process.env.RXRL_SPEC_NO_TMPFS === '1') return false;
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4m', 'tmpfs', mountPoint], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
})();
const how = mounted ? 'a full tmpfs' : 'fallback: /dev/full and an injected size-limited writer';
afterAll(() => {
  if (mounted) execFileSync('umount', [mountPoint]);
  rmSync(mountPoint, { recursive: true, force: true });
});

let runs = 0;
/** A fresh run directory on the small file system (or in the temporary directory, without one). */
function freshRunDir(): string {
  return join(mountPoint, `run-${runs++}`);
}

/** Fills the file system of `dir` until `leave` bytes (whole pages) are free; returns the filler to delete. */
function fill(dir: string, leave: number): string {
  const filler = join(mountPoint, `filler-${runs}`);
  const { bavail, bsize } = statfsSync(dir);
  writeFileSync(filler, Buffer.alloc(Math.max(0, bavail * bsize - leave)));
  return filler;
}

function lines(file: string): string[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '');
}

describe(`disk full while a run writes its directory (${how})`, () => {
  it(`a checkpoint write fails: one StorageError naming the checkpoint, the previous one intact, no temporary directory left (${how})`, async () => {
    const runDir = freshRunDir();
    let error: unknown;
    if (mounted) {
      let filler: string | undefined;
      // After step 2's checkpoint, leave room for the JSONL lines of step 3 but not its checkpoint (~17 pages).
      error = await runTraining(tinyRun(runDir, 5), {
        onStep: (step) => {
          if (step.version === 2) filler = fill(runDir, 4 * PAGE);
        },
      }).catch((e: unknown) => e);
      expect(filler).toBeDefined();
      rmSync(filler as string);
    } else {
      await runTraining(tinyRun(runDir, 2));
      // The next checkpoint's contents go through a writer that stops at 4 KiB with the kernel's ENOSPC.
      error = await writeCheckpointDir(runDir, 3, async (tmp) => {
        writeFileSync(join(tmp, 'model.safetensors'), Buffer.alloc(PAGE));
        throw Object.assign(new Error(`ENOSPC: no space left on device, write`), { code: 'ENOSPC', errno: -28, syscall: 'write' });
      }).catch((e: unknown) => e);
    }
    expect(error).toBeInstanceOf(StorageError);
    const storage = error as StorageError;
    expect(storage.retriable).toBe(false);
    expect(storage.message).toBe(`no space left on device (ENOSPC) writing ${join(runDir, checkpointName(3))}`);
    expect(storage.context).toEqual({ path: join(runDir, checkpointName(3)), code: 'ENOSPC' });
    // The failed attempt left nothing behind, and the previous checkpoint verifies.
    expect(readdirSync(runDir).filter((name) => name.startsWith('.tmp-') || name.startsWith(checkpointName(3)))).toEqual([]);
    await verifyCheckpoint(join(runDir, checkpointName(2)));
    expect(existsSync(join(runDir, RUN_LOCK_FILE))).toBe(false);

    // A killed attempt's temporary directory is removed when the next run starts, which resumes from step 2.
    mkdirSync(join(runDir, '.tmp-global_step_3-99999'));
    writeFileSync(join(runDir, '.tmp-global_step_3-99999', 'model.safetensors'), 'half');
    const warnings: string[] = [];
    const resumed = await runTraining(tinyRun(runDir, 4), { log: (line) => line.startsWith('warning:') && warnings.push(line) });
    expect(resumed.resumedFrom).toBe(join(runDir, checkpointName(2)));
    expect(warnings).toContain(
      `warning: removed ${join(runDir, '.tmp-global_step_3-99999')}, left by a checkpoint write that never finished`,
    );
    expect(readdirSync(runDir).filter((name) => name.startsWith('.tmp-'))).toEqual([]);
    expect(lines(join(runDir, 'trained.jsonl')).map((line) => (JSON.parse(line) as { step: number }).step)).toEqual([0, 1, 2, 3]);
  }, 120_000);

  it(`a trained.jsonl write fails: one StorageError naming the file; the resumed run logs each step once (${how})`, async () => {
    const runDir = freshRunDir();
    const trained = join(runDir, 'trained.jsonl');
    let undo = (): void => undefined;
    const error = await runTraining(tinyRun(runDir, 5), {
      onStep: (step) => {
        if (step.version !== 2) return;
        if (mounted) {
          // No free page, and trained.jsonl's last page filled with blank lines: its next append gets no byte.
          const filler = fill(runDir, 0);
          appendFileSync(trained, '\n'.repeat((PAGE - (statSync(trained).size % PAGE)) % PAGE));
          undo = () => rmSync(filler);
        } else {
          const kept = readFileSync(trained);
          rmSync(trained);
          symlinkSync('/dev/full', trained);
          undo = () => {
            rmSync(trained);
            writeFileSync(trained, kept);
          };
        }
      },
    }).catch((e: unknown) => e);
    undo();
    expect(error).toBeInstanceOf(StorageError);
    expect((error as Error).message).toBe(`no space left on device (ENOSPC) writing ${trained}`);
    expect((error as StorageError).context).toEqual({ path: trained, code: 'ENOSPC' });
    const resumed = await runTraining(tinyRun(runDir, 4));
    expect(resumed.resumedFrom).toBe(join(runDir, checkpointName(2)));
    expect(lines(trained).map((line) => (JSON.parse(line) as { step: number }).step)).toEqual([0, 1, 2, 3]);
  }, 120_000);

  it(`a metrics.jsonl line torn by a full disk: a StorageError naming the file, and the torn line dropped on resume (${how})`, async () => {
    const runDir = freshRunDir();
    mkdirSync(runDir, { recursive: true });
    const path = metricsPath(runDir);
    const writer = MetricsWriter.open(runDir, { now: () => 0 });
    writer.write({ step: 0, version: 1, metrics: { 'actor/pg_loss': 0.5 } });
    let undo: () => void;
    if (mounted) {
      // No free page, and 10 bytes left in the file's last one: the next line is torn after 10 bytes.
      const filler = fill(runDir, 0);
      appendFileSync(path, '\n'.repeat((PAGE - (statSync(path).size % PAGE) - 10 + PAGE) % PAGE));
      undo = () => rmSync(filler);
    } else {
      writer.close();
      const kept = readFileSync(path, 'utf8');
      rmSync(path);
      symlinkSync('/dev/full', path);
      undo = () => {
        rmSync(path);
        writeFileSync(path, `${kept}{"step":1,"vers`); // what a torn write leaves
      };
    }
    const reopened = mounted ? writer : MetricsWriter.open(runDir);
    let error: unknown;
    try {
      reopened.write({ step: 1, version: 2, metrics: { 'actor/pg_loss': 0.25 } });
    } catch (e) {
      error = e;
    }
    try {
      reopened.close();
    } catch (closing) {
      if (mounted) throw closing; // /dev/full cannot be fsynced (EINVAL)
    }
    undo();
    expect(error).toBeInstanceOf(StorageError);
    expect((error as Error).message).toBe(`no space left on device (ENOSPC) writing ${path}`);
    expect(readFileSync(path, 'utf8').endsWith('\n')).toBe(false);
    // Resume: the torn line goes, and the next record is a line of its own.
    await dropStepsFrom(path, 1);
    const again = MetricsWriter.open(runDir, { now: () => 0 });
    again.write({ step: 1, version: 2, metrics: { 'actor/pg_loss': 0.25 } });
    again.close();
    expect(lines(path).map((line) => JSON.parse(line) as Record<string, number>)).toEqual([
      { step: 0, version: 1, time: 0, 'actor/pg_loss': 0.5 },
      { step: 1, version: 2, time: 0, 'actor/pg_loss': 0.25 },
    ]);
  });
});
