/**
 * How much memory a configuration needs, computed from its sizes alone before anything is allocated, and whether
 * the backend can hold it. A `config.json` claiming a billion layers, or 10¹² positions, is refused here with a
 * {@link ConfigError} naming the key, instead of the process running out of memory a minute later.
 *
 * The bound is the inference minimum: every parameter in float32 plus the key/value cache of one sequence as long
 * as the context. Training needs more (gradients, Adam's two moments), so a model that passes may still be too
 * large to train; one that fails cannot even be served.
 *
 * @packageDocumentation
 */
import { totalmem } from 'node:os';

import * as tf from '@tensorflow/tfjs-core';

import { ConfigError } from '../core/errors.js';
import type { ResolvedPolicyConfig } from './config.js';

/** Bytes of one float32 value: every weight and cache entry is widened to it on load. */
const FLOAT32_BYTES = 4;

/** A WebAssembly (wasm32) memory holds at most 2³² bytes: 65,536 pages of 64 KiB. */
export const WASM_MEMORY_BYTES = 2 ** 32;

/** What a configuration needs in memory. */
export interface ModelFootprint {
  /** Number of weights (scalars). */
  readonly parameters: number;
  /** `parameters` in float32. */
  readonly parameterBytes: number;
  /** Key/value cache of one token of one sequence, all layers, in float32. */
  readonly kvBytesPerToken: number;
}

/**
 * The footprint of a configuration, in closed form (no per-layer loop, so absurd sizes cost nothing).
 * Agrees with the sum of {@link policyParamSpecs} shapes.
 */
export function modelFootprint(config: ResolvedPolicyConfig): ModelFootprint {
  const { vocabSize: v, dModel: d, dFF: f, headDim: dh, nLayers } = config;
  const q = config.nHeads * dh;
  const kv = config.nKvHeads * dh;
  const perLayer =
    2 * d + // input and post-attention norms
    d * q +
    2 * d * kv +
    q * d + // q, k, v, o projections
    (config.qkvBias ? q + 2 * kv : 0) +
    (config.oBias ? d : 0) +
    (config.qkNorm ? 2 * dh : 0) +
    3 * d * f; // gate, up, down
  const parameters = v * d + nLayers * perLayer + d + (config.tieWordEmbeddings ? 0 : v * d);
  return { parameters, parameterBytes: parameters * FLOAT32_BYTES, kvBytesPerToken: 2 * nLayers * kv * FLOAT32_BYTES };
}

/**
 * Bytes the current (or named) TF.js backend can hold: a wasm32 memory for `wasm`, else the machine's memory.
 *
 * @param backend - A backend name; default the active one (`tf.getBackend()`).
 */
export function backendMemoryBytes(backend: string | undefined = tf.getBackend()): number {
  return backend === 'wasm' ? Math.min(WASM_MEMORY_BYTES, totalmem()) : totalmem();
}

/** Options of {@link checkModelFits}. */
export interface ModelFitOptions {
  /**
   * Longest context the caller will use (vLLM's `--max-model-len`): the cache is sized for
   * `min(maxSeqLen, maxModelLen)` positions. Default `maxSeqLen`.
   */
  readonly maxModelLen?: number;
  /** Bytes available. Default {@link backendMemoryBytes}. */
  readonly memoryBytes?: number;
  /** The name of a configuration field in errors (a `config.json` reader names Hugging Face keys). Default the field. */
  readonly keyOf?: (field: keyof ResolvedPolicyConfig) => string;
  /** Where the configuration came from, named first in errors (a file path). */
  readonly source?: string;
  /** How a user caps the context, named in the error when the cache is what does not fit. */
  readonly capHint?: string;
}

/**
 * Typical upper sizes of released Llama/Qwen checkpoints: the field furthest above its own is the one an
 * oversized configuration's error names.
 */
const LARGEST_RELEASED: Readonly<Partial<Record<keyof ResolvedPolicyConfig, number>>> = {
  vocabSize: 262_144,
  dModel: 16_384,
  dFF: 65_536,
  nLayers: 128,
  nHeads: 128,
  nKvHeads: 128,
  headDim: 256,
};

/**
 * Checks that a configuration's weights and the cache of one full-length sequence fit in memory.
 *
 * @returns The context length to use: `min(maxSeqLen, maxModelLen)`.
 * @throws {@link ConfigError} naming the field that makes the weights too large (the one furthest above the sizes
 *   of released checkpoints), or the position limit (`maxSeqLen`) when the cache is what does not fit; context
 *   `{ key, value, parameters, bytes, limit }`.
 */
export function checkModelFits(config: ResolvedPolicyConfig, options: ModelFitOptions = {}): number {
  const keyOf = options.keyOf ?? ((field: string) => field);
  const limit = options.memoryBytes ?? backendMemoryBytes();
  const prefix = options.source === undefined ? '' : `${options.source}: `;
  const cap = options.maxModelLen;
  if (cap !== undefined && (!Number.isSafeInteger(cap) || cap <= 0)) {
    throw new ConfigError(`${prefix}maxModelLen must be a positive integer, got ${JSON.stringify(cap)}`, {
      context: { key: 'maxModelLen', value: cap },
    });
  }
  const { parameters, parameterBytes, kvBytesPerToken } = modelFootprint(config);
  if (parameterBytes > limit) {
    const field = oversizedField(config);
    throw new ConfigError(
      `${prefix}${keyOf(field)} ${config[field]} makes ${parameters.toExponential(2)} parameters ` +
        `(${humanBytes(parameterBytes)} in float32), more than the ${humanBytes(limit)} this backend can hold`,
      { context: { key: keyOf(field), value: config[field], parameters, bytes: parameterBytes, limit } },
    );
  }
  const positions = Math.min(config.maxSeqLen, cap ?? config.maxSeqLen);
  const bytes = parameterBytes + kvBytesPerToken * positions;
  if (bytes > limit) {
    const key = keyOf('maxSeqLen');
    const room = Math.floor((limit - parameterBytes) / kvBytesPerToken);
    throw new ConfigError(
      `${prefix}${key} ${positions}${cap === undefined ? '' : ' (capped)'}: the cache of one sequence that long ` +
        `(${humanBytes(kvBytesPerToken * positions)}) and the weights (${humanBytes(parameterBytes)}) need more than the ` +
        `${humanBytes(limit)} this backend can hold; cap the context at ${room} tokens or fewer${options.capHint ? ` (${options.capHint})` : ''}`,
      { context: { key, value: config.maxSeqLen, parameters, bytes, limit, maxModelLen: room } },
    );
  }
  return positions;
}

function oversizedField(config: ResolvedPolicyConfig): keyof ResolvedPolicyConfig {
  let worst: keyof ResolvedPolicyConfig = 'nLayers';
  let ratio = 0;
  for (const [field, largest] of Object.entries(LARGEST_RELEASED) as [keyof ResolvedPolicyConfig, number][]) {
    const r = (config[field] as number) / largest;
    if (r > ratio) [worst, ratio] = [field, r];
  }
  return worst;
}

function humanBytes(bytes: number): string {
  if (bytes >= 2 ** 40) return `${(bytes / 2 ** 40).toPrecision(3)} TiB`;
  return bytes >= 2 ** 30 ? `${(bytes / 2 ** 30).toPrecision(3)} GiB` : `${(bytes / 2 ** 20).toPrecision(3)} MiB`;
}
