/**
 * Agent rollouts through a session gateway: any agent that talks to an OpenAI-compatible server (the `openai` npm
 * or PyPI client, `@openai/agents`, the Vercel `ai` SDK, LangChain…) is trained unmodified, with only its base URL
 * pointed at rxrl.
 *
 * Per sample, {@link gatewayWorker} opens a session on an `rxrl serve` gateway over the run's engine and runs the
 * agent — a command with `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL` and `RXRL_TASK` (the task as JSON)
 * in its environment (see `agentCommand.ts` for the rest of it, and for how every process it starts ends with
 * the sample), or a JS function given the same — then turns the session into the sample: the exact token ids of
 * every call (see `lib/serve/sessions.ts`), the environment's tokens masked, the reward the agent gave.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';

import type { ChatTemplate } from '../chat/template.js';
import { createChatTemplate } from '../chat/template.js';
import type { RolloutEngine } from '../engine/types.js';
import { AgentError, ConfigError, isAbortError } from '../core/errors.js';
import { serve, type RxrlServer } from '../serve/server.js';
import { sessionSamples, type Session } from '../serve/sessions.js';
import type { Task } from '../core/types.js';
import type { RolloutSample, RolloutWorker, RolloutWorkerInput } from '../engine/worker.js';
import { runAgentCommand, type AgentCommand } from './agentCommand.js';

export type { AgentCommand } from './agentCommand.js';

/** What an agent function is given: where the model is, and the sample's cancellation. */
export interface AgentContext {
  /** OpenAI base URL of this sample's session (`…/sessions/<id>/v1`). */
  readonly baseURL: string;
  /** The gateway's API key. */
  readonly apiKey: string;
  /** The model name to put in requests. */
  readonly model: string;
  /** Fires when the sample is cancelled (timeout, stop). */
  readonly signal: AbortSignal;
}

/** What an agent function returns: a reward, `{ reward }`, or nothing (the recipe's evaluator scores its answer). */
export type AgentResult = number | { readonly reward: number } | undefined | void;

/** An agent written in JS. */
export type AgentFunction = (task: Task, context: AgentContext) => AgentResult | Promise<AgentResult>;

/** The agent a {@link gatewayWorker} runs per sample. */
export type AgentProgram = AgentCommand | { readonly run: AgentFunction };

/** Options of {@link gatewayWorker}. */
export interface GatewayWorkerOptions {
  /** Longest context the engine takes (the model's `max_position_embeddings`). */
  readonly maxModelLen: number;
  /** Renders chats. Default: the bundled template over the engine's tokenizer. */
  readonly template?: ChatTemplate;
  /** Most bytes of an agent's stderr kept for its failure. Default 2048. */
  readonly stderrBytes?: number;
  /** How long a command agent's processes may take to exit after SIGTERM before SIGKILL, in ms. Default 2000. */
  readonly killGraceMs?: number;
}

/** A rollout worker that owns a gateway server: `close` stops it (a run closes it when it ends). */
export interface GatewayWorker extends RolloutWorker {
  /** Stops the running agents (their samples fail with an {@link AgentError}) and the gateways; idempotent. */
  close(): Promise<void>;
}

/**
 * A rollout worker that runs `agent` once per sample against a session of a gateway over the sample's engine
 * (started on first use, one per engine, on a loopback port with a random API key).
 *
 * The sample is the session's last sequence in `trajectory` mode: the first call's prompt, then every completion
 * (trained on) and the tokens between them (tool results, user turns: masked). Its reward is the agent's (a
 * number or `{ reward }` returned, a `{"reward": r}` last stdout line, or rewards posted to the session);
 * without one the recipe's evaluator scores the last completion's text. Its version is the oldest of its calls'.
 * An agent that exits non-zero, makes no call, or is cancelled fails the sample with an {@link AgentError}
 * carrying the tail of its stderr; the run goes on. A command agent runs in a session and process group of its
 * own; when its sample ends — it exits, fails, times out, or `close()` stops the run — every process it started
 * gets SIGTERM, then SIGKILL after `killGraceMs` (metric `agent/leftover_processes`: those still running when
 * it exited).
 *
 * @example
 * ```ts
 * const worker = gatewayWorker({ command: 'python3 agent.py' }, { maxModelLen: 512 });
 * rollout(engine, { samplesPerTask: 4, concurrency: 8, maxTokens: 32, evaluator, worker });
 * ```
 * @param agent - A command or a JS function.
 * @param options - The model's context length and chat template.
 * @returns The worker, with `close()`.
 */
export function gatewayWorker(agent: AgentProgram, options: GatewayWorkerOptions): GatewayWorker {
  if (!('run' in agent) && (typeof agent.command !== 'string' || agent.command.trim() === '')) {
    throw new ConfigError('rollout.agent: give a command or a module', { context: { key: 'rollout.agent' } });
  }
  const gateways = new Map<RolloutEngine, Promise<RxrlServer<RolloutEngine>>>();
  const apiKey = randomBytes(16).toString('hex');
  const gatewayOf = (engine: RolloutEngine): Promise<RxrlServer<RolloutEngine>> => {
    let gateway = gateways.get(engine);
    if (gateway === undefined) {
      gateway = serve({
        engine,
        tokenizer: engine.tokenizer,
        modelName: engine.modelTag,
        maxModelLen: options.maxModelLen,
        apiKey,
        chatTemplate: options.template ?? createChatTemplate(engine.tokenizer),
      });
      gateways.set(engine, gateway);
    }
    return gateway;
  };
  const stopped = new AbortController();
  const running = new Set<Promise<RolloutSample>>();
  const killGraceMs = options.killGraceMs ?? 2000;
  const runSample = async (input: RolloutWorkerInput, signal: AbortSignal): Promise<RolloutSample> => {
    const gateway = await gatewayOf(input.engine);
    const sessionId = `${input.id.replace(/[^A-Za-z0-9._:-]/g, '_').slice(0, 100)}-${randomBytes(4).toString('hex')}`;
    const session = gateway.sessions.open(sessionId, {
      seed: input.seed,
      maxTokens: input.maxTokens,
      temperature: input.temperature,
      topP: input.topP,
    });
    const context: AgentContext = { baseURL: `${gateway.url}/sessions/${sessionId}/v1`, apiKey, model: gateway.modelName, signal };
    try {
      if ('run' in agent) return sampleOf(session, await runFunction(agent.run, input.task, context), input.id);
      const result = await runAgentCommand(agent, input.task, context, signal, { stderrBytes: options.stderrBytes ?? 2048, killGraceMs });
      return sampleOf(session, result.reward, input.id, { 'agent/leftover_processes': result.leftover });
    } finally {
      gateway.sessions.delete(sessionId);
    }
  };
  const worker: RolloutWorker = (input, signal) => {
    if (stopped.signal.aborted) return Promise.reject(stopped.signal.reason);
    const sample = runSample(input, AbortSignal.any([signal, stopped.signal]));
    running.add(sample);
    sample.then(
      () => running.delete(sample),
      () => running.delete(sample),
    );
    return sample;
  };
  let closed: Promise<void> | undefined;
  const close = async (): Promise<void> => {
    stopped.abort(new AgentError('the run ended while the agent was running: it was stopped'));
    await Promise.allSettled([...running]);
    await Promise.all([...gateways.values()].map(async (g) => (await g.catch(() => undefined))?.close()));
  };
  return Object.assign(worker, {
    close: (): Promise<void> => (closed ??= close()),
  });
}

async function runFunction(run: AgentFunction, task: Task, context: AgentContext): Promise<number | undefined> {
  let result: AgentResult;
  try {
    result = await run(task, context);
  } catch (cause) {
    if (context.signal.aborted || isAbortError(cause)) throw cause;
    throw new AgentError(`the agent failed on task ${task.id}: ${cause instanceof Error ? cause.message : String(cause)}`, {
      cause,
      context: { taskId: task.id },
    });
  }
  if (result === undefined || result === null) return undefined;
  const reward = typeof result === 'number' ? result : result.reward;
  if (typeof reward !== 'number' || !Number.isFinite(reward)) {
    throw new AgentError(`the agent returned a reward that is not a finite number for task ${task.id}`, {
      context: { taskId: task.id, reward },
    });
  }
  return reward;
}

/** The sample of a finished session: its last sequence, with the agent's reward or the session's. */
function sampleOf(
  session: Session,
  agentReward: number | undefined,
  id: string,
  metrics: Readonly<Record<string, number>> = {},
): RolloutSample {
  if (session.calls.length === 0) throw new AgentError(`the agent made no call to the model (sample ${id})`, { context: { id } });
  const sequences = sessionSamples(session, 'trajectory');
  const lastCall = session.calls[session.calls.length - 1].id;
  const sample = sequences.find((s) => s.calls.includes(lastCall)) ?? sequences[sequences.length - 1];
  const finishReason = sample.finish_reason === 'length' ? 'length' : sample.finish_reason === 'abort' ? 'abort' : 'stop';
  const reward = agentReward ?? sample.reward ?? undefined;
  return {
    promptTokens: sample.prompt_ids,
    responseTokens: sample.response_ids,
    logprobs: sample.logprobs,
    lossMask: sample.response_mask,
    finishReason,
    policyVersion: Math.min(...sample.versions),
    response: sample.last_text,
    ...(reward === undefined ? {} : { reward }),
    metrics: {
      'agent/calls': session.calls.length,
      'agent/sequences': sequences.length,
      'agent/drift': session.calls.filter((c) => c.drift !== undefined).length,
      ...metrics,
    },
  };
}
