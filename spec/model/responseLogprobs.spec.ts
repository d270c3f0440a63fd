import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { NamedWeights } from '../../lib/model/types.js';
import { ShapeError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { LoraAdapter } from '../../lib/model/lora.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { createRng } from '../../lib/core/random.js';

const quiet = { info: (): void => undefined };
const TOLERANCE = 1e-5;

/** The three families' variants: grouped-query llama, qwen2 with q/k/v biases and a tied head, qwen3 with q/k norms. */
const FAMILIES: readonly [string, PolicyConfig][] = [
  ['llama', { modelType: 'llama', vocabSize: 23, dModel: 16, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 32, maxSeqLen: 16 }],
  [
    'qwen2',
    { modelType: 'qwen2', vocabSize: 23, dModel: 16, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 32, maxSeqLen: 16, tieWordEmbeddings: true },
  ],
  ['qwen3', { modelType: 'qwen3', vocabSize: 23, dModel: 16, nLayers: 2, nHeads: 4, nKvHeads: 1, headDim: 8, dFF: 32, maxSeqLen: 16 }],
];

/**
 * Rows `[left-padded prompt | right-padded response]` as a trainer batch lays them out: two groups of three rows
 * sharing a prompt, and one row alone; responses of different lengths.
 */
function rows(): { ids: tf.Tensor2D; mask: tf.Tensor2D; pos: tf.Tensor2D; P: number } {
  const prompts = [
    [1, 5, 7, 9],
    [1, 5, 7, 9],
    [2, 6],
    [1, 5, 7, 9],
    [2, 6],
    [2, 6],
    [3, 3, 4],
  ];
  const responses = [[4, 8, 2], [11, 2], [7, 7, 7, 7, 1], [9], [12, 13, 2], [5, 22, 3, 2], [8, 8]];
  const P = 4;
  const R = 5;
  const ids: number[] = [];
  const mask: number[] = [];
  const pos: number[] = [];
  prompts.forEach((prompt, r) => {
    const pad = P - prompt.length;
    const response = responses[r];
    for (let i = 0; i < P + R; i++) {
      const inPrompt = i < P;
      const token = inPrompt ? (i < pad ? 0 : prompt[i - pad]) : response[i - P];
      const real = inPrompt ? i >= pad : i - P < response.length;
      ids.push(real ? token : 0);
      mask.push(real ? 1 : 0);
      pos.push(real ? i - pad : 0);
    }
  });
  const B = prompts.length;
  return { ids: tf.tensor2d(ids, [B, P + R], 'int32'), mask: tf.tensor2d(mask, [B, P + R]), pos: tf.tensor2d(pos, [B, P + R], 'int32'), P };
}

/** An adapter whose `B` is not zero, so that it changes the model and has gradients of both factors. */
function adapter(model: PolicyModel): LoraAdapter {
  const lora = { rank: 2, alpha: 4, targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const };
  const fresh = LoraAdapter.create(model.config, { ...lora, targetModules: [...lora.targetModules] }, 3);
  const rng = createRng(5, 'lora-b');
  const weights: NamedWeights = new Map(
    [...fresh.getWeights()].map(([name, w]) => [
      name,
      { ...w, data: name.includes('lora_B') ? Float32Array.from(w.data, () => rng.next() - 0.5) : w.data },
    ]),
  );
  fresh.dispose();
  return LoraAdapter.fromWeights(model.config, { ...lora, targetModules: [...lora.targetModules] }, weights);
}

/** Log-probs, entropies and the gradient of every trainable variable of a weighted sum of the response log-probs. */
function probe(model: PolicyModel, shared: boolean): Float32Array[] {
  const { ids, mask, pos, P } = rows();
  const score = (): { logprobs: tf.Tensor2D; entropy: tf.Tensor2D } =>
    shared ? model.responseLogprobs(ids, mask, pos, P) : model.tokenLogprobs(ids, mask, pos, P - 1);
  const out = score();
  const R = out.logprobs.shape[1];
  const weight = tf.mul(
    tf.slice(mask, [0, P], [-1, R]),
    tf.tensor2d(
      Float32Array.from({ length: out.logprobs.size }, (_, i) => 1 + (i % 3)),
      out.logprobs.shape,
    ),
  );
  const { value, grads } = tf.variableGrads(() => tf.sum(tf.mul(score().logprobs, weight)) as tf.Scalar, model.trainableVariables());
  const arrays = [out.logprobs, out.entropy, value, ...model.trainableVariables().map((v) => grads[v.name])].map((t) =>
    Float32Array.from(t.dataSync() as Float32Array),
  );
  tf.dispose([ids, mask, pos, out.logprobs, out.entropy, weight, value, grads]);
  return arrays;
}

function relativeError(a: Float32Array, b: Float32Array): number {
  expect(a.length).toBe(b.length);
  let diff = 0;
  let norm = 0;
  for (let i = 0; i < a.length; i++) {
    diff += (a[i] - b[i]) ** 2;
    norm += b[i] ** 2;
  }
  return Math.sqrt(diff) / Math.max(Math.sqrt(norm), 1e-12);
}

describe.each(FAMILIES)('PolicyModel.responseLogprobs (%s): each distinct prompt once, the same numbers as the whole rows', (_, config) => {
  let base: PolicyModel;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    base = PolicyModel.create(config, 9);
  });
  afterAll(() => base.dispose());

  it('log-probs, entropies and every gradient equal tokenLogprobs from the prompt’s last position', () => {
    const whole = probe(base, false);
    const shared = probe(base, true);
    whole.forEach((w, i) => expect(relativeError(shared[i], w)).toBeLessThan(TOLERANCE));
  });

  it('so they do through a LoRA adapter (its A and B trained, the base frozen)', () => {
    const lora = adapter(base);
    const view = PolicyModel.withAdapter(base, lora);
    try {
      const whole = probe(view, false);
      const shared = probe(view, true);
      expect(whole.length).toBe(3 + lora.variables().length);
      whole.forEach((w, i) => expect(relativeError(shared[i], w)).toBeLessThan(TOLERANCE));
    } finally {
      view.dispose();
      lora.dispose();
    }
  });

  it('runs one stream of 3 distinct prompts of 4 columns and 7 responses of 5, never a whole 9-column row', async () => {
    const { ids, mask, pos, P } = rows();
    const shapes = new Set<string>();
    const info = await tf.profile(() => {
      const out = base.responseLogprobs(ids, mask, pos, P);
      tf.dispose([out.logprobs, out.entropy]);
    });
    for (const kernel of info.kernels) if (kernel.name === 'BatchMatMul') shapes.add(JSON.stringify(kernel.inputShapes[0]));
    expect(shapes).toContain(JSON.stringify([3 * 4 + 7 * 5, config.dModel]));
    expect(shapes).not.toContain(JSON.stringify([7 * 9, config.dModel]));
    tf.dispose([ids, mask, pos]);
  });

  it('leaks no tensors and refuses a prompt length out of range', () => {
    const { ids, mask, pos, P } = rows();
    const before = tf.memory().numTensors;
    const out = base.responseLogprobs(ids, mask, pos, P);
    tf.dispose([out.logprobs, out.entropy]);
    expect(tf.memory().numTensors).toBe(before);
    expect(() => base.responseLogprobs(ids, mask, pos, 0)).toThrow(ShapeError);
    expect(() => base.responseLogprobs(ids, mask, pos, ids.shape[1])).toThrow(ShapeError);
    tf.dispose([ids, mask, pos]);
  });
});
