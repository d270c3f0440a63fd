import { describe, expect, it } from 'vitest';
import { modelSizes, stepBounds } from '../../bench/_bounds.js';

// A Llama-family shape small enough to count by hand: V 10, d 4, one layer of 2 heads (head 2) over 1 KV head, FF 6.
const config = { vocabSize: 10, dModel: 4, nLayers: 1, nHeads: 2, nKvHeads: 1, dFF: 6, maxSeqLen: 16 };

describe('bench bounds', () => {
  it('counts the weights a pass reads and those a token multiplies, a tied head once', () => {
    // embed 40; q 16, k 8, v 8, o 16; gate, up, down 24 each; norms 4 + 4 + 4.
    const linear = 16 + 8 + 8 + 16 + 3 * 24;
    expect(modelSizes({ ...config, tieWordEmbeddings: true })).toEqual({ params: 40 + linear + 12, bodyParams: linear, headParams: 40 });
    expect(modelSizes({ ...config, tieWordEmbeddings: false })).toEqual({ params: 80 + linear + 12, bodyParams: linear, headParams: 40 });
  });

  it('bounds generation by weight reads or FLOPs, and training by FLOPs, LoRA or full', () => {
    const sizes = { params: 1e6, bodyParams: 4e5, headParams: 1e5 };
    // 2 prompts of 6 tokens, 2 samples each, 10 new tokens a sample.
    const input = {
      sizes,
      gflops: 10,
      bandwidthGBs: 2,
      rows: 4,
      groupSize: 2,
      promptTokens: 6,
      maxTokens: 10,
      ppoEpochs: 1,
      lora: true,
      referenceForward: false,
    };
    const lora = stepBounds(input);
    expect(lora.decode_bytes).toBe(4e6);
    expect(lora.decode_memory_bound_s).toBeCloseTo((4e6 / 2e9) * 10, 12);
    // Each prompt once through the blocks, each response token through the blocks and the head.
    const generate = 2 * 4e5 * (2 * 6 + 4 * 10) + 2 * 1e5 * 4 * 10;
    expect(lora.generate_flops).toBe(generate);
    expect(lora.generate_flops_bound_s).toBeCloseTo(generate / 1e10, 12);
    expect(lora.generate_bound_s).toBe(Math.max(lora.decode_memory_bound_s, lora.generate_flops_bound_s));
    // Training runs each prompt once and every response through the blocks, the head at response tokens; LoRA's
    // backward as much again.
    expect(lora.train_tokens).toBe(2 * 6 + 4 * 10);
    const forward = 2 * 4e5 * 52 + 2 * 1e5 * 40;
    expect(lora.train_flops).toBe(2 * forward);
    expect(lora.train_bound_s).toBeCloseTo((2 * forward) / 1e10, 12);
    // Full fine-tuning adds the weight gradients; two PPO epochs twice that; a reference forward once more.
    expect(stepBounds({ ...input, lora: false }).train_flops).toBe(3 * forward);
    expect(stepBounds({ ...input, lora: false, ppoEpochs: 2, referenceForward: true }).train_flops).toBe(7 * forward);
  });
});
