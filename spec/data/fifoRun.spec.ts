/**
 * A FIFO named as `data.trainFile` is refused before anything opens it: `rxrl run` exits at once with one
 * `ConfigError` line naming the key and the path, no stack (before, it blocked forever in `open` and ignored SIGTERM).
 * Refused up front, there is no wait for a signal to end. Needs the built CLI (`npm run build`).
 */
import { execFile, spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { CLI } from '../helpers/stopRun.js';

const run = promisify(execFile);

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-fifo-run-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl run with a FIFO as its task file', () => {
  it('exits at once with a ConfigError naming data.trainFile and the FIFO, one line, no stack', async () => {
    const fifo = join(dir, 'tasks.jsonl');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const recipe = join(dir, 'recipe.json');
    await writeFile(
      recipe,
      JSON.stringify({
        run: { backend: 'cpu', steps: 1, dir: join(dir, 'run') },
        data: { source: 'jsonl', trainFile: 'tasks.jsonl', alphabet: 'abc' },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
        trainer: { algorithm: 'sft' },
        sft: { source: 'dataset' },
        rollout: { groupSize: 1, maxTokens: 4 },
        sync: { batchSize: 1 },
      }),
    );
    const started = performance.now();
    // A long deadline: only the refusal can explain an exit (a blocked run is killed at the deadline and fails here).
    const outcome = await run(process.execPath, [CLI, 'run', recipe], { timeout: 120_000, killSignal: 'SIGKILL' }).then(
      () => ({ code: 0, signal: null, stderr: '' }),
      (error: { code: number | null; signal: string | null; stderr: string }) => error,
    );
    console.log(`rxrl run with a FIFO trainFile exited in ${((performance.now() - started) / 1000).toFixed(1)} s`);
    expect(outcome.signal).toBeNull();
    expect(outcome.code).toBe(1);
    expect(outcome.stderr).not.toContain('    at ');
    const lines = outcome.stderr.split('\n').filter((line) => line.startsWith('rxrl: ') && line.includes('Error'));
    expect(lines).toEqual([`rxrl: ConfigError: data.trainFile: ${fifo}: is a FIFO, not a regular file of tasks`]);
  });
});
