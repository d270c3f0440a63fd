/**
 * Agent rollouts through a session gateway: any agent that talks to an OpenAI-compatible server (the `openai` npm
 * or PyPI client, `@openai/agents`, the Vercel `ai` SDK, LangChain…) is trained unmodified, with only its base URL
 * pointed at rxrl.
 *
 * Per sample, {@link gatewayWorker} opens a session on an `rxrl serve` gateway over the run's engine and runs the
 * agent — a command with `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL` and `RXRL_TASK` (the task as JSON)
 * in its environment, or a JS function given the same — then turns the session into the sample: the exact token
 * ids of every call (see `lib/serve/sessions.ts`), the environment's tokens masked, the reward the agent gave.
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';

import type { ChatTemplate } from '../chat/template.js';
import { createChatTemplate } from '../chat/template.js';
import type { RolloutEngine } from '../engine/types.js';
import { AgentError, ConfigError, isAbortError } from '../errors.js';
import { serve, type RxrlServer } from '../serve/server.js';
import { sessionSamples, type Session } from '../serve/sessions.js';
import type { Task } from '../types.js';
import type { RolloutSample, RolloutWorker } from '../worker.js';

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

/** An agent as a program: run with `/bin/sh -c`, its last stdout line may be `{"reward": r}`. */
export interface AgentCommand {
  readonly command: string;
  /** Working directory. Default: the process's. */
  readonly cwd?: string;
  /** Extra environment variables. */
  readonly env?: Readonly<Record<string, string>>;
}

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
}

/** A rollout worker that owns a gateway server: `close` stops it (a run closes it when it ends). */
export interface GatewayWorker extends RolloutWorker {
  /** Stops the gateways; idempotent. */
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
 * carrying the tail of its stderr; the run goes on.
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
  const worker: RolloutWorker = async (input, signal) => {
    const gateway = await gatewayOf(input.engine);
    const sessionId = `${input.id.replace(/[^A-Za-z0-9._:-]/g, '_').slice(0, 100)}-${randomBytes(4).toString('hex')}`;
    const session = gateway.sessions.open(sessionId, { seed: input.seed, maxTokens: input.maxTokens, temperature: input.temperature, topP: input.topP });
    const context: AgentContext = { baseURL: `${gateway.url}/sessions/${sessionId}/v1`, apiKey, model: gateway.modelName, signal };
    try {
      const reward = 'run' in agent ? await runFunction(agent.run, input.task, context) : await runCommand(agent, input.task, context, options.stderrBytes ?? 2048);
      return sampleOf(session, reward, input.id);
    } finally {
      gateway.sessions.delete(sessionId);
    }
  };
  let closed: Promise<void> | undefined;
  return Object.assign(worker, {
    close: (): Promise<void> => {
      closed ??= Promise.all([...gateways.values()].map(async (g) => (await g.catch(() => undefined))?.close())).then(() => undefined);
      return closed;
    },
  });
}

async function runFunction(run: AgentFunction, task: Task, context: AgentContext): Promise<number | undefined> {
  let result: AgentResult;
  try {
    result = await run(task, context);
  } catch (cause) {
    if (context.signal.aborted || isAbortError(cause)) throw cause;
    throw new AgentError(`the agent failed on task ${task.id}: ${cause instanceof Error ? cause.message : String(cause)}`, { cause, context: { taskId: task.id } });
  }
  if (result === undefined || result === null) return undefined;
  const reward = typeof result === 'number' ? result : result.reward;
  if (typeof reward !== 'number' || !Number.isFinite(reward)) {
    throw new AgentError(`the agent returned a reward that is not a finite number for task ${task.id}`, { context: { taskId: task.id, reward } });
  }
  return reward;
}

/** Runs the command; resolves with the reward of its last stdout line, if it printed one. */
function runCommand(agent: AgentCommand, task: Task, context: AgentContext, stderrBytes: number): Promise<number | undefined> {
  return new Promise((resolve, reject) => {
    const child = spawn('/bin/sh', ['-c', agent.command], {
      cwd: agent.cwd,
      env: {
        ...process.env,
        ...agent.env,
        OPENAI_BASE_URL: context.baseURL,
        OPENAI_API_KEY: context.apiKey,
        OPENAI_MODEL: context.model,
        RXRL_TASK: JSON.stringify(task),
      },
      stdio: ['ignore', 'pipe', 'pipe'],
      detached: true, // its own process group: a cancelled sample ends the agent and whatever it started
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (text: string) => {
      stdout = (stdout + text).slice(-65_536);
    });
    child.stderr.setEncoding('utf8').on('data', (text: string) => {
      stderr = (stderr + text).slice(-stderrBytes);
    });
    const kill = (): void => {
      try {
        if (child.pid !== undefined) process.kill(-child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    };
    context.signal.addEventListener('abort', kill, { once: true });
    if (context.signal.aborted) kill();
    child.on('error', (cause) => {
      context.signal.removeEventListener('abort', kill);
      reject(new AgentError(`cannot start the agent '${agent.command}': ${cause.message}`, { cause, context: { taskId: task.id } }));
    });
    child.on('close', (code, killedBy) => {
      context.signal.removeEventListener('abort', kill);
      if (context.signal.aborted) return reject(context.signal.reason instanceof Error ? context.signal.reason : new AgentError('the agent was cancelled'));
      if (code !== 0) {
        return reject(
          new AgentError(`the agent exited with ${code === null ? `signal ${killedBy}` : `code ${code}`} on task ${task.id}${stderr ? `: ${stderr.trim()}` : ''}`, {
            context: { taskId: task.id, code, stderr },
          }),
        );
      }
      const last = stdout.trim().split('\n').at(-1) ?? '';
      let reward: number | undefined;
      try {
        const parsed = JSON.parse(last) as { reward?: unknown };
        if (typeof parsed === 'object' && parsed !== null && 'reward' in parsed) {
          if (typeof parsed.reward !== 'number' || !Number.isFinite(parsed.reward)) {
            return reject(new AgentError(`the agent printed a reward that is not a finite number: ${last.slice(0, 200)}`, { context: { taskId: task.id } }));
          }
          reward = parsed.reward;
        }
      } catch {
        // the last line is not JSON: no reward printed
      }
      resolve(reward);
    });
  });
}

/** The sample of a finished session: its last sequence, with the agent's reward or the session's. */
function sampleOf(session: Session, agentReward: number | undefined, id: string): RolloutSample {
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
    },
  };
}
