/**
 * Token sampling on the CPU from one row of logits: temperature, top-k, nucleus (top-p) and greedy decoding,
 * with the semantics of transformers' `generate(do_sample=True)`.
 *
 * transformers builds, for sampling, `TemperatureLogitsWarper` → `TopKLogitsWarper` → `TopPLogitsWarper` (in that
 * order, each only when it changes something: temperature ≠ 1, top-k ≠ 0, top-p < 1), then draws from the softmax of
 * what is left. {@link samplingDistribution} is that distribution, computed here in float64 except where transformers'
 * float32 arithmetic decides which tokens are kept (the tempered scores and the top-p cut-off are rounded to float32 as
 * torch computes them), so the kept set is the same token for token; `spec/model/samplingParity.spec.ts` checks it
 * against probabilities written by transformers (`scripts/sampling_reference.py`).
 *
 * Reading the logits back and sampling in plain JS (float64) is exactly reproducible from a seeded {@link Rng}.
 * On the native backend, greedy rows and rows that draw from the whole softmax at temperature 1 take the exponentials
 * from TensorFlow (float32, both cores: `lib/model/expGraph.ts`) and sum and scan them here ({@link sampleFromExps}).
 *
 * @packageDocumentation
 */
import type { Rng } from '../core/random.js';

/** How to pick the next token. */
export interface SamplingParams {
  /** Temperature; `0` picks the arg-max (ties: the lowest id). */
  readonly temperature: number;
  /** Nucleus mass in `(0, 1]`: sample from the smallest set of most likely tokens whose mass reaches it. */
  readonly topP: number;
  /**
   * Keep only the `topK` highest-scoring tokens (every token tied with the `topK`-th stays too, as in transformers'
   * `TopKLogitsWarper`), before top-p. `0` or absent: no top-k (transformers' `top_k=0`; TRL's GRPO default).
   */
  readonly topK?: number;
}

/** A sampled token and its log-probability under the un-tempered (temperature-1) distribution. */
export interface SampledToken {
  readonly token: number;
  readonly logprob: number;
}

/** The distribution a token is drawn from: the kept tokens and their probabilities (summing to 1). */
export interface SamplingDistribution {
  /** Kept token ids (every token with a probability > 0), `[K]`. */
  readonly ids: Int32Array;
  /** Probability of each kept token, `[K]`, in float64. */
  readonly probs: Float64Array;
}

/**
 * Relative slack on the top-p mass when picking the candidates to sort: a token outside the candidates has a tail
 * mass below `1 − topP − TOP_P_SLACK`, which stays below the float32 cut-off (half an ulp of 1 is 6e-8).
 */
const TOP_P_SLACK = 1e-6;

/**
 * The next-token distribution of one row of logits under `params`: transformers' temperature, top-k and top-p
 * warpers in its order, then the softmax. Temperature 0 is greedy: all the mass on the arg-max (lowest id on ties).
 *
 * Ties are broken as transformers does on a stable sort: top-k keeps every token tied with the `k`-th score; top-p
 * drops tied tokens in increasing id order (torch sorts the scores ascending; for ties its order is that of a
 * stable sort on short rows, and unspecified on long ones).
 *
 * @param logits - Row-major logits `[rows, vocabSize]`.
 * @param offset - Index of the row's first logit.
 * @param vocabSize - `V`.
 * @param params - Temperature, top-p and top-k.
 * @returns The kept ids and their probabilities (`O(V)`, plus a sort of the top-p candidates only).
 */
export function samplingDistribution(
  logits: Float32Array,
  offset: number,
  vocabSize: number,
  params: SamplingParams,
): SamplingDistribution {
  if (params.temperature === 0) {
    return { ids: Int32Array.of(argmaxOf(logits, offset, vocabSize)), probs: Float64Array.of(1) };
  }
  const scores = temperedScores(logits, offset, vocabSize, params.temperature);
  const topK = params.topK ?? 0;
  const floor = topK > 0 && topK < vocabSize ? kthLargest(scores, topK) : -Infinity;
  let max = -Infinity;
  for (let v = 0; v < vocabSize; v++) {
    if (scores[v] >= floor && scores[v] > max) max = scores[v];
  }
  const weights = new Float64Array(vocabSize); // [V], 0 for dropped tokens
  let total = 0;
  for (let v = 0; v < vocabSize; v++) {
    if (scores[v] >= floor) {
      weights[v] = Math.exp(scores[v] - max);
      total += weights[v];
    }
  }
  const kept = params.topP < 1 ? nucleus(weights, total, params.topP) : nonZero(weights);
  let mass = 0;
  for (const v of kept) mass += weights[v];
  const probs = new Float64Array(kept.length); // [K]
  for (let i = 0; i < kept.length; i++) probs[i] = weights[kept[i]] / mass;
  return { ids: kept, probs };
}

/**
 * Samples one token from `logits[offset .. offset + vocabSize)`: one draw from {@link samplingDistribution}.
 *
 * The reported `logprob` is `log softmax(logits)[token]` at temperature 1, without top-k/top-p truncation: the
 * policy's own log-probability, which is what the trainer recomputes (`PolicyModel.tokenLogprobs`) for importance
 * ratios. Temperature, top-k and top-p only shape the sampling. (TRL's GRPOTrainer instead scores
 * `log_softmax(logits / temperature)` in its loss; at temperature 1, the default of both, the two agree.)
 *
 * @param logits - Row-major logits `[rows, vocabSize]`.
 * @param offset - Index of the row's first logit.
 * @param vocabSize - `V`.
 * @param params - Temperature, top-p and top-k.
 * @param rng - Seeded uniforms (one draw per non-greedy sample).
 */
export function sampleToken(logits: Float32Array, offset: number, vocabSize: number, params: SamplingParams, rng: Rng): SampledToken {
  if (params.temperature !== 0 && (params.topK ?? 0) === 0 && params.topP >= 1)
    return sampleWhole(logits, offset, vocabSize, params.temperature, rng);
  const { ids, probs } = samplingDistribution(logits, offset, vocabSize, params);
  let token = ids[ids.length - 1];
  if (params.temperature !== 0) {
    const target = rng.next();
    let acc = 0;
    for (let i = 0; i < ids.length; i++) {
      acc += probs[i];
      if (target < acc) {
        token = ids[i];
        break;
      }
    }
    // Rounding may leave `target` at the very top: the last kept token then.
  }
  return { token, logprob: logits[offset + token] - logSumExp(logits, offset, vocabSize) };
}

/** Reused weights of {@link sampleWhole} (one row's at a time; sampling is synchronous). */
let wholeWeights = new Float64Array(0);

/**
 * {@link sampleToken} without top-k or top-p (GRPO's usual setting): the same draw from the softmax of the tempered
 * scores, in three passes over the row and no allocation; at temperature 1 the log-normalizer is shared.
 */
function sampleWhole(logits: Float32Array, offset: number, vocabSize: number, temperature: number, rng: Rng): SampledToken {
  if (wholeWeights.length < vocabSize) wholeWeights = new Float64Array(vocabSize);
  const weights = wholeWeights;
  const t = Math.fround(temperature);
  let max = -Infinity;
  for (let v = 0; v < vocabSize; v++) {
    const score = temperature === 1 ? logits[offset + v] : Math.fround(logits[offset + v] / t);
    weights[v] = score;
    if (score > max) max = score;
  }
  let total = 0;
  for (let v = 0; v < vocabSize; v++) {
    weights[v] = Math.exp(weights[v] - max);
    total += weights[v];
  }
  const token = drawFrom(weights, 0, vocabSize, rng.next() * total);
  const logZ = temperature === 1 ? max + Math.log(total) : logSumExp(logits, offset, vocabSize);
  return { token, logprob: logits[offset + token] - logZ };
}

/**
 * Whether {@link sampleFromExps} can pick a row's token: greedy rows (temperature 0: the arg-max, and the log-softmax
 * at it) and rows that draw from the whole softmax at temperature 1 (no top-k, no top-p).
 */
export function samplesFromExps(params: SamplingParams): boolean {
  return params.temperature === 0 || (params.temperature === 1 && (params.topK ?? 0) === 0 && params.topP >= 1);
}

/**
 * {@link sampleToken} for a row that {@link samplesFromExps}, from the row's softmax numerators `exp(logit − max)`
 * computed elsewhere (in float32 by TensorFlow: `lib/model/expGraph.ts`): the greedy arg-max, or the same draw from
 * the whole softmax for the same uniform, summed and scanned in float64. Its probabilities and log-probabilities differ
 * from those of the host's float64 exponentials by the float32 rounding of each term (relative 1e-7).
 *
 * @param logits - Row-major logits `[rows, vocabSize]` (the token's log-probability is read from them).
 * @param exps - `exp(logits − rowMax)`, laid out as `logits`.
 * @param offset - Index of the row's first logit.
 * @param vocabSize - `V`.
 * @param max - The row's largest logit.
 * @param params - Temperature 0 or 1 (see {@link samplesFromExps}).
 * @param rng - Seeded uniforms (one draw when not greedy).
 */
export function sampleFromExps(
  logits: Float32Array,
  exps: Float32Array,
  offset: number,
  vocabSize: number,
  max: number,
  params: SamplingParams,
  rng: Rng,
): SampledToken {
  let total = 0;
  for (let v = offset; v < offset + vocabSize; v++) total += exps[v];
  const token = params.temperature === 0 ? argmaxOf(logits, offset, vocabSize) : drawFrom(exps, offset, vocabSize, rng.next() * total);
  return { token, logprob: logits[offset + token] - (max + Math.log(total)) };
}

/**
 * The first token whose running sum of `weights` passes `target` (rounding may leave `target` at the very top: the
 * last token with mass then), as an index from `offset`.
 */
function drawFrom(weights: Float64Array | Float32Array, offset: number, vocabSize: number, target: number): number {
  let token = -1;
  let acc = 0;
  for (let v = 0; v < vocabSize; v++) {
    const w = weights[offset + v];
    acc += w;
    if (w > 0) token = v;
    if (target < acc) break;
  }
  return token;
}

/** `log Σ exp(logits[offset + v])` over the row, in float64. */
function logSumExp(logits: Float32Array, offset: number, vocabSize: number): number {
  let max = -Infinity;
  for (let v = 0; v < vocabSize; v++) max = Math.max(max, logits[offset + v]);
  let sum = 0;
  for (let v = 0; v < vocabSize; v++) sum += Math.exp(logits[offset + v] - max);
  return max + Math.log(sum);
}

/** Index of the largest logit of the row (the lowest on ties). */
function argmaxOf(logits: Float32Array, offset: number, vocabSize: number): number {
  let argmax = 0;
  for (let v = 1; v < vocabSize; v++) {
    if (logits[offset + v] > logits[offset + argmax]) argmax = v;
  }
  return argmax;
}

/**
 * `logits / temperature` as `TemperatureLogitsWarper` computes it: a float32 division (torch casts the Python
 * scalar to the tensor's dtype), so ties and the top-k cut-off fall where transformers' do. `[V]`.
 */
function temperedScores(logits: Float32Array, offset: number, vocabSize: number, temperature: number): Float64Array {
  const scores = new Float64Array(vocabSize);
  if (temperature === 1) {
    for (let v = 0; v < vocabSize; v++) scores[v] = logits[offset + v];
    return scores;
  }
  const t = Math.fround(temperature);
  for (let v = 0; v < vocabSize; v++) scores[v] = Math.fround(logits[offset + v] / t);
  return scores;
}

/** The `k`-th largest value of `scores` (`1 ≤ k < length`), by a min-heap of the `k` largest: `O(V log k)`. */
function kthLargest(scores: Float64Array, k: number): number {
  const heap = new Float64Array(k);
  let size = 0;
  const siftDown = (from: number): void => {
    let i = from;
    for (;;) {
      const l = 2 * i + 1;
      const r = l + 1;
      let m = i;
      if (l < size && heap[l] < heap[m]) m = l;
      if (r < size && heap[r] < heap[m]) m = r;
      if (m === i) return;
      [heap[i], heap[m]] = [heap[m], heap[i]];
      i = m;
    }
  };
  for (const x of scores) {
    if (size < k) {
      let i = size++;
      heap[i] = x;
      while (i > 0 && heap[(i - 1) >> 1] > heap[i]) {
        const p = (i - 1) >> 1;
        [heap[i], heap[p]] = [heap[p], heap[i]];
        i = p;
      }
    } else if (x > heap[0]) {
      heap[0] = x;
      siftDown(0);
    }
  }
  return heap[0];
}

/**
 * A weight `τ` such that the tokens weighing at least `τ` hold more than `topP + TOP_P_SLACK` of the mass (so every
 * token top-p keeps is among them): the highest of `max·10^-j` (j = 1…8) that does, else one that always does
 * (the tokens below it hold less than `1 − topP − TOP_P_SLACK`). Each try is one pass; peaked rows stop early.
 */
function nucleusFloor(weights: Float64Array, total: number, topP: number): number {
  let max = 0;
  for (let v = 0; v < weights.length; v++) max = Math.max(max, weights[v]);
  const need = total * (topP + TOP_P_SLACK);
  for (let tau = max / 10, j = 1; j <= 8; tau /= 10, j++) {
    let mass = 0;
    for (let v = 0; v < weights.length; v++) if (weights[v] >= tau) mass += weights[v];
    if (mass >= need) return tau;
  }
  return Math.max(0, (total * (1 - topP - TOP_P_SLACK)) / weights.length);
}

/** Ids of the tokens with a weight > 0, in id order. */
function nonZero(weights: Float64Array): Int32Array {
  let count = 0;
  for (let v = 0; v < weights.length; v++) if (weights[v] > 0) count++;
  const ids = new Int32Array(count);
  for (let v = 0, i = 0; v < weights.length; v++) if (weights[v] > 0) ids[i++] = v;
  return ids;
}

/**
 * `TopPLogitsWarper`: a token stays when the mass of itself and every token sorted below it (torch's ascending
 * cumulative softmax, compared in float32) is above `1 − topP`; the most likely token always stays. Only tokens that
 * can stay are sorted: those whose weight is at least {@link nucleusFloor}.
 *
 * @param weights - `exp(score − max)` of the tokens top-k kept, 0 for the others, `[V]`.
 * @param total - Their sum.
 * @param topP - In `(0, 1)`.
 * @returns Kept ids, most likely first (ties: the higher id first).
 */
function nucleus(weights: Float64Array, total: number, topP: number): Int32Array {
  const tau = nucleusFloor(weights, total, topP);
  const candidates: number[] = [];
  for (let v = 0; v < weights.length; v++) if (weights[v] > 0 && weights[v] >= tau) candidates.push(v);
  candidates.sort((a, b) => weights[b] - weights[a] || b - a);
  const cutoff = Math.fround(1 - topP);
  let before = 0;
  let keep = 0;
  while (keep < candidates.length && (keep === 0 || Math.fround(1 - before / total) > cutoff)) {
    before += weights[candidates[keep]];
    keep++;
  }
  return Int32Array.from(candidates.slice(0, keep));
}
