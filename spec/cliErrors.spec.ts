/** A missing path on the command line is one typed line on stderr, never a stack (built CLI: `npm run build`). */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cli = join(root, 'dist', 'cli', 'main.js');

async function rxrl(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  if (!existsSync(cli)) throw new Error('dist/ is not built: run `npm run build` first (`npm test` does it in pretest)');
  try {
    const { stdout, stderr } = await run(process.execPath, [cli, ...args], { timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

/** Checks that stderr is exactly one `rxrl: <ErrorName>: …` line containing `path`, without a stack frame. */
function expectOneLine(stderr: string, name: string, path: string): void {
  expect(stderr).not.toContain('    at ');
  const lines = stderr.split('\n').filter((line) => line !== '');
  expect(lines).toHaveLength(1);
  expect(lines[0].startsWith(`rxrl: ${name}: `)).toBe(true);
  expect(lines[0]).toContain(path);
}

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-cli-errors-'));
  await writeFile(join(dir, 'metrics.jsonl'), '{"step":0,"version":1,"time":0,"rollout/reward_mean":0.5}\n');
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl CLI: missing paths are one typed line', () => {
  it('report --out into a missing directory: ConfigError naming the path, no temporary file left', async () => {
    const out = join(dir, 'no-such-dir', 'x.html');
    const result = await rxrl(['report', dir, '--out', out]);
    expect(result.code).not.toBe(0);
    expect(result.stdout).toBe('');
    expectOneLine(result.stderr, 'ConfigError', out);
    expect(result.stderr).toContain(`directory ${join(dir, 'no-such-dir')} does not exist`);
    expect((await readdir(dir)).sort()).toEqual(['metrics.jsonl']);
  });

  it('report --out onto a directory: ConfigError naming the path, no temporary file left', async () => {
    const result = await rxrl(['report', dir, `--out=${tmpdir()}`]);
    expect(result.code).not.toBe(0);
    expectOneLine(result.stderr, 'ConfigError', tmpdir());
    expect(await readdir(dir)).toEqual(['metrics.jsonl']);
  });

  it('serve --checkpoint /missing: ConfigError naming the flag and the path, before the backend starts', async () => {
    const missing = join(dir, 'missing-checkpoint');
    const result = await rxrl(['serve', '--checkpoint', missing, '--port', '0', '--backend', 'cpu']);
    expect(result.code).not.toBe(0);
    expectOneLine(result.stderr, 'ConfigError', missing);
    expect(result.stderr).toMatch(/^rxrl: ConfigError: --checkpoint .*missing-checkpoint: not a model directory \(no such directory\)\n$/);
  });

  it('serve --lora-modules: a malformed entry or a missing adapter is a ConfigError naming it, no stack', async () => {
    const malformed = await rxrl(['serve', '--lora-modules', 'coder', '--port', '0', '--backend', 'cpu']);
    expect(malformed.code).not.toBe(0);
    expectOneLine(malformed.stderr, 'ConfigError', "--lora-modules: 'coder' is not NAME=DIR");
    const missing = join(dir, 'missing-adapter');
    const result = await rxrl(['serve', '--lora-modules', `coder=${missing}`, '--port', '0', '--backend', 'cpu']);
    expect(result.code).not.toBe(0);
    expect(result.stderr).not.toContain('    at ');
    expect(result.stderr.trim().split('\n').at(-1)).toMatch(
      /^rxrl: ConfigError: loraModules\.coder: lora_path ".*missing-adapter" does not exist$/,
    );
  });

  it('serve --model with a directory that is no model: ConfigError naming it', async () => {
    const result = await rxrl(['serve', '--model', dir, '--port', '0', '--backend', 'cpu']);
    expect(result.code).not.toBe(0);
    expectOneLine(result.stderr, 'ConfigError', dir);
    expect(result.stderr).toContain('not a model directory (no config.json)');
  });

  it('serve --model with a config.json but no tokenizer: one DecodeError line naming the directory', async () => {
    const model = join(dir, 'half-model');
    await mkdir(model);
    await writeFile(join(model, 'config.json'), '{}');
    const result = await rxrl(['serve', '--model', model, '--port', '0', '--backend', 'cpu']);
    expect(result.code).not.toBe(0);
    expectOneLine(result.stderr, 'DecodeError', model);
    await rm(model, { recursive: true });
  });
});

describe('rxrl CLI: multi-agent recipes', () => {
  it('run trains a multi-agent recipe and prints its summary: both policies, adapter-sized syncs', async () => {
    const runDir = join(dir, 'agents-run');
    const result = await rxrl([
      'run',
      join(root, 'recipes', 'writer-editor-lora.yaml'),
      '--set',
      'run.steps=2',
      '--set',
      'sync.batchSize=2',
      '--set',
      'rollout.groupSize=2',
      '--set',
      'data.task.validationSize=10',
      '--set',
      `run.dir=${runDir}`,
      '--set',
      'logging.level=silent',
    ]);
    expect(result.code).toBe(0);
    const summary = JSON.parse(result.stdout.trim().split('\n').at(-1) ?? '') as {
      policies: { name: string; steps: number; syncBytes: number }[];
    };
    expect(summary.policies.map((p) => [p.name, p.steps])).toEqual([
      ['writer', 2],
      ['editor', 2],
    ]);
    expect(summary.policies[0].syncBytes).toBe(94208);
    expect((await readdir(join(runDir, 'policies', 'writer'))).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
  }, 60_000);
});

describe('rxrl CLI: numbers, ports and unexpected errors', () => {
  it('--set run.steps= and --set run.steps=0x10 are ConfigErrors naming the key, not 0 and 16', async () => {
    const recipe = join(dir, 'numbers.json');
    await writeFile(recipe, '{}');
    for (const value of ['', '0x10']) {
      const result = await rxrl(['config', recipe, '--set', `run.steps=${value}`]);
      expect(result.code).toBe(1);
      expect(result.stdout).toBe('');
      expect(result.stderr).not.toContain('    at ');
      expect(result.stderr).toMatch(/^rxrl: ConfigError: invalid configuration:\nrun\.steps: must be an integer >= 0/);
    }
  });

  it('--status-port 0x50, 65536 and --port 1e3 are ConfigErrors before anything listens, never a RangeError', async () => {
    const recipe = join(dir, 'ports.json');
    await writeFile(recipe, JSON.stringify({ run: { dir: join(dir, 'ports-run'), steps: 1, backend: 'cpu' } }));
    for (const [args, key] of [
      [['run', recipe, '--status-port', '0x50'], 'status-port'],
      [['run', recipe, '--status-port', '65536'], 'status-port'],
      [['serve', '--port', '1e3'], 'port'],
    ] as const) {
      const result = await rxrl([...args]);
      expect(result.code).toBe(1);
      expectOneLine(result.stderr, 'ConfigError', key);
    }
  });

  it('rxrl config prints no secret: the teacher key and the agent env are redacted', async () => {
    const recipe = join(dir, 'secrets.json');
    await writeFile(
      recipe,
      JSON.stringify({ distill: { teacher: { apiKey: 'sk-SECRET1' } }, rollout: { agent: { env: { TOKEN: 'SECRET2' } } } }),
    );
    const result = await rxrl(['config', recipe, '--set', 'checkpoint.maxShardSize=1000000']);
    expect(result.code).toBe(0);
    expect(result.stdout).not.toMatch(/SECRET[12]/);
    expect(result.stdout).toContain('"maxShardSize": 1000000');
  });
});
