/**
 * Rollout workers: how one sample of a task is produced. The `rollout` operator runs a worker per sample (at
 * most `concurrency` at once), then scores what it returns with the evaluator.
 *
 * The default, {@link singleTurnWorker}, samples one completion of the task's prompt. Agent workers
 * (`agentWorker`) run several turns with tool calls and return one sample whose loss mask covers only the
 * policy's own tokens.
 *
 * @packageDocumentation
 */
import type { ChatTemplate } from '../chat/template.js';
import type { ChatMessage } from '../chat/types.js';
import type { RolloutEngine } from './types.js';
import { DecodeError } from '../core/errors.js';
import type { FinishReason, ModelTag, PolicyVersion, Task } from '../core/types.js';

/** What a worker is asked to produce: one sample of `task`. */
export interface RolloutWorkerInput {
  /** The engine the `rollout` operator was given. */
  readonly engine: RolloutEngine;
  /** The task to answer. */
  readonly task: Task;
  /** Trajectory id (`${groupId}/${runId}`). */
  readonly id: string;
  /** GRPO group id. */
  readonly groupId: string;
  /** Index of the sample in its group. */
  readonly runId: number;
  /** Model tag written on the trajectory. */
  readonly modelTag: ModelTag;
  /** This sample's seed, derived from the rollout seed, the group id and the run id. */
  readonly seed: number;
  /** Largest number of new tokens per generation. */
  readonly maxTokens: number;
  /** Sampling temperature. */
  readonly temperature: number;
  /** Nucleus mass. */
  readonly topP: number;
  /**
   * Stop tokens end no generation: each runs to `maxTokens` (finish reason `length`), as vLLM's `ignore_eos`.
   * Absent: false.
   */
  readonly ignoreEos?: boolean;
}

/** One unscored sample: the token-level record a trajectory needs, and the text to score. */
export interface RolloutSample {
  /** Prompt token ids, `[P]`. */
  readonly promptTokens: readonly number[];
  /** Every token after the prompt, `[R]`: the policy's and (for agents) the environment's. */
  readonly responseTokens: readonly number[];
  /** Rollout-time log-prob of each response token, `[R]` (0 where the environment wrote the token). */
  readonly logprobs: readonly number[];
  /** 1 where the policy produced the token, 0 where the environment did, `[R]`. */
  readonly lossMask: readonly number[];
  /** Why the (last) generation ended. */
  readonly finishReason: FinishReason;
  /** Oldest policy version that produced any of the tokens. */
  readonly policyVersion: PolicyVersion;
  /** The text the evaluator scores (the completion, or an agent's final answer). */
  readonly response: string;
  /**
   * The sample's reward when the worker has one (an agent that scores itself); the evaluator is then not called.
   * Must be finite.
   */
  readonly reward?: number;
  /** Scalar metrics of the worker (for example `agent/turns`), merged under the evaluator's. */
  readonly metrics?: Readonly<Record<string, number>>;
}

/**
 * Produces one sample. Must honour `signal` (the sample is cancelled when it fires) and reject to fail just
 * this sample: the `rollout` operator reports the rejection as a `SampleFailure`.
 */
export type RolloutWorker = (input: RolloutWorkerInput, signal: AbortSignal) => Promise<RolloutSample>;

/**
 * The default worker: one completion of the task's prompt (encoded with the tokenizer's own special tokens, such
 * as a leading BOS) from the engine, stopping at any of the tokenizer's `stopIds` (at none with `ignoreEos`), every
 * response token trained on. The response text is decoded without special tokens.
 */
export const singleTurnWorker: RolloutWorker = async (input, signal) =>
  completeOnce(input, input.engine.tokenizer.encode(input.task.prompt, { addBos: true }), signal);

/**
 * A worker for chat models: the task's prompt is the user's message (after an optional system message) — or, for a
 * task read from a chat row, its conversation (`metadata.messages`) — rendered with `template` and its generation
 * prompt (the model's own template, see `loadChatTemplate`); then one completion as in {@link singleTurnWorker}.
 *
 * @example
 * ```ts
 * const worker = chatWorker(await loadChatTemplate(dir, tokenizer), { system: 'Be brief.' });
 * rollout(engine, { samplesPerTask: 8, concurrency: 64, maxTokens: 64, evaluator, worker });
 * ```
 * @param template - Renders the conversation to token ids.
 * @param options - `system`: a system message put first.
 * @returns The worker.
 */
export function chatWorker(template: ChatTemplate, options: { readonly system?: string } = {}): RolloutWorker {
  return async (input, signal) =>
    completeOnce(input, template.render(conversationOf(input.task, options.system), [], { addGenerationPrompt: true }), signal);
}

/**
 * A worker that samples nothing: each sample is the task's reference output (`task.response`, else `task.answer`)
 * as the policy would have written it after the prompt — supervised fine-tuning (`trainer.algorithm: sft`) through
 * the same loop as GRPO. Without `template` the prompt is encoded as {@link singleTurnWorker} does and the response
 * ends with the first stop token; with one, the conversation (`task.metadata.messages`, else the prompt as the user's
 * message after an optional system message) is rendered with the generation prompt as {@link chatWorker} does, and
 * the response is what the template writes for the assistant's turn, up to and including its end-of-turn stop token.
 * Every response token is trained on; the log-probs are 0 (the cross-entropy loss does not read them). The sample
 * carries the engine's version.
 *
 * @example
 * ```ts
 * const worker = referenceWorker(await loadChatTemplate(dir, tokenizer));
 * rollout(engine, { samplesPerTask: 1, concurrency: 16, maxTokens: 64, evaluator, worker });
 * ```
 * @param template - Renders conversations; absent: plain prompts.
 * @param options - `system`: a system message put first (with `template`).
 * @returns The worker; a task with no reference output fails its sample with a {@link DecodeError}.
 */
export function referenceWorker(template?: ChatTemplate, options: { readonly system?: string } = {}): RolloutWorker {
  return async ({ engine, task }) => {
    const reference = task.response ?? task.answer;
    if (reference === undefined) {
      throw new DecodeError(`task ${task.id} has no reference output to imitate (a 'response', or an 'answer')`, {
        context: { taskId: task.id },
      });
    }
    const { tokenizer } = engine;
    let promptTokens: number[];
    let rendered: number[];
    if (template) {
      const messages = conversationOf(task, options.system);
      promptTokens = template.render(messages, [], { addGenerationPrompt: true });
      rendered = template.render([...messages, { role: 'assistant', content: reference }], [], { addGenerationPrompt: false });
      if (!promptTokens.every((id, i) => rendered[i] === id)) {
        throw new DecodeError(`task ${task.id}: the chat template renders the conversation with its reply differently from the prompt`, {
          context: { taskId: task.id },
        });
      }
    } else {
      promptTokens = tokenizer.encode(task.prompt, { addBos: true });
      rendered = [...promptTokens, ...tokenizer.encode(reference, { addBos: false }), tokenizer.stopIds[0] ?? tokenizer.eosId];
    }
    const rest = rendered.slice(promptTokens.length);
    const stop = rest.findIndex((id) => tokenizer.stopIds.includes(id));
    const responseTokens = stop < 0 ? rest : rest.slice(0, stop + 1);
    return {
      promptTokens,
      responseTokens,
      logprobs: responseTokens.map(() => 0),
      lossMask: responseTokens.map(() => 1),
      finishReason: stop < 0 ? 'length' : 'stop',
      policyVersion: engine.version,
      response: tokenizer.decode(responseTokens),
    };
  };
}

/** The messages of a task: its `metadata.messages` when it has them, else its prompt as the user's (after `system`). */
function conversationOf(task: Task, system: string | undefined): ChatMessage[] {
  const context = task.metadata?.messages;
  if (Array.isArray(context)) return context as ChatMessage[];
  return [...(system === undefined ? [] : [{ role: 'system' as const, content: system }]), { role: 'user', content: task.prompt }];
}

async function completeOnce(input: RolloutWorkerInput, promptTokens: number[], signal: AbortSignal): Promise<RolloutSample> {
  const { engine } = input;
  const [response] = await engine.generate(
    [
      {
        promptTokens,
        maxTokens: input.maxTokens,
        temperature: input.temperature,
        topP: input.topP,
        stopTokens: input.ignoreEos === true ? [] : engine.tokenizer.stopIds,
        seed: input.seed,
      },
    ],
    signal,
  );
  return {
    promptTokens,
    responseTokens: response.tokens,
    logprobs: response.logprobs,
    lossMask: response.tokens.map(() => 1),
    finishReason: response.finishReason,
    policyVersion: response.policyVersion,
    response: engine.tokenizer.decode(response.tokens),
  };
}

/** Releases what a worker holds (an agent gateway's server), when it holds anything: its `close()`. */
export async function closeWorker(worker: RolloutWorker | undefined): Promise<void> {
  const close = (worker as { close?: unknown } | undefined)?.close;
  if (typeof close === 'function') await (close as () => Promise<void>).call(worker);
}
