/**
 * Token sampling on the CPU from one row of logits: temperature, nucleus (top-p) and greedy decoding.
 *
 * Vocabularies here are tiny, so reading the logits back and sampling in plain JS (float64) is cheap and
 * exactly reproducible from a seeded {@link Rng}.
 *
 * @packageDocumentation
 */
import type { Rng } from '../random.js';

/** How to pick the next token. */
export interface SamplingParams {
  /** Temperature; `0` picks the arg-max (ties: the lowest id). */
  readonly temperature: number;
  /** Nucleus mass in `(0, 1]`: sample from the smallest set of most likely tokens whose mass reaches it. */
  readonly topP: number;
}

/** A sampled token and its log-probability under the un-tempered (temperature-1) distribution. */
export interface SampledToken {
  readonly token: number;
  readonly logprob: number;
}

/**
 * Samples one token from `logits[offset .. offset + vocabSize)`.
 *
 * The reported `logprob` is `log softmax(logits)[token]` at temperature 1, without top-p truncation: the
 * policy's own log-probability, which is what the trainer recomputes for importance ratios. Temperature and
 * top-p only shape the sampling.
 *
 * @param logits - Row-major logits `[rows, vocabSize]`.
 * @param offset - Index of the row's first logit.
 * @param vocabSize - `V`.
 * @param params - Temperature and top-p.
 * @param rng - Seeded uniforms (one draw per non-greedy sample).
 */
export function sampleToken(
  logits: Float32Array,
  offset: number,
  vocabSize: number,
  params: SamplingParams,
  rng: Rng,
): SampledToken {
  let max = -Infinity;
  let argmax = 0;
  for (let v = 0; v < vocabSize; v++) {
    const x = logits[offset + v];
    if (x > max) {
      max = x;
      argmax = v;
    }
  }
  let sumExp = 0;
  for (let v = 0; v < vocabSize; v++) {
    sumExp += Math.exp(logits[offset + v] - max);
  }
  const logZ = max + Math.log(sumExp);
  const logprobOf = (token: number): SampledToken => ({ token, logprob: logits[offset + token] - logZ });

  if (params.temperature === 0) {
    return logprobOf(argmax);
  }
  const probs = new Float64Array(vocabSize);
  let total = 0;
  for (let v = 0; v < vocabSize; v++) {
    probs[v] = Math.exp((logits[offset + v] - max) / params.temperature);
    total += probs[v];
  }
  let order: number[];
  if (params.topP < 1) {
    order = [...probs.keys()].sort((a, b) => probs[b] - probs[a] || a - b);
    let mass = 0;
    let keep = 0;
    while (keep < order.length && mass < params.topP * total) {
      mass += probs[order[keep]];
      keep++;
    }
    order = order.slice(0, Math.max(keep, 1));
    total = mass > 0 ? mass : probs[order[0]];
  } else {
    order = [...probs.keys()];
  }
  const target = rng.next() * total;
  let acc = 0;
  for (const v of order) {
    acc += probs[v];
    if (target < acc) {
      return logprobOf(v);
    }
  }
  // Rounding left `target` at the very top: take the last token with mass.
  for (let i = order.length - 1; i >= 0; i--) {
    if (probs[order[i]] > 0) {
      return logprobOf(order[i]);
    }
  }
  return logprobOf(argmax);
}
