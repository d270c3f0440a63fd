/**
 * The batched generation loop shared by the KV-cache and the full-recompute decoders: request validation,
 * left padding, seeded per-request sampling, stop tokens, length limits, row retirement and cancellation.
 *
 * @packageDocumentation
 */
import type * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest, GenerateResponse } from './types.js';
import { AbortError, ConfigError } from '../core/errors.js';
import type { FinishReason, PolicyVersion } from '../core/types.js';
import { createRng, type Rng } from '../core/random.js';
import { yieldToEventLoop } from '../core/turns.js';
import { rowExps, type RowExps } from './expGraph.js';
import { samplesFromExps, sampleFromExps, sampleToken, type SampledToken, type SamplingParams } from './sampling.js';

/** Options of a generate call. */
export interface GenerateOptions {
  /** Cancels between decoding steps: every unfinished row ends with `finishReason: 'abort'`. */
  readonly signal?: AbortSignal;
  /**
   * One signal per request (or `undefined`): a row whose signal fires ends with `finishReason: 'abort'` at the next
   * decoding step and leaves the batch, while the others go on (a client that went away, say).
   */
  readonly rowSignals?: readonly (AbortSignal | undefined)[];
  /** Policy version reported in every response. Default 0. */
  readonly version?: PolicyVersion;
  /**
   * Stop tokens of requests without `stopTokens` (a tokenizer's `stopIds`). Default none: such requests run to
   * `maxTokens`.
   */
  readonly stopIds?: readonly number[];
}

/** A left-padded prompt batch in plain memory (row-major, `[b, P]`). */
export interface PromptBatch {
  /** Rows `b`. */
  readonly rows: number;
  /** Padded prompt width `P`. */
  readonly width: number;
  /** Token ids `[b, P]`, pad id 0 on the left. */
  readonly inputIds: Int32Array;
  /** 1 for prompt tokens, 0 for padding, `[b, P]`. */
  readonly attentionMask: Float32Array;
  /** Position from each row's first real token, `[b, P]` (0 on padding). */
  readonly positionIds: Int32Array;
}

/**
 * One way of producing next-token logits for a batch that grows by one token per row per step. Tensors
 * returned are owned by the caller.
 */
export interface StepDecoder {
  /**
   * Processes the prompts; resolves with the next-token logits `[b, V]`. A long batch may be processed in slices
   * of rows with turns of the event loop between them.
   */
  start(batch: PromptBatch): Promise<tf.Tensor2D>;
  /**
   * Appends one token per row and returns the following next-token logits `[b, V]`.
   *
   * @param tokens - The new token of each row, `[b]`.
   * @param positions - Its position (from the row's first real token), `[b]`.
   */
  step(tokens: Int32Array, positions: Int32Array): tf.Tensor2D;
  /** Keeps only the given rows (strictly increasing indices into the current batch). */
  keepRows(rows: readonly number[]): void;
  /** Releases all tensors. */
  dispose(): void;
}

/** Rows `[first, first + count)` of a prompt batch (views, not copies). */
export function promptRows(batch: PromptBatch, first: number, count: number): PromptBatch {
  const span = <A extends Int32Array | Float32Array>(a: A): A => a.subarray(first * batch.width, (first + count) * batch.width) as A;
  return {
    rows: count,
    width: batch.width,
    inputIds: span(batch.inputIds),
    attentionMask: span(batch.attentionMask),
    positionIds: span(batch.positionIds),
  };
}

/**
 * The distinct rows of a prompt batch, for prefilling each prompt once: a GRPO group samples several responses to
 * one prompt, so its rows repeat. `index[r]` is the row of `distinct` that row `r` equals; `null` when no two rows
 * are equal.
 */
export function distinctPromptRows(batch: PromptBatch): { readonly distinct: PromptBatch; readonly index: Int32Array } | null {
  const { rows, width } = batch;
  const firstOf = new Map<string, number>();
  const index = new Int32Array(rows);
  const kept: number[] = [];
  for (let r = 0; r < rows; r++) {
    // The ids and the mask decide a row (pad ids are 0 but so may be a real token); positions follow from the mask.
    const span = (a: Int32Array | Float32Array): string => a.subarray(r * width, (r + 1) * width).join(',');
    const key = `${span(batch.inputIds)}|${span(batch.attentionMask)}`;
    const seen = firstOf.get(key);
    if (seen === undefined) {
      firstOf.set(key, kept.length);
      index[r] = kept.length;
      kept.push(r);
    } else {
      index[r] = seen;
    }
  }
  if (kept.length === rows) return null;
  const distinct: PromptBatch = {
    rows: kept.length,
    width,
    inputIds: pickRows(batch.inputIds, width, kept),
    attentionMask: pickRows(batch.attentionMask, width, kept),
    positionIds: pickRows(batch.positionIds, width, kept),
  };
  return { distinct, index };
}

/** Rows `index` (in that order, repeats allowed) of a row-major `[rows, width]` array, as a new array. */
export function pickRows<A extends Int32Array | Float32Array>(values: A, width: number, index: ArrayLike<number>): A {
  const out = new (values.constructor as new (n: number) => A)(index.length * width);
  for (let i = 0; i < index.length; i++) out.set(values.subarray(index[i] * width, (index[i] + 1) * width), i * width);
  return out;
}

/**
 * Token positions a shared beginning must save before a batch is prefilled in two passes (the beginning once, then
 * the rest of every row after it): `(rows − 1) × shared tokens`. A second pass reads every weight once more, which
 * costs about as much as prefilling a few dozen positions.
 */
export const MIN_SHARED_POSITIONS = 64;

/** A prompt batch split at the beginning its rows share (see {@link splitSharedPrefix}). */
export interface SharedPrefix {
  /** The shared first tokens, as one row. */
  readonly prefix: PromptBatch;
  /** The rest of each row after them, left-padded, at the positions they have in the row. */
  readonly rest: PromptBatch;
  /** Keys' mask of each whole row as the two passes lay it out, `[rows, prefix + rest width]`: the prefix's, then the rest's. */
  readonly keyMask: Float32Array;
}

/** Row `r`'s real tokens and their positions, in order. */
function realTokens(batch: PromptBatch, r: number): { tokens: number[]; positions: number[] } {
  const tokens: number[] = [];
  const positions: number[] = [];
  for (let i = r * batch.width; i < (r + 1) * batch.width; i++) {
    if (batch.attentionMask[i] !== 1) continue;
    tokens.push(batch.inputIds[i]);
    positions.push(batch.positionIds[i]);
  }
  return { tokens, positions };
}

/**
 * The longest beginning (tokens and positions) that every row of a prompt batch shares, short of each row's last
 * token, and the rest of each row after it: a chat template's system prompt, say, which every prompt of a batch
 * repeats. Null when it saves fewer than {@link MIN_SHARED_POSITIONS} positions.
 */
export function splitSharedPrefix(batch: PromptBatch): SharedPrefix | null {
  const rows = Array.from({ length: batch.rows }, (_, r) => realTokens(batch, r));
  if (rows.length < 2) return null;
  const [first] = rows;
  const shortest = Math.min(...rows.map((row) => row.tokens.length));
  let shared = 0;
  const agree = (i: number): boolean => rows.every((row) => row.tokens[i] === first.tokens[i] && row.positions[i] === first.positions[i]);
  while (shared < shortest - 1 && agree(shared)) shared++;
  if ((rows.length - 1) * shared < MIN_SHARED_POSITIONS) return null;
  const prefix = padPrompts([first.tokens.slice(0, shared)]);
  prefix.positionIds.set(first.positions.slice(0, shared));
  const rest = padPrompts(rows.map((row) => row.tokens.slice(shared)));
  const keyMask = new Float32Array(rows.length * (shared + rest.width));
  rows.forEach((row, r) => {
    const pad = rest.width - (row.tokens.length - shared);
    rest.positionIds.set(row.positions.slice(shared), r * rest.width + pad);
    const at = r * (shared + rest.width);
    keyMask.fill(1, at, at + shared);
    keyMask.set(rest.attentionMask.subarray(r * rest.width, (r + 1) * rest.width), at + shared);
  });
  return { prefix, rest, keyMask };
}

/** Padding id used for left padding of prompts. */
export const PROMPT_PAD_ID = 0;

interface RowState {
  readonly request: GenerateRequest;
  readonly signal: AbortSignal | undefined;
  readonly rng: Rng;
  readonly stop: ReadonlySet<number>;
  readonly temperature: number;
  readonly topP: number;
  readonly topK: number;
  readonly tokens: number[];
  readonly logprobs: number[];
  finishReason: FinishReason | undefined;
}

/**
 * Validates requests, then samples with `decoder` until every row has stopped, reached its `maxTokens` or the
 * signal fired.
 *
 * @param decoder - Produces logits; disposed before this resolves.
 * @param requests - One response is returned per request, in order.
 * @param options - Cancellation, reported version, default stop token.
 * @param limits - `vocabSize` (token ids must be below it) and `maxSeqLen` (prompt + `maxTokens` must fit).
 * @throws {@link AbortError} when the signal has fired before any work started.
 * @throws {@link ConfigError} for an invalid request.
 */
export async function runGeneration(
  decoder: StepDecoder,
  requests: readonly GenerateRequest[],
  options: GenerateOptions,
  limits: { readonly vocabSize: number; readonly maxSeqLen: number },
): Promise<GenerateResponse[]> {
  try {
    const version = options.version ?? 0;
    const stopIds = options.stopIds ?? [];
    const states = requests.map((request, index) => ({ ...initRow(request, index, stopIds, limits), signal: options.rowSignals?.[index] }));
    if (options.signal?.aborted) {
      throw new AbortError('generate aborted before it started', { cause: options.signal.reason });
    }
    const active = states.filter((s) => {
      if (s.request.maxTokens === 0) {
        s.finishReason = 'length';
      }
      return s.finishReason === undefined;
    });
    if (active.length > 0) {
      await decodeLoop(decoder, active, options.signal);
    }
    return states.map((s) => ({
      tokens: s.tokens,
      logprobs: s.logprobs,
      finishReason: s.finishReason ?? 'abort',
      policyVersion: version,
    }));
  } finally {
    decoder.dispose();
  }
}

async function decodeLoop(decoder: StepDecoder, rows: RowState[], signal: AbortSignal | undefined): Promise<void> {
  let active = rows;
  let logits = await decoder.start(padPrompts(active.map((s) => s.request.promptTokens)));
  for (;;) {
    const step = await readStep(logits, active.some(samplesFromExps));
    const keep: number[] = [];
    active.forEach((s, row) => {
      const { token, logprob } = sampleRow(step, row, s, s.rng);
      s.tokens.push(token);
      s.logprobs.push(logprob);
      if (s.request.onToken !== undefined) tell(s.request.onToken, token, logprob);
      if (s.stop.has(token)) {
        s.finishReason = 'stop';
      } else if (s.tokens.length >= s.request.maxTokens) {
        s.finishReason = 'length';
      } else if (s.signal?.aborted) {
        s.finishReason = 'abort';
      } else {
        keep.push(row);
      }
    });
    if (keep.length === 0) {
      return;
    }
    await yieldToEventLoop();
    if (signal?.aborted) {
      for (const row of keep) {
        active[row].finishReason = 'abort';
      }
      return;
    }
    if (keep.length < active.length) {
      decoder.keepRows(keep);
      active = keep.map((row) => active[row]);
    }
    const tokens = Int32Array.from(active, (s) => s.tokens[s.tokens.length - 1]);
    const positions = Int32Array.from(active, (s) => s.request.promptTokens.length + s.tokens.length - 1);
    logits = decoder.step(tokens, positions);
  }
}

/** A step's next-token logits `[b, V]` in host memory, with the device's softmax numerators where it computed them. */
export interface StepValues {
  readonly vocab: number;
  readonly logits: Float32Array;
  /** `exp(logits − rowMax)` and the row maxima, or null (the sampler exponentiates on the host). */
  readonly exps: { readonly values: Float32Array; readonly max: Float32Array } | null;
}

/**
 * Logits a step must have (rows × vocabulary) before the device computes their exponentials: below it, a session
 * call and a second read cost more than the host's `Math.exp` (13 ns a logit).
 */
export const DEVICE_EXPS_MIN_LOGITS = 1 << 15;

/**
 * Reads a step's logits to host memory (disposing them) and, when some row {@link samplesFromExps}, the step
 * has at least {@link DEVICE_EXPS_MIN_LOGITS} logits and the backend computes them ({@link rowExps}: the native
 * one), `exp(logit − max)` beside them.
 */
export async function readStep(logits: tf.Tensor2D, exponentiate: boolean): Promise<StepValues> {
  let exps: RowExps | null = null;
  try {
    if (exponentiate && logits.size >= DEVICE_EXPS_MIN_LOGITS) exps = rowExps(logits);
    const [values, e, max] = await Promise.all([logits.data(), exps?.exps.data(), exps?.max.data()]);
    return {
      vocab: logits.shape[1],
      logits: values as Float32Array,
      exps: e === undefined || max === undefined ? null : { values: e as Float32Array, max: max as Float32Array },
    };
  } finally {
    logits.dispose();
    exps?.exps.dispose();
    exps?.max.dispose();
  }
}

/** Draws row `row`'s next token from a step read by {@link readStep}. */
export function sampleRow(step: StepValues, row: number, params: SamplingParams, rng: Rng): SampledToken {
  const { vocab, logits, exps } = step;
  return exps !== null && samplesFromExps(params)
    ? sampleFromExps(logits, exps.values, row * vocab, vocab, exps.max[row], params, rng)
    : sampleToken(logits, row * vocab, vocab, params, rng);
}

/** Passes a sampled token to a request's listener; a listener's error must not end the batch of other requests. */
function tell(listener: (token: number, logprob: number) => void, token: number, logprob: number): void {
  try {
    listener(token, logprob);
  } catch {
    // the listener's own problem (a closed stream, say): generation goes on
  }
}

function initRow(
  request: GenerateRequest,
  index: number,
  stopIds: readonly number[],
  limits: { readonly vocabSize: number; readonly maxSeqLen: number },
): Omit<RowState, 'signal'> {
  const invalid = (what: string): ConfigError => new ConfigError(`generate request ${index}: ${what}`, { context: { request: index } });
  const { promptTokens, maxTokens } = request;
  const temperature = request.temperature ?? 1;
  const topP = request.topP ?? 1;
  const topK = request.topK ?? 0;
  if (promptTokens.length === 0) {
    throw invalid('promptTokens is empty');
  }
  if (!promptTokens.every((t) => Number.isInteger(t) && t >= 0 && t < limits.vocabSize)) {
    throw invalid(`promptTokens must be integers in [0, ${limits.vocabSize})`);
  }
  if (!Number.isInteger(maxTokens) || maxTokens < 0) {
    throw invalid(`maxTokens must be a non-negative integer, got ${maxTokens}`);
  }
  if (promptTokens.length + maxTokens > limits.maxSeqLen) {
    throw invalid(`prompt (${promptTokens.length}) + maxTokens (${maxTokens}) exceeds maxSeqLen ${limits.maxSeqLen}`);
  }
  if (!(temperature >= 0) || !Number.isFinite(temperature)) {
    throw invalid(`temperature must be finite and >= 0, got ${temperature}`);
  }
  if (!(topP > 0 && topP <= 1)) {
    throw invalid(`topP must be in (0, 1], got ${topP}`);
  }
  if (!(Number.isInteger(topK) && topK >= 0)) {
    throw invalid(`topK must be an integer >= 0, got ${topK}`);
  }
  const seed = request.seed ?? Math.floor(Math.random() * Number.MAX_SAFE_INTEGER);
  return {
    request,
    rng: createRng(seed, 'sample'),
    stop: new Set(request.stopTokens ?? stopIds),
    temperature,
    topP,
    topK,
    tokens: [],
    logprobs: [],
    finishReason: undefined,
  };
}

/**
 * Left-pads prompts into one batch.
 *
 * @param prompts - Token ids of each row (non-empty).
 * @returns The batch `[b, P]` with `P` the longest prompt.
 */
export function padPrompts(prompts: readonly (readonly number[])[]): PromptBatch {
  const rows = prompts.length;
  const width = Math.max(...prompts.map((p) => p.length));
  const inputIds = new Int32Array(rows * width).fill(PROMPT_PAD_ID);
  const attentionMask = new Float32Array(rows * width);
  const positionIds = new Int32Array(rows * width);
  prompts.forEach((prompt, r) => {
    const pad = width - prompt.length;
    prompt.forEach((token, i) => {
      const at = r * width + pad + i;
      inputIds[at] = token;
      attentionMask[at] = 1;
      positionIds[at] = i;
    });
  });
  return { rows, width, inputIds, attentionMask, positionIds };
}
