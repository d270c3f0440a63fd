/**
 * What the request handlers of `rxrl serve` share: the engine, the tokenizer, the chat template and the limits.
 *
 * @packageDocumentation
 */
import type { ServeMetrics } from './metrics.js';
import type { ReasoningParserName } from './reasoning.js';
import type { ChatTemplate } from '../chat/template.js';
import type { LocalEngine } from '../engine/local.js';
import type { RolloutEngine } from '../engine/types.js';
import type { Tokenizer } from '../model/types.js';
import type { LoraAdapter } from '../model/lora.js';
import type { PolicyModel } from '../model/transformer.js';
import type { ServingModel } from './servingModel.js';
import { RequestError } from './protocol.js';
import type { SessionStore } from './sessions.js';

/** Most alternatives per position a request may ask for (`logprobs`, `top_logprobs`). */
export const MAX_TOP_LOGPROBS = 20;

/** A structured log line of the server. */
export type ServeLogger = (record: Readonly<Record<string, unknown>>) => void;

/** A LoRA adapter served under its own model name: a view of the base model and an engine of its own. */
export interface ServedAdapter {
  readonly name: string;
  /** The PEFT directory it was loaded from. */
  readonly path: string;
  readonly adapter: LoraAdapter;
  readonly view: PolicyModel;
  readonly serving: ServingModel;
  readonly engine: LocalEngine;
}

/** A model the server holds: weights it may replace and alternatives it may score. */
export interface OwnModel {
  readonly serving: ServingModel;
  readonly engine: LocalEngine;
}

/** The model the server holds; 400 naming `what` when it serves an engine it was given. */
export function ownModel(ctx: ServeContext, what: string): OwnModel {
  if (ctx.own === undefined) {
    throw new RequestError(400, `${what} is not available: this server samples from an engine it does not own (a training run's)`, {
      code: 'unsupported_parameter',
    });
  }
  return ctx.own;
}

/** State of one server, read by every request handler. */
export interface ServeContext {
  /** The engine requests are sampled from. */
  readonly engine: RolloutEngine;
  /**
   * The model this server holds, and its engine: absent when it serves an engine it was given (a training run's),
   * which has no weight updates, adapters or scored alternatives of its own.
   */
  readonly own: OwnModel | undefined;
  readonly tokenizer: Tokenizer;
  readonly template: ChatTemplate;
  readonly modelName: string;
  /** Adapters by model name (`--lora-modules`, `/v1/load_lora_adapter`). */
  readonly adapters: Map<string, ServedAdapter>;
  readonly maxSeqLen: number;
  readonly maxN: number;
  /** Most samples (prompts × `n`) one request may ask for. */
  readonly maxSamplesPerRequest: number;
  readonly maxBodyBytes: number;
  readonly weightsRoot: string | undefined;
  readonly apiKey: string | undefined;
  readonly created: number;
  readonly log: ServeLogger;
  /** Sessions of `/sessions/{id}/v1/…` (shared by the base model and its adapters). */
  readonly sessions: SessionStore;
  /** What `GET /metrics` reports. */
  readonly metrics: ServeMetrics;
  /** Splits chat replies into `reasoning_content` and `content` (`--reasoning-parser`). */
  readonly reasoningParser: ReasoningParserName | undefined;
  closing: boolean;
}
