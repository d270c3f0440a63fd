/** Decoding helpers shared by the specs of the fused sampling copy and of the graph decoding step. */
import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, NamedWeights } from '../../lib/model/types.js';
import { padPrompts } from '../../lib/model/generate.js';
import { LORA_TARGETS, LoraAdapter } from '../../lib/model/lora.js';
import type { PolicyConfig, PolicyModel } from '../../lib/model/transformer.js';
import { createRng, normalArray } from '../../lib/core/random.js';

/** Fused (merged, concatenated) and unfused products round differently: float32 sums in another order. */
export const LOGIT_TOLERANCE = 2e-4;
export const DECODE_STEPS = 4;

/** An adapter on every projection with every tensor random (a fresh adapter's B is 0, which would hide a wrong merge). */
export function randomAdapter(config: PolicyConfig, seed: number, std = 0.05): LoraAdapter {
  const lora = { rank: 4, alpha: 8, targetModules: LORA_TARGETS };
  const fresh = LoraAdapter.create(config, lora, seed);
  const rng = createRng(seed, 'random-adapter');
  const weights: NamedWeights = new Map(
    [...fresh.getWeights()].map(([name, w]) => [name, { shape: w.shape, data: normalArray(w.data.length, std, rng) }]),
  );
  fresh.dispose();
  return LoraAdapter.fromWeights(config, lora, weights);
}

/** Left-padded prompts of three lengths. */
export function prompts(vocab: number): number[][] {
  return [
    [5, 9, 14, 3, 22, 7],
    [31 % vocab, 4],
    [8, 8, 17, 2],
  ];
}

/** Positions of the extension after the decode steps (see {@link stepLogits}). */
export const EXTEND_POSITIONS = 3;

/**
 * Prefill and `DECODE_STEPS` decode steps (feeding fixed tokens) through `blocks` (a fused copy, or the variables when
 * undefined), then one extension of {@link EXTEND_POSITIONS} positions a row (the second row's first one a pad, as
 * a shared prefix's rest lays a shorter row out): each pass's logits.
 */
export function stepLogits(model: PolicyModel, fused: boolean): Float32Array[] {
  const lease = fused ? model.samplingLeaseInternal() : null;
  const blocks = lease?.blocks;
  const batch = padPrompts(prompts(model.config.vocabSize));
  const b = batch.rows;
  const out: Float32Array[] = [];
  let { logits, caches } = model.prefillInternal(batch, blocks);
  let mask = batch.attentionMask;
  for (let step = 0; ; step++) {
    out.push(logits.dataSync() as Float32Array);
    logits.dispose();
    if (step === DECODE_STEPS + 1) break;
    const t = step === DECODE_STEPS ? EXTEND_POSITIONS : 1;
    const L = mask.length / b;
    const next = new Float32Array(b * (L + t));
    const positions = new Int32Array(b * t);
    const tokens = new Int32Array(b * t);
    for (let r = 0; r < b; r++) {
      next.set(mask.subarray(r * L, (r + 1) * L), r * (L + t));
      for (let i = 0; i < t; i++) {
        const pad = t > 1 && r === 1 && i === 0;
        next[r * (L + t) + L + i] = pad ? 0 : 1;
        positions[r * t + i] = batch.positionIds[(r + 1) * batch.width - 1] + 1 + step + i - (r === 1 && t > 1 ? 1 : 0);
        tokens[r * t + i] = pad ? 0 : (3 + 5 * r + step + i) % model.config.vocabSize;
      }
    }
    const o = model.decodeInternal(tokens, positions, next, caches, blocks);
    for (const c of caches) tf.dispose([c.k, c.v]);
    ({ logits, caches } = o);
    mask = next;
  }
  for (const c of caches) tf.dispose([c.k, c.v]);
  lease?.release();
  return out;
}

export function maxDiff(a: readonly Float32Array[], b: readonly Float32Array[]): number {
  let worst = 0;
  a.forEach((x, i) => x.forEach((v, k) => (worst = Math.max(worst, Math.abs(v - b[i][k])))));
  return worst;
}

/**
 * Greedy requests: the same tokens whatever the seed, so two generations differ only through the weights. With
 * `sharedPrefix` tokens before each prompt, the prefill runs them once and the prompts' rest after them.
 */
export function greedy(vocab: number, sharedPrefix = 0): GenerateRequest[] {
  const prefix = Array.from({ length: sharedPrefix }, (_, i) => (7 + 3 * i) % vocab);
  return prompts(vocab).map((prompt) => ({ promptTokens: [...prefix, ...prompt], maxTokens: 5, temperature: 0, stopTokens: [] }));
}
