import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { POLICY_VERSION_METADATA_KEY, saveModelDir, specialIdsOf } from '../../lib/model/modelDir.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { spawnServe } from '../../lib/serve/spawn.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const run = promisify(execFile);

let dir: string;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-serve-cli-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl serve (built CLI, built by pretest)', () => {
  it('serves a fresh policy on a free loopback port and stops on SIGTERM', async () => {
    const server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model-name', 'tiny', '--max-sessions', '1'], {
      cliPath: cli,
      stderr: 'ignore',
    });
    try {
      expect(server.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
      expect((await client.models.list()).data[0].id).toBe('tiny');
      const out = await client.completions.create({ model: 'tiny', prompt: 'abcd=', n: 3, max_tokens: 5, seed: 1, logprobs: 1 });
      expect(out.choices).toHaveLength(3);
      // --max-sessions 1: a second session is refused while the first is open.
      const session = (id: string) => new OpenAI({ baseURL: `${server.url}/sessions/${id}/v1`, apiKey: 'EMPTY', maxRetries: 0 });
      await session('a').completions.create({ model: 'tiny', prompt: 'ab=', max_tokens: 2 });
      await expect(session('b').completions.create({ model: 'tiny', prompt: 'ab=', max_tokens: 2 })).rejects.toMatchObject({ status: 429 });
      expect(await (await fetch(`${server.url}/health`)).json()).toMatchObject({ status: 'ok', policy_version: 0 });
    } finally {
      await server.close();
    }
    await expect(fetch(`${server.url}/health`)).rejects.toThrow();
  }, 60_000);

  it('serves a model directory under its name, with its tokenizer and version; refuses what is not one', async () => {
    const tokenizer = new CharTokenizer('xyz=');
    const model = PolicyModel.create({ vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 12 }, 2);
    const modelDir = join(dir, 'tiny-xyz');
    await saveModelDir(modelDir, model, {
      tokenizerFiles: tokenizer.files(),
      special: specialIdsOf(tokenizer),
      metadata: { [POLICY_VERSION_METADATA_KEY]: '7' },
    });
    model.dispose();
    const server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', modelDir], { cliPath: cli, stderr: 'ignore' });
    try {
      expect(server.modelName).toBe('tiny-xyz');
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
      const out = await client.completions.create({ model: server.modelName, prompt: 'xyz=', max_tokens: 3, seed: 1 });
      expect(out.choices[0].text).toMatch(/^[xyz=]*$/);
      expect(out.system_fingerprint).toBe('rxrl-v7');
    } finally {
      await server.close();
    }
    const refused = async (args: string[]): Promise<{ code: number; stderr: string }> =>
      run(process.execPath, [cli, 'serve', '--port', '0', '--backend', 'cpu', ...args], { timeout: 60_000 }).then(
        () => ({ code: 0, stderr: '' }),
        (e: { code: number; stderr: string }) => e,
      );
    const withAlphabet = await refused(['--model', modelDir, '--alphabet', 'ab']);
    expect(withAlphabet.code).toBe(1);
    expect(withAlphabet.stderr).toMatch(/ConfigError: --alphabet applies to a fresh policy only/);
    const notADir = await refused(['--model', join(dir, 'missing')]);
    expect(notADir.code).toBe(1);
    expect(notADir.stderr).toMatch(/ConfigError: --model: no model at '.*missing' \(run `npm run model:smollm2` in a checkout/);
    const help = await run(process.execPath, [cli, '--help']);
    expect(help.stdout).toMatch(/rxrl serve/);
  }, 60_000);
});
