/** A missing path on the command line is one typed line on stderr, never a stack (built CLI: `npm run build`). */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const cli = join(root, 'dist', 'cli', 'main.js');

/** What a missing model's message ends with. */
const REMEDY = 'run `npm run model:smollm2` in a checkout, or give a local model directory or a Hugging Face id such as org/name';

/** `rxrl <args>` (the built CLI), in `cwd` and with `env` added to this process's environment when given. */
async function rxrl(
  args: string[],
  options: { env?: Record<string, string>; cwd?: string } = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  if (!existsSync(cli)) throw new Error('dist/ is not built: run `npm run build` first (`npm test` does it in pretest)');
  try {
    const { stdout, stderr } = await run(process.execPath, [cli, ...args], {
      timeout: 60_000,
      env: { ...process.env, ...options.env },
      ...(options.cwd === undefined ? {} : { cwd: options.cwd }),
    });
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
    expect(result.stderr).toBe(`rxrl: ConfigError: --checkpoint: no model at '${missing}' (${REMEDY})\n`);
  });

  it('serve --lora-modules: a malformed entry or a missing adapter is a ConfigError naming it, no stack', async () => {
    const malformed = await rxrl(['serve', '--lora-modules', 'coder', '--port', '0', '--backend', 'cpu']);
    expect(malformed.code).toBe(2);
    expectOneLine(malformed.stderr, 'UsageError', "rxrl serve: --lora-modules must be NAME=DIR[,NAME=DIR…], got 'coder'");
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
    expect(result.stderr).toBe(`rxrl: ConfigError: --model: no model at '${dir}': the directory has no config.json (${REMEDY})\n`);
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

  it('--status-port 0x50, 65536 and --port 1e3 are usage errors before anything listens, never a RangeError', async () => {
    const recipe = join(dir, 'ports.json');
    await writeFile(recipe, JSON.stringify({ run: { dir: join(dir, 'ports-run'), steps: 1, backend: 'cpu' } }));
    for (const [args, key] of [
      [['run', recipe, '--status-port', '0x50'], '--status-port'],
      [['run', recipe, '--status-port', '65536'], '--status-port'],
      [['serve', '--port', '1e3'], '--port'],
    ] as const) {
      const result = await rxrl([...args]);
      expect(result.code).toBe(2);
      expectOneLine(result.stderr, 'UsageError', key);
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

describe('rxrl CLI: one exit-code rule (2 usage, 1 configuration or run, 0 done)', () => {
  it('a malformed flag value, a malformed --set, an unknown flag or a missing argument: exit 2, one UsageError line', async () => {
    const recipe = join(dir, 'usage.json');
    await writeFile(recipe, JSON.stringify({ run: { dir: join(dir, 'usage-run'), steps: 1, backend: 'cpu' } }));
    const cases: [string[], string][] = [
      [['run', recipe, '--steps', 'abc'], "rxrl run: --steps must be a non-negative integer, got 'abc' (see rxrl run --help)"],
      [['run', recipe, '--seed=-3'], "rxrl run: --seed must be a non-negative integer, got '-3' (see rxrl run --help)"],
      [['trainer', recipe, '--steps', '1e3'], "rxrl trainer: --steps must be a non-negative integer, got '1e3' (see rxrl trainer --help)"],
      [['trainer', recipe, '--seed', ''], "rxrl trainer: option '--seed' needs a value (see rxrl trainer --help)"],
      [
        ['config', recipe, '--set', 'run.steps'],
        "rxrl config: --set must be key=value (e.g. --set trainer.learningRate=1e-5), got 'run.steps' (see rxrl config --help)",
      ],
      [['run', recipe, '--step', '2'], "rxrl run: unknown option '--step' (see rxrl run --help)"],
      [['run'], 'rxrl run: missing <recipe.json|yaml> (see rxrl run --help)'],
      [
        ['tinker', '--port', '0'],
        'rxrl tinker: --model DIR is required (a Hugging Face model directory or id, or RXRL_TINKER_MODEL) (see rxrl tinker --help)',
      ],
      [
        ['serve', '--reasoning-parser', 'r1'],
        "rxrl serve: --reasoning-parser must be one of qwen3, deepseek_r1, got 'r1' (see rxrl serve --help)",
      ],
      [
        ['status', 'http://127.0.0.1:9', '--timeout-ms', 'soon'],
        "rxrl status: --timeout-ms must be a non-negative integer, got 'soon' (see rxrl status --help)",
      ],
    ];
    for (const [args, line] of cases) {
      const result = await rxrl(args);
      expect(result.code, args.join(' ')).toBe(2);
      expect(result.stdout).toBe('');
      expect(result.stderr, args.join(' ')).toBe(`rxrl: UsageError: ${line}\n`);
    }
  });

  it('an unknown key, a TRL or verl name, a malformed environment variable: exit 1, one ConfigError line', async () => {
    const recipe = join(dir, 'keys.yaml');
    await writeFile(recipe, 'num_generations: 4\nrun:\n  steps: 1\n');
    const empty = join(dir, 'empty.json');
    await writeFile(empty, '{}');
    const cases: [string[], Record<string, string>, string][] = [
      [['config', recipe], {}, "config: 'num_generations' is TRL's name; in rxrl it is 'rollout.groupSize' (--set rollout.groupSize=…)"],
      [
        ['config', empty, '--set', 'trainer.learnig_rate=1e-5'],
        {},
        "config: unknown key 'trainer.learnig_rate' (did you mean 'trainer.learningRate'?)",
      ],
      [
        ['run', empty, '--set', 'learning_rate=1e-5'],
        {},
        "config: 'learning_rate' is TRL's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…)",
      ],
      [
        ['config', empty, '--set', 'actor_rollout_ref.rollout.n=8'],
        {},
        "config: 'actor_rollout_ref.rollout.n' is verl's name; in rxrl it is 'rollout.groupSize' (--set rollout.groupSize=…)",
      ],
      [['run', empty], { RXRL_STEPS: 'abc' }, "RXRL_STEPS must be a non-negative integer, got 'abc'"],
    ];
    for (const [args, env, line] of cases) {
      const result = await rxrl(args, { env });
      expect(result.code, args.join(' ')).toBe(1);
      expect(result.stdout).toBe('');
      expect(result.stderr, args.join(' ')).toBe(`rxrl: ConfigError: ${line}\n`);
    }
  });

  it('rxrl --help states the rule; run and trainer list --steps and --seed', async () => {
    const help = await rxrl(['--help']);
    expect(help.code).toBe(0);
    expect(help.stdout.replace(/\s+/g, ' ')).toContain(
      'Exit codes: 0 done; 2 a usage error (an unknown command or flag, a flag without its value or with a malformed one such as --steps abc, a missing or extra argument); 1 a configuration error',
    );
    for (const command of ['run', 'trainer']) {
      const usage = await rxrl([command, '--help']);
      expect(usage.stdout).toContain(`rxrl ${command} <recipe.json|yaml> [--set key=value]… [--steps N] [--seed N]`);
      expect(usage.stdout).toContain('Environment (flags win): RXRL_STEPS, RXRL_SEED (as --steps, --seed).');
    }
  });

  it('--steps and --seed (or RXRL_STEPS, RXRL_SEED) win over the recipe and --set', async () => {
    const recipe = join(dir, 'budget.json');
    await writeFile(recipe, JSON.stringify({ run: { steps: 800, seed: 1 } }));
    const printed = async (args: string[], env: Record<string, string> = {}): Promise<{ steps: number; seed: number }> => {
      const result = await rxrl(['config', recipe, ...args], { env });
      expect(result.code, result.stderr).toBe(0);
      return (JSON.parse(result.stdout) as { run: { steps: number; seed: number } }).run;
    };
    expect(await printed([], { RXRL_STEPS: '5', RXRL_SEED: '4' })).toMatchObject({ steps: 5, seed: 4 });
    expect(await printed(['--set', 'run.steps=9'], { RXRL_STEPS: '5' })).toMatchObject({ steps: 5 });
    const trained = await rxrl(
      [
        'run',
        join(root, 'recipes', 'reverse.json'),
        '--steps',
        '1',
        '--seed',
        '3',
        ...[
          'sync.batchSize=2',
          'rollout.groupSize=2',
          'data.task.validationSize=4',
          'run.backend=cpu',
          'validation.beforeTrain=false',
        ].flatMap((set) => ['--set', set]),
        '--set',
        `run.dir=${join(dir, 'budget-run')}`,
      ],
      { env: { RXRL_STEPS: '7' } },
    );
    expect(trained.code, trained.stderr).toBe(0);
    expect(JSON.parse(trained.stdout.trim().split('\n').at(-1) ?? '')).toMatchObject({ steps: 1, seed: 3 });
  }, 60_000);
});

describe('rxrl CLI: --set paths against the working directory, recipe paths against the recipe', () => {
  it('a recipe in a subdirectory, run from another directory: each path where its reader expects it', async () => {
    const project = join(dir, 'paths');
    const recipes = join(project, 'recipes');
    const work = join(project, 'work');
    await mkdir(recipes, { recursive: true });
    await mkdir(work, { recursive: true });
    const recipe = join(recipes, 'tasks.yaml');
    await writeFile(
      recipe,
      'data:\n  source: jsonl\n  trainFile: tasks/train.jsonl\n  alphabet: ab\nrollout:\n  maxTokens: 4\n  evaluator:\n    module: rxrl/recipes\nrun:\n  backend: cpu\n  dir: out\n',
    );
    const fromRecipe = await rxrl(['run', recipe], { cwd: work });
    expect(fromRecipe.code).toBe(1);
    expect(fromRecipe.stderr.trim().split('\n').at(-1)).toMatch(
      new RegExp(`^rxrl: ConfigError: data\\.trainFile: .*${join(recipes, 'tasks', 'train.jsonl')}`),
    );
    const fromCli = await rxrl(['run', '../recipes/tasks.yaml', '--set', 'data.trainFile=mine/train.jsonl', '--set', 'run.dir=cli-out'], {
      cwd: work,
    });
    expect(fromCli.code).toBe(1);
    expect(fromCli.stderr.trim().split('\n').at(-1)).toMatch(
      new RegExp(`^rxrl: ConfigError: data\\.trainFile: .*${join(work, 'mine', 'train.jsonl')}`),
    );
    const printed = await rxrl(['config', '../recipes/tasks.yaml', '--set', 'data.validationFile=v.jsonl', '--set', 'run.dir=cli-out'], {
      cwd: work,
    });
    const config = JSON.parse(printed.stdout) as { run: { dir: string }; data: { trainFile: string; validationFile: string } };
    expect(config.data).toMatchObject({ trainFile: 'tasks/train.jsonl', validationFile: join(work, 'v.jsonl') });
    expect(config.run.dir).toBe(resolve(work, 'cli-out'));
  });
});

describe('rxrl CLI: a missing model names the key, where it looked and what to do', () => {
  const offline = (): Record<string, string> => ({ HF_HUB_OFFLINE: '1', HF_HUB_CACHE: join(dir, 'hub-cache') });

  it('model.path in a recipe (relative to it), --set model.path (relative to the working directory): exit 1, one line', async () => {
    const recipes = join(dir, 'model-path', 'recipes');
    const work = join(dir, 'model-path', 'work');
    await mkdir(recipes, { recursive: true });
    await mkdir(work, { recursive: true });
    const recipe = join(recipes, 'smol.yaml');
    await writeFile(recipe, `model:\n  path: ../models/smollm2-135m\nrun:\n  steps: 1\n  backend: cpu\n  dir: ${join(dir, 'model-run')}\n`);
    const cases: [string[], string][] = [
      [[], `model.path: no model at '${join(dir, 'model-path', 'models', 'smollm2-135m')}' (${REMEDY})`],
      [['--set', 'model.path=./models/smol'], `model.path: no model at '${join(work, 'models', 'smol')}' (${REMEDY})`],
      [['--set', 'model.path=models/smollm2-135m/'], `model.path: no model at '${join(work, 'models', 'smollm2-135m')}' (${REMEDY})`],
    ];
    for (const [args, line] of cases) {
      const result = await rxrl(['run', recipe, ...args], { cwd: work, env: offline() });
      expect(result.code, args.join(' ')).toBe(1);
      expect(result.stderr).not.toContain('    at ');
      expect(result.stderr.trim().split('\n').at(-1), args.join(' ')).toBe(`rxrl: ConfigError: ${line}`);
    }
  });

  it('an org/name that is neither a local directory nor cached, offline: both readings', async () => {
    const recipe = join(dir, 'model-id.yaml');
    await writeFile(recipe, `model:\n  path: model/smollm2\nrun:\n  steps: 1\n  backend: cpu\n  dir: ${join(dir, 'model-id-run')}\n`);
    const result = await rxrl(['run', recipe], { env: offline() });
    expect(result.code).toBe(1);
    expect(result.stderr.trim().split('\n').at(-1)).toBe(
      `rxrl: ConfigError: model.path: no local directory '${join(dir, 'model', 'smollm2')}' and no cached Hugging Face model 'model/smollm2' ` +
        `(offline: HF_HUB_OFFLINE forbids downloading it into ${join(dir, 'hub-cache')}; give a local model directory, or download it online)`,
    );
  });

  it("distillation's teacher, a policy's adapter and serve --model name their own key", async () => {
    const teacher = await rxrl(
      [
        'run',
        join(root, 'recipes', 'smollm2-distill.yaml'),
        '--set',
        `model.path=${join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2')}`,
        '--set',
        'distill.teacher.path=./teacher',
        '--set',
        `run.dir=${join(dir, 'teacher-run')}`,
        '--set',
        'run.backend=cpu',
      ],
      { cwd: dir, env: offline() },
    );
    expect(teacher.code).toBe(1);
    expect(teacher.stderr.trim().split('\n').at(-1)).toBe(
      `rxrl: ConfigError: distill.teacher.path: no model at '${join(dir, 'teacher')}' (${REMEDY})`,
    );
    const adapter = await rxrl(
      [
        'run',
        join(root, 'recipes', 'reverse.json'),
        '--set',
        'policies=[{"name":"p","specialization":"lora","adapterPath":"./adapters/none"}]',
        '--set',
        `run.dir=${join(dir, 'adapter-run')}`,
        '--set',
        'run.backend=cpu',
      ],
      { cwd: dir, env: offline() },
    );
    expect(adapter.code).toBe(1);
    expect(adapter.stderr.trim().split('\n').at(-1)).toBe(
      `rxrl: ConfigError: policies[0].adapterPath: no adapter at '${join(dir, 'adapters', 'none')}' (give a PEFT adapter directory, such as a LoRA run's checkpoint global_step_N)`,
    );
    const serve = await rxrl(['serve', '--model', './no-model', '--port', '0', '--backend', 'cpu'], { cwd: dir, env: offline() });
    expect(serve.code).toBe(1);
    expect(serve.stderr).toBe(`rxrl: ConfigError: --model: no model at '${join(dir, 'no-model')}' (${REMEDY})\n`);
  }, 60_000);
});
