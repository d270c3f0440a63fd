/**
 * TF.js's cpu backend prints "Hi, looks like you are running TensorFlow.js in Node.js…" on its first use in Node;
 * rxrl silences it (and TF.js's other console warnings) where it loads TF.js. A process that imports the built
 * package and computes on the cpu and wasm backends (and the native one where installed) prints nothing; with
 * `RXRL_TFJS_WARNINGS=1` the banner is back.
 */
import { execFile } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { promisify } from 'node:util';

import { describe, expect, it } from 'vitest';

import { nativeBackendInstalled } from '../../lib/model/backend.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const BANNER = 'looks like you are running TensorFlow.js in Node.js';

/**
 * Runs a script that imports the built `rxrl` and computes on the cpu, then the wasm backend (and the native one
 * where installed, or only `kinds`); its whole output.
 */
async function computeOutput(env: NodeJS.ProcessEnv, only?: readonly string[]): Promise<string> {
  const built = join(root, 'dist', 'lib', 'index.js');
  // The native backend too where it is installed: libtensorflow's own note at load is off as well.
  const kinds = only ?? (nativeBackendInstalled() ? ['cpu', 'wasm', 'tensorflow'] : ['cpu', 'wasm']);
  expect(existsSync(built), 'dist/ is not built: npm run build').toBe(true);
  const script = `
    const { initBackend } = await import(${JSON.stringify(pathToFileURL(built).href)});
    const tf = await import('@tensorflow/tfjs-core');
    for (const kind of ${JSON.stringify(kinds)}) {
      await initBackend(kind, { logger: { info: () => undefined } });
      tf.square(tf.tensor1d([1, 2, 3])).dataSync();
    }
    console.log('done');
  `;
  const { stdout, stderr } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', script], { cwd: root, env });
  return stdout + stderr;
}

describe("TF.js's Node.js banner", () => {
  it('is never printed by a process that uses rxrl on the cpu and wasm backends', async () => {
    const env = { ...process.env };
    delete env.RXRL_TFJS_WARNINGS;
    delete env.TF_CPP_MIN_LOG_LEVEL;
    expect(await computeOutput(env)).toBe('done\n');
  }, 60_000);

  it('comes back with RXRL_TFJS_WARNINGS=1 (so the check above can fail)', async () => {
    expect(await computeOutput({ ...process.env, RXRL_TFJS_WARNINGS: '1' })).toContain(BANNER);
  }, 60_000);
});

// libtensorflow says at its first op whether its oneDNN kernels are on (an informational line, shown here).
const ONEDNN = 'oneDNN custom operations are on';

describe.runIf(nativeBackendInstalled())('the native backend', () => {
  it("runs TensorFlow's oneDNN kernels unless TF_ENABLE_ONEDNN_OPTS says otherwise", async () => {
    const env: NodeJS.ProcessEnv = { ...process.env, RXRL_TFJS_WARNINGS: '1' };
    delete env.TF_ENABLE_ONEDNN_OPTS;
    expect(await computeOutput(env, ['tensorflow'])).toContain(ONEDNN);
    expect(await computeOutput({ ...env, TF_ENABLE_ONEDNN_OPTS: '0' }, ['tensorflow'])).not.toContain(ONEDNN);
  }, 60_000);
});
