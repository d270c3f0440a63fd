import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';

import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { AbortError, ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { MIN_SHARED_POSITIONS, distinctPromptRows, padPrompts, splitSharedPrefix } from '../../lib/model/generate.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PREFILL_ROWS, PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { ALL_BACKENDS } from '../helpers/backends.js';

const LOGPROB_TOLERANCE = 1e-4;
const quiet = { info: (): void => undefined };
const tok = new CharTokenizer();
const CONFIG: PolicyConfig = { vocabSize: tok.vocabSize, dModel: 32, nLayers: 2, nHeads: 4, dFF: 64, maxSeqLen: 40 };

/** Left-padded prompts of different lengths, different budgets and stop sets, so rows retire at different steps. */
function requests(): GenerateRequest[] {
  return [
    { promptTokens: tok.encode('12+30=', { addBos: true }), maxTokens: 12, seed: 1, stopTokens: [] },
    { promptTokens: tok.encode('a', { addBos: true }), maxTokens: 20, seed: 2, temperature: 0.7, stopTokens: [] },
    { promptTokens: tok.encode('reverse: abcdef ->', { addBos: true }), maxTokens: 16, seed: 3, topP: 0.9 },
    { promptTokens: tok.encode('q: 3*4?', { addBos: true }), maxTokens: 5, seed: 4, temperature: 0 },
    // Many stop tokens: this row ends early with 'stop'.
    { promptTokens: tok.encode('xyz', { addBos: true }), maxTokens: 20, seed: 5, stopTokens: [...Array(30).keys()].map((i) => i + 3) },
  ];
}

function expectSame(a: GenerateResponse[], b: GenerateResponse[]): void {
  expect(a.map((r) => r.tokens)).toEqual(b.map((r) => r.tokens));
  expect(a.map((r) => r.finishReason)).toEqual(b.map((r) => r.finishReason));
  a.forEach((r, i) => {
    r.logprobs.forEach((lp, t) => expect(Math.abs(lp - b[i].logprobs[t])).toBeLessThanOrEqual(LOGPROB_TOLERANCE));
  });
}

/** `model.generate(requests)`, with the `[rows, width]` of each prefill pass it ran. */
async function generateSpied(model: PolicyModel, requests: GenerateRequest[]): Promise<{ all: GenerateResponse[]; prefilled: number[][] }> {
  const prefilled: number[][] = [];
  const prefill = model.prefillInternal.bind(model);
  const spy = vi.spyOn(model, 'prefillInternal').mockImplementation((batch) => {
    prefilled.push([batch.rows, batch.width]);
    return prefill(batch);
  });
  try {
    return { all: await model.generate(requests), prefilled };
  } finally {
    spy.mockRestore();
  }
}

describe('PolicyModel.generate', () => {
  let model: PolicyModel;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    model = PolicyModel.create(CONFIG, 11);
  });
  afterAll(() => {
    model.dispose();
  });

  it('the KV cache gives the same tokens and log-probs as full recompute (left-padded, mixed lengths)', async () => {
    const cached = await model.generate(requests());
    const recomputed = await model.generateRecompute(requests());
    expectSame(cached, recomputed);
    expect(cached[4].finishReason).toBe('stop');
    expect(cached[3].finishReason).toBe('length');
    expect(cached[3].tokens).toHaveLength(5);
    expect(cached[0].tokens).toHaveLength(12);
    expect(new Set(cached.map((r) => r.tokens.length)).size).toBeGreaterThan(2);
  });

  it('is the same on wasm: cache vs recompute, and wasm vs cpu log-probs', async () => {
    const cpu = await model.generate(requests());
    const weights = model.getWeights();
    await initBackend('wasm', { logger: quiet });
    const onWasm = PolicyModel.fromWeights(CONFIG, weights);
    const cached = await onWasm.generate(requests());
    const recomputed = await onWasm.generateRecompute(requests());
    onWasm.dispose();
    await initBackend('cpu', { logger: quiet });
    expectSame(cached, recomputed);
    expectSame(cached, cpu);
  });

  it('is deterministic per seed, whatever else is in the batch', async () => {
    const all = await model.generate(requests());
    const again = await model.generate(requests());
    expect(again.map((r) => r.tokens)).toEqual(all.map((r) => r.tokens));
    const alone = await model.generate([requests()[1]]);
    expect(alone[0].tokens).toEqual(all[1].tokens);
    const reseeded = await model.generate([{ ...requests()[1], seed: 77 }]);
    expect(reseeded[0].tokens).not.toEqual(all[1].tokens);
  });

  it('prefills a long batch in slices of PREFILL_ROWS rows with turns of the event loop between them, sampling what each row samples alone', async () => {
    const rows = 2 * PREFILL_ROWS + 3;
    // Distinct prompts (equal ones are prefilled once): each row's prompt ends with its own index.
    const many = Array.from({ length: rows }, (_, i) => {
      const base = requests()[i % 5];
      return { ...base, promptTokens: [...base.promptTokens, ...tok.encode(String(i))], maxTokens: 1, seed: 100 + i };
    });
    let turns = 0;
    let ticking = true;
    const tick = (): void => {
      turns++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const tensors = tf.memory().numTensors;
    const all = await model.generate(many); // one token: no decode step, so every turn here is the prefill's
    ticking = false;
    expect(turns).toBeGreaterThanOrEqual(2); // three slices
    expect(tf.memory().numTensors).toBe(tensors);
    for (const i of [0, PREFILL_ROWS - 1, PREFILL_ROWS, rows - 1]) {
      const [alone] = await model.generate([many[i]]);
      expect(alone.tokens).toEqual(all[i].tokens);
      expect(Math.abs(alone.logprobs[0] - all[i].logprobs[0])).toBeLessThanOrEqual(LOGPROB_TOLERANCE);
    }
    const longer = await model.generate(many.map((r) => ({ ...r, maxTokens: 4 })));
    expectSame(longer, await model.generateRecompute(many.map((r) => ({ ...r, maxTokens: 4 }))));
  });

  it('prefills each distinct prompt once: a group of rows sharing a prompt samples what each row samples alone', async () => {
    const [a, b] = [requests()[0], requests()[2]];
    const grouped = [a, a, b, a, b, b].map((r, i) => ({ ...r, maxTokens: 6, stopTokens: [], seed: 10 + i }));
    const tensors = tf.memory().numTensors;
    const { all, prefilled } = await generateSpied(model, grouped);
    expect(prefilled.map(([rows]) => rows)).toEqual([2]);
    expect(tf.memory().numTensors).toBe(tensors);
    expectSame(all, await model.generateRecompute(grouped));
    for (const i of [0, 3, 5]) {
      const [alone] = await model.generate([grouped[i]]);
      expect(alone.tokens).toEqual(all[i].tokens);
    }
  });

  it("prefills a beginning every prompt shares once, then each prompt's rest after it: what full recompute and each row alone sample", async () => {
    const system = 'system: be brief. q: ';
    const rests = ['1+2=', '30*4=', 'abc', 'x'];
    const shared = rests.flatMap((rest, p) =>
      [0, 1].map((k) => ({
        promptTokens: tok.encode(system + rest, { addBos: true }),
        maxTokens: 6,
        stopTokens: [],
        seed: 20 + 2 * p + k,
      })),
    );
    const prefix = tok.encode(system, { addBos: true }).length;
    expect((rests.length - 1) * prefix).toBeGreaterThanOrEqual(MIN_SHARED_POSITIONS);
    const tensors = tf.memory().numTensors;
    const { all, prefilled } = await generateSpied(model, shared);
    expect(prefilled).toEqual([[1, prefix]]);
    expect(tf.memory().numTensors).toBe(tensors);
    expectSame(all, await model.generateRecompute(shared));
    for (const i of [0, 3, 6]) {
      const [alone] = await model.generate([shared[i]]);
      expect(alone.tokens).toEqual(all[i].tokens);
      alone.logprobs.forEach((lp, t) => expect(Math.abs(lp - all[i].logprobs[t])).toBeLessThanOrEqual(LOGPROB_TOLERANCE));
    }
  });

  it("splitSharedPrefix: the longest common beginning short of each row's last token, the rest left-padded at its positions", () => {
    const long = Array.from({ length: 40 }, (_, i) => 3 + i);
    const split = splitSharedPrefix(padPrompts([[...long, 7, 8, 9], [...long, 7], long, [...long, 5, 6]]));
    // The third prompt is the beginning itself: its last token stays in the rest.
    expect(split?.prefix.rows).toBe(1);
    expect([...(split?.prefix.inputIds ?? [])]).toEqual(long.slice(0, 39));
    expect([...(split?.prefix.positionIds ?? [])]).toEqual([...long.keys()].slice(0, 39));
    expect(split?.rest.width).toBe(4);
    expect([...(split?.rest.inputIds ?? [])]).toEqual([42, 7, 8, 9, 0, 0, 42, 7, 0, 0, 0, 42, 0, 42, 5, 6]);
    expect([...(split?.rest.positionIds ?? [])]).toEqual([39, 40, 41, 42, 0, 0, 39, 40, 0, 0, 0, 39, 0, 39, 40, 41]);
    expect([...(split?.keyMask.subarray(0, 43) ?? [])]).toEqual(Array<number>(43).fill(1));
    expect([...(split?.keyMask.subarray(2 * 43 + 39, 3 * 43) ?? [])]).toEqual([0, 0, 0, 1]);
    // Saving fewer than MIN_SHARED_POSITIONS positions, or one row: no split.
    expect(
      splitSharedPrefix(
        padPrompts([
          [...long.slice(0, 20), 1],
          [...long.slice(0, 20), 2],
        ]),
      ),
    ).toBeNull();
    expect(splitSharedPrefix(padPrompts([[...long, 1]]))).toBeNull();
  });

  it('distinctPromptRows: rows equal in ids and mask share one row; a padded row differs from an unpadded one with a 0 token', () => {
    expect(
      distinctPromptRows(
        padPrompts([
          [1, 2],
          [3, 4],
          [5, 6],
        ]),
      ),
    ).toBeNull();
    const rows = distinctPromptRows(
      padPrompts([
        [1, 2, 3],
        [2, 3],
        [1, 2, 3],
        [2, 3],
        [0, 2, 3],
      ]),
    );
    expect(rows?.distinct.rows).toBe(3);
    expect([...(rows?.index ?? [])]).toEqual([0, 1, 0, 1, 2]);
    expect([...(rows?.distinct.attentionMask ?? [])]).toEqual([1, 1, 1, 0, 1, 1, 1, 1, 1]);
    expect([...(rows?.distinct.positionIds ?? [])]).toEqual([0, 1, 2, 0, 0, 1, 0, 1, 2]);
  });

  it('reports un-tempered log-probs that match tokenLogprobs on the full sequence', async () => {
    const [res] = await model.generate([
      { promptTokens: tok.encode('ab', { addBos: true }), maxTokens: 6, seed: 9, temperature: 0.5, stopTokens: [] },
    ]);
    const seq = [...tok.encode('ab', { addBos: true }), ...res.tokens];
    const T = seq.length;
    const lp = tf.tidy(
      () =>
        model
          .tokenLogprobs(
            tf.tensor2d(seq, [1, T], 'int32'),
            tf.ones([1, T]) as tf.Tensor2D,
            tf.tensor2d([...Array(T).keys()], [1, T], 'int32'),
          )
          .logprobs.arraySync()[0],
    );
    res.logprobs.forEach((x, t) => expect(Math.abs(x - lp[3 - 1 + t])).toBeLessThanOrEqual(LOGPROB_TOLERANCE));
  });

  it('greedy (temperature 0) and a tiny top-p both pick the arg-max token', async () => {
    const prompt = tok.encode('hello', { addBos: true });
    const [greedy] = await model.generate([{ promptTokens: prompt, maxTokens: 8, temperature: 0, stopTokens: [] }]);
    const [nucleus] = await model.generate([{ promptTokens: prompt, maxTokens: 8, topP: 1e-6, seed: 3, stopTokens: [] }]);
    expect(nucleus.tokens).toEqual(greedy.tokens);
    const seq = [...prompt, ...greedy.tokens.slice(0, 1)];
    const first = tf.tidy(() => {
      const T = prompt.length;
      const logits = model.logits(
        tf.tensor2d(prompt, [1, T], 'int32'),
        tf.ones([1, T]) as tf.Tensor2D,
        tf.tensor2d([...Array(T).keys()], [1, T], 'int32'),
      );
      return tf.argMax(tf.reshape(tf.slice(logits, [0, T - 1, 0], [1, 1, -1]), [-1])).dataSync()[0];
    });
    expect(seq[prompt.length]).toBe(first);
  });

  it('stops at stop tokens (kept in the output) and defaults to the options stopIds', async () => {
    const stopAll = [...Array(tok.vocabSize).keys()];
    const [res] = await model.generate([{ promptTokens: [1, 5], maxTokens: 10, seed: 1, stopTokens: stopAll }]);
    expect(res.tokens).toHaveLength(1);
    expect(res.finishReason).toBe('stop');
    // With the greedy token as the default stop set, generation ends at once too; without one it runs to maxTokens.
    const [greedy] = await model.generate([{ promptTokens: [1, 5], maxTokens: 10, temperature: 0, stopTokens: [] }]);
    const [viaEos] = await model.generate([{ promptTokens: [1, 5], maxTokens: 10, temperature: 0 }], { stopIds: [greedy.tokens[0]] });
    expect(viaEos.tokens).toEqual([greedy.tokens[0]]);
    expect(viaEos.finishReason).toBe('stop');
    const [unbounded] = await model.generate([{ promptTokens: [1, 5], maxTokens: 10, temperature: 0 }]);
    expect(unbounded).toMatchObject({ tokens: greedy.tokens, finishReason: 'length' });
  });

  it('honours an abort between steps: all unfinished rows end with abort and keep their tokens', async () => {
    const controller = new AbortController();
    const pending = model.generate(requests(), { signal: controller.signal, version: 4 });
    setImmediate(() => controller.abort());
    const out = await pending;
    expect(out.every((r) => r.policyVersion === 4)).toBe(true);
    const aborted = out.filter((r) => r.finishReason === 'abort');
    expect(aborted.length).toBeGreaterThan(0);
    for (const r of aborted) {
      expect(r.tokens.length).toBeGreaterThan(0);
      expect(r.tokens.length).toBe(r.logprobs.length);
    }
    expect(Math.max(...out.map((r) => r.tokens.length))).toBeLessThan(12);
  });

  it('rejects with AbortError when already aborted, and validates requests', async () => {
    const controller = new AbortController();
    controller.abort();
    await expect(model.generate(requests(), { signal: controller.signal })).rejects.toBeInstanceOf(AbortError);
    await expect(model.generate([{ promptTokens: [], maxTokens: 3 }])).rejects.toBeInstanceOf(ConfigError);
    await expect(model.generate([{ promptTokens: [1, 99], maxTokens: 3 }])).rejects.toBeInstanceOf(ConfigError);
    await expect(model.generate([{ promptTokens: [1], maxTokens: 40 }])).rejects.toBeInstanceOf(ConfigError);
    await expect(model.generate([{ promptTokens: [1], maxTokens: 3, topP: 0 }])).rejects.toBeInstanceOf(ConfigError);
    await expect(model.generate([{ promptTokens: [1], maxTokens: 3, temperature: -1 }])).rejects.toBeInstanceOf(ConfigError);
    const [empty] = await model.generate([{ promptTokens: [1], maxTokens: 0 }]);
    expect(empty).toEqual({ tokens: [], logprobs: [], finishReason: 'length', policyVersion: 0 });
    expect(await model.generate([])).toEqual([]);
  });

  it('leaks no tensors (cache, recompute, abort and error paths)', async () => {
    await model.generate(requests());
    const before = tf.memory().numTensors;
    await model.generate(requests());
    await model.generateRecompute(requests());
    const controller = new AbortController();
    const pending = model.generate(requests(), { signal: controller.signal });
    setImmediate(() => controller.abort());
    await pending;
    await model.generate([{ promptTokens: [1], maxTokens: 99 }]).catch(() => undefined);
    expect(tf.memory().numTensors).toBe(before);
  });
});

describe.each(ALL_BACKENDS)('the KV-cache decode step equals full recompute for every variant of the family (%s backend)', (backend) => {
  const base = { vocabSize: tok.vocabSize, dModel: 32, nLayers: 2, nHeads: 4, dFF: 48, maxSeqLen: 40 };
  const VARIANTS: Record<string, PolicyConfig> = {
    'llama, grouped-query, llama3 rope scaling': {
      ...base,
      nKvHeads: 2,
      ropeScaling: { type: 'llama3', factor: 8, lowFreqFactor: 1, highFreqFactor: 4, originalMaxPositionEmbeddings: 16 },
    },
    'qwen2, q/k/v biases, tied head': { ...base, modelType: 'qwen2', qkvBias: true, tieWordEmbeddings: true, nKvHeads: 1 },
    'qwen3, q/k norms, explicit head width, attention biases': {
      ...base,
      modelType: 'qwen3',
      qkNorm: true,
      headDim: 12,
      nKvHeads: 2,
      qkvBias: true,
      oBias: true,
    },
  };
  beforeAll(async () => {
    await initBackend(backend, { logger: quiet });
  });

  it.each(Object.keys(VARIANTS))('%s', async (name) => {
    // Every weight perturbed (norm gains and biases too, which start at ones and zeros), so each fold is exercised.
    const rng = createRng(7, name);
    const created = PolicyModel.create(VARIANTS[name], 3);
    const weights = new Map(
      [...created.getWeights()].map(([key, w]) => [
        key,
        { shape: w.shape, data: w.data.map((x, i) => x + normalArray(1, 0.3, rng)[0] * (i % 3 === 0 ? 1 : 0.5)) },
      ]),
    );
    created.dispose();
    const model = PolicyModel.fromWeights(VARIANTS[name], weights);
    const tensors = tf.memory().numTensors;
    expectSame(await model.generate(requests()), await model.generateRecompute(requests()));
    model.weightsChanged(); // frees the fused sampling weights, cached until the weights change
    expect(tf.memory().numTensors).toBe(tensors);
    model.dispose();
  });
});
