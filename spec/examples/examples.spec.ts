import { execFile } from 'node:child_process';
import { readdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const built = join(root, 'dist', 'examples');
const sources = readdirSync(join(root, 'examples')).filter((f) => f.endsWith('.ts'));

/** Every example runs with node from the build (`npm test` builds first) with a tiny step budget. */
describe('examples (smoke, built by pretest)', () => {
  it('has examples to run', () => {
    expect(sources.length).toBeGreaterThan(0);
  });

  for (const source of sources) {
    it(`${source} runs to completion and ends with a JSON summary`, async () => {
      const file = join(built, source.replace(/\.ts$/, '.js'));
      const { stdout } = await run(process.execPath, [file], {
        cwd: root,
        env: { ...process.env, RXRL_STEPS: '2' },
        timeout: 120_000,
      });
      const last = stdout.trim().split('\n').at(-1) ?? '';
      const summary = JSON.parse(last) as { steps?: number };
      expect(summary.steps).toBe(2);
    }, 150_000);
  }
});
