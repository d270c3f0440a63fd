/**
 * TensorBoard event files against a hostile or full file system: a link planted where the next event file goes is
 * refused, never followed; a write that fails (the file reaches the process's size limit, as a full disk would stop
 * it) is a warning of the tracker layer, and the run's lines keep coming.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

import { describe, expect, it } from 'vitest';

import { ForbiddenPathError } from '../../lib/core/errors.js';
import { TensorBoardWriter } from '../../lib/observe/tensorboard.js';

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

describe('openTrackers', () => {
  it('a TensorBoard write that fails is a warning: every line still goes through the trackers', () => {
    const built = join(root, 'dist', 'pipelines', 'parts', 'trackers.js');
    expect(existsSync(built), 'dist/ is not built: npm run build').toBe(true);
    const runDir = mkdtempSync(join(tmpdir(), 'rxrl-tb-full-'));
    // A child process whose files may not grow past 16 blocks (`ulimit -f`): its writes then fail with EFBIG, as
    // they would with ENOSPC on a full disk (node ignores SIGXFSZ, so the write returns the error).
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
    const { lines, warnings } = JSON.parse(child.stdout) as { lines: number; warnings: string[] };
    expect(lines).toBe(100);
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(/^tensorboard: StorageError: file size limit reached \(EFBIG\) writing .*events\.out\.tfevents\./);
  });
});
