/**
 * vLLM's serving extras in `rxrl serve`: `--reasoning-parser` splits `<think>…</think>` into `reasoning_content`
 * (whole and streamed, read by the real `openai` clients, npm and PyPI), and `GET /metrics` serves Prometheus text
 * under vLLM's metric names. The model is a real policy whose weights script its reply.
 */
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { runServeCommand } from '../../lib/serve/command.js';
import { ReasoningStream, splitReasoning } from '../../lib/serve/reasoning.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { scriptedWeights, writeAt } from '../helpers/scripted.js';
import { lacks } from '../helpers/testSetup.js';

const tokenizer = new CharTokenizer('abcdefghijklmnopqrstuvwxyz<>/ ');
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
/** bos h i eos | <think>ab c</think>ok eos */
const REPLY = '<think>ab c</think>ok';
let model: PolicyModel;
let server: RxrlServer;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, REPLY)));
  server = await serve({ model, tokenizer, modelName: 'thinker', reasoningParser: 'qwen3', port: 0 });
});

afterAll(async () => {
  await server?.close();
  model?.dispose();
});

describe('splitting a reply', () => {
  it('as vLLM does: <think> dropped, before </think> reasoning, after it content; without one qwen3 says content', () => {
    expect(splitReasoning('qwen3', '<think>\nwhy\n</think>\n\nbecause')).toEqual({ reasoning: '\nwhy\n', content: '\n\nbecause' });
    expect(splitReasoning('qwen3', 'why</think>because')).toEqual({ reasoning: 'why', content: 'because' });
    expect(splitReasoning('qwen3', 'no thinking')).toEqual({ content: 'no thinking' });
    expect(splitReasoning('deepseek_r1', '<think>cut off')).toEqual({ reasoning: 'cut off', content: '' });
  });

  it('streamed in any pieces, it adds up to the whole split', () => {
    const texts = ['<think>ab c</think>ok', '<think></think>', 'plain <t>ext', '<think>x</thin', '<thinking>?'];
    for (const parser of ['qwen3', 'deepseek_r1'] as const) {
      for (const text of texts) {
        for (const size of [1, 2, 3, 5, 100]) {
          const stream = new ReasoningStream(parser);
          let reasoning = '';
          let content = '';
          for (let i = 0; i < text.length; i += size) {
            const d = stream.push(text.slice(i, i + size));
            reasoning += d.reasoning;
            content += d.content;
          }
          const d = stream.end();
          reasoning += d.reasoning;
          content += d.content;
          const whole = splitReasoning(parser, text);
          // Streamed as vLLM streams it, a <think> never closed stays reasoning (whole, qwen3 gives it as content).
          const unclosed = parser === 'qwen3' && text.startsWith('<think>') && !text.includes('</think>');
          const expected = unclosed ? [whole.content, ''] : [whole.reasoning ?? '', whole.content];
          expect([reasoning, content], `${parser} ${JSON.stringify(text)} by ${size}`).toEqual(expected);
        }
      }
    }
  });
});

describe('rxrl serve --reasoning-parser qwen3', () => {
  it('answers reasoning_content beside content, whole and streamed (npm openai)', async () => {
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    const answer = await client.chat.completions.create({ model: 'thinker', messages: [{ role: 'user', content: 'hi' }], max_tokens: 24 });
    const message = answer.choices[0].message as OpenAI.Chat.ChatCompletionMessage & { reasoning_content?: string };
    expect(message.reasoning_content).toBe('ab c');
    expect(message.content).toBe('ok');
    const stream = await client.chat.completions.create({
      model: 'thinker',
      messages: [{ role: 'user', content: 'hi' }],
      max_tokens: 24,
      stream: true,
    });
    let reasoning = '';
    let content = '';
    let reasoningDeltas = 0;
    for await (const chunk of stream) {
      const delta = (chunk.choices[0]?.delta ?? {}) as { content?: string | null; reasoning_content?: string };
      if (delta.reasoning_content) reasoningDeltas++;
      reasoning += delta.reasoning_content ?? '';
      content += delta.content ?? '';
    }
    expect([reasoning, content]).toEqual(['ab c', 'ok']);
    expect(reasoningDeltas).toBeGreaterThan(1); // streamed as its own deltas, not in one piece at the end
  });

  it.skipIf(lacks('python'))('the Python openai client reads reasoning_content too', async () => {
    const script = [
      'import sys, openai',
      "c = openai.OpenAI(base_url=sys.argv[1], api_key='EMPTY')",
      "m = c.chat.completions.create(model='thinker', messages=[{'role': 'user', 'content': 'hi'}], max_tokens=24).choices[0].message",
      "print(m.model_extra['reasoning_content'] + '|' + m.content)",
    ].join('\n');
    // Asynchronously: the server answers from this process.
    const { stdout } = await promisify(execFile)('python3', ['-c', script, server.baseURL], { encoding: 'utf8' });
    expect(stdout.trim()).toBe('ab c|ok');
  });

  it('refuses an unknown parser, naming the flag', async () => {
    const run = runServeCommand({
      reasoningParser: 'nope',
      defaultAlphabet: 'ab',
      defaultModel: config,
      signal: new AbortController().signal,
      out: () => undefined,
      err: () => undefined,
    } as Parameters<typeof runServeCommand>[0]);
    await expect(run).rejects.toThrow(ConfigError);
    await expect(run).rejects.toThrow('--reasoning-parser nope: not a known parser (qwen3, deepseek_r1)');
  });
});

describe('GET /metrics', () => {
  it("counts requests, tokens and latencies under vLLM's names, without the API key", async () => {
    const keyed = await serve({ model, tokenizer, modelName: 'thinker', port: 0, apiKey: 'secret' });
    try {
      const client = new OpenAI({ baseURL: keyed.baseURL, apiKey: 'secret', maxRetries: 0 });
      for (let i = 0; i < 2; i++)
        await client.chat.completions.create({ model: 'thinker', messages: [{ role: 'user', content: 'hi' }], max_tokens: 24 });
      const response = await fetch(`${keyed.url}/metrics`);
      expect(response.status).toBe(200);
      expect(response.headers.get('content-type')).toContain('text/plain; version=0.0.4');
      const text = await response.text();
      const value = (line: string): number => Number(new RegExp(`^${line.replace(/[{}|.+"]/g, '\\$&')} (\\S+)$`, 'm').exec(text)?.[1]);
      expect(value('vllm:num_requests_running{model_name="thinker"}')).toBe(0);
      expect(value('vllm:num_requests_waiting{model_name="thinker"}')).toBe(0);
      expect(value('vllm:prompt_tokens_total{model_name="thinker"}')).toBe(2 * 4);
      expect(value('vllm:generation_tokens_total{model_name="thinker"}')).toBe(2 * (REPLY.length + 1));
      expect(value('vllm:request_success_total{model_name="thinker",finished_reason="stop"}')).toBe(2);
      expect(value('vllm:time_to_first_token_seconds_count{model_name="thinker"}')).toBe(2);
      expect(value('vllm:e2e_request_latency_seconds_bucket{model_name="thinker",le="+Inf"}')).toBe(2);
      expect(text).toContain('# TYPE vllm:time_to_first_token_seconds histogram');
    } finally {
      await keyed.close();
    }
  });
});
