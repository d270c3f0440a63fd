import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cli = join(root, 'dist', 'lib', 'cli.js');

async function rxrl(args: string[], env: Record<string, string> = {}): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(process.execPath, [cli, ...args], { env: { ...process.env, ...env }, timeout: 120_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('rxrl CLI (built by pretest)', () => {
  it('start trains with a step budget and prints the summary as its last stdout line', async () => {
    const { code, stdout, stderr } = await rxrl(['start', '--steps', '2'], { RXRL_SEED: '5' });
    expect(code).toBe(0);
    const summary = JSON.parse(stdout.trim().split('\n').at(-1)!) as Record<string, unknown>;
    expect(summary).toMatchObject({ recipe: 'reverse-abcde-4', mode: 'sync', steps: 2, seed: 5 });
    for (const key of ['seconds', 'valRewardInitial', 'valRewardFinal']) expect(typeof summary[key]).toBe('number');
    expect(stderr).toMatch(/step +2 +reward/);
  }, 150_000);

  it('takes the step budget from the environment', async () => {
    const { code, stdout } = await rxrl(['start'], { RXRL_STEPS: '1' });
    expect(code).toBe(0);
    expect(JSON.parse(stdout.trim().split('\n').at(-1)!)).toMatchObject({ steps: 1 });
  }, 150_000);

  it('prints help, and fails with a typed message on bad input', async () => {
    expect((await rxrl(['--help'])).stdout).toMatch(/rxrl start/);
    const unknown = await rxrl(['frobnicate']);
    expect(unknown.code).toBe(2);
    const bad = await rxrl(['start', '--steps', 'many']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/ConfigError: steps must be a non-negative integer/);
    const mode = await rxrl(['start', '--steps', '1', '--mode', 'eventually']);
    expect(mode.code).toBe(1);
    expect(mode.stderr).toMatch(/ConfigError: invalid configuration:\s+sync\.mode: must be one of the possible values: \["sync","batch-async","fully-async"\]/);
    // A typo is refused, not ignored (the run would otherwise start with defaults).
    const typo = await rxrl(['start', '--bogus-flag']);
    expect(typo.code).toBe(1);
    expect(typo.stderr).toMatch(/ConfigError: rxrl start: unknown option '--bogus-flag'/);
    const serveTypo = await rxrl(['serve', '--prot', '0']);
    expect(serveTypo.code).toBe(1);
    expect(serveTypo.stderr).toMatch(/ConfigError: rxrl serve: unknown option '--prot'/);
  }, 150_000);
});
