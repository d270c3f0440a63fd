import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, describe, expect, it } from 'vitest';

import {
  CONFIG_REFERENCE_FILE,
  configKeys,
  referenceDifference,
  renderConfigReference,
  writeConfigReference,
} from '../../lib/config/reference.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const script = join(root, 'scripts', 'config-reference.mjs');
const committed = readFileSync(join(root, CONFIG_REFERENCE_FILE), 'utf8');
const temp = mkdtempSync(join(tmpdir(), 'rxrl-config-reference-'));
afterAll(() => rmSync(temp, { recursive: true, force: true }));

/** The committed reference with one table row's description changed. */
function staleCopy(): string {
  const path = join(temp, 'stale.md');
  writeFileSync(path, committed.replace('| Adam learning rate. |', '| Learning rate. |'));
  return path;
}

describe('configuration reference (docs/configuration-reference.md)', () => {
  it('the committed file is what the schema gives (npm run docs:config -- --check)', () => {
    expect(writeConfigReference({ root, check: true })).toEqual({ code: 0, message: `${CONFIG_REFERENCE_FILE} is up to date` });
  });

  it('lists every key of the schema once, with its format, default, environment variable and doc text', () => {
    const keys = configKeys();
    expect(keys.length).toBeGreaterThan(100);
    for (const { key } of keys) expect(committed.split('\n').filter((l) => l.startsWith(`| \`${key}\` |`))).toHaveLength(1);
    expect(committed).toContain('| `trainer.learningRate` | number > 0 | `0.001` |  | Adam learning rate. |');
    expect(committed).toContain('| `run.seed` | integer ≥ 0 | `1` | `RXRL_SEED` |');
    expect(committed).toContain('| `run.backend` | one of `auto`, `wasm`, `cpu`, `tensorflow` | `"auto"` | `RXRL_BACKEND` |');
    expect(committed).toContain('| `kafka.brokers` | string | `"localhost:9092"` | `KAFKA_BROKERS` |');
    expect(committed).toMatch(/\| `openai\.apiKey` \|.*Secret: masked/);
    expect(committed).toContain('## trainer\n');
    expect(committed).toContain('by `npm run docs:config`');
  });

  it('keeps doc text literal in Markdown: no tags from <run-dir>, no emphasis from *', () => {
    expect(committed).toContain('runs/&lt;recipe name&gt;');
    expect(committed).not.toMatch(/\| [^|`]*<run-dir>/);
    expect(committed).toContain("operators, a string of '+', '-', '\\*'.");
  });

  it('names the first difference when the file is stale, and says how to rewrite it', () => {
    const outcome = writeConfigReference({ root, check: true, file: staleCopy() });
    expect(outcome.code).toBe(1);
    expect(outcome.message).toMatch(/is stale \(line \d+: expected '.*Adam learning rate\. \|', found '.*Learning rate\. \|'\)/);
    expect(outcome.message).toContain('run `npm run docs:config` to rewrite it');
    expect(writeConfigReference({ root, check: true, file: join(temp, 'none.md') })).toMatchObject({ code: 1 });
    expect(referenceDifference('a\nb\n', 'a\n')).toBe("line 2: expected 'b', found ''");
    expect(referenceDifference('a\n', 'a\n')).toBeUndefined();
  });

  it('writes the rendered reference', () => {
    const file = join(temp, 'written.md');
    expect(writeConfigReference({ root, file }).code).toBe(0);
    expect(readFileSync(file, 'utf8')).toBe(renderConfigReference());
  });

  it('refuses a key without doc text and a format it has no words for, naming the key', () => {
    expect(() => configKeys({ a: { b: { doc: ' ', format: String, default: '' } } })).toThrow(/^a\.b: the schema gives no doc text/);
    expect(() => configKeys({ c: { doc: 'x', format: 'port', default: 1 } })).toThrow(/^c: format port has no text/);
  });

  it('the script checks the committed file (exit 0) and a stale one (exit 1), and refuses unknown arguments (exit 2)', () => {
    if (!existsSync(join(root, 'dist', 'lib', 'config', 'reference.js'))) {
      throw new Error('dist/lib/config/reference.js missing: run `npm run build` (npm test builds first)');
    }
    const ok = spawnSync(process.execPath, [script, '--check'], { encoding: 'utf8' });
    expect([ok.status, ok.stdout.trim()]).toEqual([0, `${CONFIG_REFERENCE_FILE} is up to date`]);
    const stale = spawnSync(process.execPath, [script, '--check', '--file', staleCopy()], { encoding: 'utf8' });
    expect(stale.status).toBe(1);
    expect(stale.stderr).toMatch(/stale\.md is stale \(line \d+: expected/);
    const bad = spawnSync(process.execPath, [script, '--frobnicate'], { encoding: 'utf8' });
    expect([bad.status, bad.stderr.trim()]).toEqual([
      2,
      "config-reference: unknown argument '--frobnicate' (usage: npm run docs:config -- [--check] [--file PATH])",
    ]);
  });
});
