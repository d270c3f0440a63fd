/**
 * The sampling model behind `rxrl serve`: a {@link PolicyModel} plus top-k log-probs on request.
 *
 * The `LocalEngine` runs one batch at a time and never swaps weights while a batch runs, so scoring the
 * alternatives inside the batch uses exactly the weights that sampled the tokens.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { SamplingModel } from '../engine/local.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../engine/types.js';
import { padPrompts, type GenerateOptions } from '../model/generate.js';
import type { PolicyModel } from '../model/transformer.js';

/** One alternative token at a position and its log-probability. */
export interface TopLogprob {
  readonly token: number;
  readonly logprob: number;
}

/**
 * Wraps a policy model for the local engine and remembers, per request object, how many top alternatives to
 * score; the alternatives of each response are then available from {@link ServingModel.topLogprobs}.
 */
export class ServingModel implements SamplingModel {
  private readonly wanted = new WeakMap<GenerateRequest, number>();
  private readonly found = new WeakMap<GenerateResponse, TopLogprob[][]>();

  constructor(readonly model: PolicyModel) {}

  /** Asks for the `k` most likely tokens at each position of the response to `request` (request identity). */
  requestTopLogprobs(request: GenerateRequest, k: number): void {
    if (k > 0) this.wanted.set(request, k);
  }

  /** The alternatives scored for `response`, one list per response token (most likely first), if any. */
  topLogprobs(response: GenerateResponse): TopLogprob[][] | undefined {
    return this.found.get(response);
  }

  async generate(requests: readonly GenerateRequest[], options: GenerateOptions): Promise<GenerateResponse[]> {
    const responses = await this.model.generate(requests, options);
    const rows = requests.flatMap((request, i) =>
      (this.wanted.get(request) ?? 0) > 0 && responses[i].tokens.length > 0 ? [i] : [],
    );
    if (rows.length > 0) await this.scoreAlternatives(rows, requests, responses);
    return responses;
  }

  setWeights(weights: NamedWeights): void {
    this.model.setWeights(weights);
  }

  /** One forward pass over prompt + response of each row; keeps the top-k of every response position. */
  private async scoreAlternatives(
    rows: readonly number[],
    requests: readonly GenerateRequest[],
    responses: readonly GenerateResponse[],
  ): Promise<void> {
    const sequences = rows.map((i) => [...requests[i].promptTokens, ...responses[i].tokens.slice(0, -1)]);
    const batch = padPrompts(sequences);
    const V = this.model.config.vocabSize;
    const logp = tf.tidy(() => {
      const ids = tf.tensor2d(batch.inputIds, [batch.rows, batch.width], 'int32'); // [b, W]
      const mask = tf.tensor2d(batch.attentionMask, [batch.rows, batch.width], 'float32'); // [b, W]
      const positions = tf.tensor2d(batch.positionIds, [batch.rows, batch.width], 'int32'); // [b, W]
      return tf.logSoftmax(this.model.logits(ids, mask, positions)); // [b, W, V]
    });
    let values: Float32Array;
    try {
      values = (await logp.data()) as Float32Array;
    } finally {
      logp.dispose();
    }
    rows.forEach((i, r) => {
      const k = this.wanted.get(requests[i]) ?? 0;
      const promptLength = requests[i].promptTokens.length;
      const pad = batch.width - sequences[r].length;
      const perToken: TopLogprob[][] = responses[i].tokens.map((_, j) => {
        const at = (r * batch.width + pad + promptLength - 1 + j) * V; // logits that predicted response token j
        const ranked = Array.from({ length: V }, (_, v) => v).sort((a, b) => values[at + b] - values[at + a] || a - b);
        return ranked.slice(0, k).map((token) => ({ token, logprob: values[at + token] }));
      });
      this.found.set(responses[i], perToken);
    });
  }
}
