/**
 * Model configurations are bounded before allocation: a config.json claiming a billion layers or 10¹² positions is a
 * ConfigError naming the key, from the library, `rxrl serve --model` and `rxrl run --set model.path=` alike.
 */
import { execFile } from 'node:child_process';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { WASM_MEMORY_BYTES, backendMemoryBytes, checkModelFits, modelFootprint } from '../../lib/model/capacity.js';
import { readModelDir } from '../../lib/model/modelDir.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, policyParamSpecs, validatePolicyConfig, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve } from '../../lib/serve/server.js';
import { loadConfig } from '../../lib/config/schema.js';
import { initialModel } from '../../lib/model/policies.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen3');
const cli = join(root, 'dist', 'cli', 'main.js');
const GiB = 2 ** 30;

let dir: string;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-capacity-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A copy of the tiny Qwen3 fixture whose config.json has `changes` applied. */
async function modelWith(name: string, changes: Record<string, unknown>): Promise<string> {
  const out = join(dir, name);
  await cp(fixture, out, { recursive: true });
  const config = JSON.parse(await readFile(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
  await writeFile(join(out, 'config.json'), JSON.stringify({ ...config, ...changes }));
  return out;
}

describe('modelFootprint', () => {
  it('counts exactly the parameters the decoder allocates, in closed form', () => {
    const configs: PolicyConfig[] = [
      { vocabSize: 51, dModel: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 192, maxSeqLen: 64 },
      {
        modelType: 'qwen2',
        vocabSize: 483,
        dModel: 64,
        nLayers: 3,
        nHeads: 4,
        nKvHeads: 2,
        dFF: 96,
        maxSeqLen: 128,
        tieWordEmbeddings: true,
      },
      { modelType: 'qwen3', vocabSize: 483, dModel: 64, nLayers: 2, nHeads: 4, nKvHeads: 2, headDim: 32, dFF: 96, maxSeqLen: 128 },
      { vocabSize: 7, dModel: 8, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 8, qkvBias: true, oBias: true },
    ];
    for (const config of configs) {
      const resolved = validatePolicyConfig(config);
      const counted = policyParamSpecs(resolved).reduce((n, s) => n + s.shape.reduce((p, d) => p * d, 1), 0);
      expect(modelFootprint(resolved).parameters).toBe(counted);
      expect(modelFootprint(resolved).kvBytesPerToken).toBe(2 * resolved.nLayers * resolved.nKvHeads * resolved.headDim * 4);
    }
  });

  it('a wasm backend holds at most a wasm32 memory', () => {
    expect(backendMemoryBytes('wasm')).toBeLessThanOrEqual(WASM_MEMORY_BYTES);
    expect(backendMemoryBytes('cpu')).toBeGreaterThan(0);
  });
});

describe('checkModelFits', () => {
  const small = validatePolicyConfig({ vocabSize: 51, dModel: 64, nLayers: 2, nHeads: 4, dFF: 192, maxSeqLen: 64 });

  it('returns the context length, capped by maxModelLen', () => {
    expect(checkModelFits(small)).toBe(64);
    expect(checkModelFits(small, { maxModelLen: 16 })).toBe(16);
    expect(checkModelFits(small, { maxModelLen: 1000 })).toBe(64);
    expect(() => checkModelFits(small, { maxModelLen: 0 })).toThrow(ConfigError);
  });

  it('names the field that makes the weights too large, and the positions when the cache is what does not fit', () => {
    const layers = validatePolicyConfig({ ...small, nLayers: 1e9 });
    expect(() => checkModelFits(layers, { memoryBytes: 4 * GiB })).toThrow(
      expect.objectContaining({ name: 'ConfigError', context: expect.objectContaining({ key: 'nLayers', value: 1e9 }) }),
    );
    // A real 1.5 B model does not fit a wasm32 memory: its width is the largest factor here.
    const qwen15 = validatePolicyConfig({
      modelType: 'qwen2',
      vocabSize: 151_936,
      dModel: 1536,
      nLayers: 28,
      nHeads: 12,
      nKvHeads: 2,
      dFF: 8960,
      maxSeqLen: 32_768,
    });
    expect(modelFootprint(qwen15).parameters).toBeGreaterThan(1.5e9);
    expect(() => checkModelFits(qwen15, { memoryBytes: WASM_MEMORY_BYTES })).toThrow(/more than the 4.00 GiB this backend can hold/);
    const positions = validatePolicyConfig({ ...small, maxSeqLen: 1e12 });
    expect(() => checkModelFits(positions, { memoryBytes: 4 * GiB, capHint: '--max-model-len' })).toThrow(
      expect.objectContaining({
        context: expect.objectContaining({ key: 'maxSeqLen', value: 1e12 }),
        message: expect.stringMatching(/cap the context at \d+ tokens or fewer \(--max-model-len\)$/),
      }),
    );
    expect(checkModelFits(positions, { memoryBytes: 4 * GiB, maxModelLen: 4096 })).toBe(4096);
  });
});

describe('config.json bounds before anything is read or allocated', () => {
  it('refuses a billion (or a million) layers, a huge vocabulary and 10¹² positions, naming the Hugging Face key', async () => {
    const cases: [Record<string, unknown>, string][] = [
      [{ num_hidden_layers: 1_000_000_000 }, 'num_hidden_layers'],
      [{ num_hidden_layers: 1_000_000 }, 'num_hidden_layers'],
      [{ vocab_size: 1e12 }, 'vocab_size'],
      [{ intermediate_size: 2 ** 40 }, 'intermediate_size'],
      [{ max_position_embeddings: 1e12 }, 'max_position_embeddings'],
    ];
    for (const [i, [changes, key]] of cases.entries()) {
      const path = await modelWith(`huge-${i}`, changes);
      await rm(join(path, 'model.safetensors')); // never reached: the configuration is refused first
      const error = await readModelDir(path).catch((e: unknown) => e);
      expect(error, key).toBeInstanceOf(ConfigError);
      expect((error as ConfigError).context.key, key).toBe(key);
      expect((error as ConfigError).message, key).toContain(join(path, 'config.json'));
    }
  });

  it('a context cap (maxModelLen) admits a model with 10¹² positions and bounds what is used', async () => {
    const path = await modelWith('long', { max_position_embeddings: 1e12 });
    const contents = await readModelDir(path, { maxModelLen: 96 });
    expect(contents.config.maxSeqLen).toBe(1e12); // the model is unchanged: checkpoints keep its own limit
    expect(contents.contextLength).toBe(96);
    const config = loadConfig({ env: {}, values: { model: { path, maxModelLen: 96 } } });
    const { model, contextLength } = await initialModel(config.model, path, 483, 1);
    expect(contextLength).toBe(96);
    model.dispose();
  });

  it("the tiny model's own keys are bounded too (rxrl run --set model.nLayers=…)", async () => {
    const config = loadConfig({ env: {}, values: { model: { nLayers: 1_000_000_000 } } });
    await expect(initialModel(config.model, undefined, new CharTokenizer('ab').vocabSize, 1)).rejects.toMatchObject({
      name: 'ConfigError',
      context: { key: 'model.nLayers' },
    });
  });
});

describe('rxrl serve --max-model-len', () => {
  it('caps the served context: /v1/models reports it, and longer requests get 400', async () => {
    const model = PolicyModel.create({ vocabSize: 3, dModel: 8, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 64 }, 1);
    const server = await serve({ model, tokenizer: new CharTokenizer('ab'), port: 0, maxModelLen: 12 });
    try {
      const models = (await (await fetch(`${server.baseURL}/models`)).json()) as { data: { max_model_len: number }[] };
      expect(models.data[0].max_model_len).toBe(12);
      const answer = await fetch(`${server.baseURL}/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'rxrl-policy', prompt: 'abab', max_tokens: 9 }),
      });
      expect(answer.status).toBe(400);
      await expect(serve({ model, tokenizer: new CharTokenizer('ab'), port: 0, maxModelLen: 0 })).rejects.toThrow(ConfigError);
    } finally {
      await server.close();
      model.dispose();
    }
  });
});

describe('the CLI refuses a huge config.json in one typed line', () => {
  const rxrl = async (args: string[]): Promise<{ code: number; stderr: string }> => {
    try {
      await promisify(execFile)(process.execPath, [cli, ...args], { timeout: 60_000 });
      return { code: 0, stderr: '' };
    } catch (error) {
      return error as { code: number; stderr: string };
    }
  };

  it('rxrl serve --model and rxrl run --set model.path=', async () => {
    const path = await modelWith('cli-huge', { num_hidden_layers: 1_000_000_000 });
    const serve = await rxrl(['serve', '--model', path, '--port', '0', '--backend', 'cpu']);
    expect(serve.code).not.toBe(0);
    expect(serve.stderr).not.toContain('    at ');
    expect(serve.stderr).toMatch(/^rxrl: ConfigError: .*config\.json: num_hidden_layers 1000000000 makes .* parameters/m);
    const recipe = join(dir, 'huge.yaml');
    await writeFile(recipe, `model:\n  path: ${path}\nrun:\n  steps: 1\n  backend: cpu\n  dir: ${join(dir, 'huge-run')}\n`);
    const train = await rxrl(['run', recipe]);
    expect(train.code).not.toBe(0);
    expect(train.stderr).not.toContain('    at ');
    expect(train.stderr).toMatch(/ConfigError: .*num_hidden_layers 1000000000/);
  });
});
