/**
 * The sampling routes of rxrl's Tinker service: `save_weights_for_sampler`, `create_sampling_session`,
 * `GET samplers/{id}` and `asample`. A sample request is checked whole — its prompt, its sampling parameters,
 * `max_tokens` within the model's context after the prompt — before it joins a batch, so a bad one is refused
 * alone (400) and never fails the requests it would have been batched with.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, Tokenizer } from '../model/types.js';
import type { PolicyModel } from '../model/transformer.js';
import { hashSeed } from '../core/random.js';
import { absent, excerpt, invalid, quote, readBoolean, readInteger, readNumber, type JsonObject } from '../serve/protocol.js';
import type { FutureAnswer, TinkerContext } from './context.js';
import type { Outcome } from './futures.js';
import { encodeSampleResponse, type SampledSequenceWire } from './proto.js';
import { Sampler } from './sampling.js';
import { checkName } from './states.js';
import { readObject } from './trainingRoutes.js';

/** Most stop tokens of one request. */
const MAX_STOPS = 64;

/**
 * `POST save_weights_for_sampler`: a snapshot of the client's adapter, kept under
 * `tinker://<model>/sampler_weights/<path>` when a path is given, else opened as a sampling session.
 */
export function saveWeightsForSampler(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const client = ctx.clients.get(body.model_id);
  const name = absent(body, 'path') || body.path === '' ? undefined : checkName(body.path);
  const id = ctx.futures.submit(
    () => {
      const snapshot = { weights: client.trainer.adapter.getWeights(), rank: client.trainer.rank };
      if (name !== undefined) {
        const path = `tinker://${client.id}/sampler_weights/${name}`;
        ctx.samplerWeights.set(path, snapshot);
        return { json: { path, type: 'save_weights_for_sampler' } };
      }
      const sampler = new Sampler(ctx.model, ctx.tokenizer.stopIds, snapshot, undefined, client.session);
      ctx.samplers.add(sampler);
      return { json: { path: null, sampling_session_id: sampler.id, type: 'save_weights_for_sampler' } };
    },
    client.queue,
    client.session,
  );
  return { request_id: id, model_id: client.id };
}

/** `POST create_sampling_session`: of named sampler weights (`model_path`; 404 when unknown or dropped), or of the base model. */
export function createSamplingSession(ctx: TinkerContext, body: JsonObject): unknown {
  const session = typeof body.session_id === 'string' && ctx.clients.touch(body.session_id) ? body.session_id : undefined;
  let sampler: Sampler;
  if (!absent(body, 'model_path')) {
    if (typeof body.model_path !== 'string')
      throw invalid('model_path', `model_path must be a tinker:// path, got ${quote(body.model_path)}`);
    sampler = new Sampler(ctx.model, ctx.tokenizer.stopIds, ctx.samplerWeights.get(body.model_path), body.model_path, session);
  } else {
    if (body.base_model !== ctx.baseModel)
      throw invalid('base_model', `this service samples '${ctx.baseModel}', not '${excerpt(String(body.base_model))}'`);
    sampler = new Sampler(ctx.model, ctx.tokenizer.stopIds, undefined, undefined, session);
  }
  ctx.samplers.add(sampler);
  return { sampling_session_id: sampler.id, type: 'create_sampling_session' };
}

/** `GET samplers/{id}`: what the SDK asks of a sampling session it did not make (its base model). */
export function getSampler(ctx: TinkerContext, id: string): unknown {
  const sampler = ctx.samplers.get(id);
  return { sampler_id: sampler.id, base_model: ctx.baseModel, model_path: sampler.modelPath ?? null };
}

/** A checked `asample` call. */
interface SampleCall {
  readonly prompt: number[];
  readonly requests: GenerateRequest[];
  readonly promptLogprobs: boolean;
}

/**
 * `POST asample`: `num_samples` continuations of the prompt, decoded in the sampler's next turn with whatever else
 * waits on it; the sampler lives until the call settles.
 */
export function asample(ctx: TinkerContext, body: JsonObject): unknown {
  const sampler = ctx.samplers.get(body.sampling_session_id);
  if (sampler.session !== undefined) ctx.clients.touch(sampler.session);
  const call = readSampleCall(ctx, body);
  const request = ctx.futures.submit(() => sampler.hold(() => sampleOn(sampler, call)), undefined, sampler.session);
  const seq = typeof body.seq_id === 'number' ? body.seq_id : 0;
  return { request_id: request, sample_sequence_ids: call.requests.map((_, i) => `${sampler.id}:${seq}:${i}`) };
}

/** Samples a checked call on `sampler` (which the caller holds): the sequences, and the prompt's log-probs if asked. */
async function sampleOn(sampler: Sampler, call: SampleCall): Promise<Outcome> {
  const responses = await sampler.generate(call.requests);
  const sequences: SampledSequenceWire[] = responses.map((r) => ({
    tokens: r.tokens,
    logprobs: r.logprobs,
    stopReason: r.finishReason === 'stop' ? 'stop' : 'length',
  }));
  const promptLogprobs = call.promptLogprobs ? scorePrompt(sampler.view, call.prompt) : undefined;
  return { proto: encodeSampleResponse({ sequences, ...(promptLogprobs ? { promptLogprobs } : {}) }) };
}

/** Checks an `asample` body whole; 400 naming the field for anything a generation would refuse. */
function readSampleCall(ctx: TinkerContext, body: JsonObject): SampleCall {
  const { context } = ctx.limits;
  const prompt = readPrompt(body, ctx.model.config.vocabSize, context - 1);
  const n = readInteger(body, 'num_samples', 1, ctx.limits.maxSamples, 1);
  const params = readObject(body, 'sampling_params');
  const room = context - prompt.length;
  const maxTokens = params.max_tokens ?? Math.min(16, room);
  if (typeof maxTokens !== 'number' || !Number.isInteger(maxTokens) || maxTokens < 1 || maxTokens > room) {
    throw invalid(
      'max_tokens',
      `sampling_params.max_tokens must be an integer in [1, ${room}] (the model's context of ${context} tokens less the prompt's ${prompt.length}), got ${quote(maxTokens)}`,
    );
  }
  if (!absent(params, 'top_k') && params.top_k !== -1 && params.top_k !== 0)
    throw invalid('top_k', 'sampling_params.top_k is not supported (give -1)');
  const temperature = readNumber(params, 'temperature', 0, Number.MAX_VALUE, 1);
  const topP = readNumber(params, 'top_p', 0, 1, 1, true);
  const seed =
    readInteger(params, 'seed', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER) ??
    readInteger(body, 'seed', Number.MIN_SAFE_INTEGER, Number.MAX_SAFE_INTEGER);
  const stopTokens = stopIds(params.stop, ctx.tokenizer, ctx.model.config.vocabSize);
  const requests = Array.from({ length: n }, (_, i) => ({
    promptTokens: prompt,
    maxTokens,
    temperature,
    topP,
    stopTokens,
    ...(seed === undefined ? {} : { seed: i === 0 ? seed : hashSeed(seed, 'choice', String(i)) }),
  }));
  return { prompt, requests, promptLogprobs: readBoolean(body, 'prompt_logprobs', false) };
}

/** `prompt.chunks`: `encoded_text` chunks of token ids below `vocabSize`, `[1, maxTokens]` tokens in all. */
function readPrompt(body: JsonObject, vocabSize: number, maxTokens: number): number[] {
  const chunks = readObject(body, 'prompt').chunks;
  const bad = (): never => {
    throw invalid('prompt', `prompt.chunks must be encoded_text chunks of token ids in [0, ${vocabSize}) (images are not supported)`);
  };
  if (!Array.isArray(chunks)) return bad();
  const prompt: number[] = [];
  for (const chunk of chunks as unknown[]) {
    if (typeof chunk !== 'object' || chunk === null) return bad();
    const { type, tokens } = chunk as { type?: unknown; tokens?: unknown };
    if (type !== 'encoded_text' || !Array.isArray(tokens)) return bad();
    if (prompt.length + tokens.length > maxTokens)
      throw invalid('prompt', `the prompt has more than ${maxTokens} tokens (the model's context less one)`);
    for (const t of tokens as unknown[]) {
      if (typeof t !== 'number' || !Number.isInteger(t) || t < 0 || t >= vocabSize) return bad();
      prompt.push(t);
    }
  }
  if (prompt.length === 0) throw invalid('prompt', 'the prompt is empty');
  return prompt;
}

/** `sampling_params.stop`: absent (the model's stop ids), token ids, or strings of one token each. */
function stopIds(stop: unknown, tokenizer: Tokenizer, vocabSize: number): number[] {
  if (stop === undefined || stop === null) return [...tokenizer.stopIds];
  const list: unknown[] = Array.isArray(stop) ? stop : [stop];
  if (list.length > MAX_STOPS) throw invalid('stop', `sampling_params.stop has more than ${MAX_STOPS} entries`);
  return list.map((s) => {
    if (typeof s === 'number' && Number.isInteger(s) && s >= 0 && s < vocabSize) return s;
    if (typeof s === 'string') {
      const ids = tokenizer.encode(s);
      if (ids.length === 1) return ids[0];
    }
    throw invalid('stop', `sampling_params.stop: ${quote(s)} is not a token id or a one-token string`);
  });
}

/** Log-prob of each prompt token given its prefix; NaN for the first. */
function scorePrompt(view: PolicyModel, prompt: readonly number[]): number[] {
  if (prompt.length < 2) return [Number.NaN];
  const values = tf.tidy(() => {
    const T = prompt.length;
    const ids = tf.tensor2d([...prompt], [1, T], 'int32');
    const mask = tf.ones([1, T]) as tf.Tensor2D;
    const positions = tf.tensor2d([prompt.map((_, i) => i)], [1, T], 'int32');
    return view.tokenLogprobs(ids, mask, positions).logprobs.dataSync();
  });
  return [Number.NaN, ...Array.from(values)];
}
