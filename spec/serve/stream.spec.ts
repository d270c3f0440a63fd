import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { GenerateResponse } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';
import { lacks } from '../helpers/testSetup.js';

const run = promisify(execFile);
const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const owned: RxrlServer[] = [];
const models: PolicyModel[] = [];

async function start(
  model: PolicyModel,
  log?: (record: Readonly<Record<string, unknown>>) => void,
  maxWaitMs?: number,
): Promise<{ server: RxrlServer; client: OpenAI }> {
  models.push(model);
  const server = await serve({ model, tokenizer, port: 0, ...(log ? { log } : {}), ...(maxWaitMs === undefined ? {} : { maxWaitMs }) });
  owned.push(server);
  return { server, client: new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 }) };
}

/** Whether Python's `openai` package imports (`npm test` installs it into .cache/python, first on the specs' PATH). */
async function pythonOpenAI(): Promise<boolean> {
  return run('python3', ['-c', 'import openai']).then(
    () => true,
    () => false,
  );
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

afterAll(async () => {
  await Promise.all(owned.map((s) => s.close()));
  for (const m of models) m.dispose();
});

describe('rxrl serve streams (server-sent events)', () => {
  it('streams completions whose text, token ids and log-probs equal the unstreamed answer (seeded, stop strings, n = 3)', async () => {
    const { client } = await start(PolicyModel.create(config, 5));
    for (const stop of [undefined, ['c'], ['ab', 'e=']]) {
      const request = {
        model: 'rxrl-policy',
        prompt: 'abcd=',
        n: 3,
        max_tokens: 12,
        temperature: 1,
        seed: 9,
        logprobs: 0,
        return_token_ids: true,
        ...(stop ? { stop } : {}),
      };
      const whole = await client.completions.create(request);
      const stream = await client.completions.create({ ...request, stream: true, stream_options: { include_usage: true } });
      const text = ['', '', ''];
      const ids: number[][] = [[], [], []];
      const logprobs: number[][] = [[], [], []];
      const finish: (string | null)[] = [null, null, null];
      let usage: unknown;
      for await (const chunk of stream) {
        if (chunk.usage) usage = chunk.usage;
        for (const choice of chunk.choices) {
          text[choice.index] += choice.text;
          ids[choice.index].push(...((choice as unknown as { token_ids?: number[] }).token_ids ?? []));
          logprobs[choice.index].push(...((choice.logprobs?.token_logprobs as number[] | undefined) ?? []));
          if (choice.finish_reason) finish[choice.index] = choice.finish_reason;
        }
      }
      expect(text).toEqual(whole.choices.map((c) => c.text));
      expect(ids).toEqual(whole.choices.map((c) => (c as unknown as { token_ids: number[] }).token_ids));
      expect(logprobs).toEqual(whole.choices.map((c) => c.logprobs!.token_logprobs));
      expect(finish).toEqual(whole.choices.map((c) => c.finish_reason));
      expect(usage).toEqual(whole.usage);
    }
  });

  it('streams chat deltas (role first, content, finish, usage) equal to the unstreamed reply, and tool calls as a delta', async () => {
    // bos 2 + 3 eos | c a l c ( 2 + 3 ) eos
    const model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, mergeScripts(writeAt(5, 'calc(2+3)'))));
    const { client } = await start(model);
    const messages = [{ role: 'user' as const, content: '2+3' }];
    const request = { model: 'rxrl-policy', messages, temperature: 0, logprobs: true, return_token_ids: true };
    const whole = await client.chat.completions.create(request);
    const chunks = [];
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true, stream_options: { include_usage: true } }))
      chunks.push(chunk);
    expect(chunks[0].choices[0].delta).toEqual({ role: 'assistant', content: '' });
    expect((chunks[0] as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(
      (whole as unknown as { prompt_token_ids: number[] }).prompt_token_ids,
    );
    const content = chunks.flatMap((c) => c.choices.map((x) => x.delta.content ?? '')).join('');
    expect(content).toBe(whole.choices[0].message.content);
    const ids = chunks.flatMap((c) => c.choices.flatMap((x) => (x as unknown as { token_ids?: number[] }).token_ids ?? []));
    expect(ids).toEqual((whole.choices[0] as unknown as { token_ids: number[] }).token_ids);
    expect(chunks.flatMap((c) => c.choices.flatMap((x) => x.logprobs?.content ?? []))).toEqual(whole.choices[0].logprobs!.content);
    const last = chunks.at(-1)!;
    expect(last.choices).toEqual([]);
    expect(last.usage).toEqual(whole.usage);
    const done = chunks.at(-2)!;
    expect(done.choices[0].finish_reason).toBe('stop');
    expect((done as unknown as { policy_version: number }).policy_version).toBe(0);

    // With the tool offered, the call comes as a tool_calls delta; the client's stream helper assembles it.
    const tools = [
      {
        type: 'function' as const,
        function: { name: 'calc', parameters: { type: 'object', properties: { expression: { type: 'string' } } } },
      },
    ];
    const runner = client.chat.completions.stream({ model: 'rxrl-policy', messages, tools, temperature: 0 });
    const final = await runner.finalChatCompletion();
    const unstreamed = await client.chat.completions.create({ model: 'rxrl-policy', messages, tools, temperature: 0 });
    expect(final.choices[0].finish_reason).toBe('tool_calls');
    const fns = (calls: unknown): unknown => (calls as { function: unknown; type: string }[]).map((c) => [c.type, c.function]);
    expect(fns(final.choices[0].message.tool_calls)).toEqual(fns(unstreamed.choices[0].message.tool_calls));
    expect(fns(final.choices[0].message.tool_calls)).toEqual([['function', { name: 'calc', arguments: '{"expression":"2+3"}' }]]);
  });

  it('streams to curl as text/event-stream ending in [DONE]', async () => {
    const { server } = await start(PolicyModel.create(config, 6));
    const body = JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 5, temperature: 0, stream: true });
    const { stdout } = await run('curl', [
      '-sN',
      '-D',
      '-',
      '-H',
      'content-type: application/json',
      '-d',
      body,
      `${server.baseURL}/completions`,
    ]);
    expect(stdout).toMatch(/content-type: text\/event-stream/i);
    const events = stdout
      .split('\r\n\r\n')
      .slice(1)
      .join('')
      .split('\n\n')
      .filter((e) => e !== '');
    expect(events.at(-1)).toBe('data: [DONE]');
    const text = events
      .slice(0, -1)
      .map((e) => (JSON.parse(e.slice('data: '.length)) as { choices: { text: string }[] }).choices[0]?.text ?? '')
      .join('');
    const whole = (await (
      await fetch(`${server.baseURL}/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 5, temperature: 0 }),
      })
    ).json()) as { choices: { text: string }[] };
    expect(text).toBe(whole.choices[0].text);
  });

  // npm test's setup installs Python's openai; this fails without it, and skips only where the setup could not make
  // its Python environment (no root for python3-venv).
  it.skipIf(lacks('python'))('streams to the Python openai client, with the unstreamed greedy text', async () => {
    expect(await pythonOpenAI()).toBe(true);
    const { server, client } = await start(PolicyModel.create(config, 7));
    const script = [
      'import sys, openai',
      'c = openai.OpenAI(base_url=sys.argv[1], api_key="EMPTY", max_retries=0)',
      's = c.chat.completions.create(model="rxrl-policy", messages=[{"role": "user", "content": "abc"}], temperature=0, max_tokens=8, stream=True)',
      'print("".join((ch.choices[0].delta.content or "") for ch in s if ch.choices), end="")',
    ].join('\n');
    const { stdout } = await run('python3', ['-c', script, server.baseURL]);
    const whole = await client.chat.completions.create({
      model: 'rxrl-policy',
      messages: [{ role: 'user', content: 'abc' }],
      temperature: 0,
      max_tokens: 8,
    });
    expect(stdout).toBe(whole.choices[0].message.content);
  });

  it('cancels the generation when the client disconnects mid-stream: its row stops early, the rest of its batch goes on', async () => {
    const long: PolicyConfig = { ...config, maxSeqLen: 256 };
    const model = PolicyModel.create(long, 11);
    const generated: GenerateResponse[][] = [];
    const generate = model.generate.bind(model);
    model.generate = async (requests, options) => {
      const out = await generate(requests, options);
      generated.push(out);
      return out;
    };
    const records: Readonly<Record<string, unknown>>[] = [];
    // A wait of 200 ms gathers the two requests below into one batch.
    const { server, client } = await start(model, (r) => records.push(r), 200);
    const request = { model: 'rxrl-policy', prompt: 'ab', max_tokens: 250, temperature: 0 };
    // Precondition: unstreamed, this request runs to its budget (greedy, no end-of-sequence token on the way).
    const whole = await client.completions.create(request);
    expect(whole.choices[0].finish_reason).toBe('length');
    expect(generated[0][0].tokens).toHaveLength(250);

    const other = client.completions.create(request); // shares the batch, and its client stays
    const controller = new AbortController();
    const response = await fetch(`${server.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ ...request, stream: true }),
      signal: controller.signal,
    });
    const reader = response.body!.getReader();
    let seen = '';
    while (!seen.includes('"text":"') || seen.split('data: ').length < 4) seen += new TextDecoder().decode((await reader.read()).value);
    controller.abort();
    await reader.cancel().catch(() => undefined);
    expect((await other).choices[0].text).toBe(whole.choices[0].text);
    await server.engine.idle();
    await waitFor(() => records.some((r) => r.event === 'request' && r.status === 499));
    expect(generated).toHaveLength(2);
    const finishes = generated[1].map((r) => r.finishReason).sort();
    expect(finishes).toEqual(['abort', 'length']);
    const aborted = generated[1].find((r) => r.finishReason === 'abort')!;
    expect(aborted.tokens.length).toBeLessThan(250);
  });
});

async function waitFor(ok: () => boolean): Promise<void> {
  for (let i = 0; i < 200 && !ok(); i++) await new Promise((resolve) => setTimeout(resolve, 10));
  expect(ok()).toBe(true);
}
