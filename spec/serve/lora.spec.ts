import * as tf from '@tensorflow/tfjs-core';
import { execFileSync } from 'node:child_process';
import { cp, mkdir, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import OpenAI, { NotFoundError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { LoraAdapter, savePeftAdapter, type LoraConfig } from '../../lib/model/lora.js';
import { saveModelDir } from '../../lib/model/modelDir.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';

const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const LORA: LoraConfig = { rank: 4, alpha: 16, targetModules: ['q_proj', 'v_proj', 'o_proj', 'down_proj'] };
const PROMPT = [1, 14, 15, 16, 30];

/** An adapter whose B is random too, so it changes what the model says. */
function adapterOf(seed: number): LoraAdapter {
  const fresh = LoraAdapter.create(config, LORA, seed);
  const rng = createRng(seed, 'serve-lora');
  const weights = new Map(
    [...fresh.getWeights()].map(([name, w]) => [name, { shape: w.shape, data: normalArray(w.data.length, 0.5, rng) }]),
  );
  fresh.dispose();
  return LoraAdapter.fromWeights(config, LORA, weights);
}

let dir: string;
let base: PolicyModel;
let server: RxrlServer;
let client: OpenAI;
const greedy = async (model: string): Promise<number[]> => {
  const out = await client.completions.create({ model, prompt: PROMPT, max_tokens: 8, temperature: 0, return_token_ids: true } as never);
  return (out.choices[0] as unknown as { token_ids: number[] }).token_ids;
};
const post = async (path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> => {
  const response = await fetch(`${server.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  return { status: response.status, json: (await response.json()) as Record<string, unknown> };
};

/** What the base plus `adapter` generates greedily in-process. */
async function local(adapter: LoraAdapter): Promise<number[]> {
  const view = PolicyModel.withAdapter(base, adapter);
  const [out] = await view.generate([{ promptTokens: PROMPT, maxTokens: 8, temperature: 0, stopTokens: tokenizer.stopIds }]);
  view.dispose();
  return out.tokens;
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-serve-lora-'));
  base = PolicyModel.create(config, 2);
  const coder = adapterOf(1);
  await savePeftAdapter(join(dir, 'root', 'coder'), coder);
  coder.dispose();
  const critic = adapterOf(2);
  await savePeftAdapter(join(dir, 'root', 'critic'), critic);
  critic.dispose();
  server = await serve({
    model: base,
    tokenizer,
    port: 0,
    weightsRoot: join(dir, 'root'),
    loraModules: { coder: join(dir, 'root', 'coder') },
  });
  client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
});

afterAll(async () => {
  await server.close();
  base.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl serve with LoRA adapters (vLLM --lora-modules and /v1/load_lora_adapter)', () => {
  it('lists each adapter as a model whose parent is the base, and routes requests by model name', async () => {
    const list = await client.models.list();
    expect(list.data.map((m) => [m.id, (m as unknown as { parent: string | null }).parent])).toEqual([
      ['rxrl-policy', null],
      ['coder', 'rxrl-policy'],
    ]);
    const coder = adapterOf(1);
    const [fromBase, fromCoder] = [await greedy('rxrl-policy'), await greedy('coder')];
    expect(fromCoder).toEqual(await local(coder));
    expect(fromCoder).not.toEqual(fromBase);
    coder.dispose();
    await expect(client.completions.create({ model: 'critic', prompt: 'ab', max_tokens: 2 })).rejects.toBeInstanceOf(NotFoundError);
  });

  it('loads, replaces in place and unloads adapters at run time', async () => {
    const loaded = await post('/v1/load_lora_adapter', { lora_name: 'critic', lora_path: join(dir, 'root', 'critic') });
    expect(loaded).toMatchObject({ status: 200, json: { success: true, lora_name: 'critic', policy_version: 0 } });
    const critic = adapterOf(2);
    expect(await greedy('critic')).toEqual(await local(critic));
    critic.dispose();

    const again = await post('/v1/load_lora_adapter', { lora_name: 'critic', lora_path: join(dir, 'root', 'coder') });
    expect(again).toMatchObject({ status: 400, json: { error: { param: 'lora_name', code: 'adapter_exists' } } });
    const replaced = await post('/v1/load_lora_adapter', {
      lora_name: 'critic',
      lora_path: join(dir, 'root', 'coder'),
      load_inplace: true,
    });
    expect(replaced).toMatchObject({ status: 200, json: { policy_version: 1 } });
    expect(await greedy('critic')).toEqual(await greedy('coder'));

    expect(await post('/v1/unload_lora_adapter', { lora_name: 'critic' })).toMatchObject({ status: 200, json: { success: true } });
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['rxrl-policy', 'coder']);
    expect(await post('/v1/unload_lora_adapter', { lora_name: 'critic' })).toMatchObject({
      status: 404,
      json: { error: { code: 'adapter_not_found' } },
    });

    // Two loads of one new name at once: one wins, the other is refused, and nothing leaks.
    const tensors = tf.memory().numTensors;
    const twins = await Promise.all(
      [0, 1].map(() => post('/v1/load_lora_adapter', { lora_name: 'twin', lora_path: join(dir, 'root', 'critic') })),
    );
    expect(twins.map((t) => t.status).sort()).toEqual([200, 409]);
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['rxrl-policy', 'coder', 'twin']);
    expect(await post('/v1/unload_lora_adapter', { lora_name: 'twin' })).toMatchObject({ status: 200 });
    expect(tf.memory().numTensors).toBe(tensors);
  });

  it('refuses what is not a PEFT LoRA directory of this architecture, naming lora_path, and leaves nothing loaded', async () => {
    const model = join(dir, 'root', 'model');
    await saveModelDir(model, base);
    const other = join(dir, 'root', 'other');
    const wide = LoraAdapter.create({ ...config, dFF: 48 }, LORA, 3);
    await savePeftAdapter(other, wide);
    wide.dispose();
    const fifo = join(dir, 'root', 'fifo');
    await mkdir(fifo);
    await cp(join(dir, 'root', 'coder', 'adapter_config.json'), join(fifo, 'adapter_config.json'));
    execFileSync('mkfifo', [join(fifo, 'adapter_model.safetensors')]);
    const cases: [unknown, number, RegExp][] = [
      [{ lora_name: 'x', lora_path: model }, 400, /cannot be loaded: .*adapter_config\.json: cannot be read \(ENOENT\)/],
      [{ lora_name: 'x', lora_path: other }, 400, /cannot be loaded: .*down_proj\.lora_A\.weight has shape \[4, 48\], expected \[4, 32\]/],
      [{ lora_name: 'x', lora_path: fifo }, 400, /cannot be loaded: .*adapter_model\.safetensors: not a regular file/],
      [{ lora_name: 'x', lora_path: '/etc' }, 403, /outside the weights root/],
      // Outside the root, existing or not: the same 403 (nothing to learn about the file system).
      [{ lora_name: 'x', lora_path: join(dir, 'missing') }, 403, /outside the weights root/],
      [{ lora_name: 'rxrl-policy', lora_path: join(dir, 'root', 'coder') }, 400, /the base model's name/],
      [{ lora_name: 'a/b', lora_path: join(dir, 'root', 'coder') }, 400, /lora_name must be a non-empty name/],
    ];
    for (const [body, status, message] of cases) {
      const answer = await post('/v1/load_lora_adapter', body);
      expect(answer.status, JSON.stringify(answer.json)).toBe(status);
      expect(String((answer.json.error as { message: string }).message)).toMatch(message);
    }
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['rxrl-policy', 'coder']);
  });

  it('fails to start, naming the module, when --lora-modules points at no adapter', async () => {
    await expect(serve({ model: base, tokenizer, port: 0, loraModules: { bad: join(dir, 'missing') } })).rejects.toThrow(
      /^loraModules\.bad: lora_path .* does not exist/,
    );
  });
});
