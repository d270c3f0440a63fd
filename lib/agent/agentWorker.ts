/**
 * Multi-turn agent rollouts over chat completions: the policy answers, calls tools, reads their results and
 * answers again, and the whole episode becomes ONE trajectory.
 *
 * ```
 * prompt P₀ = render(opening messages)            ┐ promptTokens
 * turn 0:   policy tokens A₀                      │ lossMask 1, rollout log-probs
 *           environment tokens E₁ (tool results)  │ lossMask 0, log-prob 0
 * turn 1:   policy tokens A₁                      │ lossMask 1
 * …                                               ┘ responseTokens = A₀ E₁ A₁ …
 * ```
 *
 * The environment's tokens are what the server's chat template put between the policy's turns: the prompt of
 * turn `k` must start with the prompt and tokens of turn `k − 1` (a prefix-consistent template, as the
 * bundled one is); otherwise the sample fails with a {@link DecodeError} rather than train on tokens the
 * policy never saw.
 *
 * @packageDocumentation
 */
import { isChatEngine, type ChatEngine, type ChatMessage, type ChatResult, type ChatTool, type ToolCall } from '../chat/types.js';
import { ConfigError, DecodeError, isAbortError, throwIfAborted } from '../core/errors.js';
import { hashSeed } from '../core/random.js';
import type { FinishReason, PolicyVersion, Task } from '../core/types.js';
import type { RolloutSample, RolloutWorker } from '../engine/worker.js';

/** The world an agent acts in: the tools it may call and what they answer. */
export interface ToolEnvironment {
  /** Tools offered to the policy. */
  readonly tools: readonly ChatTool[];
  /** Opening messages of an episode. Default: one user message holding the task's prompt. */
  start?(task: Task): readonly ChatMessage[];
  /**
   * Runs one tool call and returns the text the policy reads. Throwing (or calling an unknown tool) answers
   * with {@link AgentWorkerOptions.errorText} instead and counts an `agent/tool_errors`.
   */
  call(call: ToolCall, task: Task, signal: AbortSignal): string | Promise<string>;
  /** Text answered for a failed call (it must be encodable by the policy's tokenizer). Default `error`. */
  errorText?(call: ToolCall, error: unknown): string;
}

/** Options of {@link agentWorker}. */
export interface AgentWorkerOptions {
  /** Tools and their implementations. */
  readonly environment: ToolEnvironment;
  /** Most policy turns per episode (≥ 1). Default 4. */
  readonly maxTurns?: number;
  /**
   * Most tokens in the whole episode (prompt, policy turns and tool results); each turn's `maxTokens` is cut to
   * fit, counting a pending tool result as its tokens plus one end-of-turn token (leave a margin for templates
   * with role prefixes). Set it to the model's context length. Default none.
   */
  readonly maxTotalTokens?: number;
  /** Chat engine to use. Default: the rollout engine, which must then implement `chat` (as `OpenAIEngine` does). */
  readonly engine?: ChatEngine;
  /** Text answered for a failed or unknown tool call. Default: the environment's `errorText`, else `error`. */
  readonly errorText?: (call: ToolCall, error: unknown) => string;
}

/**
 * A rollout worker that runs a tool-using episode per sample. Each policy turn is one chat completion (seeded
 * from the sample's seed and the turn index); tool calls are answered by the environment and the episode goes
 * on until the policy answers without calling a tool, a turn is cut by its token limit, or `maxTurns` is
 * reached. The evaluator scores the last assistant message's content.
 *
 * Metrics: `agent/turns`, `agent/tool_calls`, `agent/tool_errors`, `agent/policy_tokens`, `agent/env_tokens`.
 *
 * @example
 * ```ts
 * import { rollout } from 'rxrl/operators';
 * import { agentWorker } from 'rxrl';
 * import { calculatorTask } from 'rxrl/recipes';
 * const calc = calculatorTask();
 * tasks$.pipe(rollout(openaiEngine, {
 *   samplesPerTask: 8, concurrency: 64, maxTokens: 16, evaluator: calc.evaluator,
 *   worker: agentWorker({ environment: calc.environment, maxTurns: 3 }),
 * }));
 * ```
 * @param options - the environment and the episode limits.
 * @returns the worker, for the `worker` option of `rollout`.
 * @throws {@link ConfigError} for invalid limits.
 */
export function agentWorker(options: AgentWorkerOptions): RolloutWorker {
  const maxTurns = options.maxTurns ?? 4;
  if (!Number.isInteger(maxTurns) || maxTurns < 1) throw new ConfigError(`maxTurns must be an integer >= 1, got ${maxTurns}`);
  const budget = options.maxTotalTokens ?? Infinity;
  if (!(budget > 0)) throw new ConfigError(`maxTotalTokens must be > 0, got ${budget}`);
  const { environment } = options;
  const errorText = options.errorText ?? environment.errorText?.bind(environment) ?? (() => 'error');
  return async (input, signal) => {
    const engine = options.engine ?? (isChatEngine(input.engine) ? input.engine : undefined);
    if (engine === undefined) {
      throw new ConfigError('agentWorker needs a chat engine: pass options.engine or roll out with an engine that implements chat');
    }
    const messages: ChatMessage[] = [...(environment.start?.(input.task) ?? [{ role: 'user', content: input.task.prompt }])];
    const episode = new Episode(input.id);
    // Estimated tokens not yet seen in a returned prompt: the opening messages (with BOS and an end-of-turn
    // token each), later the tool results.
    let pending = 1 + messages.reduce((sum, m) => sum + estimateTokens(engine, m.content) + 1, 0);
    for (let turn = 0; turn < maxTurns; turn++) {
      throwIfAborted(signal, { sample: input.id, turn });
      const used = episode.tokens + pending;
      if (used >= budget) {
        episode.finishReason = 'length';
        break;
      }
      const result = await engine.chat(
        {
          messages,
          tools: environment.tools,
          maxTokens: Math.min(input.maxTokens, budget - used),
          temperature: input.temperature,
          topP: input.topP,
          seed: turn === 0 ? input.seed : hashSeed(input.seed, 'turn', String(turn)),
        },
        signal,
      );
      episode.add(result, turn);
      pending = 0;
      messages.push(result.message);
      const calls = result.message.toolCalls ?? [];
      if (calls.length === 0 || result.finishReason !== 'stop') break;
      if (turn === maxTurns - 1) {
        episode.finishReason = 'length';
        break;
      }
      for (const call of calls) {
        const content = await answerCall(environment, call, input.task, signal, episode, errorText);
        messages.push({ role: 'tool', content, toolCallId: call.id });
        pending += estimateTokens(engine, content) + 1; // + the end-of-turn token
      }
    }
    return episode.sample();
  };
}

/** One episode's tokens and counters as its turns arrive: the trajectory it becomes. */
class Episode {
  promptTokens: number[] | undefined;
  readonly responseTokens: number[] = [];
  readonly logprobs: number[] = [];
  readonly lossMask: number[] = [];
  version: PolicyVersion = Infinity;
  finishReason: FinishReason = 'length';
  answer = '';
  toolCalls = 0;
  toolErrors = 0;
  envTokens = 0;
  turns = 0;

  constructor(private readonly id: string) {}

  /** Tokens of the episode so far (prompt, policy and environment). */
  get tokens(): number {
    return (this.promptTokens?.length ?? 0) + this.responseTokens.length;
  }

  /**
   * Appends turn `turn`: the environment tokens its prompt adds after what the episode holds (masked), then the
   * policy's tokens.
   *
   * @throws {@link DecodeError} when the prompt does not extend the episode's tokens.
   */
  add(result: ChatResult, turn: number): void {
    this.turns++;
    if (this.promptTokens === undefined) {
      this.promptTokens = result.promptTokens;
    } else {
      const seen = [...this.promptTokens, ...this.responseTokens];
      const consistent = result.promptTokens.length >= seen.length && seen.every((t, i) => result.promptTokens[i] === t);
      if (!consistent) {
        throw new DecodeError(`turn ${turn} prompt does not extend the conversation's tokens (chat template is not prefix-consistent)`, {
          context: { sample: this.id, turn },
        });
      }
      const added = result.promptTokens.slice(seen.length);
      this.envTokens += added.length;
      this.responseTokens.push(...added);
      this.logprobs.push(...added.map(() => 0));
      this.lossMask.push(...added.map(() => 0));
    }
    this.responseTokens.push(...result.tokens);
    this.logprobs.push(...result.logprobs);
    this.lossMask.push(...result.tokens.map(() => 1));
    this.version = Math.min(this.version, result.policyVersion);
    this.finishReason = result.finishReason;
    this.answer = result.message.content;
  }

  sample(): RolloutSample {
    return {
      promptTokens: this.promptTokens ?? [],
      responseTokens: this.responseTokens,
      logprobs: this.logprobs,
      lossMask: this.lossMask,
      finishReason: this.finishReason,
      policyVersion: Number.isFinite(this.version) ? this.version : 0,
      response: this.answer,
      metrics: {
        'agent/turns': this.turns,
        'agent/tool_calls': this.toolCalls,
        'agent/tool_errors': this.toolErrors,
        'agent/policy_tokens': this.lossMask.filter((m) => m === 1).length,
        'agent/env_tokens': this.envTokens,
      },
    };
  }
}

/** Runs one tool call; a failure (not a cancellation) answers with `errorText` and counts as a tool error. */
async function answerCall(
  environment: ToolEnvironment,
  call: ToolCall,
  task: Task,
  signal: AbortSignal,
  episode: Episode,
  errorText: (call: ToolCall, error: unknown) => string,
): Promise<string> {
  episode.toolCalls++;
  try {
    return await environment.call(call, task, signal);
  } catch (error) {
    if (isAbortError(error) && signal.aborted) throw error;
    episode.toolErrors++;
    return errorText(call, error);
  }
}

/** Token count of a tool result under the engine's tokenizer (its length in characters if it cannot be encoded). */
function estimateTokens(engine: ChatEngine, text: string): number {
  try {
    return engine.tokenizer.encode(text).length;
  } catch {
    return text.length;
  }
}
