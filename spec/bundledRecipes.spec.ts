/**
 * The recipes shipped in the package: every file under `recipes/` is either bundled (in package.json `files`,
 * addressable as `rxrl:<name>`, free of relative paths) or kept to the checkout for a stated reason; `rxrl:<name>`
 * resolves for every command that takes a recipe; `rxrl recipes` lists them; `rxrl init` copies one and never
 * overwrites.
 */
import { execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';

import {
  BUNDLED_RECIPES,
  bundledRecipe,
  bundledRecipePath,
  describeBundledRecipes,
  initRecipe,
  packageRoot,
  recipeFile,
} from '../cli/bundled.js';
import { ConfigError, UsageError } from '../lib/core/errors.js';
import { loadConfig } from '../lib/config/schema.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const cli = join(root, 'dist', 'cli', 'main.js');

/** Recipes that stay in the checkout, and why they cannot run from an install. */
const CHECKOUT_ONLY: Readonly<Record<string, string>> = {
  'smollm2-arithmetic-parquet.yaml': 'reads ../data/arithmetic, made in a checkout by scripts/arithmetic_parquet.py',
  'smollm2-arithmetic-trl.yaml': 'reads ../data/arithmetic, made in a checkout by scripts/arithmetic_parquet.py',
  'smollm2-distill.yaml': "its teacher is ../runs/smollm2-arithmetic-sft's checkpoint, trained in a checkout",
};

/** Every string in a parsed recipe, with its key path. */
function strings(value: unknown, path = ''): [string, string][] {
  if (typeof value === 'string') return [[path, value]];
  if (value === null || typeof value !== 'object') return [];
  return Object.entries(value).flatMap(([key, inner]) => strings(inner, path === '' ? key : `${path}.${key}`));
}

async function rxrl(args: readonly string[], cwd: string): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [cli, ...args], { cwd, timeout: 60_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const e = error as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

describe('bundled recipes', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rxrl-bundled-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('cover every recipe file but those that need the checkout, and package.json ships exactly them', () => {
    const files = readdirSync(join(root, 'recipes')).filter((f) => /\.(json|ya?ml)$/.test(f));
    const bundled = BUNDLED_RECIPES.map((r) => r.file);
    expect([...bundled, ...Object.keys(CHECKOUT_ONLY)].sort()).toEqual(files.sort());
    const shipped = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { files: string[] }).files.filter((f) =>
      f.startsWith('recipes/'),
    );
    expect(shipped.sort()).toEqual(bundled.map((f) => `recipes/${f}`).sort());
    expect(packageRoot()).toBe(root.replace(/\/$/, ''));
  });

  it('load, and hold no path relative to their directory', () => {
    for (const recipe of BUNDLED_RECIPES) {
      const file = bundledRecipePath(recipe);
      expect(() => loadConfig({ file, env: {} }), recipe.name).not.toThrow();
      const text = readFileSync(file, 'utf8');
      const parsed: unknown = file.endsWith('.json') ? JSON.parse(text) : parseYaml(text);
      const relative = strings(parsed).filter(([, v]) => /^\.\.?\//.test(v) || (/\//.test(v) && !/^[~/]/.test(v)));
      expect(relative, recipe.name).toEqual([]);
    }
  });

  it('resolve rxrl:<name> to the shipped file and leave a file argument alone', () => {
    expect(recipeFile('rxrl:reverse')).toBe(join(root, 'recipes', 'reverse.json'));
    expect(recipeFile('recipes/reverse.json')).toBe('recipes/reverse.json');
    expect(bundledRecipe('reverse')).toBe(bundledRecipe('rxrl:reverse'));
    expect(() => bundledRecipe('rxrl:reverse.json')).toThrow(UsageError);
    expect(() => recipeFile('rxrl:nope')).toThrow(
      "no bundled recipe 'rxrl:nope' (bundled: rxrl:reverse, rxrl:reverse-batch-async, rxrl:writer-editor-lora, rxrl:smollm2-arithmetic, rxrl:smollm2-arithmetic-full, rxrl:smollm2-arithmetic-sft; rxrl recipes describes them)",
    );
  });

  it('are listed one line each, with what a recipe needs beyond the package', () => {
    const lines = describeBundledRecipes().split('\n');
    for (const recipe of BUNDLED_RECIPES) {
      const at = lines.findIndex((line) => line.startsWith(`rxrl:${recipe.name} `));
      expect(lines[at]).toContain(recipe.description);
      if (recipe.needs !== undefined) expect(lines[at + 1].trim()).toBe(`needs ${recipe.needs}`);
    }
    expect(BUNDLED_RECIPES.filter((r) => r.needs !== undefined).map((r) => r.name)).toEqual([
      'smollm2-arithmetic',
      'smollm2-arithmetic-full',
      'smollm2-arithmetic-sft',
    ]);
  });

  it('are copied by init as YAML with their comments or as JSON, and an existing file is never overwritten', async () => {
    const yaml = join(dir, 'batch.yaml');
    expect(initRecipe('reverse-batch-async', yaml)).toBe(yaml);
    const text = await readFile(yaml, 'utf8');
    expect(text).toMatch(
      /^# Starter recipe from rxrl:reverse-batch-async: .*\n# Train it with: npx rxrl run .*batch\.yaml\n# The bundled reverse task/,
    );
    expect(loadConfig({ file: yaml, env: {} })).toEqual(loadConfig({ file: recipeFile('rxrl:reverse-batch-async'), env: {} }));
    const json = join(dir, 'new', 'reverse.json');
    initRecipe('rxrl:reverse', json);
    expect(JSON.parse(await readFile(json, 'utf8'))).toEqual(JSON.parse(readFileSync(recipeFile('rxrl:reverse'), 'utf8')));
    await writeFile(join(dir, 'mine.yaml'), 'run: { steps: 3 }\n');
    expect(() => initRecipe('reverse', join(dir, 'mine.yaml'))).toThrow(ConfigError);
    expect(await readFile(join(dir, 'mine.yaml'), 'utf8')).toBe('run: { steps: 3 }\n');
  });

  it('work through the CLI: rxrl recipes, rxrl init, rxrl config rxrl:<name> (built by pretest)', async () => {
    const cwd = await mkdtemp(join(dir, 'cwd-'));
    const listed = await rxrl(['recipes'], cwd);
    expect(listed).toMatchObject({ code: 0, stdout: describeBundledRecipes() });
    const init = await rxrl(['init'], cwd);
    expect(init).toMatchObject({ code: 0, stdout: `${join(cwd, 'rxrl-recipe.yaml')}\n` });
    expect(init.stderr).toBe('rxrl: wrote rxrl-recipe.yaml; train it with: npx rxrl run rxrl-recipe.yaml\n');
    expect(existsSync(join(cwd, 'rxrl-recipe.yaml'))).toBe(true);
    const again = await rxrl(['init', 'writer-editor-lora'], cwd);
    expect(again.code).toBe(1);
    expect(again.stderr).toBe(
      'rxrl: ConfigError: rxrl-recipe.yaml exists and is left as it is (remove it, or give --out FILE for another name)\n',
    );
    expect((await rxrl(['init', 'a', 'b'], cwd)).stderr).toBe(
      "rxrl: UsageError: rxrl init: unexpected argument 'b' (see rxrl init --help)\n",
    );
    const config = await rxrl(['config', 'rxrl:reverse'], cwd);
    expect(config.code).toBe(0);
    expect(config.stdout).toContain(join(cwd, 'runs', 'reverse'));
    const unknown = await rxrl(['run', 'rxrl:nope'], cwd);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/^rxrl: UsageError: rxrl run: no bundled recipe 'rxrl:nope' .* \(see rxrl run --help\)\n$/);
    expect((await rxrl(['run', '--help'], cwd)).stdout).toContain('may also be rxrl:<name>');
  }, 120_000);
});
