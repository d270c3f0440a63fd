import { mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { from, lastValueFrom, toArray } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../lib/engine/local.js';
import { OpenAIEngine, resolveEndpoint } from '../../lib/engine/openai.js';
import type { GenerateRequest } from '../../lib/model/types.js';
import { ConfigError, EngineError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { isSampleFailure, type Trajectory } from '../../lib/core/types.js';
import { rollout } from '../../operators/rollout.js';
import { partialCreditEvaluator } from '../../recipes/stringTransform.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';

const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const calc = { name: 'calc', parameters: { type: 'object', properties: { expression: { type: 'string' } } } };

let dir: string;
const cleanup: (() => unknown)[] = [];

async function start(model: PolicyModel): Promise<{ server: RxrlServer; engine: OpenAIEngine }> {
  const server = await serve({ model, tokenizer });
  cleanup.push(
    () => server.close(),
    () => model.dispose(),
  );
  const engine = new OpenAIEngine({
    baseURL: server.baseURL,
    model: server.modelName,
    tokenizer,
    weightSync: { directory: join(dir, `sync-${server.port}`), config },
  });
  return { server, engine };
}

const requests: GenerateRequest[] = ['ab=', 'abcd=', 'e='].map((p, i) => ({
  promptTokens: tokenizer.encode(p, { addBos: true }),
  maxTokens: 8,
  temperature: 1,
  seed: 10 + i,
}));

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-openai-'));
});

afterAll(async () => {
  for (const fn of cleanup.reverse()) await fn();
  await rm(dir, { recursive: true, force: true });
});

describe('OpenAIEngine against rxrl serve', () => {
  it('samples the same tokens and log-probs as the in-process engine for the same weights and seeds', async () => {
    const model = PolicyModel.create(config, 11);
    const { engine } = await start(model);
    const local = new LocalEngine(PolicyModel.fromWeights(config, model.getWeights()), { tokenizer });
    const remote = await engine.generate(requests);
    const reference = await local.generate(requests);
    remote.forEach((r, i) => {
      expect(r.tokens).toEqual(reference[i].tokens);
      expect(r.finishReason).toBe(reference[i].finishReason);
      expect(r.policyVersion).toBe(0);
      r.logprobs.forEach((lp, j) => expect(lp).toBeCloseTo(reference[i].logprobs[j], 4));
    });
    expect(engine.stats()).toMatchObject({ calls: 3, attempts: 3, retries: 0, failures: 0 });
    expect(engine.metrics()['engine/calls']).toBe(3);
  });

  it('passes stop tokens, and feeds the rollout operator', async () => {
    const { engine } = await start(PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'dcba'))));
    const [cut] = await engine.generate([
      { promptTokens: tokenizer.encode('ab=', { addBos: true }), maxTokens: 8, stopTokens: tokenizer.encode('c') },
    ]);
    expect(cut).toMatchObject({ tokens: tokenizer.encode('dc'), finishReason: 'stop' });
    const out = await lastValueFrom(
      from([{ id: 'abcd', prompt: 'ab=', answer: 'dcba' }]).pipe(
        rollout(engine, { samplesPerTask: 3, concurrency: 3, maxTokens: 6, evaluator: partialCreditEvaluator }),
        toArray(),
      ),
    );
    expect(out.filter(isSampleFailure)).toEqual([]);
    for (const t of out as Trajectory[]) {
      expect(t).toMatchObject({ reward: 1, finishReason: 'stop', policyVersion: 0, modelTag: 'policy' });
      expect(t.responseTokens).toEqual([...tokenizer.encode('dcba'), tokenizer.eosId]);
      expect(t.lossMask).toEqual([1, 1, 1, 1, 1]);
      expect(t.logprobs.every((lp) => lp <= 0 && lp > -0.01)).toBe(true);
    }
  });

  it('no stop tokens: sends ignore_eos, so the server runs past its end-of-sequence token to max_tokens', async () => {
    const { engine } = await start(PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'dcba'))));
    const prompt = tokenizer.encode('ab=', { addBos: true });
    const scripted = [...tokenizer.encode('dcba'), tokenizer.eosId];
    const [stopped, running] = await engine.generate([
      { promptTokens: prompt, maxTokens: 8, seed: 1 },
      { promptTokens: prompt, maxTokens: 8, seed: 1, stopTokens: [] },
    ]);
    expect(stopped).toMatchObject({ tokens: scripted, finishReason: 'stop' });
    // rxrl serve stops at its tokenizer's stop ids whatever stop_token_ids says, unless the body has ignore_eos.
    expect(running.finishReason).toBe('length');
    expect(running.tokens).toHaveLength(8);
    expect(running.tokens.slice(0, 5)).toEqual(scripted);
    const out = await lastValueFrom(
      from([{ id: 'abcd', prompt: 'ab=', answer: 'dcba' }]).pipe(
        rollout(engine, { samplesPerTask: 2, concurrency: 2, maxTokens: 7, evaluator: partialCreditEvaluator, ignoreEos: true }),
        toArray(),
      ),
    );
    expect(out.filter(isSampleFailure)).toEqual([]);
    for (const t of out as Trajectory[]) {
      expect(t.finishReason).toBe('length');
      expect(t.responseTokens).toHaveLength(7);
      expect(t.responseTokens.slice(0, 5)).toEqual(scripted);
    }
  });

  it('chats: parsed tool calls, prompt token ids and per-token log-probs', async () => {
    const { engine } = await start(
      PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5')))),
    );
    const turn = await engine.chat({ messages: [{ role: 'user', content: '2+3' }], tools: [calc], maxTokens: 12, seed: 1 });
    expect(turn.message).toMatchObject({
      role: 'assistant',
      content: '',
      toolCalls: [{ name: 'calc', arguments: '{"expression":"2+3"}' }],
    });
    expect(turn.promptTokens).toEqual([1, ...tokenizer.encode('2+3'), 2]);
    expect(turn.tokens).toEqual([...tokenizer.encode('calc(2+3)'), 2]);
    expect(turn.logprobs).toHaveLength(turn.tokens.length);
    expect(turn.finishReason).toBe('stop');
    const answer = await engine.chat({
      messages: [{ role: 'user', content: '2+3' }, turn.message, { role: 'tool', content: '5', toolCallId: turn.message.toolCalls![0].id }],
      tools: [calc],
      maxTokens: 4,
    });
    expect(answer.message).toEqual({ role: 'assistant', content: '5' });
    expect(answer.promptTokens).toEqual([...turn.promptTokens, ...turn.tokens, ...tokenizer.encode('5'), 2]);
  });

  it('publishes weights as safetensors plus an update call: the served version and outputs change', async () => {
    const first = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'aa')));
    const { server, engine } = await start(first);
    const prompt = { promptTokens: tokenizer.encode('ab=', { addBos: true }), maxTokens: 6, seed: 2 };
    expect((await engine.generate([prompt]))[0].tokens).toEqual([...tokenizer.encode('aa'), 2]);
    const sync = join(dir, `sync-${server.port}`);
    for (const [version, text] of [
      [1, 'bb'],
      [2, 'cc'],
      [3, 'dd'],
    ] as const) {
      await engine.loadWeights(version, scriptedWeights(config, tokenizer, writeAt(4, text)));
      expect(engine.version).toBe(version);
      expect(server.version).toBe(version);
      const [response] = await engine.generate([prompt]);
      expect(response).toMatchObject({ tokens: [...tokenizer.encode(text), 2], policyVersion: version });
    }
    expect((await readdir(sync)).sort()).toEqual(['v2', 'v3']); // keep: 2
    expect(engine.stats().weightLoads).toBe(3);

    await expect(engine.loadWeights(4, new Map([['lmHead', { shape: [1], data: new Float32Array(1) }]]))).rejects.toSatisfy(
      (e: unknown) => e instanceof EngineError && !e.retriable && e.context.status === 400,
    );
    expect(engine.version).toBe(3);
    expect(server.version).toBe(3);

    const absolute = new OpenAIEngine({
      baseURL: server.baseURL,
      model: server.modelName,
      tokenizer,
      weightSync: { directory: join(dir, 'dirs'), config, endpoint: `${server.url}/update_weights_from_disk` },
    });
    await absolute.loadWeights(9, scriptedWeights(config, tokenizer, writeAt(4, 'ee')));
    expect(await readdir(join(dir, 'dirs'))).toEqual(['v9']);
    expect((await readdir(join(dir, 'dirs', 'v9'))).sort()).toEqual(
      expect.arrayContaining(['config.json', 'generation_config.json', 'model.safetensors']),
    );
    expect((await engine.generate([prompt]))[0]).toMatchObject({ tokens: [...tokenizer.encode('ee'), 2], policyVersion: 9 });

    const noSync = new OpenAIEngine({ baseURL: server.baseURL, model: server.modelName, tokenizer });
    await expect(noSync.loadWeights(1, new Map())).rejects.toBeInstanceOf(ConfigError);
  });

  it('validates its options and resolves update endpoints on the server origin', () => {
    const base = { baseURL: 'http://127.0.0.1:1/v1', model: 'm', tokenizer };
    expect(() => new OpenAIEngine({ ...base, concurrency: 0 })).toThrow(ConfigError);
    expect(() => new OpenAIEngine({ ...base, concurrency: Infinity })).toThrow(ConfigError);
    expect(() => new OpenAIEngine({ ...base, timeoutMs: -1 })).toThrow(ConfigError);
    expect(() => new OpenAIEngine({ ...base, model: '' })).toThrow(ConfigError);
    expect(resolveEndpoint('http://h:1/v1', '/update_weights_from_disk')).toBe('http://h:1/update_weights_from_disk');
    expect(resolveEndpoint('http://h:1/v1/', 'update')).toBe('http://h:1/update');
    expect(resolveEndpoint('http://h:1/v1', 'https://other/x')).toBe('https://other/x');
  });
});
