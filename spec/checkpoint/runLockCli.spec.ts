/** `rxrl run` on a run directory another run holds: one typed line, nothing written (built CLI: `npm run build`). */
import { execFile, spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, writeFile } from 'node:fs/promises';
import { hostname, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const cli = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'dist', 'cli', 'main.js');

describe('rxrl run on a run directory in use', () => {
  it('is refused with one RunLockedError line naming the holder and the lock, exit code 1, nothing written', async () => {
    if (!existsSync(cli)) throw new Error('dist/ is not built: run `npm run build` first (`npm test` does it in pretest)');
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-lock-cli-'));
    const runDir = join(dir, 'run');
    await mkdir(runDir);
    await writeFile(
      join(dir, 'recipe.json'),
      JSON.stringify({
        run: { dir: 'run', seed: 3, steps: 2, backend: 'cpu' },
        data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
        rollout: { groupSize: 2 },
        sync: { batchSize: 2 },
      }),
    );
    const holder = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1 << 30)'], { stdio: 'ignore' });
    try {
      const lock = join(runDir, 'rxrl.lock');
      await writeFile(lock, JSON.stringify({ pid: holder.pid, host: hostname(), startedAt: '2020-01-01T00:00:00.000Z' }));
      const result = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
        execFile(process.execPath, [cli, 'run', join(dir, 'recipe.json')], { timeout: 60_000 }, (error, _stdout, stderr) =>
          resolve({ code: error ? ((error as { code?: number }).code ?? null) : 0, stderr }),
        );
      });
      expect(result.code).toBe(1);
      expect(result.stderr.split('\n').filter((line) => line !== '')).toEqual([
        `rxrl: RunLockedError: run directory ${runDir} is in use by pid ${holder.pid} on ${hostname()} since 2020-01-01T00:00:00.000Z: lock ${lock}`,
      ]);
      expect(await readdir(runDir)).toEqual(['rxrl.lock']);
    } finally {
      holder.kill();
    }
  });
});
