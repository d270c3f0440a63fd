/** `rxrl report` from the built package (`npm test` builds it first, in `pretest`). */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');

async function rxrl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  if (!existsSync(join(root, 'dist', 'lib', 'observe', 'report.js'))) {
    throw new Error('dist/ has no observe module: run `npm run build` first (`npm test` does it in pretest)');
  }
  try {
    const { stdout, stderr } = await run(process.execPath, [cli, ...args], { timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('rxrl report (built CLI)', () => {
  it('writes <run-dir>/report.html and prints its path; --out chooses the file', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-report-cli-'));
    writeFileSync(join(dir, 'metrics.jsonl'), '{"step":0,"version":1,"time":0,"rollout/reward_mean":0.25}\n');
    const first = await rxrl(['report', dir]);
    expect(first).toMatchObject({ code: 0, stdout: `${join(dir, 'report.html')}\n` });
    expect(readFileSync(join(dir, 'report.html'), 'utf8')).toContain('data-series="rollout/reward_mean"');
    const out = join(dir, 'custom.html');
    expect(await rxrl(['report', dir, `--out=${out}`])).toMatchObject({ code: 0, stdout: `${out}\n` });
    expect(readFileSync(out, 'utf8')).toBe(readFileSync(join(dir, 'report.html'), 'utf8'));
  });

  it('prints help, and fails with a typed message for a missing run dir or bad arguments', async () => {
    expect((await rxrl(['report', '--help'])).stdout).toMatch(/rxrl report <run-dir>/);
    const missing = await rxrl(['report', join(tmpdir(), 'rxrl-no-such-run-dir')]);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/RunDirError: not a run directory/);
    const none = await rxrl(['report']);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/UsageError: rxrl report: missing <run-dir>/);
    expect((await rxrl(['report', '.', '--colour'])).stderr).toMatch(/unknown option '--colour'/);
  });
});
