/**
 * Whole-softmax sampling from softmax numerators computed elsewhere (TensorFlow's float32 `exp(logit − max)` on the
 * native backend) draws the tokens, and reports the log-probs, that the host's float64 sampler does.
 */
import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import { createRng, normalArray } from '../../lib/core/random.js';
import { initBackend, nativeBackendInstalled } from '../../lib/model/backend.js';
import { rowExps } from '../../lib/model/expGraph.js';
import { DEVICE_EXPS_MIN_LOGITS, readStep, runGeneration, type StepDecoder } from '../../lib/model/generate.js';
import { samplesFromExps, sampleFromExps, sampleToken } from '../../lib/model/sampling.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';

const quiet = { info: (): void => undefined };
const VOCAB = 8192; // 4 rows: the smallest step whose exponentials the device computes (DEVICE_EXPS_MIN_LOGITS)

/** Seeded logits of `rows` rows, spread as a language model's (a few tokens well above the rest). */
function logitRows(rows: number, seed: number): Float32Array {
  const logits = normalArray(rows * VOCAB, 3, createRng(seed, 'exp-graph-logits'));
  for (let r = 0; r < rows; r++) logits[r * VOCAB + ((seed * 31 + r * 97) % VOCAB)] += 12;
  return logits;
}

/** A row's numerators in float32, as a float32 device computes them. */
function float32Exps(logits: Float32Array, offset: number): { exps: Float32Array; max: number } {
  let max = -Infinity;
  for (let v = 0; v < VOCAB; v++) max = Math.max(max, logits[offset + v]);
  const exps = new Float32Array(logits.length);
  for (let v = 0; v < VOCAB; v++) exps[offset + v] = Math.fround(Math.exp(logits[offset + v] - max));
  return { exps, max };
}

describe('sampling from softmax numerators', () => {
  it('is for greedy rows and rows that draw from the whole softmax at temperature 1', () => {
    expect(samplesFromExps({ temperature: 1, topP: 1 })).toBe(true);
    expect(samplesFromExps({ temperature: 1, topP: 1, topK: 0 })).toBe(true);
    expect(samplesFromExps({ temperature: 0.7, topP: 1 })).toBe(false);
    expect(samplesFromExps({ temperature: 0, topP: 0.5, topK: 3 })).toBe(true);
    expect(samplesFromExps({ temperature: 1, topP: 0.9 })).toBe(false);
    expect(samplesFromExps({ temperature: 1, topP: 1, topK: 50 })).toBe(false);
  });

  it('draws the host sampler’s token for the same uniform, and its log-prob within 1e-6', () => {
    const rows = 4;
    const logits = logitRows(rows, 7);
    let worst = 0;
    const tokens = new Set<number>();
    for (let r = 0; r < rows; r++) {
      const { exps, max } = float32Exps(logits, r * VOCAB);
      const host = createRng(11, `row-${r}`);
      const device = createRng(11, `row-${r}`);
      for (let i = 0; i < 500; i++) {
        const want = sampleToken(logits, r * VOCAB, VOCAB, { temperature: 1, topP: 1 }, host);
        const got = sampleFromExps(logits, exps, r * VOCAB, VOCAB, max, { temperature: 1, topP: 1 }, device);
        expect(got.token).toBe(want.token);
        worst = Math.max(worst, Math.abs(got.logprob - want.logprob));
        tokens.add(got.token);
      }
    }
    expect(worst).toBeLessThan(1e-6);
    expect(tokens.size).toBeGreaterThan(100); // the draws reach well into the tail, not only the top token
  });

  it('picks the arg-max of a greedy row (the lowest id on ties) with the host’s log-prob, drawing no uniform', () => {
    const logits = logitRows(2, 8);
    logits[VOCAB + 5] = logits[VOCAB + 9] = 40; // a tie at the top of row 1
    const never = { next: (): number => expect.fail('a greedy row draws no uniform') };
    for (const r of [0, 1]) {
      const { exps, max } = float32Exps(logits, r * VOCAB);
      const want = sampleToken(logits, r * VOCAB, VOCAB, { temperature: 0, topP: 1 }, never);
      const got = sampleFromExps(logits, exps, r * VOCAB, VOCAB, max, { temperature: 0, topP: 1 }, never);
      expect(got.token).toBe(want.token);
      expect(Math.abs(got.logprob - want.logprob)).toBeLessThan(1e-6);
    }
    expect(sampleFromExps(logits, float32Exps(logits, VOCAB).exps, VOCAB, VOCAB, 40, { temperature: 0, topP: 1 }, never).token).toBe(5);
  });

  it('takes the last token with mass when the uniform lands at the very top', () => {
    const logits = Float32Array.from([0, 0, -Infinity, 0, -Infinity]);
    const exps = Float32Array.from([1, 1, 0, 1, 0]);
    const top = { next: () => 1 - Number.EPSILON / 2 };
    const whole = { temperature: 1, topP: 1 };
    expect(sampleFromExps(logits, exps, 0, 5, 0, whole, top).token).toBe(3);
    expect(sampleFromExps(logits, exps, 0, 5, 0, whole, { next: () => 0 }).token).toBe(0);
  });
});

/** A decoder that replays seeded logits: `rows` rows at every step. */
function replayDecoder(rows: number): StepDecoder {
  let step = 0;
  const next = (): tf.Tensor2D => tf.tensor2d(logitRows(rows, 100 + step++), [rows, VOCAB]);
  let kept = rows;
  return {
    start: async () => next(),
    step: () => tf.tidy(() => tf.slice(next(), [0, 0], [kept, VOCAB])),
    keepRows: (r) => {
      kept = r.length;
    },
    dispose: () => undefined,
  };
}

describe.runIf(nativeBackendInstalled())('the native backend’s softmax numerators', () => {
  it('are exp(logit − max) of each row, with the row maxima', async () => {
    await initBackend('tensorflow', { logger: quiet });
    const values = logitRows(3, 5);
    const logits = tf.tensor2d(values, [3, VOCAB]);
    const out = rowExps(logits);
    expect(out).not.toBeNull();
    const { exps, max } = out!;
    expect(exps.shape).toEqual([3, VOCAB]);
    expect(max.shape).toEqual([3, 1]);
    const [e, m] = [await exps.data(), await max.data()];
    let worst = 0;
    for (let r = 0; r < 3; r++) {
      const want = float32Exps(values, r * VOCAB);
      expect(m[r]).toBe(want.max);
      for (let v = r * VOCAB; v < (r + 1) * VOCAB; v++) worst = Math.max(worst, Math.abs(e[v] - want.exps[v]) / want.exps[v]);
    }
    expect(worst).toBeLessThan(4e-6); // a few float32 ulps: TensorFlow's vectorized exp is not correctly rounded
    tf.dispose([logits, exps, max]);
  });

  it('are read beside the logits of a large step only', async () => {
    await initBackend('tensorflow', { logger: quiet });
    const large = await readStep(tf.tensor2d(logitRows(4, 9), [4, VOCAB]), true);
    expect(4 * VOCAB).toBeGreaterThanOrEqual(DEVICE_EXPS_MIN_LOGITS);
    expect(large.exps?.values.length).toBe(4 * VOCAB);
    expect(Array.from(large.exps!.max)).toEqual([0, 1, 2, 3].map((r) => float32Exps(large.logits, r * VOCAB).max));
    expect((await readStep(tf.tensor2d(logitRows(4, 9), [4, VOCAB]), false)).exps).toBeNull(); // no row draws from it
    const small = tf.tensor2d(logitRows(4, 9).subarray(0, 2 * VOCAB), [2, VOCAB]);
    expect((await readStep(small, true)).exps).toBeNull();
    expect(small.isDisposed).toBe(true);
  });

  it('give a generation the host’s tokens and log-probs (greedy rows too); other settings sample on the host', async () => {
    const requests: GenerateRequest[] = [
      { promptTokens: [1, 2], maxTokens: 6, seed: 1, stopTokens: [] },
      { promptTokens: [3], maxTokens: 6, seed: 2, stopTokens: [] },
      { promptTokens: [4], maxTokens: 6, seed: 3, temperature: 0.7, stopTokens: [] },
      { promptTokens: [5], maxTokens: 6, seed: 4, topK: 5, stopTokens: [] },
      { promptTokens: [6], maxTokens: 6, seed: 5, temperature: 0, stopTokens: [] },
    ];
    const generate = async (backend: 'tensorflow' | 'cpu'): Promise<GenerateResponse[]> => {
      await initBackend(backend, { logger: quiet });
      return runGeneration(replayDecoder(requests.length), requests, {}, { vocabSize: VOCAB, maxSeqLen: 64 });
    };
    const device = await generate('tensorflow');
    const host = await generate('cpu');
    expect(device.map((r) => r.tokens)).toEqual(host.map((r) => r.tokens));
    const worst = Math.max(...device.flatMap((r, i) => r.logprobs.map((lp, j) => Math.abs(lp - host[i].logprobs[j]))));
    expect(worst).toBeLessThan(1e-5);
    expect(new Set(device.flatMap((r) => r.tokens)).size).toBeGreaterThan(12);
  });
});

describe('other backends', () => {
  it('compute no numerators: the host exponentiates', async () => {
    await initBackend('wasm', { logger: quiet });
    const logits = tf.zeros([1, 8]) as tf.Tensor2D;
    expect(rowExps(logits)).toBeNull();
    logits.dispose();
  });
});
