/**
 * The chat vocabulary shared by `rxrl serve`, the OpenAI engine and agent rollouts: messages, tools and tool
 * calls, in plain data (no dependency on the `openai` package).
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../model/types.js';
import type { FinishReason, PolicyVersion } from '../core/types.js';

/** Who wrote a chat message. */
export type ChatRole = 'system' | 'user' | 'assistant' | 'tool';

/** Valid chat roles. */
export const CHAT_ROLES: readonly ChatRole[] = ['system', 'user', 'assistant', 'tool'];

/** A call of a function tool, as the policy emitted it. */
export interface ToolCall {
  /** Id that the tool's answer refers to (`tool_call_id`). */
  readonly id: string;
  /** Name of the called tool. */
  readonly name: string;
  /** Arguments as a JSON object text, as in the OpenAI API. */
  readonly arguments: string;
}

/** One chat message. */
export interface ChatMessage {
  readonly role: ChatRole;
  /** Text of the message ('' when an assistant message only calls tools). */
  readonly content: string;
  /** Tool calls of an assistant message. */
  readonly toolCalls?: readonly ToolCall[];
  /** For `tool` messages: the id of the call this message answers. */
  readonly toolCallId?: string;
}

/** JSON-schema description of a tool's parameters (the subset rxrl reads: property names and types). */
export interface ToolParameters {
  readonly type?: string;
  readonly properties?: Readonly<Record<string, { readonly type?: string; readonly description?: string }>>;
  readonly required?: readonly string[];
}

/** A function tool offered to the policy. */
export interface ChatTool {
  readonly name: string;
  readonly description?: string;
  readonly parameters?: ToolParameters;
}

/** One chat generation request (one sample). */
export interface ChatRequest {
  /** The conversation so far. */
  readonly messages: readonly ChatMessage[];
  /** Tools offered to the policy. */
  readonly tools?: readonly ChatTool[];
  /** Largest number of new tokens. */
  readonly maxTokens: number;
  /** Sampling temperature; 0 means greedy. Default 1. */
  readonly temperature?: number;
  /** Nucleus mass in (0, 1]. Default 1. */
  readonly topP?: number;
  /** Seed of this sample's sampling stream. */
  readonly seed?: number;
}

/** One generated assistant turn, with the token ids and log-probs the trainer needs. */
export interface ChatResult {
  /** The assistant message (content and parsed tool calls). */
  readonly message: ChatMessage;
  /** Token ids of the rendered prompt (the conversation and the start of the assistant turn), `[P]`. */
  readonly promptTokens: number[];
  /** Generated token ids, `[R]`, including the stop token when one was sampled. */
  readonly tokens: number[];
  /** Log-probability of each generated token under the sampling policy, `[R]`. */
  readonly logprobs: number[];
  /** Why generation ended. */
  readonly finishReason: FinishReason;
  /** Oldest policy version whose weights produced any token of this turn. */
  readonly policyVersion: PolicyVersion;
}

/** Something that generates assistant turns over chat messages (an OpenAI-compatible chat endpoint). */
export interface ChatEngine {
  /** Tokenizer of the served model. */
  readonly tokenizer: Tokenizer;
  /** Generates one assistant turn. Rejects with an `AbortError` when `signal` fires. */
  chat(request: ChatRequest, signal?: AbortSignal): Promise<ChatResult>;
}

/** True when `engine` can generate chat turns. */
export function isChatEngine(engine: unknown): engine is ChatEngine {
  return typeof engine === 'object' && engine !== null && typeof (engine as Partial<ChatEngine>).chat === 'function';
}
