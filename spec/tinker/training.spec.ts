/**
 * The Tinker service's trainer decodes a call's datums together (right-padded, in chunks): each datum's log-probs
 * and losses, the summed loss and the gradient equal those of the datums taken one at a time.
 */
import { beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import type { WireDatum } from '../../lib/tinker/proto.js';
import { TinkerTrainer } from '../../lib/tinker/training.js';

const config = { vocabSize: 11, dModel: 16, nLayers: 2, nHeads: 2, dFF: 32, maxSeqLen: 16 };
let base: PolicyModel;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  base = PolicyModel.create(config, 3);
});

/** A ppo datum over `tokens` (targets are the next tokens), with the given advantages. */
function datum(tokens: number[], advantage: number): WireDatum {
  const n = tokens.length - 1;
  return {
    tokens: tokens.slice(0, n),
    lossFnInputs: {
      target_tokens: { dtype: 'int64', data: tokens.slice(1), shape: [n] },
      logprobs: { dtype: 'float32', data: new Float32Array(n).fill(-2), shape: [n] },
      advantages: { dtype: 'float32', data: new Float32Array(n).fill(advantage), shape: [n] },
    },
  };
}

describe('TinkerTrainer.forward', () => {
  it.each([
    ['in one chunk', undefined],
    ['in chunks of 6 padded positions (one datum each)', 6],
  ])('gives each datum of a batch what it gives alone, and the same gradient (%s)', async (_, chunkTokens) => {
    const data = [datum([1, 2, 3, 4], 0.5), datum([5, 6, 7, 8, 9, 10], -1), datum([2, 9], 2)];
    const together = new TinkerTrainer(base, 2, 1, chunkTokens === undefined ? {} : { chunkTokens });
    const alone = new TinkerTrainer(base, 2, 1);
    const batched = await together.forward(data, 'ppo', {}, true);
    let sum = 0;
    for (const [i, d] of data.entries()) {
      const single = await alone.forward([d], 'ppo', {}, true);
      sum += single.metrics['loss:sum'];
      expect(batched.outputs[i].logprobs).toHaveLength(d.tokens.length);
      single.outputs[0].logprobs.forEach((lp, j) => expect(batched.outputs[i].logprobs[j]).toBeCloseTo(lp, 5));
      single.outputs[0].elementwise_loss.forEach((l, j) => expect(batched.outputs[i].elementwise_loss[j]).toBeCloseTo(l, 5));
    }
    expect(batched.metrics['loss:sum']).toBeCloseTo(sum, 5);
    const adam = { learningRate: 0.1, beta1: 0.9, beta2: 0.95, eps: 1e-8, weightDecay: 0, gradClipNorm: 0 };
    expect(together.optimStep(adam)['grad_norm:mean']).toBeCloseTo(alone.optimStep(adam)['grad_norm:mean'], 5);
    const a = together.state(false);
    const b = alone.state(false);
    for (const [name, w] of a) w.data.forEach((v, j) => expect(v).toBeCloseTo(b.get(name)!.data[j], 5));
    together.dispose();
    alone.dispose();
  });
});
