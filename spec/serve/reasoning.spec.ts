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
import { REASONING_PARSERS, ReasoningStream, splitReasoning, type ReasoningParserName } from '../../lib/serve/reasoning.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { mulberry32, randomInt, type Rng } from '../helpers/random.js';
import { scriptedWeights, writeAt } from '../helpers/scripted.js';
import { lacks } from '../helpers/testSetup.js';

const tokenizer = new CharTokenizer('abcdefghijklmnopqrstuvwxyz<>/ ');
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
/** bos h i eos | <think>ab c</think>ok eos */
const REPLY = '<think>ab c</think>ok';
/** The lengths of `<think>` and `</think>`. */
const OPEN_CLOSE = ['<think>'.length, '</think>'.length] as const;
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

/** The stream's split of `text` cut into `pieces`, with what `end()` gives. */
function streamed(parser: ReasoningParserName, pieces: readonly string[]): [string, string] {
  const stream = new ReasoningStream(parser);
  let reasoning = '';
  let content = '';
  for (const d of [...pieces.map((piece) => stream.push(piece)), stream.end()]) {
    reasoning += d.reasoning;
    content += d.content;
  }
  return [reasoning, content];
}

/** The whole split as the two strings a streamed reply adds up to. */
function whole(parser: ReasoningParserName, text: string): [string, string] {
  const split = splitReasoning(parser, text);
  return [split.reasoning ?? '', split.content];
}

/** A random text over an alphabet of the tags, their fragments and plain characters. */
function randomText(rng: Rng): string {
  const alphabet = ['<think>', '</think>', '<', '>', '/', '<th', '</th', 'ink>', 'k>', 't', 'h', 'a', ' ', '\n', '<think', '</'];
  return Array.from({ length: randomInt(rng, 0, 12) }, () => alphabet[randomInt(rng, 0, alphabet.length - 1)]).join('');
}

/** `text` cut at random points (some pieces empty). */
function randomPieces(rng: Rng, text: string): string[] {
  const cuts = Array.from({ length: randomInt(rng, 0, 6) }, () => randomInt(rng, 0, text.length)).sort((a, b) => a - b);
  return [0, ...cuts].map((from, i, all) => text.slice(from, all[i + 1] ?? text.length));
}

describe('splitting a reply', () => {
  it('as vLLM does: <think> dropped, before </think> reasoning, after it content; without <think> qwen3 says content', () => {
    expect(splitReasoning('qwen3', '<think>\nwhy\n</think>\n\nbecause')).toEqual({ reasoning: '\nwhy\n', content: '\n\nbecause' });
    expect(splitReasoning('deepseek_r1', 'why</think>because')).toEqual({ reasoning: 'why', content: 'because' });
    expect(splitReasoning('qwen3', 'no thinking')).toEqual({ content: 'no thinking' });
    expect(splitReasoning('deepseek_r1', '<think>cut off')).toEqual({ reasoning: 'cut off', content: '' });
  });

  // The inputs on which the whole and the streamed split disagreed (issue 53, row 12), with what both now give.
  const examples: readonly [ReasoningParserName, string, [string, string]][] = [
    ['qwen3', 'x</think>y', ['', 'x</think>y']], // qwen3 requires <think>: a stray </think> is content
    ['deepseek_r1', 'x</think>y', ['x', 'y']], // deepseek_r1 thinks from the first token
    ['qwen3', '<think>abc', ['abc', '']], // cut off while thinking: reasoning
    ['deepseek_r1', '<think>abc', ['abc', '']],
    ['qwen3', 'pre<think>r</think>post', ['r', 'prepost']], // nothing before <think> is lost
    ['deepseek_r1', 'pre<think>r</think>post', ['prer', 'post']],
    ['qwen3', '</think><think>', ['', '</think>']],
    ['deepseek_r1', '</think><think>', ['', '<think>']], // after </think>, tags are content
    ['qwen3', '<think>a<think>b</think>c', ['a<think>b', 'c']], // one <think> is dropped, not two
    ['deepseek_r1', '<think>a<think>b</think>c', ['a<think>b', 'c']],
    ['qwen3', '<think></think></think>', ['', '</think>']],
    ['deepseek_r1', '</think>', ['', '']],
    ['qwen3', '<think', ['', '<think']], // a tag never finished is text
    ['deepseek_r1', 'a</thin', ['a</thin', '']],
  ];
  it.each(examples)('%s %j reads the same whole and streamed', (parser, text, expected) => {
    expect(whole(parser, text)).toEqual(expected);
    for (let size = 1; size <= text.length; size++) {
      const pieces = Array.from({ length: Math.ceil(text.length / size) }, (_, i) => text.slice(i * size, (i + 1) * size));
      expect(streamed(parser, pieces), `by ${size}`).toEqual(expected);
    }
  });

  it('property: random texts cut at random points stream to the whole split, losing only the two tags', () => {
    const rng = mulberry32(53);
    for (const parser of REASONING_PARSERS) {
      for (let trial = 0; trial < 3000; trial++) {
        const text = randomText(rng);
        const pieces = randomPieces(rng, text);
        const expected = whole(parser, text);
        expect(streamed(parser, pieces), `${parser} ${JSON.stringify(pieces)}`).toEqual(expected);
        expect([0, OPEN_CLOSE[0], OPEN_CLOSE[1], OPEN_CLOSE[0] + OPEN_CLOSE[1]]).toContain(text.length - expected.join('').length);
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
