/**
 * A hostile audit of `rxrl serve` (issue 31): invalid requests cost no session slot, a session's token limit
 * holds under concurrency, a prompt of megabytes that cannot fit is refused without tokenizing it, a client that
 * reads slowly cannot make the server pile up its stream, and rewards cannot sum past a finite number.
 */
import { connect, type Socket } from 'node:net';
import { fileURLToPath } from 'node:url';

import OpenAI from 'openai';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { createJinjaChatTemplate } from '../../lib/chat/jinjaTemplate.js';
import type { EncodeOptions } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { HfTokenizer, readTokenizerFiles } from '../../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import { serve, type RxrlServer, type ServeOptions } from '../../lib/serve/server.js';
// The policy the hostileServe bench measures with: it writes 'a', 'b'… up to max_tokens, never stopping early.
import { RunOnModel } from '../../bench/_fakes.js';

const tokenizer = new CharTokenizer();
const owned: RxrlServer[] = [];
const JSON_HEADERS = { 'content-type': 'application/json' };

async function runOnServer(options: Partial<ServeOptions> = {}, maxSeqLen = 256): Promise<{ server: RxrlServer; model: RunOnModel }> {
  const model = new RunOnModel(tokenizer.encode('ab'), tokenizer.vocabSize, maxSeqLen);
  const server = await serve({ ...options, model: model as unknown as PolicyModel, tokenizer, port: 0 });
  owned.push(server);
  return { server, model };
}

/** Sends a JSON POST on a raw socket and reads nothing until told (`socket.resume()`). */
function rawPost(port: number, path: string, body: unknown): Socket {
  const text = JSON.stringify(body);
  const socket = connect(port, '127.0.0.1');
  socket.pause();
  socket.write(
    `POST ${path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(text)}\r\n\r\n${text}`,
  );
  return socket;
}

/** Everything a socket receives until the server ends the response (`data: [DONE]`). */
function readAll(socket: Socket): Promise<string> {
  return new Promise((resolve, reject) => {
    let text = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      text += chunk;
      if (text.includes('data: [DONE]')) {
        socket.destroy();
        resolve(text);
      }
    });
    socket.on('error', reject);
    socket.resume();
  });
}

async function waitFor<T>(find: () => T | undefined, what: string): Promise<T> {
  for (let tries = 0; tries < 500; tries++) {
    const found = find();
    if (found !== undefined) return found;
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
  throw new Error(`timed out waiting for ${what}`);
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

afterAll(async () => {
  await Promise.all(owned.map((s) => s.close()));
});

describe('rxrl serve under hostile clients', () => {
  it('opens a session only for a valid call: refused requests (400, 404, 405, malformed JSON) cost no slot', async () => {
    const { server } = await runOnServer({ apiKey: 'k', sessions: { maxSessions: 4 } });
    const auth = { authorization: 'Bearer k' };
    const refused = [
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/completions`, {
          method: 'POST',
          headers: { ...JSON_HEADERS, ...auth },
          body: JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: -1 }),
        }),
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/chat/completions`, {
          method: 'POST',
          headers: { ...JSON_HEADERS, ...auth },
          body: JSON.stringify({ model: 'rxrl-policy', messages: [] }),
        }),
      (id: string) => fetch(`${server.url}/sessions/${id}/v1/completions`, { method: 'GET', headers: auth }),
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/chat/completions`, {
          method: 'POST',
          headers: { ...JSON_HEADERS, ...auth },
          body: '{"model": ',
        }),
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/embeddings`, { method: 'POST', headers: { ...JSON_HEADERS, ...auth }, body: '{}' }),
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/completions`, {
          method: 'POST',
          headers: { ...JSON_HEADERS, ...auth },
          body: JSON.stringify({ model: 'other', prompt: 'ab' }),
        }),
      (id: string) =>
        fetch(`${server.url}/sessions/${id}/v1/completions`, {
          method: 'POST',
          headers: JSON_HEADERS,
          body: JSON.stringify({ model: 'rxrl-policy', prompt: 'ab' }),
        }),
    ];
    const statuses = new Set<number>();
    for (let i = 0; i < 70; i++) {
      const response = await refused[i % refused.length](`intruder-${i}`);
      statuses.add(response.status);
      expect(response.status).toBeGreaterThanOrEqual(400);
      expect(response.status).toBeLessThan(500);
      await response.body?.cancel();
    }
    expect([...statuses].sort()).toEqual([400, 401, 404, 405]);
    expect(server.sessions.size).toBe(0);
    // Every slot is still there for the agents.
    for (let k = 0; k < 4; k++) {
      const client = new OpenAI({ baseURL: `${server.url}/sessions/agent-${k}/v1`, apiKey: 'k', maxRetries: 0 });
      const out = await client.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 2 });
      expect(out.choices[0].text).toBe('ab');
    }
    expect(server.sessions.size).toBe(4);
  });

  it('holds a session to its token limit under concurrent calls: each reserves prompt + n × max_tokens at admission', async () => {
    const { server } = await runOnServer({ sessions: { maxTokens: 100 } });
    const client = new OpenAI({ baseURL: `${server.url}/sessions/agent/v1`, apiKey: 'EMPTY', maxRetries: 0 });
    // Each call records 11 tokens (bos a b, then 8 sampled): 9 fit in 100.
    const calls = await Promise.allSettled(
      Array.from({ length: 20 }, () => client.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 8 })),
    );
    const refused = calls.filter((c): c is PromiseRejectedResult => c.status === 'rejected');
    for (const { reason } of refused) {
      expect(reason).toBeInstanceOf(OpenAI.BadRequestError);
      expect((reason as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('session_too_large');
    }
    const session = server.sessions.get('agent');
    expect(session.tokens).toBeLessThanOrEqual(100);
    expect(session.calls).toHaveLength(9);
    expect(refused).toHaveLength(11);
    expect(session.reserved).toBe(0);
    // Streamed calls reserve too, and give their reservations back when they end.
    const streamer = new OpenAI({ baseURL: `${server.url}/sessions/streamer/v1`, apiKey: 'EMPTY', maxRetries: 0 });
    const read = async (): Promise<string> => {
      let text = '';
      for await (const chunk of await streamer.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 8, stream: true }))
        text += chunk.choices[0]?.text ?? '';
      return text;
    };
    const streams = await Promise.allSettled(Array.from({ length: 20 }, read));
    expect(streams.filter((c) => c.status === 'fulfilled').map((c) => c.value)).toEqual(Array.from({ length: 9 }, () => 'abababab'));
    expect(server.sessions.get('streamer').tokens).toBe(99);
    expect(server.sessions.get('streamer').reserved).toBe(0);
  });

  it('refuses a prompt of megabytes that cannot fit the context before tokenizing it, and /health answers', async () => {
    class WatchedTokenizer extends CharTokenizer {
      longest = 0;
      override encode(text: string, options?: EncodeOptions): number[] {
        this.longest = Math.max(this.longest, text.length);
        return super.encode(text, options);
      }
    }
    const watched = new WatchedTokenizer();
    const model = new RunOnModel(watched.encode('ab'), watched.vocabSize, 4096);
    const server = await serve({ model: model as unknown as PolicyModel, tokenizer: watched, port: 0 });
    owned.push(server);
    const huge = 'ab'.repeat(1_950_000); // 3.9 MB
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    for (const call of [
      () => client.completions.create({ model: 'rxrl-policy', prompt: huge, max_tokens: 4 }),
      () => client.completions.create({ model: 'rxrl-policy', prompt: ['ab', huge] }),
      () => client.chat.completions.create({ model: 'rxrl-policy', messages: [{ role: 'user', content: huge }] }),
    ]) {
      const error = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(OpenAI.BadRequestError);
      expect((error as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('context_length_exceeded');
    }
    expect(watched.longest).toBeLessThan(1000);
    expect((await fetch(`${server.url}/health`)).status).toBe(200);
    // A prompt that fits is still served.
    expect((await client.completions.create({ model: 'rxrl-policy', prompt: 'ab'.repeat(100), max_tokens: 2 })).choices[0].text).toBe('ab');
  });

  it('refuses a huge chat for a byte-level BPE tokenizer and its Jinja template before encoding it', async () => {
    const files = await readTokenizerFiles(fileURLToPath(new URL('../fixtures/hf/tiny-qwen2/', import.meta.url)));
    let longest = 0;
    const hf = new (class extends HfTokenizer {
      override encode(text: string, options?: EncodeOptions): number[] {
        longest = Math.max(longest, text.length);
        return super.encode(text, options);
      }
    })({ tokenizer: files.tokenizer!, config: files.config, generationConfig: files.generationConfig });
    const template = createJinjaChatTemplate(hf, files.chatTemplate ?? String(files.config.chat_template));
    const model = new RunOnModel(hf.encode('ab'), hf.vocabSize, 1024);
    const server = await serve({ model: model as unknown as PolicyModel, tokenizer: hf, chatTemplate: template, port: 0 });
    owned.push(server);
    longest = 0;
    const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'EMPTY', maxRetries: 0 });
    const error = await client.chat.completions
      .create({ model: 'rxrl-policy', messages: [{ role: 'user', content: 'é'.repeat(1_000_000) + 'ab '.repeat(600_000) }] })
      .then(
        () => undefined,
        (e: unknown) => e,
      );
    expect((error as InstanceType<typeof OpenAI.BadRequestError>).code).toBe('context_length_exceeded');
    expect(longest).toBe(0);
  });

  it('writes a stream as the client reads it: one that reads nothing leaves at most a buffer waiting; a slow one gets every token', async () => {
    const logs: Record<string, unknown>[] = [];
    const { server, model } = await runOnServer({ log: (record) => logs.push({ ...record }) }, 200_000);
    const maxTokens = 100_000;
    // A client that sends its request and never reads: the server must stop writing once the connection is full.
    const generated = model.nextEnd();
    const stalled = rawPost(server.port, '/sessions/stalled/v1/completions', {
      model: 'rxrl-policy',
      prompt: 'ab',
      max_tokens: maxTokens,
      stream: true,
    });
    await generated;
    expect(model.produced).toBe(maxTokens);
    stalled.destroy();
    const stream = await waitFor(() => logs.find((r) => r.event === 'stream'), 'the stream record');
    expect(stream.chunks as number).toBeLessThan(maxTokens / 2); // ~170 bytes a chunk: the socket holds a few MB
    expect(stream.peak_buffered_bytes as number).toBeLessThan(64 * 1024);
    // It went away before it had the answer: nothing recorded, and the session it opened is freed.
    await waitFor(() => (logs.some((r) => r.event === 'request' && r.status === 499) ? true : undefined), 'the cancelled request');
    expect(server.sessions.size).toBe(0);

    // A client that reads only after the generation has ended gets the whole answer, each choice in order.
    const done = model.nextEnd();
    const slow = rawPost(server.port, '/v1/completions', { model: 'rxrl-policy', prompt: 'ab', max_tokens: 20_000, n: 2, stream: true });
    await done;
    const text = await readAll(slow);
    const texts = ['', ''];
    let finished = 0;
    for (const line of text.split('\n')) {
      if (!line.startsWith('data: {')) continue;
      const chunk = JSON.parse(line.slice('data: '.length)) as { choices: { index: number; text: string; finish_reason: string | null }[] };
      for (const choice of chunk.choices) {
        texts[choice.index] += choice.text;
        if (choice.finish_reason === 'length') finished++;
      }
    }
    expect(texts).toEqual(['ab'.repeat(10_000), 'ab'.repeat(10_000)]);
    expect(finished).toBe(2);
  });

  it('refuses a reward whose sum would not be finite, leaving the stored reward as it was', async () => {
    const { server } = await runOnServer();
    const client = new OpenAI({ baseURL: `${server.url}/sessions/greedy/v1`, apiKey: 'EMPTY', maxRetries: 0 });
    const out = await client.completions.create({ model: 'rxrl-policy', prompt: 'ab', max_tokens: 2 });
    const post = (body: unknown) =>
      fetch(`${server.url}/sessions/greedy/reward`, { method: 'POST', headers: JSON_HEADERS, body: JSON.stringify(body) });
    expect((await post({ reward: 1.7e308 })).status).toBe(200);
    const twice = await post({ reward: 1.7e308 });
    expect(twice.status).toBe(400);
    expect(((await twice.json()) as { error: { param: string } }).error.param).toBe('reward');
    // A call's reward adds to the session's in every sample: that sum must stay finite too.
    expect((await post({ reward: 1.7e308, call: out.id })).status).toBe(400);
    expect((await post({ reward: 0.5, call: out.id })).status).toBe(200);
    const json = (await (await fetch(`${server.url}/sessions/greedy`)).json()) as { reward: number; trajectories: { reward: number }[] };
    expect(json.reward).toBe(1.7e308);
    expect(json.trajectories.map((t) => t.reward)).toEqual([1.7e308 + 0.5]);
  });
});
