import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { spawnServe, type SpawnedServer } from '../../lib/serve/spawn.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const modelDir = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

/** Written by `scripts/make_hf_fixtures.py` with torch + transformers: logits of fixed inputs and rendered chats. */
interface Expected {
  readonly logits: { readonly input_ids: number[][]; readonly attention_mask: number[][]; readonly logits: number[][][] };
  readonly chat: readonly {
    readonly messages: { role: 'system' | 'user' | 'assistant'; content: string }[];
    readonly tools: unknown;
    readonly add_generation_prompt: boolean;
    readonly ids: number[];
  }[];
}
const expected = JSON.parse(readFileSync(join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2.expected.json'), 'utf8')) as Expected;

function logSoftmax(row: readonly number[]): number[] {
  const max = Math.max(...row);
  const lse = max + Math.log(row.reduce((s, x) => s + Math.exp(x - max), 0));
  return row.map((x) => x - lse);
}

type PromptLogprobs = (Record<string, { logprob: number; rank: number; decoded_token: string }> | null)[];

let server: SpawnedServer;
beforeAll(async () => {
  server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', modelDir], { cliPath: cli, stderr: 'ignore' });
}, 60_000);
afterAll(async () => {
  await server?.close();
});

describe('rxrl serve --model <Hugging Face directory> (built CLI)', () => {
  it('is served under the directory name', async () => {
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
    expect(server.modelName).toBe('tiny-qwen2');
    expect((await client.models.list()).data.map((m) => m.id)).toEqual(['tiny-qwen2']);
  });

  it("answers prompt_logprobs with transformers' log-probs of every prompt token given its prefix", async () => {
    // Row 0 of the fixture has no padding: its logits at position j predict token j + 1.
    const ids = expected.logits.input_ids[0];
    const reference = expected.logits.logits[0].map(logSoftmax);
    const response = await fetch(`${server.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny-qwen2', prompt: ids, max_tokens: 1, temperature: 0, prompt_logprobs: 3, n: 2 }),
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as { choices: { prompt_logprobs: PromptLogprobs }[] };
    expect(body.choices).toHaveLength(2);
    const scored = body.choices[0].prompt_logprobs;
    expect(body.choices[1].prompt_logprobs).toEqual(scored);
    expect(scored).toHaveLength(ids.length);
    expect(scored[0]).toBeNull();
    for (let j = 1; j < ids.length; j++) {
      const entry = scored[j]!;
      const row = reference[j - 1];
      const own = entry[String(ids[j])];
      expect(Math.abs(own.logprob - row[ids[j]])).toBeLessThan(1e-4);
      expect(own.rank).toBe(1 + row.filter((x) => x > row[ids[j]]).length);
      // The three most likely tokens of transformers' distribution are there too, with their log-probs.
      const top3 = [...row.keys()].sort((a, b) => row[b] - row[a]).slice(0, 3);
      for (const t of top3) expect(Math.abs(entry[String(t)].logprob - row[t])).toBeLessThan(1e-4);
      expect(Object.keys(entry).length).toBe(top3.includes(ids[j]) ? 3 : 4);
    }
    // Without the parameter there is no field; a bad value is a 400.
    const plain = await fetch(`${server.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny-qwen2', prompt: ids, max_tokens: 1 }),
    });
    expect(Object.keys(((await plain.json()) as { choices: object[] }).choices[0])).not.toContain('prompt_logprobs');
    const bad = await fetch(`${server.baseURL}/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'tiny-qwen2', prompt: ids, max_tokens: 1, prompt_logprobs: -2 }),
    });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { error: { param: string } }).error.param).toBe('prompt_logprobs');
  });

  it("renders chats with the model's own template (token for token as transformers' apply_chat_template)", async () => {
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY' });
    const cases = expected.chat.filter((c) => c.tools === null && c.add_generation_prompt);
    expect(cases.length).toBeGreaterThan(0);
    for (const c of cases) {
      const out = await client.chat.completions.create({
        model: 'tiny-qwen2',
        messages: c.messages,
        max_tokens: 2,
        seed: 1,
        // vLLM extension: the prompt's token ids come back with the response.
        ...({ return_token_ids: true } as object),
      });
      expect((out as unknown as { prompt_token_ids: number[] }).prompt_token_ids).toEqual(c.ids);
    }
  });
});
