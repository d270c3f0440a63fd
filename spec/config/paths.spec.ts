/** `--set` paths are relative to the working directory; a recipe's own paths stay relative to the recipe. */
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { PATH_KEYS, isBareSpecifier, resolveSetPath } from '../../lib/config/paths.js';
import { SCHEMA, loadConfig } from '../../lib/config/schema.js';
import { recipeDir } from '../../pipelines/parts/data.js';

const root = mkdtempSync(join(tmpdir(), 'rxrl-paths-'));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe('resolveSetPath', () => {
  const cwd = join(root, 'work');

  it('makes a file, directory or module path absolute against the working directory', () => {
    expect(resolveSetPath('data.trainFile', 'data/train.jsonl', cwd)).toBe(join(cwd, 'data', 'train.jsonl'));
    expect(resolveSetPath('run.dir', '../runs/a', cwd)).toBe(join(root, 'runs', 'a'));
    expect(resolveSetPath('rollout.evaluator.module', './ev.js', cwd)).toBe(join(cwd, 'ev.js'));
    expect(resolveSetPath('resume.path', '/abs/ckpt', cwd)).toBe('/abs/ckpt');
  });

  it('keeps a bare module specifier, a model id with no such local path, ~ paths and values that are no path', () => {
    expect(resolveSetPath('rollout.evaluator.module', 'rxrl/recipes', cwd)).toBe('rxrl/recipes');
    expect(resolveSetPath('model.path', 'Qwen/Qwen3-0.6B', cwd)).toBe('Qwen/Qwen3-0.6B');
    expect(resolveSetPath('model.path', '~/models/m', cwd)).toBe('~/models/m');
    expect(resolveSetPath('model.path', './models/m', cwd)).toBe(join(cwd, 'models', 'm'));
    expect(resolveSetPath('model.path', 'models/m/', cwd)).toBe(join(cwd, 'models', 'm'));
    expect(resolveSetPath('trainer.learningRate', 3, cwd)).toBe(3);
    expect(resolveSetPath('data.validationFile', null, cwd)).toBe(null);
    expect(resolveSetPath('kafka.brokers', 'a/b', cwd)).toBe('a/b');
  });

  it('a model id that is also a local path is the local path', () => {
    const here = join(root, 'local-id');
    mkdirSync(join(here, 'org', 'name'), { recursive: true });
    expect(resolveSetPath('model.path', 'org/name', here)).toBe(join(here, 'org', 'name'));
  });

  it("resolves each policy's adapterPath", () => {
    const policies = [
      { name: 'a', specialization: 'lora', adapterPath: 'adapters/a' },
      { name: 'b', specialization: 'full' },
    ];
    expect(resolveSetPath('policies', policies, cwd)).toEqual([
      { name: 'a', specialization: 'lora', adapterPath: join(cwd, 'adapters', 'a') },
      { name: 'b', specialization: 'full' },
    ]);
  });

  it('knows bare specifiers from files, and every path key is a schema key', () => {
    for (const bare of ['rxrl/recipes', '@scope/pkg/sub', 'pkg']) expect(isBareSpecifier(bare), bare).toBe(true);
    for (const file of ['./ev.js', '../ev', '/abs/ev.mjs', 'evaluators/mine.ts', '~/ev']) expect(isBareSpecifier(file), file).toBe(false);
    for (const key of Object.keys(PATH_KEYS)) {
      const node = key.split('.').reduce<Record<string, unknown>>((n, part) => n[part] as Record<string, unknown>, SCHEMA);
      expect(node, key).toHaveProperty('doc');
    }
  });
});

describe('loadConfig: a recipe in a subdirectory, --set from another working directory', () => {
  it("the recipe's paths stay as written (relative to its directory); --set paths become absolute against cwd", () => {
    const recipes = join(root, 'project', 'recipes');
    mkdirSync(recipes, { recursive: true });
    const file = join(recipes, 'r.yaml');
    writeFileSync(
      file,
      'data:\n  source: jsonl\n  trainFile: tasks/train.jsonl\n  alphabet: ab\nrollout:\n  evaluator:\n    module: ./ev.js\n',
    );
    const fromRecipe = loadConfig({ file, env: {} });
    expect(fromRecipe.data.trainFile).toBe('tasks/train.jsonl');
    expect(recipeDir(file)).toBe(recipes);
    const cwd = join(root, 'elsewhere');
    const fromCli = loadConfig({ file, env: {}, cwd, set: ['data.trainFile=mine/train.jsonl', 'data.validationFile=val.jsonl'] });
    expect(fromCli.data.trainFile).toBe(join(cwd, 'mine', 'train.jsonl'));
    expect(fromCli.data.validationFile).toBe(join(cwd, 'val.jsonl'));
    expect(fromCli.rollout.evaluator.module).toBe('./ev.js');
  });
});
