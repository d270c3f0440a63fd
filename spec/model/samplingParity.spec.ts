/**
 * rxrl's sampler draws from the distribution transformers' `generate(do_sample=True)` draws from, and reports the
 * log-probs the trainer recomputes.
 *
 * The reference (spec/fixtures/sampling/reference.json) is written by scripts/sampling_reference.py with
 * transformers' own logits processors (temperature → top-k → top-p, as `generate` builds them) on logit rows both
 * sides generate from a seed.
 */
import * as tf from '@tensorflow/tfjs-core';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { collate } from '../../lib/data/collate.js';
import { initBackend } from '../../lib/model/backend.js';
import { runGeneration, type StepDecoder } from '../../lib/model/generate.js';
import { sampleToken, samplingDistribution, type SamplingParams } from '../../lib/model/sampling.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { createRng } from '../../lib/core/random.js';
import type { Task, Trajectory } from '../../lib/core/types.js';

/** Largest allowed |rxrl − transformers| per probability. */
const PROB_TOLERANCE = 1e-6;
/** Samples per row in the goodness-of-fit test. */
const DRAWS = 20_000;
/** Significance of the chi-square test; its critical value is from the Wilson–Hilferty approximation. */
const ALPHA_Z = 3.719; // one-sided standard normal quantile of α = 1e-4
/** Smallest expected count of a bin of its own; smaller ones are pooled. */
const MIN_EXPECTED = 5;

interface RowRecipe {
  readonly name: string;
  readonly vocab: number;
  readonly seed: number;
  readonly scale: number;
  readonly set: readonly (readonly [number, number | '-inf'])[];
}
interface Case {
  readonly row: string;
  readonly temperature: number;
  readonly topP: number;
  readonly topKAsked: number | null;
  readonly topK: number;
  readonly processors: readonly string[];
  readonly kept: readonly number[];
  readonly q: string;
  readonly top: readonly (readonly [number, number])[];
  readonly float32Error: number;
}
interface RowInfo extends RowRecipe {
  /** Whether torch's sort orders this row's equal scores by id (then the kept ids must match one for one). */
  readonly tieOrderStable: boolean;
}
interface Fixture {
  readonly qUnit: number;
  readonly rows: readonly RowInfo[];
  readonly cases: readonly Case[];
}

const fixture = JSON.parse(readFileSync(new URL('../fixtures/sampling/reference.json', import.meta.url), 'utf8')) as Fixture;

/** murmur3's finalizer, as scripts/sampling_reference.py's `mix32`. */
function mix32(x: number): number {
  let h = x >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/** The row's float32 logits, bit for bit those of the Python script's `logit_row`. */
function logitRow(row: RowRecipe): Float32Array {
  const key = mix32(row.seed ^ 0x9e3779b9);
  const out = new Float32Array(row.vocab);
  for (let i = 0; i < row.vocab; i++) {
    const u = [0, 1, 2, 3].map((j) => (mix32(key ^ ((4 * i + j) >>> 0)) + 0.5) / 4294967296);
    out[i] = row.scale * (u[0] + u[1] + (u[2] + u[3]) - 2);
  }
  for (const [index, value] of row.set) out[index] = value === '-inf' ? -Infinity : value;
  return out;
}

/** transformers' distribution of a case: kept id → probability (within qUnit / 2). */
function reference(c: Case): Map<number, number> {
  const ids: number[] = [];
  for (let i = 0; i < c.kept.length; i += 2) for (let v = c.kept[i]; v < c.kept[i + 1]; v++) ids.push(v);
  const bytes = Buffer.from(c.q, 'base64');
  const out = new Map<number, number>();
  let at = 0;
  for (const id of ids) {
    let value = 0;
    let shift = 1;
    for (;;) {
      const byte = bytes[at++];
      value += (byte & 0x7f) * shift;
      shift *= 128;
      if (byte < 0x80) break;
    }
    out.set(id, value * fixture.qUnit);
  }
  expect(at).toBe(bytes.length);
  return out;
}

const logitsOf = new Map(fixture.rows.map((row) => [row.name, logitRow(row)]));
const stableRows = new Set(fixture.rows.filter((row) => row.tieOrderStable).map((row) => row.name));
const paramsOf = (c: Case): SamplingParams => ({ temperature: c.temperature, topP: c.topP, topK: c.topK });
const caseName = (c: Case): string => `${c.row} T=${c.temperature} top_p=${c.topP} top_k=${c.topKAsked}`;

function rxrlDistribution(c: Case): Map<number, number> {
  const logits = logitsOf.get(c.row)!;
  const { ids, probs } = samplingDistribution(logits, 0, logits.length, paramsOf(c));
  return new Map([...ids].map((id, i) => [id, probs[i]]));
}

/**
 * Whether a kept set holds every token tied with one of its members: torch's sort orders equal scores in no
 * specified order on long rows, so where a tie straddles the cut-off the tied token transformers keeps is arbitrary.
 */
function tieClosed(kept: ReadonlySet<number>, logits: Float32Array): boolean {
  const keptValues = new Set([...kept].map((v) => logits[v]));
  return logits.every((x, v) => kept.has(v) || !keptValues.has(x) || x === -Infinity);
}

/** Probabilities by logit value, sorted: the distribution up to which of equal-score tokens carries which mass. */
const byScore = (dist: Map<number, number>, logits: Float32Array): [number, number][] =>
  [...dist].map(([v, p]): [number, number] => [logits[v] + 0, p]).sort((a, b) => a[0] - b[0] || a[1] - b[1]);

/** Pearson's chi-square of observed counts against expected probabilities, with bins under MIN_EXPECTED pooled. */
function chiSquare(counts: Map<number, number>, probs: Map<number, number>, draws: number): { stat: number; df: number; outside: number } {
  let stat = 0;
  let bins = 0;
  let pooledObserved = 0;
  let pooledExpected = 0;
  for (const [id, p] of probs) {
    const observed = counts.get(id) ?? 0;
    const expected = p * draws;
    if (expected >= MIN_EXPECTED) {
      stat += (observed - expected) ** 2 / expected;
      bins++;
    } else {
      pooledObserved += observed;
      pooledExpected += expected;
    }
  }
  if (pooledExpected >= MIN_EXPECTED) {
    stat += (pooledObserved - pooledExpected) ** 2 / pooledExpected;
    bins++;
  }
  const outside = [...counts].filter(([id]) => !probs.has(id)).reduce((n, [, k]) => n + k, 0);
  return { stat: outside > 0 ? Infinity : stat, df: bins - 1, outside };
}

/** Upper-α critical value of a chi-square with `df` degrees of freedom (Wilson–Hilferty). */
function critical(df: number): number {
  const a = 2 / (9 * df);
  return df * (1 - a + ALPHA_Z * Math.sqrt(a)) ** 3;
}

/** Counts of `draws` tokens drawn by `draw` from a seeded stream. */
function countDraws(draw: (rng: ReturnType<typeof createRng>) => number, seed: number, draws = DRAWS): Map<number, number> {
  const rng = createRng(seed, 'samplingParity');
  const counts = new Map<number, number>();
  for (let i = 0; i < draws; i++) {
    const token = draw(rng);
    counts.set(token, (counts.get(token) ?? 0) + 1);
  }
  return counts;
}

/** Inverse-CDF draw from an explicit distribution (a sampler with a bug, for the power check). */
const drawFrom = (dist: Map<number, number>) => {
  const entries = [...dist];
  return (rng: ReturnType<typeof createRng>): number => {
    let u = rng.next();
    for (const [id, p] of entries) {
      if ((u -= p) < 0) return id;
    }
    return entries[entries.length - 1][0];
  };
};

const normalized = (entries: [number, number][]): Map<number, number> => {
  const total = entries.reduce((s, [, p]) => s + p, 0);
  return new Map(entries.map(([id, p]) => [id, p / total]));
};

describe('sampling parity with transformers (reference written by scripts/sampling_reference.py)', () => {
  it('the fixture covers the rows and settings asked for, with the processors generate builds', () => {
    expect(new Set(fixture.cases.map((c) => c.row))).toEqual(new Set(['peaked', 'flat', 'ties', 'neg-inf', 'small', 'large']));
    expect(logitsOf.get('large')!.length).toBe(49152);
    for (const c of fixture.cases) {
      const expected = [
        ...(c.temperature !== 1 ? ['TemperatureLogitsWarper'] : []),
        ...(c.topK !== 0 ? ['TopKLogitsWarper'] : []),
        ...(c.topP < 1 ? ['TopPLogitsWarper'] : []),
      ];
      expect(c.processors, caseName(c)).toEqual(expected);
      // generate resolves top_k=None to transformers' global default, 50; 0 turns top-k off.
      expect(c.topK, caseName(c)).toBe(c.topKAsked ?? 50);
    }
  });

  it('gives transformers’ probabilities within 1e-6 per entry, on the same support', () => {
    let maxError = 0;
    let maxTopError = 0;
    let tieCases = 0;
    for (const c of fixture.cases) {
      const logits = logitsOf.get(c.row)!;
      const ref = reference(c);
      const ours = rxrlDistribution(c);
      expect(ours.size, caseName(c)).toBe(ref.size);
      if (stableRows.has(c.row) || tieClosed(new Set(ref.keys()), logits)) {
        expect(
          [...ours.keys()].sort((a, b) => a - b),
          caseName(c),
        ).toEqual([...ref.keys()]);
        for (const [id, p] of ref) maxError = Math.max(maxError, Math.abs(ours.get(id)! - p));
      } else {
        // A tie straddles the cut-off and torch's order of ties is unspecified on this row: the same scores are kept, the same masses, whichever tied ids carry them.
        tieCases++;
        const a = byScore(ours, logits);
        const b = byScore(ref, logits);
        expect(
          a.map(([x]) => x),
          caseName(c),
        ).toEqual(b.map(([x]) => x));
        a.forEach(([, p], i) => (maxError = Math.max(maxError, Math.abs(p - b[i][1]))));
      }
      for (const [id, p] of c.top) {
        if (ours.has(id)) maxTopError = Math.max(maxTopError, Math.abs(ours.get(id)! - p));
      }
    }
    // The reference is rounded to qUnit: what is left of the tolerance bounds the true error.
    expect(maxError).toBeLessThanOrEqual(PROB_TOLERANCE - fixture.qUnit / 2);
    expect(maxTopError).toBeLessThanOrEqual(PROB_TOLERANCE);
    const float32 = Math.max(...fixture.cases.map((c) => c.float32Error));
    console.info(
      `sampling parity: ${fixture.cases.length} cases (${tieCases} with a tie at the cut-off), max |Δp| ${maxError.toExponential(2)} ` +
        `(vs the ${fixture.qUnit}-rounded reference), ${maxTopError.toExponential(2)} on the top-8 probabilities; ` +
        `torch's own float32 softmax is off by up to ${float32.toExponential(2)}`,
    );
  });

  const sampled = [
    { row: 'neg-inf', temperature: 0.7, topP: 0.9, topKAsked: 0 },
    { row: 'peaked', temperature: 1.3, topP: 0.9, topKAsked: 0 },
    { row: 'small', temperature: 1.3, topP: 1, topKAsked: 0 },
    { row: 'neg-inf', temperature: 1, topP: 0.5, topKAsked: 0 },
    { row: 'ties', temperature: 1, topP: 0.9, topKAsked: 0 },
    // A 49152-logit row costs ~1 ms a draw: fewer draws, still enough for its 4 and 3 degrees of freedom.
    { row: 'large', temperature: 1, topP: 1, topKAsked: 50, draws: 3000 },
    { row: 'large', temperature: 1.3, topP: 0.9, topKAsked: 50, draws: 3000 },
  ];
  const find = (s: (typeof sampled)[number]): Case =>
    fixture.cases.find((c) => c.row === s.row && c.temperature === s.temperature && c.topP === s.topP && c.topKAsked === s.topKAsked)!;

  it.each(sampled)('draws $row (T=$temperature, top_p=$topP, top_k=$topKAsked) as transformers: chi-square at α = 1e-4', (s) => {
    const c = find(s);
    const logits = logitsOf.get(c.row)!;
    const ref = reference(c);
    const draws = (s as { draws?: number }).draws ?? DRAWS;
    const counts = countDraws((rng) => sampleToken(logits, 0, logits.length, paramsOf(c), rng).token, 1, draws);
    const { stat, df, outside } = chiSquare(counts, ref, draws);
    console.info(`${caseName(c)}: chi2 ${stat.toFixed(2)}, df ${df}, critical ${critical(df).toFixed(2)}, outside the support ${outside}`);
    expect(outside).toBe(0);
    expect(df).toBeGreaterThanOrEqual(1);
    expect(stat).toBeLessThan(critical(df));
  });

  it('the chi-square test rejects a sampler that applies the temperature twice or is one token off at the top-p cut', () => {
    const c = find(sampled[0]);
    const logits = logitsOf.get(c.row)!;
    const ref = reference(c);
    const full = samplingDistribution(logits, 0, logits.length, { temperature: c.temperature, topP: 1 });
    const order = [...full.ids].map((id, i): [number, number] => [id, full.probs[i]]).sort((a, b) => b[1] - a[1]);
    const k = ref.size;
    const twice = samplingDistribution(logits, 0, logits.length, { temperature: c.temperature ** 2, topP: c.topP });
    const bugs: Record<string, Map<number, number>> = {
      'temperature twice': new Map([...twice.ids].map((id, i) => [id, twice.probs[i]])),
      'one token more': normalized(order.slice(0, k + 1)),
      'one token fewer': normalized(order.slice(0, k - 1)),
    };
    expect(k).toBeGreaterThanOrEqual(3);
    for (const [bug, dist] of Object.entries(bugs)) {
      const { stat, df } = chiSquare(countDraws(drawFrom(dist), 2), ref, DRAWS);
      console.info(`power, ${bug}: chi2 ${stat.toFixed(2)} vs critical ${critical(Math.max(df, 1)).toFixed(2)}`);
      expect(stat, bug).toBeGreaterThan(critical(Math.max(df, 1)));
    }
  });

  it('reports log_softmax(logits)[token] at temperature 1, whatever the temperature, top-k and top-p', () => {
    let worst = 0;
    for (const c of fixture.cases) {
      const logits = logitsOf.get(c.row)!;
      let max = -Infinity;
      for (const x of logits) max = Math.max(max, x);
      let sum = 0;
      for (const x of logits) sum += Math.exp(x - max);
      const rng = createRng(3, caseName(c));
      for (let i = 0; i < 4; i++) {
        const { token, logprob } = sampleToken(logits, 0, logits.length, paramsOf(c), rng);
        worst = Math.max(worst, Math.abs(logprob - (logits[token] - max - Math.log(sum))));
      }
    }
    expect(worst).toBeLessThan(1e-9);
  });
});

/** A decoder whose next-token logits are scripted: step `t` puts `LOGIT` on `script[t]`, 0 elsewhere. */
function scriptedDecoder(script: readonly number[], vocab: number): StepDecoder {
  const LOGIT = 30;
  let t = 0;
  const next = (): tf.Tensor2D => {
    const row = new Float32Array(vocab);
    row[script[Math.min(t++, script.length - 1)]] = LOGIT;
    return tf.tensor2d(row, [1, vocab]);
  };
  return { start: async () => next(), step: () => next(), keepRows: () => undefined, dispose: () => undefined };
}

/** TRL 1.16's completion mask (grpo_trainer.py `_generate_single_turn`): 1 up to and including the first EOS. */
function trlCompletionMask(completion: readonly number[], eosIds: readonly number[]): number[] {
  const first = completion.findIndex((t) => eosIds.includes(t));
  const end = first === -1 ? completion.length : first;
  return completion.map((_, i) => (i <= end ? 1 : 0));
}

describe('stop handling and the trained mask, as TRL', () => {
  const VOCAB = 16;
  const EOS = [2, 0]; // SmolLM2's generation_config.json: eos_token_id [2, 0], pad 2
  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
  });

  it.each([
    { name: 'stops at the first EOS', script: [5, 6, 2, 7, 0], maxTokens: 8, finish: 'stop', tokens: [5, 6, 2] },
    { name: 'an EOS id other than the tokenizer’s', script: [9, 0, 3], maxTokens: 8, finish: 'stop', tokens: [9, 0] },
    { name: 'runs to maxTokens without EOS', script: [5, 6, 7, 8, 9], maxTokens: 4, finish: 'length', tokens: [5, 6, 7, 8] },
  ])('$name: the tokens, log-probs and loss mask rxrl trains are those TRL trains', async ({ script, maxTokens, finish, tokens }) => {
    const [res] = await runGeneration(
      scriptedDecoder(script, VOCAB),
      [{ promptTokens: [1, 4], maxTokens, seed: 1 }],
      { stopIds: EOS },
      { vocabSize: VOCAB, maxSeqLen: 32 },
    );
    expect(res.tokens).toEqual(tokens);
    expect(res.finishReason).toBe(finish);
    expect(res.logprobs).toHaveLength(tokens.length);
    // transformers' generate keeps writing pad (= EOS 2 for SmolLM2) after a row finished, up to max_new_tokens.
    const hfCompletion = [...script.slice(0, tokens.length), ...Array(maxTokens - tokens.length).fill(2)];
    const trlMask = trlCompletionMask(hfCompletion, EOS);
    const trlKept = hfCompletion.filter((_, i) => trlMask[i] === 1);
    expect(res.tokens).toEqual(trlKept);
    // rxrl's trajectory (singleTurnWorker: every generated token is the policy's) through collate.
    const trajectory: Trajectory = {
      id: 'g/0',
      taskId: 't',
      groupId: 'g',
      runId: 0,
      modelTag: 'policy',
      policyVersion: 0,
      promptTokens: [1, 4],
      responseTokens: res.tokens,
      logprobs: res.logprobs,
      lossMask: res.tokens.map(() => 1),
      reward: 1,
      finishReason: res.finishReason,
      metrics: {},
      task: { id: 't', prompt: '' } as Task,
    };
    const batch = collate([trajectory], { padId: 2, modelTag: 'policy', minResponseLength: maxTokens });
    expect([...batch.lossMask]).toEqual(trlMask);
    expect([...batch.oldLogprobs.subarray(0, tokens.length)]).toEqual(res.logprobs.map((x) => Math.fround(x)));
  });
});

describe('the sampler’s log-probs are what the trainer recomputes', () => {
  let model: PolicyModel;
  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
    model = PolicyModel.create({ vocabSize: 40, dModel: 32, nLayers: 2, nHeads: 4, dFF: 64, maxSeqLen: 32 }, 5);
  });
  afterAll(() => model.dispose());

  it('with temperature 0.7, top-p 0.9 and top-k 5, tokenLogprobs gives back the sampled log-probs', async () => {
    const prompt = [1, 7, 9];
    const [res] = await model.generate([
      { promptTokens: prompt, maxTokens: 10, seed: 4, temperature: 0.7, topP: 0.9, topK: 5, stopTokens: [] },
    ]);
    const seq = [...prompt, ...res.tokens];
    const T = seq.length;
    const lp = tf.tidy(
      () =>
        model
          .tokenLogprobs(
            tf.tensor2d(seq, [1, T], 'int32'),
            tf.ones([1, T]) as tf.Tensor2D,
            tf.tensor2d([...Array(T).keys()], [1, T], 'int32'),
            prompt.length - 1,
          )
          .logprobs.arraySync()[0],
    );
    expect(lp).toHaveLength(res.logprobs.length);
    res.logprobs.forEach((x, t) => expect(Math.abs(x - lp[t])).toBeLessThanOrEqual(1e-4));
  });

  it('top-k keeps only the k most likely tokens (and rejects a bad topK)', async () => {
    const prompt = [1, 7, 9];
    const logits = tf.tidy(() => {
      const T = prompt.length;
      const all = model.logits(
        tf.tensor2d(prompt, [1, T], 'int32'),
        tf.ones([1, T]) as tf.Tensor2D,
        tf.tensor2d([...Array(T).keys()], [1, T], 'int32'),
      );
      return tf.reshape(tf.slice(all, [0, T - 1, 0], [1, 1, -1]), [-1]).dataSync() as Float32Array;
    });
    const top3 = new Set([...logits.keys()].sort((a, b) => logits[b] - logits[a]).slice(0, 3));
    const firsts = await model.generate(
      [...Array(40).keys()].map((seed) => ({ promptTokens: prompt, maxTokens: 1, seed, temperature: 5, topK: 3, stopTokens: [] })),
    );
    expect(firsts.every((r) => top3.has(r.tokens[0]))).toBe(true);
    await expect(model.generate([{ promptTokens: prompt, maxTokens: 1, topK: 1.5 }])).rejects.toThrow();
  });
});
