import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cli = join(root, 'dist', 'cli', 'main.js');

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
    // Not a terminal: plain progress lines, `step 2/2 · 1.3 s/it · reward 0.312 · loss 0.0123 · …`.
    expect(stderr).toMatch(/^step 1\/2 · [\d.]+ s\/it · ETA \d+:\d\d · reward \d\.\d{3} · loss -?\d\.\d{4}/m);
    expect(stderr).toMatch(/^step 2\/2 · [\d.]+ s\/it · reward \d\.\d{3} · loss -?\d\.\d{4}/m);
    expect(stderr).not.toContain('looks like you are running TensorFlow.js');
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
    // A malformed flag value is a usage error (exit 2), as an unknown flag is; a malformed variable is configuration (exit 1).
    const bad = await rxrl(['start', '--steps', 'many']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toBe("rxrl: UsageError: rxrl start: --steps must be a non-negative integer, got 'many' (see rxrl start --help)\n");
    const mode = await rxrl(['start', '--steps', '1', '--mode', 'eventually']);
    expect(mode.code).toBe(2);
    expect(mode.stderr).toBe(
      "rxrl: UsageError: rxrl start: --mode must be one of sync, batch-async, fully-async, got 'eventually' (see rxrl start --help)\n",
    );
    const variable = await rxrl(['start'], { RXRL_SEED: '-1' });
    expect(variable.code).toBe(1);
    expect(variable.stderr).toBe("rxrl: ConfigError: RXRL_SEED must be a non-negative integer, got '-1'\n");
    // A typo is refused, not ignored (the run would otherwise start with defaults).
    const typo = await rxrl(['start', '--bogus-flag']);
    expect(typo.code).toBe(2);
    expect(typo.stderr).toBe("rxrl: UsageError: rxrl start: unknown option '--bogus-flag' (see rxrl start --help)\n");
    const serveTypo = await rxrl(['serve', '--prot', '0']);
    expect(serveTypo.code).toBe(2);
    expect(serveTypo.stderr).toBe("rxrl: UsageError: rxrl serve: unknown option '--prot' (see rxrl serve --help)\n");
  }, 150_000);
});

const COMMANDS = ['start', 'serve', 'tinker', 'run', 'trainer', 'worker', 'config', 'report'];

describe('rxrl CLI: strict arguments on every command', () => {
  it('a flag without its value is one line on stderr and exit 2, not a run with the default', async () => {
    const result = await rxrl(['start', '--steps']);
    expect(result).toEqual({
      code: 2,
      stdout: '',
      stderr: "rxrl: UsageError: rxrl start: option '--steps' needs a value (see rxrl start --help)\n",
    });
    const before = await rxrl(['start', '--steps', '--seed', '3']);
    expect(before.code).toBe(2);
    expect(before.stderr).toMatch(/^rxrl: UsageError: rxrl start: option '--steps' needs a value, got the option '--seed'.*\n$/);
    const set = await rxrl(['config', join(root, 'recipes', 'reverse.json'), '--set']);
    expect(set).toEqual({
      code: 2,
      stdout: '',
      stderr: "rxrl: UsageError: rxrl config: option '--set' needs a value (see rxrl config --help)\n",
    });
  });

  it('every command refuses an unknown flag and a wrong argument count with one line and exit 2', async () => {
    for (const command of COMMANDS) {
      const result = await rxrl([command, '--no-such-flag']);
      expect({ command, code: result.code, stdout: result.stdout }).toEqual({ command, code: 2, stdout: '' });
      expect(result.stderr).toBe(`rxrl: UsageError: rxrl ${command}: unknown option '--no-such-flag' (see rxrl ${command} --help)\n`);
    }
    expect((await rxrl(['run'])).stderr).toBe('rxrl: UsageError: rxrl run: missing <recipe.json|yaml> (see rxrl run --help)\n');
    const extra = await rxrl(['report', 'a', 'b']);
    expect(extra).toEqual({
      code: 2,
      stdout: '',
      stderr: "rxrl: UsageError: rxrl report: unexpected argument 'b' (see rxrl report --help)\n",
    });
    expect(await rxrl(['frobnicate'])).toEqual({
      code: 2,
      stdout: '',
      stderr: "rxrl: UsageError: unknown command 'frobnicate' (see rxrl --help)\n",
    });
  });

  it("-h and --help print that command's usage and exit 0, on every command", async () => {
    for (const command of COMMANDS) {
      for (const flag of ['-h', '--help']) {
        const result = await rxrl([command, flag]);
        expect({ command, flag, code: result.code, stderr: result.stderr }).toEqual({ command, flag, code: 0, stderr: '' });
        expect(result.stdout.startsWith(`Usage:\n  rxrl ${command} `)).toBe(true);
        const others = COMMANDS.filter((c) => c !== command);
        for (const other of others) expect(result.stdout).not.toContain(`  rxrl ${other} `);
      }
    }
    expect((await rxrl(['report', '--no-such-flag', '-h'])).code).toBe(0);
  });

  it('a repeated flag keeps its last value; --set collects every value', async () => {
    // The last value is the one checked: a bad last value is refused whatever came first.
    const steps = await rxrl(['start', '--steps', '1', '--steps', 'many']);
    const usage = (line: string): { code: number; stdout: string; stderr: string } => ({
      code: 2,
      stdout: '',
      stderr: `rxrl: UsageError: ${line}\n`,
    });
    expect(steps).toEqual(usage("rxrl start: --steps must be a non-negative integer, got 'many' (see rxrl start --help)"));
    const lora = await rxrl(['serve', '--lora-modules', `coder=${root}`, '--lora-modules=broken', '--port', '0', '--backend', 'cpu']);
    expect(lora).toEqual(usage("rxrl serve: --lora-modules must be NAME=DIR[,NAME=DIR…], got 'broken' (see rxrl serve --help)"));
    const rank = await rxrl(['tinker', '--max-rank', '8', '--max-rank', 'x']);
    expect(rank).toEqual(usage("rxrl tinker: --max-rank must be a non-negative integer, got 'x' (see rxrl tinker --help)"));
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-cli-repeat-'));
    try {
      await writeFile(join(dir, 'metrics.jsonl'), '{"step":0,"version":1,"time":0,"rollout/reward_mean":0.5}\n');
      const [first, last] = [join(dir, 'first.html'), join(dir, 'last.html')];
      expect(await rxrl(['report', dir, '--out', first, `--out=${last}`])).toEqual({ code: 0, stdout: `${last}\n`, stderr: '' });
      expect(existsSync(last)).toBe(true);
      expect(existsSync(first)).toBe(false);
      const config = await rxrl([
        'config',
        join(root, 'recipes', 'reverse.json'),
        '--set',
        'run.steps=7',
        '--set=run.seed=9',
        '--set',
        'run.steps=8',
      ]);
      expect(config.code).toBe(0);
      expect(JSON.parse(config.stdout).run).toMatchObject({ steps: 8, seed: 9 });
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
