import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadChatTemplate, type JinjaChatTemplate } from '../../lib/chat/jinjaTemplate.js';
import type { ChatMessage, ChatTool } from '../../lib/chat/types.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';

/** Fixtures written by `scripts/make_hf_fixtures.py` with transformers 5. */
const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));

const addTool: ChatTool = {
  name: 'add',
  description: 'Add two integers.',
  parameters: { type: 'object', properties: { a: { type: 'integer' }, b: { type: 'integer' } }, required: ['a', 'b'] },
};
const openaiAddTool = { type: 'function' as const, function: { ...addTool, parameters: { ...addTool.parameters } } };

const owned: RxrlServer[] = [];
const models: PolicyModel[] = [];

/**
 * A stand-in for a policy model behind the real server: it answers each request with `reply(prompt)`, cut at the
 * first of the request's stop tokens (kept) or at `maxTokens`, with log-prob −0.5 per token. It records the
 * requests, so the specs can check which stop tokens the server asked for. Only what `serve` uses is provided
 * (no top log-probs, no weight updates), which keeps the spec independent of the transformer's internals.
 */
function scriptedModel(vocabSize: number, maxSeqLen: number, reply: (prompt: readonly number[]) => readonly number[]) {
  const requests: GenerateRequest[] = [];
  const generate = async (batch: readonly GenerateRequest[], options: { version?: number } = {}): Promise<GenerateResponse[]> =>
    batch.map((request) => {
      requests.push(request);
      const all = reply(request.promptTokens).slice(0, request.maxTokens);
      const stopAt = all.findIndex((t) => (request.stopTokens ?? []).includes(t));
      const tokens = stopAt >= 0 ? all.slice(0, stopAt + 1) : all;
      return {
        tokens,
        logprobs: tokens.map(() => -0.5),
        finishReason: stopAt >= 0 ? 'stop' : 'length',
        policyVersion: options.version ?? 0,
      };
    });
  const model = { config: { vocabSize, maxSeqLen }, generate, setWeights: () => undefined } as unknown as PolicyModel;
  return { model, requests };
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

afterAll(async () => {
  await Promise.all(owned.map((s) => s.close()));
  for (const m of models) m.dispose();
});

describe('rxrl serve with a Hugging Face tokenizer and Jinja chat template, through the real openai client', () => {
  it('renders chats with the template passed in options, parses <tool_call> blocks and re-renders the tool turn', async () => {
    const dir = join(FIXTURES, 'tiny-qwen3');
    const tokenizer = await loadTokenizer(dir);
    const template = (await loadChatTemplate(dir, tokenizer)) as JinjaChatTemplate;
    const user: ChatMessage = { role: 'user', content: 'Add 40 and 2.' };
    const prompt = template.render([user], [addTool], { addGenerationPrompt: true });
    const completion = [...tokenizer.encode('<tool_call>\n{"name": "add", "arguments": {"a": 40, "b": 2}}\n</tool_call>'), tokenizer.eosId];
    // Calls the tool on the first turn; answers "42" once the tool has answered.
    const { model, requests } = scriptedModel(tokenizer.vocabSize, 1024, (p) =>
      p.length === prompt.length ? completion : [...tokenizer.encode('The sum is 42.'), tokenizer.eosId],
    );
    const server = await serve({ model, tokenizer, chatTemplate: template, port: 0 });
    owned.push(server);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    const base = { model: server.modelName, seed: 3, logprobs: true, return_token_ids: true, max_completion_tokens: 64 };

    const first = await client.chat.completions.create({
      ...base,
      messages: [{ role: 'user', content: user.content }],
      tools: [openaiAddTool],
    });
    const choice = first.choices[0];
    const extra = first as unknown as { prompt_token_ids: number[] };
    const tokens = (choice as unknown as { token_ids: number[] }).token_ids;
    expect(extra.prompt_token_ids).toEqual(prompt);
    expect(tokens).toEqual(completion);
    expect(choice.finish_reason).toBe('tool_calls');
    expect(choice.message.content).toBeNull();
    const call = choice.message.tool_calls![0];
    if (call.type !== 'function') throw new Error('expected a function call');
    expect(call.function).toEqual({ name: 'add', arguments: '{"a":40,"b":2}' });
    // Log-probs spell tokens with their vocabulary strings; the stop token is <|im_end|>.
    const labels = choice.logprobs!.content!.map((c) => c.token);
    expect(labels).toEqual(completion.map((id) => tokenizer.tokenLabel(id)));
    expect(labels.at(-1)).toBe('<|im_end|>');
    // Generation stops at every stop id of the model (<|im_end|> and generation_config.json's <|endoftext|>).
    expect(requests[0].stopTokens).toEqual(expect.arrayContaining([...tokenizer.stopIds]));

    const conversation = [
      { role: 'user' as const, content: user.content },
      { role: 'assistant' as const, content: null, tool_calls: [call] },
      { role: 'tool' as const, tool_call_id: call.id, content: '42' },
    ];
    const second = await client.chat.completions.create({ ...base, messages: conversation, tools: [openaiAddTool] });
    expect(second.choices[0].message).toMatchObject({ role: 'assistant', content: 'The sum is 42.' });
    expect(second.choices[0].finish_reason).toBe('stop');
    const expected = template.render(
      [
        user,
        { role: 'assistant', content: '', toolCalls: [{ id: call.id, name: 'add', arguments: call.function.arguments }] },
        { role: 'tool', content: '42', toolCallId: call.id },
      ],
      [addTool],
      { addGenerationPrompt: true },
    );
    expect((second as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(expected);
    // The re-rendered assistant turn holds exactly the tokens the policy sampled.
    expect(expected.slice(0, prompt.length + completion.length)).toEqual([...prompt, ...completion]);
  });

  it('gives prompt token ids equal to transformers apply_chat_template for a fixture conversation', async () => {
    for (const name of ['tiny-qwen2', 'tiny-llama']) {
      const dir = join(FIXTURES, name);
      const tokenizer = await loadTokenizer(dir);
      const chatTemplate = await loadChatTemplate(dir, tokenizer);
      const [c] = (
        JSON.parse(readFileSync(join(FIXTURES, `${name}.expected.json`), 'utf8')) as {
          chat: { messages: { role: 'system' | 'user'; content: string }[]; ids: number[]; add_generation_prompt: boolean }[];
        }
      ).chat;
      expect(c.add_generation_prompt).toBe(true);
      const config: PolicyConfig = {
        vocabSize: tokenizer.vocabSize,
        dModel: 16,
        nLayers: 1,
        nHeads: 2,
        dFF: 16,
        maxSeqLen: c.ids.length + 8,
      };
      const model = PolicyModel.create(config, 1);
      models.push(model);
      const server = await serve({ model, tokenizer, chatTemplate, port: 0 });
      owned.push(server);
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
      const out = await client.chat.completions.create({
        model: server.modelName,
        messages: c.messages,
        max_tokens: 3,
        seed: 1,
        return_token_ids: true,
      } as never);
      expect((out as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(c.ids);
    }
  });

  it('completes text with BOS handling, stop ids, whole multi-byte characters and stop strings', async () => {
    const dir = join(FIXTURES, 'tiny-llama');
    const tokenizer = await loadTokenizer(dir);
    const prompt = tokenizer.encode('Hi', { addBos: true });
    expect(prompt[0]).toBe(tokenizer.bosId);
    const reply = tokenizer.encode('🙂 ok');
    const stop = tokenizer.stopIds[1]; // <|end_of_text|>: a stop id of generation_config.json, not the eos
    const completion = [...reply, stop];
    const { model } = scriptedModel(tokenizer.vocabSize, 64, () => [...completion, ...tokenizer.encode(' more')]);
    const server = await serve({ model, tokenizer, port: 0 });
    owned.push(server);
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    const ask = async (extra: Record<string, unknown>) =>
      (await client.completions.create({
        model: server.modelName,
        prompt: 'Hi',
        max_tokens: 12,
        logprobs: 0,
        return_token_ids: true,
        ...extra,
      } as never)) as unknown as {
        choices: {
          text: string;
          finish_reason: string;
          token_ids: number[];
          prompt_token_ids: number[];
          logprobs: { tokens: string[]; text_offset: number[] };
        }[];
      };
    const [plain] = (await ask({})).choices;
    expect(plain.prompt_token_ids).toEqual(prompt);
    expect(plain.token_ids).toEqual(completion); // cut at the stop id, which the server asked for
    expect(plain.text).toBe('🙂 ok'); // the emoji spans several byte-level tokens
    expect(plain.finish_reason).toBe('stop');
    expect(plain.logprobs.tokens).toEqual(completion.map((id) => tokenizer.tokenLabel(id)));
    expect(plain.logprobs.text_offset.at(-1)).toBe('🙂 ok'.length);
    const [cut] = (await ask({ stop: [' ok'] })).choices;
    expect(cut.text).toBe('🙂');
    expect(tokenizer.decode(cut.token_ids)).toBe('🙂');
  });
});
