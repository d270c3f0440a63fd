import { appendFileSync, readFileSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { dropStepsFrom } from '../../pipelines/parts/runDir.js';
import { runTraining } from '../../pipelines/run.js';
import { tinyRun } from '../checkpoint/tinyRun.js';

/** Every non-blank line of a JSONL file, parsed (a line that does not parse fails the test). */
function records(file: string): { step: number }[] {
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as { step: number });
}

describe('torn JSONL lines (a crash or a full disk mid-write) are dropped on resume', () => {
  it('a torn last line of trained.jsonl and metrics.jsonl goes, and the resumed run writes whole lines after it', async () => {
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-torn-')), 'run');
    await runTraining(tinyRun(dir, 3));
    appendFileSync(join(dir, 'trained.jsonl'), '{"step":3,"version":4,"groups":["g');
    appendFileSync(join(dir, 'metrics.jsonl'), '{"step":3,"vers');
    const resumed = await runTraining(tinyRun(dir, 4));
    expect(resumed.resumedFrom).toBe(join(dir, 'global_step_3'));
    expect(records(join(dir, 'trained.jsonl')).map((r) => r.step)).toEqual([0, 1, 2, 3]);
    // Steps 0-3, each with its timing line, and the two final validations (after step 2, then after step 3).
    expect(records(join(dir, 'metrics.jsonl')).map((r) => r.step)).toEqual([0, 0, 1, 1, 2, 2, 2, 3, 3, 3]);
  }, 120_000);

  it('dropStepsFrom drops lines that do not parse and ends the file with a newline; a complete file is left as it is', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-torn-'));
    const file = join(dir, 'steps.jsonl');
    await writeFile(file, '{"step":0}\nnot json\n{"step":1}\n{"step":2}\n{"step":3');
    await dropStepsFrom(file, 2);
    expect(readFileSync(file, 'utf8')).toBe('{"step":0}\n{"step":1}\n');
    // A last line complete but for its newline stays, and gets one.
    await writeFile(file, '{"step":0}\n{"step":1}');
    await dropStepsFrom(file, 5);
    expect(readFileSync(file, 'utf8')).toBe('{"step":0}\n{"step":1}\n');
    await dropStepsFrom(file, 5);
    expect(readFileSync(file, 'utf8')).toBe('{"step":0}\n{"step":1}\n');
  });
});
