/**
 * The sampling model behind `rxrl serve`: a {@link PolicyModel} plus top-k and prompt log-probs on request.
 *
 * The `LocalEngine` runs one batch at a time and never swaps weights while a batch runs, so scoring the
 * alternatives inside the batch uses exactly the weights that sampled the tokens.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { SamplingModel } from '../engine/local.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../model/types.js';
import { padPrompts, type GenerateOptions } from '../model/generate.js';
import type { PolicyModel } from '../model/transformer.js';
import { yieldToEventLoop } from '../core/turns.js';

/** Rows per scoring pass: one pass runs per turn of the event loop, so a large batch's scoring leaves it turns. */
export const SCORE_ROWS = 64;

/** One alternative token at a position and its log-probability. */
export interface TopLogprob {
  readonly token: number;
  readonly logprob: number;
}

/** The log-prob of one prompt token given its prefix, its rank in that distribution, and the top alternatives. */
export interface PromptTokenLogprob {
  readonly token: number;
  readonly logprob: number;
  /** 1 for the most likely token; ties share the better rank. */
  readonly rank: number;
  /** The most likely tokens at this position, most likely first. */
  readonly top: readonly TopLogprob[];
}

/** What to score for one request; either part may be absent. */
export interface ScoreRequest {
  /** Alternatives per response token (`logprobs`, `top_logprobs`). */
  readonly topLogprobs?: number;
  /** Alternatives per prompt token, besides the token itself (`prompt_logprobs`). */
  readonly promptLogprobs?: number;
}

/** What was scored for one response. */
export interface Scores {
  /** One list per response token, most likely first. */
  readonly top?: TopLogprob[][];
  /** One entry per prompt token; `null` for the first (it has no prefix). */
  readonly prompt?: (PromptTokenLogprob | null)[];
}

/**
 * Wraps a policy model for the local engine and remembers, per request object, what to score besides sampling:
 * top alternatives of the response tokens and log-probs of the prompt tokens. Both come from one forward pass
 * over prompt and response, under the weights that sampled the response; read them with
 * {@link ServingModel.scores}.
 */
export class ServingModel implements SamplingModel {
  private readonly wanted = new WeakMap<GenerateRequest, ScoreRequest>();
  private readonly found = new WeakMap<GenerateResponse, Scores>();

  constructor(readonly model: PolicyModel) {}

  /** Asks for scores of `request` (by identity) when it is generated; zero or absent parts are not computed. */
  requestScores(request: GenerateRequest, what: ScoreRequest): void {
    const topLogprobs = what.topLogprobs ?? 0;
    if (topLogprobs > 0 || what.promptLogprobs !== undefined) this.wanted.set(request, what);
  }

  /** The scores computed for `response`, if any were asked for. */
  scores(response: GenerateResponse): Scores | undefined {
    return this.found.get(response);
  }

  async generate(requests: readonly GenerateRequest[], options: GenerateOptions): Promise<GenerateResponse[]> {
    const responses = await this.model.generate(requests, options);
    const rows = requests.flatMap((request, i) => (this.wanted.has(request) ? [i] : []));
    if (rows.length > 0) await this.score(rows, requests, responses);
    return responses;
  }

  setWeights(weights: NamedWeights): void {
    this.model.setWeights(weights);
  }

  /**
   * Forward passes over prompt + response of each row, {@link SCORE_ROWS} rows per pass and one pass per turn of
   * the event loop; keeps what each row asked for.
   */
  private async score(
    rows: readonly number[],
    requests: readonly GenerateRequest[],
    responses: readonly GenerateResponse[],
  ): Promise<void> {
    const sequences = rows.map((i) => [...requests[i].promptTokens, ...responses[i].tokens.slice(0, -1)]);
    const batch = padPrompts(sequences); // one width for every pass: a row's scores do not depend on its pass
    const V = this.model.config.vocabSize;
    for (let first = 0; first < rows.length; first += SCORE_ROWS) {
      await yieldToEventLoop();
      const count = Math.min(SCORE_ROWS, rows.length - first);
      const span = <A extends Int32Array | Float32Array>(a: A): A => a.subarray(first * batch.width, (first + count) * batch.width) as A;
      const logp = tf.tidy(() => {
        const ids = tf.tensor2d(span(batch.inputIds), [count, batch.width], 'int32'); // [c, W]
        const mask = tf.tensor2d(span(batch.attentionMask), [count, batch.width], 'float32'); // [c, W]
        const positions = tf.tensor2d(span(batch.positionIds), [count, batch.width], 'int32'); // [c, W]
        return tf.logSoftmax(this.model.logits(ids, mask, positions)); // [c, W, V]
      });
      let values: Float32Array;
      try {
        values = (await logp.data()) as Float32Array;
      } finally {
        logp.dispose();
      }
      rows.slice(first, first + count).forEach((i, r) => {
        const start = (r * batch.width + batch.width - sequences[first + r].length) * V; // logits after the row's first token
        this.keepScores(requests[i], responses[i], values, start, V);
      });
    }
  }

  /** Reads one row's top alternatives and prompt log-probs out of log-probs whose row starts at `values[start]`. */
  private keepScores(request: GenerateRequest, response: GenerateResponse, values: Float32Array, start: number, V: number): void {
    const what = this.wanted.get(request) ?? {};
    const prompt = request.promptTokens;
    const at = (position: number): number => start + position * V; // logits that predicted token position + 1
    const scores: { top?: TopLogprob[][]; prompt?: (PromptTokenLogprob | null)[] } = {};
    const k = what.topLogprobs ?? 0;
    if (k > 0) scores.top = response.tokens.map((_, j) => topTokens(values, at(prompt.length - 1 + j), V, k));
    if (what.promptLogprobs !== undefined) {
      const kp = what.promptLogprobs;
      scores.prompt = prompt.map((token, j) => {
        if (j === 0) return null;
        const offset = at(j - 1);
        const logprob = values[offset + token];
        let rank = 1;
        for (let v = 0; v < V; v++) if (values[offset + v] > logprob) rank++;
        return { token, logprob, rank, top: kp > 0 ? topTokens(values, offset, V, kp) : [] };
      });
    }
    this.found.set(response, scores);
  }
}

/** The `k` largest of `values[offset … offset + V)`, largest first (lower id first among equals). */
function topTokens(values: Float32Array, offset: number, V: number, k: number): TopLogprob[] {
  const best: TopLogprob[] = [];
  for (let token = 0; token < V; token++) {
    const logprob = values[offset + token];
    if (best.length === k && logprob <= best[k - 1].logprob) continue;
    let slot = best.length;
    while (slot > 0 && best[slot - 1].logprob < logprob) slot--;
    best.splice(slot, 0, { token, logprob });
    if (best.length > k) best.pop();
  }
  return best;
}
