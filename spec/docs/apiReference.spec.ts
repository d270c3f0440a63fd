import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

const root = fileURLToPath(new URL('../..', import.meta.url));
const typedoc = join(root, 'node_modules', 'typedoc', 'bin', 'typedoc');
const out = mkdtempSync(join(tmpdir(), 'rxrl-api-reference-'));
afterAll(() => rmSync(out, { recursive: true, force: true }));

/** What `npm run docs:api` printed, built into a temporary folder. */
let run: { status: number | null; output: string };

beforeAll(() => {
  // TypeDoc converts the whole program (about 30 s of CPU), once for every case below.
  const result = spawnSync(process.execPath, [typedoc, '--treatWarningsAsErrors', '--out', out], {
    cwd: root,
    encoding: 'utf8',
  });
  run = { status: result.status, output: `${result.stdout}${result.stderr}` };
}, 600_000);

describe('API reference (npm run docs:api)', () => {
  it('builds from the package exports with warnings as errors and no warning at all', () => {
    expect(run.output).not.toMatch(/\[(warning|error)\]/);
    expect(run.status).toBe(0);
    const options = JSON.parse(readFileSync(join(root, 'typedoc.json'), 'utf8')) as Record<string, unknown>;
    expect(options).toMatchObject({
      entryPoints: ['lib/index.ts', 'operators/index.ts', 'pipelines/index.ts', 'recipes/index.ts'],
      out: 'docs/api',
      treatWarningsAsErrors: true,
      validation: { notExported: true, invalidLink: true, rewrittenLink: true },
    });
  });

  it('documents every export path of package.json as a module named by its import path', () => {
    const exportsField = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { exports: Record<string, unknown> }).exports;
    const paths = Object.keys(exportsField).filter((p) => p !== './package.json');
    expect(paths.length).toBeGreaterThanOrEqual(4);
    for (const path of paths) {
      const name = path === '.' ? 'rxrl' : `rxrl${path.slice(1)}`;
      expect(existsSync(join(out, 'modules', `${name.replace(/\//g, '_')}.html`)), name).toBe(true);
    }
  });

  it('has a page for the main symbols, with their doc comments', () => {
    const pages: Record<string, string> = {
      'functions/rxrl_pipelines.grpoPipeline.html': 'grpoPipeline',
      'functions/rxrl_operators.rollout.html': 'rollout',
      'functions/rxrl_operators.admit.html': 'admit',
      'classes/rxrl.PolicyModel.html': 'PolicyModel',
      'classes/rxrl.ConfigError.html': 'ConfigError',
      'functions/rxrl.loadConfig.html': 'loadConfig',
      'functions/rxrl_recipes.stringTransformTask.html': 'stringTransformTask',
    };
    for (const [page, symbol] of Object.entries(pages)) {
      const path = join(out, page);
      expect(existsSync(path), page).toBe(true);
      expect(readFileSync(path, 'utf8')).toContain(symbol);
    }
    const config = readFileSync(join(out, 'functions', 'rxrl.loadConfig.html'), 'utf8');
    expect(config).toContain('Loads, merges and validates a configuration');
  });
});
