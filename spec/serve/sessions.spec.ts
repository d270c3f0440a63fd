import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createJinjaChatTemplate } from '../../lib/chat/jinjaTemplate.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';

const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));
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
const owned: RxrlServer[] = [];
const models: PolicyModel[] = [];

interface Sample {
  prompt_ids: number[];
  response_ids: number[];
  response_mask: number[];
  logprobs: number[];
  reward: number | null;
  versions: number[];
  calls: string[];
}
interface SessionJson {
  calls: { id: string; prompt_ids: number[]; continues: unknown; drift: { at: number } | null }[];
  trajectories: Sample[];
  drift: number;
  ended: boolean;
}

async function getJson<T>(url: string, init?: RequestInit): Promise<{ status: number; json: T }> {
  const response = await fetch(url, init);
  return { status: response.status, json: (await response.json()) as T };
}

function postJson<T>(url: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; json: T }> {
  return getJson<T>(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
}

/** The calculator agent's conversation: calc(2+3) is called, the tool answers 5, the policy says 5. */
async function calculatorServer(options: Parameters<typeof serve>[0] extends infer O ? Partial<O> : never = {}): Promise<RxrlServer> {
  // bos 2 + 3 eos | c a l c ( 2 + 3 ) eos | 5 eos | 5 eos
  const model = PolicyModel.fromWeights(
    config,
    scriptedWeights(config, tokenizer, mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5'))),
  );
  models.push(model);
  const server = await serve({ ...options, model, tokenizer, port: 0 });
  owned.push(server);
  return server;
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

afterAll(async () => {
  await Promise.all(owned.map((s) => s.close()));
  for (const m of models) m.dispose();
});

describe('sessions: /sessions/{id}/v1 records token-exact trajectories of unmodified OpenAI clients', () => {
  it('turns a tool round trip into one trajectory: sampled ids as the client received them, tool tokens masked, reward attached', async () => {
    const server = await calculatorServer();
    const client = new OpenAI({ baseURL: `${server.url}/sessions/agent-1/v1`, apiKey: 'EMPTY', maxRetries: 0 });
    const extra = { return_token_ids: true } as Record<string, unknown>;
    const first = await client.chat.completions.create({
      model: 'rxrl-policy',
      messages: [{ role: 'user', content: '2+3' }],
      tools: [calcTool],
      ...extra,
    });
    const call = first.choices[0].message.tool_calls![0];
    const firstIds = (first.choices[0] as unknown as { token_ids: number[] }).token_ids;
    const firstPrompt = (first as unknown as { prompt_token_ids: number[] }).prompt_token_ids;
    // The second turn streams, as agent frameworks do; its ids come in the chunks.
    const stream = await client.chat.completions.create({
      model: 'rxrl-policy',
      tools: [calcTool],
      stream: true,
      messages: [
        { role: 'user', content: '2+3' },
        { role: 'assistant', content: null, tool_calls: [call] },
        { role: 'tool', tool_call_id: call.id, content: '5' },
      ],
      ...extra,
    });
    let secondIds: number[] = [];
    let secondPrompt: number[] = [];
    let answer = '';
    for await (const chunk of stream) {
      const raw = chunk as unknown as {
        prompt_token_ids?: number[];
        choices: { token_ids?: number[]; delta: { content?: string | null } }[];
      };
      if (raw.prompt_token_ids) secondPrompt = raw.prompt_token_ids;
      for (const c of raw.choices) {
        secondIds = [...secondIds, ...(c.token_ids ?? [])];
        answer += c.delta.content ?? '';
      }
    }
    expect(answer).toBe('5');
    const toolTurn = [...tokenizer.encode('5'), tokenizer.eosId];
    expect(secondPrompt).toEqual([...firstPrompt, ...firstIds, ...toolTurn]);

    const reward = await postJson<{ reward: number }>(`${server.url}/sessions/agent-1/reward`, { reward: 1 });
    expect(reward.json.reward).toBe(1);
    const { json } = await getJson<SessionJson>(`${server.url}/sessions/agent-1`);
    expect(json.calls).toHaveLength(2);
    expect(json.calls[1].continues).toEqual({ call: json.calls[0].id, choice: 0 });
    expect(json.drift).toBe(0);
    expect(json.trajectories).toHaveLength(1);
    const [sample] = json.trajectories;
    expect(sample.prompt_ids).toEqual(firstPrompt);
    expect(sample.response_ids).toEqual([...firstIds, ...toolTurn, ...secondIds]);
    expect(sample.response_mask).toEqual([...firstIds.map(() => 1), ...toolTurn.map(() => 0), ...secondIds.map(() => 1)]);
    expect(sample.logprobs.slice(firstIds.length, firstIds.length + toolTurn.length)).toEqual([0, 0]);
    expect(sample.logprobs.every((l) => l <= 0)).toBe(true);
    expect(sample).toMatchObject({ reward: 1, versions: [0, 0], calls: json.calls.map((c) => c.id) });

    // Transition mode: one sample per call; the reward is discounted back from the last call.
    const transitions = (await getJson<SessionJson>(`${server.url}/sessions/agent-1?mode=transition&discount=0.5`)).json.trajectories;
    expect(transitions.map((t) => [t.prompt_ids, t.response_ids, t.reward])).toEqual([
      [firstPrompt, firstIds, 0.5],
      [secondPrompt, secondIds, 1],
    ]);
    expect(transitions.every((t) => t.response_mask.every((m) => m === 1))).toBe(true);

    // Ended sessions take no more calls; they are still read, then freed.
    expect((await postJson(`${server.url}/sessions/agent-1/end`, {})).status).toBe(200);
    const late = await postJson<{ error: { code: string } }>(`${server.url}/sessions/agent-1/v1/chat/completions`, {
      model: 'rxrl-policy',
      messages: [{ role: 'user', content: '1' }],
    });
    expect([late.status, late.json.error.code]).toEqual([409, 'session_ended']);
    expect((await getJson<SessionJson>(`${server.url}/sessions/agent-1`)).json.ended).toBe(true);
    expect((await getJson(`${server.url}/sessions/agent-1`, { method: 'DELETE' })).json).toMatchObject({ deleted: true });
    expect((await getJson(`${server.url}/sessions/agent-1`)).status).toBe(404);
  });

  it('starts a new sequence when a call does not continue an earlier one; completions calls join by token prefix', async () => {
    const server = await calculatorServer();
    const base = `${server.url}/sessions/s2/v1`;
    const a = await postJson<{ choices: { token_ids: number[] }[] }>(`${base}/completions`, {
      model: 'rxrl-policy',
      prompt: [1, 5],
      max_tokens: 3,
      return_token_ids: true,
      seed: 1,
    });
    const continued = [1, 5, ...a.json.choices[0].token_ids, 7];
    const b = await postJson<{ choices: { token_ids: number[] }[] }>(`${base}/completions`, {
      model: 'rxrl-policy',
      prompt: continued,
      max_tokens: 2,
      seed: 2,
      return_token_ids: true,
    });
    const c = await postJson<{ choices: { token_ids: number[] }[] }>(`${base}/completions`, {
      model: 'rxrl-policy',
      prompt: [1, 9],
      max_tokens: 2,
      seed: 3,
      return_token_ids: true,
    });
    const { json } = await getJson<SessionJson>(`${server.url}/sessions/s2`);
    const ones = (ids: number[]): number[] => ids.map(() => 1);
    expect(json.trajectories.map((t) => [t.prompt_ids, t.response_ids, t.response_mask])).toEqual([
      [
        [1, 5],
        [...a.json.choices[0].token_ids, 7, ...b.json.choices[0].token_ids],
        [...ones(a.json.choices[0].token_ids), 0, ...ones(b.json.choices[0].token_ids)],
      ],
      [[1, 9], c.json.choices[0].token_ids, ones(c.json.choices[0].token_ids)],
    ]);
    expect(json.trajectories.every((t) => t.reward === null)).toBe(true);
    // Per-call rewards add up along the sequence.
    await postJson(`${server.url}/sessions/s2/reward`, { reward: 0.25, call: json.calls[0].id });
    await postJson(`${server.url}/sessions/s2/reward`, { reward: 0.5 });
    const rewards = (await getJson<SessionJson>(`${server.url}/sessions/s2`)).json.trajectories.map((t) => t.reward);
    expect(rewards).toEqual([0.75, 0.5]);
  });

  it('validates ids and bodies, is bounded in sessions and tokens, and sits behind --api-key', async () => {
    const server = await calculatorServer({ apiKey: 'k', sessions: { maxSessions: 1, maxTokens: 40 } });
    const auth = { authorization: 'Bearer k' };
    const chat = { model: 'rxrl-policy', messages: [{ role: 'user', content: '2+3' }], max_tokens: 2 };
    expect((await postJson(`${server.url}/sessions/a/v1/chat/completions`, chat)).status).toBe(401);
    expect((await getJson(`${server.url}/sessions/a`)).status).toBe(401);
    expect((await postJson(`${server.url}/sessions/a/v1/chat/completions`, chat, auth)).status).toBe(200);
    const bad = await postJson<{ error: { code: string } }>(
      `${server.url}/sessions/${encodeURIComponent('a b')}/v1/chat/completions`,
      chat,
      auth,
    );
    expect([bad.status, bad.json.error.code]).toEqual([400, 'invalid_session_id']);
    const full = await postJson<{ error: { code: string } }>(`${server.url}/sessions/b/v1/chat/completions`, chat, auth);
    expect([full.status, full.json.error.code]).toEqual([429, 'too_many_sessions']);
    for (;;) {
      const next = await postJson<{ error?: { code: string } }>(
        `${server.url}/sessions/a/v1/completions`,
        { model: 'rxrl-policy', prompt: 'ab', max_tokens: 8 },
        auth,
      );
      if (next.status === 200) continue;
      expect([next.status, next.json.error?.code]).toEqual([400, 'session_too_large']);
      break;
    }
    const reward = await postJson<{ error: { param: string } }>(`${server.url}/sessions/a/reward`, { reward: 'lots' }, auth);
    expect([reward.status, reward.json.error.param]).toEqual([400, 'reward']);
    const mode = await getJson<{ error: { param: string } }>(`${server.url}/sessions/a?mode=tree`, { headers: auth });
    expect([mode.status, mode.json.error.param]).toEqual([400, 'mode']);
    // An ended session makes room for a new one.
    await postJson(`${server.url}/sessions/a/end`, {}, auth);
    expect((await postJson(`${server.url}/sessions/b/v1/chat/completions`, chat, auth)).status).toBe(200);
  });

  it('trains on what was sampled where the template re-renders past turns differently (<think> dropped): drift is seen, not trained on', async () => {
    const dir = join(FIXTURES, 'tiny-qwen3');
    const hf = await loadTokenizer(dir);
    // ChatML that, as Qwen3's template does, drops the <think>…</think> part of assistant turns before the last user turn.
    const source = [
      '{%- set ns = namespace(last_user=-1) -%}',
      "{%- for m in messages -%}{%- if m.role == 'user' -%}{%- set ns.last_user = loop.index0 -%}{%- endif -%}{%- endfor -%}",
      '{%- for m in messages -%}',
      '{%- set content = m.content -%}',
      "{%- if m.role == 'assistant' and loop.index0 < ns.last_user and '</think>' in content -%}{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}",
      "{{- '<|im_start|>' + m.role + '\\n' + content + '<|im_end|>\\n' -}}",
      '{%- endfor -%}',
      "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}",
    ].join('');
    const template = createJinjaChatTemplate(hf, source);
    const replies = ['<think>\nsmall sum\n</think>\n\n7', '<think>\nagain\n</think>\n\n9'].map((text) => [...hf.encode(text), hf.eosId]);
    let turn = 0;
    const requests: GenerateRequest[] = [];
    const generate = async (batch: readonly GenerateRequest[], options: { version?: number } = {}): Promise<GenerateResponse[]> =>
      batch.map((request) => {
        requests.push(request);
        const tokens = replies[turn++ % replies.length];
        return { tokens, logprobs: tokens.map(() => -0.25), finishReason: 'stop', policyVersion: options.version ?? 0 };
      });
    const model = { config: { vocabSize: hf.vocabSize, maxSeqLen: 1024 }, generate, setWeights: () => undefined } as unknown as PolicyModel;
    const server = await serve({ model, tokenizer: hf, chatTemplate: template, port: 0 });
    owned.push(server);
    const client = new OpenAI({ baseURL: `${server.url}/sessions/think/v1`, apiKey: 'EMPTY', maxRetries: 0 });
    const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: '3+4?' }];
    const first = await client.chat.completions.create({
      model: 'rxrl-policy',
      messages,
      return_token_ids: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    messages.push({ role: 'assistant', content: first.choices[0].message.content }, { role: 'user', content: 'and 4+5?' });
    const second = await client.chat.completions.create({
      model: 'rxrl-policy',
      messages,
      return_token_ids: true,
    } as OpenAI.Chat.ChatCompletionCreateParamsNonStreaming);
    expect(second.choices[0].message.content).toContain('9');

    const { json } = await getJson<SessionJson>(`${server.url}/sessions/think`);
    // Re-rendering the final messages drops the first turn's <think>: a re-encoding trainer would train on other tokens.
    const retemplated = template.render(
      [
        { role: 'user', content: '3+4?' },
        { role: 'assistant', content: first.choices[0].message.content ?? '' },
        { role: 'user', content: 'and 4+5?' },
      ],
      [],
      { addGenerationPrompt: true },
    );
    expect(json.drift).toBe(1);
    expect(json.calls[1].drift).not.toBeNull();
    const exactPrompt = (second as unknown as { prompt_token_ids: number[] }).prompt_token_ids;
    expect(exactPrompt).not.toEqual(retemplated);
    expect(requests[1].promptTokens).toEqual(exactPrompt); // the engine sampled from the exact prompt
    // What rxrl trains on: each turn's sampled ids exactly (0 drift), the user's turn masked.
    const [sample] = json.trajectories;
    const firstIds = (first.choices[0] as unknown as { token_ids: number[] }).token_ids;
    const secondIds = (second.choices[0] as unknown as { token_ids: number[] }).token_ids;
    expect(firstIds).toEqual(replies[0]);
    expect(secondIds).toEqual(replies[1]);
    const userTurn = exactPrompt.slice(sample.prompt_ids.length + firstIds.length);
    expect(sample.response_ids).toEqual([...firstIds, ...userTurn, ...secondIds]);
    expect(sample.response_mask).toEqual([...firstIds.map(() => 1), ...userTurn.map(() => 0), ...secondIds.map(() => 1)]);
    expect(hf.decode(userTurn, { skipSpecialTokens: false })).toBe('\n<|im_start|>user\nand 4+5?<|im_end|>\n<|im_start|>assistant\n');
  });
});
