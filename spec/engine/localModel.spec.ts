import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';
import { LocalEngine } from '../../lib/engine/local.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';

const tokenizer = new CharTokenizer('abcde=');
const config = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 2, nHeads: 2, dFF: 32, maxSeqLen: 16 };
const prompts = ['ab=', 'abcde=', 'c=', 'edcb=', 'aaaa=', 'b='];
const requests: GenerateRequest[] = prompts.map((p, i) => ({
  promptTokens: tokenizer.encode(p, { addBos: true }),
  maxTokens: 6,
  temperature: 1,
  seed: 100 + i,
}));

describe('LocalEngine over a real PolicyModel', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
  });

  it('micro-batched requests return the same tokens and log-probs as unbatched ones', async () => {
    const model = PolicyModel.create(config, 8);
    const batched = new LocalEngine(model, { tokenizer, maxBatchSize: 64, maxWaitMs: 5 });
    const single = new LocalEngine(model, { tokenizer, maxBatchSize: 1 });
    const together = await Promise.all(requests.map((r) => batched.generate([r])));
    const alone: GenerateResponse[] = [];
    for (const r of requests) alone.push((await single.generate([r]))[0]);
    expect(batched.batchSizes).toEqual([requests.length]);
    expect(single.batchSizes).toEqual(requests.map(() => 1));
    together.forEach(([response], i) => {
      expect(response.tokens).toEqual(alone[i].tokens);
      expect(response.finishReason).toEqual(alone[i].finishReason);
      response.logprobs.forEach((lp, j) => expect(lp).toBeCloseTo(alone[i].logprobs[j], 5));
    });
    model.dispose();
  });

  it('an invalid request in a batch fails alone; the others get what they would get alone', async () => {
    const model = PolicyModel.create(config, 8);
    const batched = new LocalEngine(model, { tokenizer, maxBatchSize: 64, maxWaitMs: 5 });
    const single = new LocalEngine(model, { tokenizer, maxBatchSize: 1 });
    const tooLong: GenerateRequest = { promptTokens: tokenizer.encode('abcdeabcdeab=', { addBos: true }), maxTokens: 6, seed: 1 };
    const mixed = [requests[0], tooLong, requests[1], requests[2]];
    const settled = await Promise.allSettled(mixed.map((r) => batched.generate([r])));
    expect(settled[1]).toMatchObject({ status: 'rejected', reason: expect.objectContaining({ name: 'ConfigError' }) });
    for (const i of [0, 2, 3]) {
      const outcome = settled[i];
      expect(outcome.status).toBe('fulfilled');
      const [alone] = await single.generate([mixed[i]]);
      expect((outcome as PromiseFulfilledResult<GenerateResponse[]>).value[0].tokens).toEqual(alone.tokens);
    }
    model.dispose();
  });

  it('loads new weights as a new version, and generate leaks no tensor', async () => {
    const model = PolicyModel.create(config, 8);
    const other = PolicyModel.create(config, 9);
    const engine = new LocalEngine(model, { tokenizer });
    await engine.generate(requests); // warm up
    const tensors = tf.memory().numTensors;
    const before = await engine.generate(requests);
    expect(tf.memory().numTensors).toBe(tensors);
    await engine.loadWeights(1, other.getWeights());
    const after = await engine.generate(requests);
    expect(after.every((r) => r.policyVersion === 1)).toBe(true);
    expect(before.every((r) => r.policyVersion === 0)).toBe(true);
    expect(after.map((r) => r.logprobs)).not.toEqual(before.map((r) => r.logprobs));
    model.dispose();
    other.dispose();
  });
});

describe('LocalEngine weight sync policies', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
  });

  const long: GenerateRequest[] = Array.from({ length: 8 }, (_, i) => ({
    promptTokens: tokenizer.encode('ab=', { addBos: true }),
    maxTokens: 10,
    stopTokens: [],
    seed: i,
  }));

  async function loadDuring(policy: 'continue' | 'interrupt'): Promise<{ responses: GenerateResponse[]; engine: LocalEngine }> {
    const model = PolicyModel.create(config, 21);
    const other = PolicyModel.create(config, 22);
    const engine = new LocalEngine(model, { tokenizer, weightSync: policy, maxWaitMs: 0 });
    const pending = engine.generate(long);
    // Let the batch start and take a couple of decoding steps, then publish version 1.
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve));
    await engine.loadWeights(1, other.getWeights());
    const responses = await pending;
    model.dispose();
    other.dispose();
    return { responses, engine };
  }

  it('continue: in-flight generations finish with the old weights and the old version', async () => {
    const { responses, engine } = await loadDuring('continue');
    expect(engine.resumed).toBe(0);
    expect(responses.every((r) => r.policyVersion === 0 && r.tokens.length === 10)).toBe(true);
  });

  it('interrupt: partial responses resume with the new weights, tagged with the oldest version', async () => {
    const { responses, engine } = await loadDuring('interrupt');
    expect(engine.resumed).toBe(long.length);
    expect(engine.batchSizes).toEqual([long.length, long.length]);
    for (const r of responses) {
      expect(r.tokens).toHaveLength(10);
      expect(r.logprobs).toHaveLength(10);
      expect(r.policyVersion).toBe(0);
      expect(r.finishReason).toBe('length');
    }
    expect(() => new LocalEngine(PolicyModel.create(config, 1), { tokenizer, weightSync: 'later' as never })).toThrow(
      /continue, interrupt/,
    );
  });
});
