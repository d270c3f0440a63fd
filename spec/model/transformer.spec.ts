import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { WeightArray } from '../../lib/model/types.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { decodeSafetensors, encodeSafetensors } from '../../lib/model/safetensors.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';

const TOLERANCE = 1e-4;
const quiet = { info: (): void => undefined };
const CONFIG: PolicyConfig = { vocabSize: 19, dModel: 16, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 32, maxSeqLen: 12 };

/** A left-padded batch: rows of different lengths, positions counted from each row's first real token. */
function batch(rows: number[][], width: number): { ids: tf.Tensor2D; mask: tf.Tensor2D; pos: tf.Tensor2D } {
  const ids: number[] = [];
  const mask: number[] = [];
  const pos: number[] = [];
  for (const row of rows) {
    const pad = width - row.length;
    for (let i = 0; i < width; i++) {
      ids.push(i < pad ? 0 : row[i - pad]);
      mask.push(i < pad ? 0 : 1);
      pos.push(i < pad ? 0 : i - pad);
    }
  }
  return {
    ids: tf.tensor2d(ids, [rows.length, width], 'int32'),
    mask: tf.tensor2d(mask, [rows.length, width], 'float32'),
    pos: tf.tensor2d(pos, [rows.length, width], 'int32'),
  };
}

const ROWS = [
  [1, 5, 7, 9, 3, 11, 4, 8],
  [1, 6, 2],
  [1, 18, 17, 16, 15],
];

/** Logits, log-probs, entropies and gradients of a masked mean NLL, as plain arrays. */
function probe(model: PolicyModel): Float32Array[] {
  const { ids, mask, pos } = batch(ROWS, 8);
  const targetMask = tf.slice(mask, [0, 1], [3, 7]);
  const logits = model.logits(ids, mask, pos);
  const { logprobs, entropy } = model.tokenLogprobs(ids, mask, pos);
  const { value, grads } = tf.variableGrads(() => {
    const lp = model.tokenLogprobs(ids, mask, pos).logprobs;
    return tf.div(tf.neg(tf.sum(tf.mul(lp, targetMask))), tf.sum(targetMask)) as tf.Scalar;
  }, model.trainableVariables());
  const out = [logits, logprobs, entropy, value, ...model.trainableVariables().map((v) => grads[v.name])].map((t) =>
    Float32Array.from(t.dataSync() as Float32Array),
  );
  tf.dispose([ids, mask, pos, targetMask, logits, logprobs, entropy, value, grads]);
  return out;
}

function maxAbsDiff(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let worst = 0;
  for (let i = 0; i < a.length; i++) {
    worst = Math.max(worst, Math.abs(a[i] - b[i]));
  }
  return worst;
}

describe('PolicyModel', () => {
  let model: PolicyModel;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    model = PolicyModel.create(CONFIG, 7);
  });
  afterAll(() => {
    model.dispose();
  });

  it('validates its configuration', () => {
    expect(() => PolicyModel.create({ ...CONFIG, nHeads: 3 }, 1)).toThrow(ConfigError);
    expect(() => PolicyModel.create({ ...CONFIG, dFF: 0 }, 1)).toThrow(ConfigError);
  });

  it('initializes identically from the same seed and differently from another', () => {
    const again = PolicyModel.create(CONFIG, 7);
    const other = PolicyModel.create(CONFIG, 8);
    const a = model.getWeights();
    const b = again.getWeights();
    const c = other.getWeights();
    for (const [name, w] of a) {
      expect(Array.from((b.get(name) as WeightArray).data)).toEqual(Array.from(w.data));
    }
    expect(Array.from((c.get('model.layers.0.self_attn.q_proj.weight') as WeightArray).data)).not.toEqual(
      Array.from((a.get('model.layers.0.self_attn.q_proj.weight') as WeightArray).data),
    );
    again.dispose();
    other.dispose();
  });

  it('names its weights stably with the documented shapes', () => {
    const w = model.getWeights();
    // Hugging Face names and [out, in] layout.
    expect(w.get('model.embed_tokens.weight')?.shape).toEqual([19, 16]);
    expect(w.get('model.layers.0.self_attn.q_proj.weight')?.shape).toEqual([16, 16]);
    expect(w.get('model.layers.0.self_attn.k_proj.weight')?.shape).toEqual([8, 16]); // 2 kv heads of 4
    expect(w.get('model.layers.1.mlp.gate_proj.weight')?.shape).toEqual([32, 16]);
    expect(w.get('model.layers.1.mlp.down_proj.weight')?.shape).toEqual([16, 32]);
    expect(w.get('model.norm.weight')?.shape).toEqual([16]);
    expect(w.get('lm_head.weight')?.shape).toEqual([19, 16]);
    expect(model.weightNames()).toHaveLength(1 + 9 * 2 + 2);
    expect(model.trainableVariables()).toHaveLength(model.weightNames().length);
    expect(model.numParameters()).toBe([...w.values()].reduce((n, x) => n + x.data.length, 0));
  });

  it('tokenLogprobs equals the log-softmax of logits at the next token, with entropies', () => {
    const { ids, mask, pos } = batch(ROWS, 8);
    const logits = model.logits(ids, mask, pos);
    expect(logits.shape).toEqual([3, 8, 19]);
    const { logprobs, entropy } = model.tokenLogprobs(ids, mask, pos);
    expect(logprobs.shape).toEqual([3, 7]);
    const L = logits.arraySync();
    const lp = logprobs.arraySync();
    const ent = entropy.arraySync();
    const idv = ids.arraySync();
    for (let b = 0; b < 3; b++) {
      for (let t = 0; t < 7; t++) {
        const row = L[b][t];
        const m = Math.max(...row);
        const z = Math.log(row.reduce((s, x) => s + Math.exp(x - m), 0)) + m;
        expect(lp[b][t]).toBeCloseTo(row[idv[b][t + 1]] - z, 4);
        const h = -row.reduce((s, x) => s + Math.exp(x - z) * (x - z), 0);
        expect(ent[b][t]).toBeCloseTo(h, 4);
      }
    }
    tf.dispose([ids, mask, pos, logits, logprobs, entropy]);
  });

  it('tokenLogprobs from a position scores the columns from there on, and refuses one out of range', () => {
    const { ids, mask, pos } = batch(ROWS, 8);
    const all = model.tokenLogprobs(ids, mask, pos);
    for (const from of [1, 4, 6]) {
      const part = model.tokenLogprobs(ids, mask, pos, from);
      expect(part.logprobs.shape).toEqual([3, 7 - from]);
      const [lp, ent] = [all.logprobs, all.entropy].map((t) =>
        t
          .arraySync()
          .map((row) => row.slice(from))
          .flat(),
      );
      expect(maxAbsDiff(Float32Array.from(part.logprobs.dataSync()), Float32Array.from(lp))).toBeLessThan(1e-5);
      expect(maxAbsDiff(Float32Array.from(part.entropy.dataSync()), Float32Array.from(ent))).toBeLessThan(1e-5);
      tf.dispose([part.logprobs, part.entropy]);
    }
    expect(() => model.tokenLogprobs(ids, mask, pos, 7)).toThrow(/from must be an integer in 0\.\.6/);
    expect(() => model.tokenLogprobs(ids, mask, pos, -1)).toThrow(ShapeError);
    tf.dispose([ids, mask, pos, all.logprobs, all.entropy]);
  });

  it('left padding does not change a row (positions from the first real token, padding keys masked)', () => {
    const alone = batch([ROWS[1]], 3);
    const padded = batch(ROWS, 8);
    const a = model.tokenLogprobs(alone.ids, alone.mask, alone.pos).logprobs.dataSync();
    const p = model.tokenLogprobs(padded.ids, padded.mask, padded.pos).logprobs.arraySync();
    expect(maxAbsDiff(Float32Array.from(a), Float32Array.from(p[1].slice(5)))).toBeLessThan(1e-5);
    tf.dispose([alone, padded].flatMap((x) => [x.ids, x.mask, x.pos]));
  });

  it('getWeights / setWeights round-trip, also through safetensors', () => {
    const other = PolicyModel.create(CONFIG, 99);
    const bytes = encodeSafetensors(model.getWeights());
    other.setWeights(decodeSafetensors(bytes).weights);
    const a = model.getWeights();
    for (const [name, w] of other.getWeights()) {
      expect(Array.from(w.data)).toEqual(Array.from((a.get(name) as WeightArray).data));
    }
    const fresh = PolicyModel.fromWeights(CONFIG, a);
    expect(maxAbsDiff(probe(fresh)[0], probe(model)[0])).toBe(0);
    fresh.dispose();
    other.dispose();
  });

  it('getWeights returns copies', () => {
    const w = model.getWeights();
    (w.get('lm_head.weight') as WeightArray).data.fill(0);
    expect(Array.from((model.getWeights().get('lm_head.weight') as WeightArray).data).some((x) => x !== 0)).toBe(true);
  });

  it('setWeights rejects missing, unknown and misshapen weights with ShapeError, changing nothing', () => {
    const w = new Map(model.getWeights());
    const before = Array.from((model.getWeights().get('lm_head.weight') as WeightArray).data);
    const missing = new Map(w);
    missing.delete('lm_head.weight');
    expect(() => model.setWeights(missing)).toThrow(ShapeError);
    const unknown = new Map(w).set('extra', { shape: [1], data: new Float32Array(1) });
    expect(() => model.setWeights(unknown)).toThrow(ShapeError);
    const misshapen = new Map(w).set('lm_head.weight', { shape: [16, 19], data: new Float32Array(19 * 16) });
    const zeroed = misshapen.set('model.embed_tokens.weight', { shape: [19, 16], data: new Float32Array(19 * 16) });
    expect(() => model.setWeights(zeroed)).toThrow(ShapeError);
    const short = new Map(w).set('lm_head.weight', { shape: [19, 16], data: new Float32Array(5) });
    expect(() => model.setWeights(short)).toThrow(ShapeError);
    expect(Array.from((model.getWeights().get('lm_head.weight') as WeightArray).data)).toEqual(before);
  });

  it('leaks no tensors in logits, tokenLogprobs + gradients, and weight round trips', () => {
    probe(model);
    const before = tf.memory().numTensors;
    probe(model);
    model.setWeights(model.getWeights());
    expect(tf.memory().numTensors).toBe(before);
  });

  it('gives the same logits, log-probs and gradients on wasm and cpu', async () => {
    await initBackend('cpu', { logger: quiet });
    const onCpu = PolicyModel.create(CONFIG, 3);
    const cpu = probe(onCpu);
    onCpu.dispose();
    await initBackend('wasm', { logger: quiet });
    const onWasm = PolicyModel.create(CONFIG, 3);
    const wasm = probe(onWasm);
    onWasm.dispose();
    await initBackend('cpu', { logger: quiet });
    expect(cpu.length).toBe(4 + model.weightNames().length);
    cpu.forEach((values, i) => {
      expect(maxAbsDiff(values, wasm[i]), `output ${i}`).toBeLessThanOrEqual(TOLERANCE);
    });
    // The gradients are not trivially zero.
    expect(cpu.slice(4).some((g) => g.some((x) => Math.abs(x) > 1e-6))).toBe(true);
  });

  it('gradients match central finite differences (norms, q/k norms, biases, RoPE attention, SwiGLU, embeddings, head)', () => {
    const probeModel = PolicyModel.create(
      { ...CONFIG, modelType: 'qwen3', qkvBias: true, oBias: true, dModel: 8, nHeads: 2, nKvHeads: 1, dFF: 16 },
      21,
    );
    // Random biases and norm scales, so their gradients are exercised away from 0 and 1.
    probeModel.setWeights(
      new Map(
        [...probeModel.getWeights()].map(([name, w]) => [
          name,
          /(bias|norm\.weight|layernorm\.weight)$/.test(name)
            ? { shape: w.shape, data: w.data.map((x, i) => x + 0.3 * Math.sin(7 * i + name.length)) }
            : w,
        ]),
      ),
    );
    const { ids, mask, pos } = batch(ROWS, 8);
    const targetMask = tf.slice(mask, [0, 1], [3, 7]);
    const loss = (): tf.Scalar =>
      tf.div(tf.neg(tf.sum(tf.mul(probeModel.tokenLogprobs(ids, mask, pos).logprobs, targetMask))), tf.sum(targetMask)) as tf.Scalar;
    const vars = probeModel.trainableVariables();
    const names = probeModel.weightNames();
    const { value, grads } = tf.variableGrads(loss, vars);
    const step = 1e-2;
    for (const name of [
      'model.embed_tokens.weight',
      'model.layers.0.input_layernorm.weight',
      'model.layers.0.self_attn.q_proj.weight',
      'model.layers.0.self_attn.k_proj.weight',
      'model.layers.0.self_attn.q_proj.bias',
      'model.layers.0.self_attn.k_norm.weight',
      'model.layers.1.self_attn.q_norm.weight',
      'model.layers.1.self_attn.v_proj.weight',
      'model.layers.1.self_attn.o_proj.weight',
      'model.layers.1.self_attn.o_proj.bias',
      'model.layers.0.post_attention_layernorm.weight',
      'model.layers.1.mlp.gate_proj.weight',
      'model.layers.1.mlp.up_proj.weight',
      'model.layers.0.mlp.down_proj.weight',
      'model.norm.weight',
      'lm_head.weight',
    ]) {
      const v = vars[names.indexOf(name)];
      const analytic = grads[v.name].dataSync();
      const base = Float32Array.from(v.dataSync() as Float32Array);
      // The entries with the largest gradients, where the difference quotient is well above float32 noise.
      const order = [...analytic.keys()].sort((a, b) => Math.abs(analytic[b]) - Math.abs(analytic[a])).slice(0, 3);
      for (const i of order) {
        const at = (delta: number): number => {
          const w = Float32Array.from(base);
          w[i] += delta;
          tf.tidy(() => v.assign(tf.tensor(w, v.shape)));
          return tf.tidy(() => loss().dataSync()[0]);
        };
        const numeric = (at(step) - at(-step)) / (2 * step);
        tf.tidy(() => v.assign(tf.tensor(base, v.shape)));
        expect(Math.abs(numeric - analytic[i]), `${name}[${i}] ${analytic[i]} vs ${numeric}`).toBeLessThanOrEqual(
          2e-4 + 0.05 * Math.abs(analytic[i]),
        );
      }
    }
    tf.dispose([value, grads, ids, mask, pos, targetMask]);
    probeModel.dispose();
  });

  it('trains: a few Adam steps lower the NLL of a fixed batch', () => {
    const trainee = PolicyModel.create(CONFIG, 5);
    const optimizer = tf.train.adam(1e-2);
    const { ids, mask, pos } = batch(ROWS, 8);
    const targetMask = tf.slice(mask, [0, 1], [3, 7]);
    const loss = (): tf.Scalar =>
      tf.div(tf.neg(tf.sum(tf.mul(trainee.tokenLogprobs(ids, mask, pos).logprobs, targetMask))), tf.sum(targetMask)) as tf.Scalar;
    const first = tf.tidy(() => loss().dataSync()[0]);
    for (let i = 0; i < 10; i++) {
      const { value, grads } = tf.variableGrads(loss, trainee.trainableVariables());
      optimizer.applyGradients(Object.entries(grads).map(([name, tensor]) => ({ name, tensor })));
      tf.dispose([value, grads]);
    }
    const last = tf.tidy(() => loss().dataSync()[0]);
    expect(last).toBeLessThan(first - 0.5);
    optimizer.dispose();
    tf.dispose([ids, mask, pos, targetMask]);
    trainee.dispose();
  });
});

describe('a tied head over a large vocabulary', () => {
  // From 1,024 tokens a tied head is computed vocabulary-major, (E·hᵀ)ᵀ; the same weights untied (lm_head a copy of
  // the embedding) take the row-major product: both must give the same logits, log-probs, gradients and tokens.
  const LARGE: PolicyConfig = {
    vocabSize: 1500,
    dModel: 16,
    nLayers: 2,
    nHeads: 4,
    nKvHeads: 2,
    dFF: 32,
    maxSeqLen: 12,
    tieWordEmbeddings: true,
  };
  let tied: PolicyModel;
  let untied: PolicyModel;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    tied = PolicyModel.create(LARGE, 5);
    const weights = new Map(tied.getWeights());
    weights.set('lm_head.weight', weights.get('model.embed_tokens.weight') as WeightArray);
    untied = PolicyModel.fromWeights({ ...LARGE, tieWordEmbeddings: false }, weights);
  });
  afterAll(() => {
    tied.dispose();
    untied.dispose();
  });

  it('gives the logits, log-probs and gradients of the row-major product', () => {
    const [a, b] = [probe(tied), probe(untied)];
    // logits, log-probs, entropies and the loss, then one gradient per variable
    for (let i = 0; i < 4; i++) expect(maxAbsDiff(a[i], b[i])).toBeLessThan(TOLERANCE);
    const byName = (m: PolicyModel, out: Float32Array[]): Map<string, Float32Array> =>
      new Map(m.weightNames().map((name, i) => [name, out[4 + i]]));
    const [ga, gb] = [byName(tied, a), byName(untied, b)];
    expect([...gb.keys()].filter((n) => !ga.has(n))).toEqual(['lm_head.weight']);
    // The tied embedding's gradient `[V, d]` is the untied embedding's plus lm_head's (a variable `[d, V]`).
    const { vocabSize: V, dModel: d } = LARGE;
    const head = gb.get('lm_head.weight') as Float32Array;
    const embedding = (gb.get('model.embed_tokens.weight') as Float32Array).map((x, at) => x + head[(at % d) * V + Math.floor(at / d)]);
    for (const [name, grad] of ga) {
      const expected = name === 'model.embed_tokens.weight' ? embedding : (gb.get(name) as Float32Array);
      expect({ name, close: maxAbsDiff(grad, expected) < TOLERANCE }).toEqual({ name, close: true });
    }
  });

  it('samples the same tokens with the KV cache', async () => {
    const requests = [7, 8].map((seed) => ({ promptTokens: [1, 900, 1499, 3], maxTokens: 6, temperature: 1, seed, stopTokens: [] }));
    const [a, b] = [await tied.generate(requests), await untied.generate(requests)];
    expect(a.map((r) => r.tokens)).toEqual(b.map((r) => r.tokens));
  });
});
