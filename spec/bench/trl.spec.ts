import { spawn } from 'node:child_process';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

import { loadTokenizer } from '../../lib/model/hfTokenizer.js';

const root = resolve(import.meta.dirname, '..', '..');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

function bench(args: readonly string[]): Promise<{ code: number | null; lines: Record<string, unknown>[]; stderr: string }> {
  const child = spawn(process.execPath, [join(root, 'dist', 'bench', 'run.js'), 'trl', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((done) =>
    child.on('exit', (code) =>
      done({
        code,
        stderr,
        lines: stdout
          .split('\n')
          .filter((l) => l.startsWith('{'))
          .map((l) => JSON.parse(l) as Record<string, unknown>),
      }),
    ),
  );
}

describe('npm run bench -- trl', () => {
  it("exports the recipe's task with rxrl's prompt ids, runs rxrl's side and writes the comparison and its report", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-bench-trl-'));
    const recipe = join(dir, 'tiny.yaml');
    // The SmolLM2 recipe on the tiny Qwen2 fixture.
    const text = await readFile(join(root, 'recipes', 'smollm2-arithmetic.yaml'), 'utf8');
    await writeFile(recipe, text.replace(/path: .*SmolLM2-135M-Instruct/, `path: ${fixture}`));
    const out = join(dir, 'out');
    const { code, lines, stderr } = await bench(['--steps', '2', '--only', 'rxrl', '--backend', 'wasm', '--recipe', recipe, '--out', out]);
    expect(code, stderr).toBe(0);

    const [header] = lines;
    expect(header).toMatchObject({ bench: 'trl', steps: 2, settings: { rows: 16, microBatchSize: 8, groupSize: 4, maxTokens: 16, lossType: 'dapo', scaleRewards: 'group' } });
    expect((header.settings as { lora: { rank: number } }).lora.rank).toBe(16);
    const steps = lines.filter((l) => l.side === 'rxrl' && typeof l.step === 'number');
    expect(steps.map((s) => s.step)).toEqual([0, 1]);
    for (const s of steps) expect(Number(s.rollout_s) + Number(s.train_s)).toBeCloseTo(Number(s.total_s), 6);
    const summary = lines.find((l) => l.side === 'rxrl' && 'step_s_median' in l);
    expect(summary).toMatchObject({ backend: 'wasm', steps: 2, val_before: { reward: expect.any(Number), format: expect.any(Number) } });
    expect(lines.at(-1)).toMatchObject({ bench: 'trl-summary', steps: 2, trl_gain: null, step_time_ratio: null });
    expect(typeof lines.at(-1)!.rxrl_gain).toBe('number');

    // Each exported prompt is its rendered text and the ids rxrl sampled from: the tokenizer gives the one from the other.
    const tokenizer = await loadTokenizer(fixture);
    const rows = (await readFile(join(out, 'data', 'validation.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as { prompt: string; prompt_ids: number[]; answer: string });
    expect(rows).toHaveLength(64);
    for (const row of rows.slice(0, 8)) {
      expect(row.prompt).toContain('Answer with the equation only');
      expect(tokenizer.encode(row.prompt)).toEqual(row.prompt_ids);
    }
    const metrics = await readFile(join(out, 'metrics.jsonl'), 'utf8');
    expect(metrics).toContain('"rxrl/rollout/reward_mean"');
    expect(await readFile(join(out, 'report.html'), 'utf8')).toContain('rxrl and TRL');
  }, 120_000);
});
