/**
 * What the routes of rxrl's Tinker service share: the base model and its tokenizer, the limits, and the
 * registries with their bounds and lifetimes — sessions and training clients, samplers, named sampler weights,
 * futures.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../model/types.js';
import type { PolicyModel } from '../model/transformer.js';
import type { TrainingClients } from './clients.js';
import type { FutureStore } from './futures.js';
import type { SamplerPool, SamplerWeights } from './sampling.js';

/** The limits the routes check, resolved from the service's options. */
export interface TinkerLimits {
  /** Largest LoRA rank. */
  readonly maxRank: number;
  /** Largest request body in bytes. */
  readonly maxBodyBytes: number;
  /** How long `retrieve_future` holds a poll before answering `try_again`, in ms. */
  readonly pollMs: number;
  /** The model's context: the most tokens of a datum, and of a prompt with its samples. */
  readonly context: number;
  /** Most tokens and tensor elements of one `forward_backward`, summed. */
  readonly maxForwardElements: number;
  /** Padded positions a forward pass computes between two turns of the event loop. */
  readonly chunkTokens: number;
  /** Largest saved state read (the adapter of `maxRank` with Adam's two moments, and header room). */
  readonly maxStateBytes: number;
  /** Most samples of one `asample`. */
  readonly maxSamples: number;
}

/** A structured log line of the service. */
export type TinkerLogger = (record: Readonly<Record<string, unknown>>) => void;

/** State of one service, read by every route. */
export interface TinkerContext {
  /** The base model every training client adapts and every sampler samples. */
  readonly model: PolicyModel;
  readonly tokenizer: Tokenizer;
  /** The name clients give as `base_model`. */
  readonly baseModel: string;
  /** What `get_info` reports as the tokenizer. */
  readonly tokenizerId: string;
  /** Where saved states are written and read. */
  readonly stateDir: string;
  readonly limits: TinkerLimits;
  /** Seed of the next training client's adapter. */
  nextSeed: number;
  readonly clients: TrainingClients;
  readonly samplers: SamplerPool;
  readonly samplerWeights: SamplerWeights;
  readonly futures: FutureStore;
  readonly log: TinkerLogger;
}

/** What a route answers with status 200: JSON, or protobuf bytes (a settled future's result). */
export type Reply = { readonly json: unknown } | { readonly proto: Uint8Array };

/** A future's answer: its request id and, for a training client's request, the client. */
export interface FutureAnswer {
  readonly request_id: string;
  readonly model_id?: string;
}
