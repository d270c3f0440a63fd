/**
 * Runs an agent program for one sample: `/bin/sh -c <command>` in its own session and process group, with only
 * the environment it is given, and ends every process it started when the sample ends, however it ends (see
 * `processTree.ts`).
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';

import { AgentError } from '../core/errors.js';
import type { Task } from '../core/types.js';
import { endTree, SAMPLE_COOKIE_VARIABLE, trackTree, type ProcessTree } from './processTree.js';

/** An agent as a program: run with `/bin/sh -c`, its last stdout line may be `{"reward": r}`. */
export interface AgentCommand {
  readonly command: string;
  /** Working directory. Default: the process's. */
  readonly cwd?: string;
  /** Extra environment variables (they win over inherited ones). */
  readonly env?: Readonly<Record<string, string>>;
  /**
   * Give the agent the whole environment of this process, not only {@link AGENT_BASE_ENV}. Default false: a
   * trainer's secrets (cloud keys, `TINKER_API_KEY`, tokens) stay out of agents unless the recipe says so.
   */
  readonly inheritEnv?: boolean;
}

/** Where the agent's model is: its session's base URL, the key and the model name. */
export interface AgentEndpoint {
  readonly baseURL: string;
  readonly apiKey: string;
  readonly model: string;
}

/** How a command agent ended well: the reward it printed, and how many of its processes outlived it. */
export interface AgentCommandResult {
  readonly reward: number | undefined;
  /** Descendants still running when the agent exited (ended by rxrl). */
  readonly leftover: number;
}

/** Options of {@link runAgentCommand}. */
export interface RunAgentCommandOptions {
  /** Most bytes of stderr kept for a failure. */
  readonly stderrBytes: number;
  /** How long the agent's processes may take to exit after SIGTERM before SIGKILL. */
  readonly killGraceMs: number;
}

/**
 * Variables of this process's environment that an agent gets without `inheritEnv`: what a program needs to run
 * at all (find executables, a home and a temporary directory, its locale and time zone), plus every `LC_*`.
 */
export const AGENT_BASE_ENV: readonly string[] = [
  'PATH',
  'HOME',
  'USER',
  'LOGNAME',
  'SHELL',
  'LANG',
  'LANGUAGE',
  'TZ',
  'TERM',
  'TMPDIR',
  'TMP',
  'TEMP',
];

/**
 * The environment of an agent command: {@link AGENT_BASE_ENV} and `LC_*` from `parent` (or all of it with
 * `inheritEnv`), then the agent's `env`, then `OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`, `RXRL_TASK`
 * and the sample's cookie.
 *
 * @param parent - This process's environment.
 * @param agent - The command, its `env` and `inheritEnv`.
 * @param endpoint - The session the agent talks to.
 * @param task - The sample's task (as JSON in `RXRL_TASK`).
 * @param cookie - The sample's cookie ({@link SAMPLE_COOKIE_VARIABLE}).
 * @returns The variables.
 */
export function agentEnvironment(
  parent: NodeJS.ProcessEnv,
  agent: AgentCommand,
  endpoint: AgentEndpoint,
  task: Task,
  cookie: string,
): Record<string, string> {
  const env: Record<string, string> = {};
  for (const [name, value] of Object.entries(parent)) {
    if (value !== undefined && (agent.inheritEnv === true || AGENT_BASE_ENV.includes(name) || name.startsWith('LC_'))) env[name] = value;
  }
  return {
    ...env,
    ...agent.env,
    OPENAI_BASE_URL: endpoint.baseURL,
    OPENAI_API_KEY: endpoint.apiKey,
    OPENAI_MODEL: endpoint.model,
    RXRL_TASK: JSON.stringify(task),
    [SAMPLE_COOKIE_VARIABLE]: cookie,
  };
}

/**
 * Runs `agent` for `task` against `endpoint` and resolves with the reward of its last stdout line, if it printed
 * one. Whenever it ends (it exits, fails, or `signal` fires) every process it started is ended, SIGTERM then
 * SIGKILL after `killGraceMs`, before this settles.
 *
 * @param agent - The command.
 * @param task - The sample's task.
 * @param endpoint - The session.
 * @param signal - Cancels the sample (a timeout, the run's end).
 * @param options - stderr bytes kept, SIGKILL grace.
 * @returns The reward and the count of processes left behind.
 * @throws {@link AgentError} when it cannot start, exits non-zero or prints a reward that is no finite number;
 * `signal.reason` when cancelled.
 */
export async function runAgentCommand(
  agent: AgentCommand,
  task: Task,
  endpoint: AgentEndpoint,
  signal: AbortSignal,
  options: RunAgentCommandOptions,
): Promise<AgentCommandResult> {
  if (signal.aborted)
    throw signal.reason instanceof Error ? signal.reason : new AgentError('the agent was cancelled', { context: { taskId: task.id } });
  const cookie = randomBytes(16).toString('hex');
  const child = spawn('/bin/sh', ['-c', agent.command], {
    cwd: agent.cwd,
    env: agentEnvironment(process.env, agent, endpoint, task, cookie),
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true, // a new session and process group, led by the agent
  });
  let stdout = '';
  let stderr = '';
  child.stdout.setEncoding('utf8').on('data', (text: string) => {
    stdout = (stdout + text).slice(-65_536);
  });
  child.stderr.setEncoding('utf8').on('data', (text: string) => {
    stderr = (stderr + text).slice(-options.stderrBytes);
  });
  const closed = new Promise<void>((resolve) => child.once('close', () => resolve()));
  const exited = new Promise<{ code: number | null; killedBy: NodeJS.Signals | null } | Error>((resolve) => {
    child.once('exit', (code, killedBy) => resolve({ code, killedBy }));
    child.once('error', resolve);
  });
  if (child.pid === undefined) {
    const cause = await exited;
    throw new AgentError(`cannot start the agent '${agent.command}': ${cause instanceof Error ? cause.message : 'no process'}`, {
      cause,
      context: { taskId: task.id },
    });
  }
  const tree: ProcessTree = { leader: child.pid, cookie };
  const untrack = trackTree(tree);
  let stopping: Promise<number> | undefined;
  const stop = (): void => {
    stopping ??= endTree(tree, options.killGraceMs);
  };
  signal.addEventListener('abort', stop, { once: true });
  if (signal.aborted) stop();
  let outcome: Awaited<typeof exited>;
  let leftover: number;
  try {
    outcome = await exited;
    await stopping;
    leftover = await endTree(tree, options.killGraceMs);
    await drain(child, closed, options.killGraceMs);
  } finally {
    signal.removeEventListener('abort', stop);
    untrack();
  }
  if (signal.aborted)
    throw signal.reason instanceof Error ? signal.reason : new AgentError('the agent was cancelled', { context: { taskId: task.id } });
  if (outcome instanceof Error)
    throw new AgentError(`the agent '${agent.command}' failed: ${outcome.message}`, { cause: outcome, context: { taskId: task.id } });
  if (outcome.code !== 0) {
    const how = outcome.code === null ? `signal ${outcome.killedBy}` : `code ${outcome.code}`;
    throw new AgentError(`the agent exited with ${how} on task ${task.id}${stderr ? `: ${stderr.trim()}` : ''}`, {
      context: { taskId: task.id, code: outcome.code, stderr },
    });
  }
  return { reward: printedReward(stdout, task), leftover };
}

/**
 * Waits until the agent's stdout and stderr are read to their end; once its processes are gone that is at once,
 * unless a process outside its tree holds them: then after `waitMs` they are closed unread.
 */
async function drain(child: ReturnType<typeof spawn>, closed: Promise<void>, waitMs: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<void>((resolve) => {
    timer = setTimeout(resolve, waitMs);
  });
  await Promise.race([closed, late]);
  clearTimeout(timer);
  child.stdout?.destroy();
  child.stderr?.destroy();
}

/** The reward of the last stdout line when it is `{"reward": r}`; undefined when that line is no such object. */
function printedReward(stdout: string, task: Task): number | undefined {
  const last = stdout.trim().split('\n').at(-1) ?? '';
  let parsed: unknown;
  try {
    parsed = JSON.parse(last);
  } catch {
    return undefined; // the last line is not JSON: no reward printed
  }
  if (typeof parsed !== 'object' || parsed === null || !('reward' in parsed)) return undefined;
  const { reward } = parsed as { reward: unknown };
  if (typeof reward !== 'number' || !Number.isFinite(reward)) {
    throw new AgentError(`the agent printed a reward that is not a finite number: ${last.slice(0, 200)}`, { context: { taskId: task.id } });
  }
  return reward;
}
