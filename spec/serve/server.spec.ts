import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { connect } from 'node:net';
import { join } from 'node:path';

import OpenAI, { BadRequestError, NotFoundError } from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../lib/engine/local.js';
import { initBackend } from '../../lib/model/backend.js';
import { saveSafetensors } from '../../lib/model/safetensors.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { saveModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';

const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const calcTool = {
  type: 'function' as const,
  function: {
    name: 'calc',
    description: 'evaluates an arithmetic expression',
    parameters: { type: 'object', properties: { expression: { type: 'string' } } },
  },
};

let dir: string;
const owned: { close(): Promise<void> }[] = [];
const models: PolicyModel[] = [];

async function start(
  model: PolicyModel,
  options: { maxBatchSize?: number; maxWaitMs?: number } = {},
): Promise<{ server: RxrlServer; client: OpenAI }> {
  models.push(model);
  const server = await serve({ model, tokenizer, port: 0, ...options });
  owned.push(server);
  return { server, client: new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 }) };
}

async function post(url: string, body: unknown, raw = false): Promise<{ status: number; json: Record<string, unknown> }> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: raw ? (body as string) : JSON.stringify(body),
  });
  return { status: response.status, json: (await response.json()) as Record<string, unknown> };
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-serve-'));
});

afterAll(async () => {
  await Promise.all(owned.map((s) => s.close()));
  for (const m of models) m.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl serve, through the real openai client', () => {
  it('lists its model and reports health with the policy version', async () => {
    const { server, client } = await start(PolicyModel.create(config, 1));
    expect(server.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    const list = await client.models.list();
    expect(list.data.map((m) => m.id)).toEqual(['rxrl-policy']);
    expect((await client.models.retrieve('rxrl-policy')).id).toBe('rxrl-policy');
    await expect(client.models.retrieve('gpt-9')).rejects.toBeInstanceOf(NotFoundError);
    const health = (await (await fetch(`${server.url}/health`)).json()) as Record<string, unknown>;
    expect(health).toEqual({ status: 'ok', model: 'rxrl-policy', policy_version: 0 });
  });

  it('samples n > 1 completions with token ids and log-probs, seeded like the in-process engine', async () => {
    const model = PolicyModel.create(config, 3);
    const { client } = await start(model);
    const request = {
      model: 'rxrl-policy',
      prompt: 'abcd=',
      n: 4,
      max_tokens: 6,
      temperature: 1,
      seed: 42,
      logprobs: 2,
      return_tokens_as_token_ids: true,
    };
    const first = await client.completions.create(request);
    const again = await client.completions.create(request);
    expect(first.choices).toHaveLength(4);
    expect(first.choices.map((c) => c.index)).toEqual([0, 1, 2, 3]);
    expect(again.choices.map((c) => c.text)).toEqual(first.choices.map((c) => c.text));
    expect(new Set(first.choices.map((c) => c.logprobs!.tokens!.join(' '))).size).toBeGreaterThan(1);
    const local = new LocalEngine(model, { tokenizer });
    const [reference] = await local.generate([
      { promptTokens: tokenizer.encode('abcd=', { addBos: true }), maxTokens: 6, temperature: 1, seed: 42 },
    ]);
    for (const choice of first.choices) {
      const lp = choice.logprobs!;
      const ids = lp.tokens!.map((t) => Number(t.replace('token_id:', '')));
      expect(lp.tokens!.every((t) => /^token_id:\d+$/.test(t))).toBe(true);
      expect(lp.token_logprobs).toHaveLength(ids.length);
      expect(choice.text).toBe(tokenizer.decode(ids));
      expect(choice.finish_reason).toBe(ids.at(-1) === tokenizer.eosId ? 'stop' : 'length');
      lp.top_logprobs!.forEach((alternatives, j) => {
        const sampled = lp.token_logprobs![j];
        expect(sampled).toBeLessThanOrEqual(0);
        expect(alternatives[lp.tokens![j]]).toBe(sampled);
        expect(Object.keys(alternatives).length).toBeGreaterThanOrEqual(2);
        expect(Object.keys(alternatives).length).toBeLessThanOrEqual(3);
        expect(Math.max(...Object.values(alternatives))).toBeGreaterThanOrEqual(sampled);
      });
    }
    const ids0 = first.choices[0].logprobs!.tokens!.map((t) => Number(t.replace('token_id:', '')));
    expect(ids0).toEqual(reference.tokens);
    first.choices[0].logprobs!.token_logprobs!.forEach((lp, j) => expect(lp).toBeCloseTo(reference.logprobs[j], 4));
    expect((first as unknown as { policy_version: number }).policy_version).toBe(0);
    expect(first.usage).toMatchObject({ prompt_tokens: 6, total_tokens: 6 + first.usage!.completion_tokens });
  });

  it('takes prompts as token ids and lists of prompts, and returns token ids on request', async () => {
    const { client } = await start(PolicyModel.create(config, 4));
    const prompts = [tokenizer.encode('ab=', { addBos: true }), tokenizer.encode('c=', { addBos: true })];
    const body = { model: 'rxrl-policy', prompt: prompts, n: 2, max_tokens: 3, seed: 1, return_token_ids: true };
    const out = await client.completions.create(body);
    expect(out.choices).toHaveLength(4);
    out.choices.forEach((choice, i) => {
      const extra = choice as unknown as { token_ids: number[]; prompt_token_ids: number[] };
      expect(extra.prompt_token_ids).toEqual(prompts[Math.floor(i / 2)]);
      expect(choice.text).toBe(tokenizer.decode(extra.token_ids));
      expect(choice.logprobs).toBeNull();
    });
    const texts = await client.completions.create({ model: 'rxrl-policy', prompt: ['ab=', 'c='], max_tokens: 2, seed: 1 });
    expect(texts.choices).toHaveLength(2);
  });

  it('applies stop strings to text and tokens', async () => {
    const model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'hello world')));
    const { client } = await start(model);
    const ask = async (extra: Record<string, unknown>) => {
      const out = await client.completions.create({ model: 'rxrl-policy', prompt: 'ab=', max_tokens: 14, logprobs: 0, ...extra });
      return out.choices[0];
    };
    const plain = await ask({});
    expect(plain.text).toBe('hello world');
    expect(plain.finish_reason).toBe('stop');
    expect(plain.logprobs!.tokens!.at(-1)).toBe('<eos>');
    const space = await ask({ stop: [' '] });
    expect(space).toMatchObject({ text: 'hello', finish_reason: 'stop' });
    expect(space.logprobs!.tokens).toEqual(['h', 'e', 'l', 'l', 'o']);
    expect((await ask({ stop: 'lo w' })).text).toBe('hel');
    expect((await ask({ stop: ['lo w'], include_stop_str_in_output: true })).text).toBe('hello w');
    expect((await ask({ max_tokens: 3 })).finish_reason).toBe('length');
  });

  it('chats with tool calls in the name(args) format, with prefix-consistent prompt token ids', async () => {
    // bos 2 + 3 eos | c a l c ( 2 + 3 ) eos | 5 eos | 5 eos
    const script = mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5'));
    const model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, script));
    const { client } = await start(model);
    const base = { model: 'rxrl-policy', seed: 7, logprobs: true, return_tokens_as_token_ids: true, return_token_ids: true };
    const first = await client.chat.completions.create({ ...base, messages: [{ role: 'user', content: '2+3' }], tools: [calcTool] });
    const call = first.choices[0];
    expect(call.finish_reason).toBe('tool_calls');
    expect(call.message.content).toBeNull();
    expect(call.message.tool_calls).toHaveLength(1);
    const toolCall = call.message.tool_calls![0];
    if (toolCall.type !== 'function') throw new Error('expected a function call');
    expect(toolCall.function).toEqual({ name: 'calc', arguments: '{"expression":"2+3"}' });
    const firstExtra = first as unknown as { prompt_token_ids: number[] };
    const firstTokens = (call as unknown as { token_ids: number[] }).token_ids;
    expect(firstExtra.prompt_token_ids).toEqual([1, ...tokenizer.encode('2+3'), 2]);
    expect(firstTokens).toEqual([...tokenizer.encode('calc(2+3)'), 2]);
    expect(call.logprobs!.content!.map((c) => c.token)).toEqual(firstTokens.map((t) => `token_id:${t}`));

    const second = await client.chat.completions.create({
      ...base,
      tools: [calcTool],
      messages: [
        { role: 'user', content: '2+3' },
        { role: 'assistant', content: null, tool_calls: [toolCall] },
        { role: 'tool', tool_call_id: toolCall.id, content: '5' },
      ],
    });
    const answer = second.choices[0];
    expect(answer.message.content).toBe('5');
    expect(answer.finish_reason).toBe('stop');
    const prompt2 = (second as unknown as { prompt_token_ids: number[] }).prompt_token_ids;
    expect(prompt2.slice(0, firstExtra.prompt_token_ids.length + firstTokens.length)).toEqual([
      ...firstExtra.prompt_token_ids,
      ...firstTokens,
    ]);
    expect(prompt2.slice(firstExtra.prompt_token_ids.length + firstTokens.length)).toEqual([...tokenizer.encode('5'), 2]);

    const none = await client.chat.completions.create({
      ...base,
      messages: [{ role: 'user', content: '2+3' }],
      tools: [calcTool],
      tool_choice: 'none',
    });
    expect(none.choices[0].message.content).toBe('calc(2+3)');
    const noTools = await client.chat.completions.create({ model: 'rxrl-policy', messages: [{ role: 'user', content: '2+3' }] });
    expect(noTools.choices[0]).toMatchObject({ message: { content: 'calc(2+3)' }, finish_reason: 'stop', logprobs: null });
  });

  it('loads a model directory as a new version (SGLang update_weights_from_disk), changing outputs', async () => {
    const before = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'aaa')));
    const { server, client } = await start(before);
    const ask = async () => client.completions.create({ model: 'rxrl-policy', prompt: 'ab=', max_tokens: 6, seed: 3 });
    const old = await ask();
    expect(old.choices[0].text).toBe('aaa');
    expect(old.system_fingerprint).toBe('rxrl-v0');

    const checkpoint = join(dir, 'v1');
    await saveModelDir(checkpoint, { config, weights: scriptedWeights(config, tokenizer, writeAt(4, 'bcd')) });
    const update = await post(`${server.url}/update_weights_from_disk`, { model_path: checkpoint, weight_version: '1' });
    expect(update.status).toBe(200);
    expect(update.json).toMatchObject({ success: true, weight_version: '1' });
    expect(server.version).toBe(1);
    const fresh = await ask();
    expect(fresh.choices[0].text).toBe('bcd');
    expect((fresh as unknown as { policy_version: number }).policy_version).toBe(1);

    const v5 = join(dir, 'v5');
    await saveModelDir(
      v5,
      { config, weights: scriptedWeights(config, tokenizer, writeAt(4, 'ee')) },
      { metadata: { 'rxrl.policyVersion': '5' } },
    );
    expect((await post(`${server.url}/update_weights_from_disk`, { model_path: v5 })).json).toMatchObject({ policy_version: 5 });
    expect((await ask()).choices[0].text).toBe('ee');

    const missing = await post(`${server.url}/update_weights_from_disk`, { model_path: join(dir, 'nope') });
    expect(missing.status).toBe(400);
    expect(missing.json).toMatchObject({ success: false, error: { param: 'model_path' } });
    const wrong = join(dir, 'wrong');
    await saveModelDir(wrong, { config, weights: new Map([['lm_head.weight', { shape: [2], data: new Float32Array(2) }]]) });
    const refused = await post(`${server.url}/update_weights_from_disk`, { model_path: wrong });
    expect(refused.status).toBe(400);
    expect(refused.json.success).toBe(false);
    const bare = join(dir, 'bare.safetensors');
    await saveSafetensors(bare, scriptedWeights(config, tokenizer, writeAt(4, 'ee')));
    const notADir = await post(`${server.url}/update_weights_from_disk`, { model_path: bare });
    expect(notADir.status).toBe(400);
    expect(notADir.json).toMatchObject({ success: false, error: { param: 'model_path' } });
    expect(server.version).toBe(5);
    expect((await ask()).choices[0].text).toBe('ee');
  });

  it('update_weights_from_disk is safe with any path: regular files of bounded size, rising versions, a weights root', async () => {
    const root = join(dir, 'root');
    await mkdir(root, { recursive: true });
    const { server } = await (async () => {
      const model = PolicyModel.create(config, 9);
      models.push(model);
      const s = await serve({ model, tokenizer, port: 0, weightsRoot: root });
      owned.push(s);
      return { server: s };
    })();
    const update = (body: unknown): Promise<{ status: number; json: Record<string, unknown> }> =>
      post(`${server.url}/update_weights_from_disk`, body);
    const good = join(root, 'v3');
    await saveModelDir(good, { config, weights: PolicyModel.create(config, 10).getWeights() });
    // Devices, plain files and directories without a model: 4xx, nothing read, no content echoed.
    for (const path of ['/dev/zero', '/etc/passwd', '/etc']) {
      const answer = await update({ model_path: path });
      expect(answer.status, path).toBeGreaterThanOrEqual(400);
      expect(answer.status, path).toBeLessThan(500);
      expect(JSON.stringify(answer.json)).not.toMatch(/root:/);
    }
    // A model directory whose files are a device or far larger than the served model.
    const device = join(root, 'device');
    await saveModelDir(device, { config, weights: PolicyModel.create(config, 10).getWeights() });
    await rm(join(device, 'model.safetensors'));
    await symlink('/dev/zero', join(device, 'model.safetensors'));
    // A link inside the root to a device outside it is refused as outside (each file is resolved on its own).
    expect(await update({ model_path: device })).toMatchObject({
      status: 403,
      json: { error: { param: 'model_path', code: 'forbidden_path' } },
    });
    await rm(join(device, 'model.safetensors'));
    execFileSync('mkfifo', [join(device, 'model.safetensors')]);
    expect(await update({ model_path: device })).toMatchObject({
      status: 400,
      json: { error: { param: 'model_path', message: expect.stringMatching(/not a regular file/) } },
    });
    const huge = join(root, 'huge');
    await saveModelDir(huge, { config, weights: PolicyModel.create(config, 10).getWeights() });
    await truncate(join(huge, 'model.safetensors'), 1 << 30); // sparse: 1 GiB on paper, nothing written
    expect(await update({ model_path: huge })).toMatchObject({
      status: 400,
      json: { error: { message: expect.stringMatching(/more than the \d+ allowed/) } },
    });
    const other = join(root, 'other');
    await saveModelDir(other, { config: { ...config, dFF: 48 }, weights: PolicyModel.create({ ...config, dFF: 48 }, 10).getWeights() });
    expect(await update({ model_path: other })).toMatchObject({
      status: 400,
      json: { error: { message: expect.stringMatching(/another architecture: dFF 48/) } },
    });
    // Outside the root: 403, even through a link that leads out.
    const outside = join(dir, 'outside');
    await saveModelDir(outside, { config, weights: PolicyModel.create(config, 10).getWeights() });
    expect((await update({ model_path: outside })).status).toBe(403);
    await symlink(outside, join(root, 'link-out'));
    expect((await update({ model_path: join(root, 'link-out') })).status).toBe(403);
    // Versions only go up, unless forced.
    expect(await update({ model_path: good, weight_version: 7 })).toMatchObject({ status: 200, json: { policy_version: 7 } });
    expect(await update({ model_path: good, weight_version: 3 })).toMatchObject({
      status: 400,
      json: { error: { param: 'weight_version', code: 'stale_version' } },
    });
    expect(await update({ model_path: good, weight_version: 3, force: true })).toMatchObject({ status: 200, json: { policy_version: 3 } });
    expect(server.version).toBe(3);
  });

  it('--weights-root is checked per file after links: one 403 for every escape, existing or not, no byte of a file quoted', async () => {
    const root = join(dir, 'escape-root');
    const outside = join(dir, 'escape-outside');
    await mkdir(root, { recursive: true });
    await mkdir(outside, { recursive: true });
    const model = PolicyModel.create(config, 12);
    models.push(model);
    const server = await serve({ model, tokenizer, port: 0, weightsRoot: root });
    owned.push(server);
    const update = (path: string): Promise<{ status: number; json: Record<string, unknown> }> =>
      post(`${server.url}/update_weights_from_disk`, { model_path: path });
    const secret = join(outside, 'secret.txt');
    await writeFile(secret, 'hunter2!' + 'x'.repeat(28)); // 36 bytes: its first 8 read as a header length are 2392100132157814120
    const valid = join(outside, 'valid');
    await saveModelDir(valid, { config, weights: PolicyModel.create(config, 13).getWeights() });
    /** A model directory inside the root whose `file` is a link to `target`. */
    const linking = async (name: string, file: string, target: string): Promise<string> => {
      const path = join(root, name);
      await saveModelDir(path, { config, weights: PolicyModel.create(config, 13).getWeights() });
      await rm(join(path, file));
      await symlink(target, join(path, file));
      return path;
    };
    const answers = [
      await update(await linking('weights-to-secret', 'model.safetensors', secret)),
      await update(await linking('weights-to-valid', 'model.safetensors', join(valid, 'model.safetensors'))),
      await update(await linking('config-to-secret', 'config.json', secret)),
      await update(await linking('config-to-valid', 'config.json', join(valid, 'config.json'))),
      await update(await linking('dangling-out', 'model.safetensors', join(outside, 'no-such-file'))),
      await update(valid),
      await update(join(outside, 'no-such-dir')),
      await update(join(root, '..', 'escape-outside', 'valid')),
    ];
    for (const answer of answers) {
      expect(answer).toMatchObject({ status: 403, json: { error: { param: 'model_path', code: 'forbidden_path' } } });
      const message = String((answer.json.error as { message: string }).message);
      expect(message).toMatch(/^model_path ".*" is outside the weights root or not readable there$/);
      expect(message).not.toMatch(/hunter2|2392100132157814120|36 bytes/);
    }
    expect(server.version).toBe(0);
    // A name missing inside the root is an ordinary 400.
    expect(await update(join(root, 'not-yet'))).toMatchObject({ status: 400, json: { error: { code: 'not_found' } } });
  });

  it('refuses bodies that are not JSON (415) and checks --api-key on every route but /health', async () => {
    const model = PolicyModel.create(config, 11);
    models.push(model);
    const server = await serve({ model, tokenizer, port: 0, apiKey: 'sesame' });
    owned.push(server);
    const form = await fetch(`${server.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'text/plain', authorization: 'Bearer sesame' },
      body: JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 1 }),
    });
    expect(form.status).toBe(415);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    expect((await fetch(`${server.baseURL}/models`)).status).toBe(401);
    expect((await fetch(`${server.baseURL}/models`, { headers: { authorization: 'Bearer nope' } })).status).toBe(401);
    const noKey = new OpenAI({ baseURL: server.baseURL, apiKey: 'wrong', maxRetries: 0 });
    await expect(noKey.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 1 })).rejects.toMatchObject({ status: 401 });
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'sesame', maxRetries: 0 });
    expect((await client.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 1 })).choices).toHaveLength(1);
  });

  it('gathers concurrent requests into one batched generation', async () => {
    const { server, client } = await start(PolicyModel.create(config, 5), { maxBatchSize: 12, maxWaitMs: 60_000 });
    const outs = await Promise.all(
      Array.from({ length: 6 }, (_, i) => client.completions.create({ model: 'rxrl-policy', prompt: 'ab=', n: 2, max_tokens: 3, seed: i })),
    );
    expect(outs.every((o) => o.choices.length === 2)).toBe(true);
    expect(server.engine.batchSizes).toEqual([12]);
  });

  it('answers /health between the batches of a completion of many samples (the event loop gets its turns)', async () => {
    const model = PolicyModel.create(config, 5);
    models.push(model);
    const events: string[] = [];
    const generate = model.generate.bind(model);
    model.generate = (requests, options) => {
      events.push('batch');
      return generate(requests, options);
    };
    const log = (record: Readonly<Record<string, unknown>>): void => {
      if (record.path === '/health') events.push('health');
    };
    // One-token responses: a batch is a single forward pass, with no decoding step to yield between.
    const server = await serve({ model, tokenizer, maxBatchSize: 4, maxWaitMs: 0, log });
    owned.push(server);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    let flooding = true;
    const probe = (async () => {
      while (flooding) expect(await (await fetch(`${server.url}/health`)).json()).toMatchObject({ status: 'ok' });
    })();
    const out = await client.completions.create({
      model: 'rxrl-policy',
      prompt: Array<string>(8).fill('ab='),
      n: 64,
      max_tokens: 1,
      seed: 1,
    });
    flooding = false;
    await probe;
    expect(out.choices.map((c) => c.index)).toEqual(Array.from({ length: 512 }, (_, i) => i));
    expect(server.engine.batchSizes).toHaveLength(128);
    const during = events.slice(events.indexOf('batch'), events.lastIndexOf('batch'));
    expect(during.filter((e) => e === 'health').length, 'health answers between the first and the last batch').toBeGreaterThan(0);
  });

  it('survives garbage on the socket, and closes once (also through its signal)', async () => {
    const controller = new AbortController();
    const model = PolicyModel.create(config, 7);
    models.push(model);
    const server = await serve({ model, tokenizer, signal: controller.signal });
    const reply = await new Promise<string>((resolve, reject) => {
      const socket = connect(server.port, '127.0.0.1', () => socket.write('NOT HTTP AT ALL\r\n\r\n'));
      let text = '';
      socket.on('data', (chunk) => (text += chunk.toString()));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
    expect(reply).toMatch(/^HTTP\/1\.1 400/);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    controller.abort();
    await server.close();
    await server.close();
    await expect(fetch(`${server.url}/health`)).rejects.toThrow();
  });

  it('answers malformed requests with OpenAI-style 4xx errors and keeps serving', async () => {
    const { server, client } = await start(PolicyModel.create(config, 6));
    const completions = `${server.baseURL}/completions`;
    const chat = `${server.baseURL}/chat/completions`;
    const cases: [string, unknown, number, string | null, boolean?][] = [
      [completions, '{"model": "rxrl-policy", "prompt": "ab', 400, null, true],
      [completions, '[1, 2]', 400, null, true],
      [completions, { prompt: 'ab' }, 400, 'model'],
      [completions, { model: 'gpt-9', prompt: 'ab' }, 404, 'model'],
      [completions, { model: 'rxrl-policy' }, 400, 'prompt'],
      [completions, { model: 'rxrl-policy', prompt: 'ABC' }, 400, 'prompt'],
      [completions, { model: 'rxrl-policy', prompt: [1, 999] }, 400, 'prompt'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', n: 0 }, 400, 'n'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', n: 1.5 }, 400, 'n'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', temperature: -1 }, 400, 'temperature'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', top_p: 0 }, 400, 'top_p'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', max_tokens: 'many' }, 400, 'max_tokens'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', max_tokens: 30 }, 400, 'max_tokens'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', logprobs: 99 }, 400, 'logprobs'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', stop: [1] }, 400, 'stop'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', stream: 'yes' }, 400, 'stream'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', stream_options: { include_usage: true } }, 400, 'stream_options'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', echo: true }, 400, 'echo'],
      [completions, { model: 'rxrl-policy', prompt: 'ab', seed: 'x' }, 400, 'seed'],
      [chat, { model: 'rxrl-policy', messages: [] }, 400, 'messages'],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'wizard', content: 'x' }] }, 400, 'messages[0].role'],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'user', content: 'ÄÖ' }] }, 400, 'messages[0].content'],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'user', content: [{ type: 'image_url' }] }] }, 400, 'messages[0].content[0]'],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'tool', content: '1' }] }, 400, 'messages[0].tool_call_id'],
      [
        chat,
        { model: 'rxrl-policy', messages: [{ role: 'user', content: 'a' }], tools: [{ type: 'function', function: { name: '1x' } }] },
        400,
        'tools[0].function.name',
      ],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'user', content: 'a' }], tool_choice: 'sometimes' }, 400, 'tool_choice'],
      [chat, { model: 'rxrl-policy', messages: [{ role: 'user', content: 'a' }], top_logprobs: 2 }, 400, 'top_logprobs'],
      [`${server.url}/update_weights_from_disk`, {}, 400, 'model_path'],
      [`${server.url}/v1/embeddings`, {}, 404, null],
    ];
    for (const [url, body, status, param, raw] of cases) {
      const { status: got, json } = await post(url, body, raw);
      expect({ url, body, got }).toEqual({ url, body, got: status });
      const error = json.error as { message: string; type: string; param: string | null; code: string | null };
      expect(typeof error.message).toBe('string');
      expect(typeof error.type).toBe('string');
      expect(error.param).toBe(param);
      expect('code' in error).toBe(true);
    }
    expect((await fetch(completions)).status).toBe(405);
    const huge = await fetch(completions, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'rxrl-policy', prompt: 'a'.repeat(5 * 1024 * 1024) }),
    });
    expect(huge.status).toBe(413);
    await expect(client.completions.create({ model: 'rxrl-policy', prompt: 'ABC' })).rejects.toBeInstanceOf(BadRequestError);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    const ok = await client.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 2 });
    expect(ok.choices).toHaveLength(1);
  });
});
