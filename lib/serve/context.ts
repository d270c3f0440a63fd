/**
 * What the request handlers of `rxrl serve` share: the engine, the tokenizer, the chat template and the limits.
 *
 * @packageDocumentation
 */
import type { ChatTemplate } from '../chat/template.js';
import type { LocalEngine } from '../engine/local.js';
import type { Tokenizer } from '../engine/types.js';
import type { LoraAdapter } from '../model/lora.js';
import type { PolicyModel } from '../model/transformer.js';
import type { ServingModel } from './servingModel.js';

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

/** State of one server, read by every request handler. */
export interface ServeContext {
  readonly engine: LocalEngine;
  readonly serving: ServingModel;
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
  closing: boolean;
}
