/**
 * TensorBoard event files against a hostile or full file system: a link planted where the next event file goes is
 * refused, never followed; a write that fails (a full tmpfs under the event files, or the process's file size
 * limit) is a warning of the tracker layer, and the run trains to its end.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { afterAll, describe, expect, it } from 'vitest';

import { ForbiddenPathError } from '../../lib/core/errors.js';
import { TENSORBOARD_DIR, TensorBoardWriter } from '../../lib/observe/tensorboard.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from '../checkpoint/tinyRun.js';
import { intactCheckpoint } from '../helpers/stopRun.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

describe('TensorBoardWriter', () => {
  it('refuses a link planted at the next event file path, and leaves its target untouched', () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-tb-'));
    const now = (): number => 1_700_000_000_000;
    const first = TensorBoardWriter.open(dir, { now });
    first.close();
    // The next file's name is predictable (time, host, pid, a counter): plant a link there.
    const next = first.path.replace(/\.(\d+)\.v2$/, (_, n: string) => `.${Number(n) + 1}.v2`);
    const target = join(mkdtempSync(join(tmpdir(), 'rxrl-tb-target-')), 'precious');
    writeFileSync(target, 'precious');
    symlinkSync(target, next);
    const error = (() => {
      try {
        TensorBoardWriter.open(dir, { now });
      } catch (e) {
        return e;
      }
      return undefined;
    })();
    expect(error).toBeInstanceOf(ForbiddenPathError);
    expect((error as ForbiddenPathError).context).toMatchObject({ path: next });
    expect(readFileSync(target, 'utf8')).toBe('precious');
  });
});

/**
 * Lines written through the run's trackers (`openTrackers`, from the built dist) by a child process whose files may
 * not grow past 16 blocks (`ulimit -f`): its writes then fail with EFBIG, as they would with ENOSPC on a full disk
 * (node ignores SIGXFSZ, so the write returns the error). Returns the lines that went through and the warnings.
 */
function throughSizeLimitedTrackers(): { lines: number; warnings: string[] } {
  const built = join(root, 'dist', 'pipelines', 'parts', 'trackers.js');
  expect(existsSync(built), 'dist/ is not built: npm run build').toBe(true);
  const runDir = mkdtempSync(join(tmpdir(), 'rxrl-tb-full-'));
  const script = `
    const { openTrackers } = await import(${JSON.stringify(pathToFileURL(built).href)});
    const warnings = [];
    const config = { run: {}, logging: { tensorboard: true, mlflow: { trackingUri: null } } };
    const sinks = await openTrackers(config, ${JSON.stringify(runDir)}, { warn: (line) => warnings.push(line) });
    let lines = 0;
    for (let version = 1; version <= 100; version++) {
      const metrics = Object.fromEntries(Array.from({ length: 40 }, (_, i) => ['group/metric_' + i, version + i]));
      for (const sink of sinks) sink.write({ step: version - 1, version, metrics });
      lines++;
    }
    for (const sink of sinks) await sink.close();
    console.log(JSON.stringify({ lines, warnings }));
  `;
  const child = spawnSync('/bin/sh', ['-c', 'ulimit -f 16 && exec "$0" --input-type=module -e "$1"', process.execPath, script], {
    encoding: 'utf8',
  });
  expect(child.stderr).toBe('');
  expect(child.status).toBe(0);
  return JSON.parse(child.stdout) as { lines: number; warnings: string[] };
}

/** A 4 KiB tmpfs at `dir` when this process may mount one (root, as in CI). */
function fullTmpfsAt(dir: string): boolean {
  if (process.env.RXRL_SPEC_NO_TMPFS === '1') return false;
  try {
    mkdirSync(dir, { recursive: true });
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=4k', 'tmpfs', dir], { stdio: 'ignore' });
    mounts.push(dir);
    return true;
  } catch {
    return false;
  }
}
const mounts: string[] = [];
afterAll(() => {
  for (const dir of mounts) execFileSync('umount', [dir]);
});

describe('openTrackers', () => {
  it('a TensorBoard write that fails is a warning: every line still goes through the trackers', () => {
    const { lines, warnings } = throughSizeLimitedTrackers();
    expect(lines).toBe(100);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^tensorboard: StorageError: file size limit reached \(EFBIG\) writing .*events\.out\.tfevents\./);
  });

  const runDir = join(mkdtempSync(join(tmpdir(), 'rxrl-tb-run-')), 'run');
  const mounted = fullTmpfsAt(join(runDir, TENSORBOARD_DIR));
  const how = mounted ? 'a real run, its tensorboard directory on a 4 KiB tmpfs' : 'fallback: the trackers in a size-limited process';
  it(`a full disk under TensorBoard is a warning and the run trains to its end with its checkpoints (${how})`, async () => {
    if (!mounted) {
      expect(throughSizeLimitedTrackers().lines).toBe(100);
      return;
    }
    const warnings: string[] = [];
    const summary = await runTraining(tinyRun(runDir, 8, { logging: { tensorboard: true } }), { log: (line) => warnings.push(line) });
    expect(summary.steps).toBe(8);
    const full = warnings.filter((line) => line.startsWith('tensorboard: '));
    expect(full).toHaveLength(1);
    expect(full[0]).toMatch(/^tensorboard: StorageError: no space left on device \(ENOSPC\)/);
    expect(await intactCheckpoint(runDir)).toMatch(/global_step_8$/);
  }, 120_000);
});
