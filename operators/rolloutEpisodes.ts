import { concatMap, map, mergeMap, range, type Observable, type OperatorFunction } from 'rxjs';
import {
  episodeSlots,
  type AgentName,
  type AgentSpec,
  type EpisodeSlot,
  type EpisodeStep,
  type MultiAgentEnvironment,
  type TrajectoryGranularity,
  TRAJECTORY_GRANULARITIES,
} from '../lib/agent/environment.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { GenerateResponse } from '../lib/model/types.js';
import { ConfigError, EvaluationError, isAbortError, throwIfAborted } from '../lib/core/errors.js';
import { hashSeed } from '../lib/core/random.js';
import type { ModelTag, RolloutOutput, Task, Trajectory } from '../lib/core/types.js';
import { runSample } from './internal/runSample.js';
import { groupIdOf } from './rollout.js';

/** Options of {@link rolloutEpisodes}. */
export interface RolloutEpisodesOptions {
  /** The turn-based environment. */
  readonly environment: MultiAgentEnvironment;
  /** Every agent of the environment's turn order, with its policy. */
  readonly agents: readonly AgentSpec[];
  /** Episodes per task: the GRPO group size of every slot (≥ 1). */
  readonly samplesPerTask: number;
  /** Most episodes in flight at once (≥ 1, finite). */
  readonly concurrency: number;
  /** Largest number of new tokens per turn. */
  readonly maxTokens: number;
  /** Sampling temperature. Default 1. */
  readonly temperature?: number | undefined;
  /** Nucleus mass. Default 1. */
  readonly topP?: number | undefined;
  /**
   * Stop tokens end no response: every generation runs to `maxTokens` (finish reason `length`), as vLLM's
   * `ignore_eos`. Default false.
   */
  readonly ignoreEos?: boolean | undefined;
  /** Base seed; each turn's seed is derived from it, its slot's group id and the run id. Default 0. */
  readonly seed?: number | undefined;
  /** One trajectory per (agent, turn) or per agent. Default `turn`. */
  readonly granularity?: TrajectoryGranularity;
  /** An episode still running this long (ms) is cancelled and every slot of it fails with an `EngineError`. */
  readonly episodeTimeoutMs?: number;
  /** Cancels every episode; the stream then errors with the abort. */
  readonly signal?: AbortSignal;
}

/** One played turn. */
interface PlayedTurn {
  readonly agent: AgentName;
  readonly promptTokens: readonly number[];
  readonly response: GenerateResponse;
  readonly step: EpisodeStep;
}

/**
 * Multi-agent rollout: plays `samplesPerTask` episodes of each task, the agents taking turns in the environment's
 * `turnOrder`, each turn sampled from the engine of the agent's policy. Every episode emits one output per slot
 * (see `episodeSlots`): a trajectory tagged with the slot's policy, group id `${task group}/${agent}/${turn}` (or
 * `/${agent}`) and id `${group}/${runId}`, so the samples of one task group slot by slot. A slot the episode never
 * reached is emitted as a skipped {@link rxrl!SampleFailure}; an episode that fails (engine, environment, timeout) fails
 * each of its slots, and the stream goes on.
 *
 * ```
 * task:     --a-----------------|          turnOrder [w, e], samplesPerTask 2
 * rolloutEpisodes(engines, { … })
 * output:   ------(w0 e0)--(w1 e1)|        (wN/eN = the writer's / editor's slot of episode N)
 * ```
 *
 * @example
 * ```ts
 * import { from } from 'rxjs';
 * import { rolloutEpisodes } from 'rxrl/operators';
 * from(tasks).pipe(rolloutEpisodes(new Map([['shared', engine]]), {
 *   environment, agents: [{ name: 'writer', policy: 'shared' }, { name: 'editor', policy: 'shared' }],
 *   samplesPerTask: 8, concurrency: 32, maxTokens: 8,
 * })).subscribe((t) => console.log(t.modelTag, t.id));
 * ```
 * @param engines - the rollout engine of each policy (`modelTag`).
 * @param options - environment, agents, group size, concurrency and sampling parameters.
 * @returns an operator from tasks to trajectories and sample failures, in completion order.
 * @see groupTrajectories
 */
export function rolloutEpisodes(
  engines: ReadonlyMap<ModelTag, RolloutEngine>,
  options: RolloutEpisodesOptions,
): OperatorFunction<Task, RolloutOutput> {
  const { samplesPerTask, concurrency, environment } = options;
  if (!Number.isInteger(samplesPerTask) || samplesPerTask < 1) {
    throw new ConfigError(`rolloutEpisodes samplesPerTask must be an integer >= 1, got ${samplesPerTask}`);
  }
  if (!Number.isInteger(concurrency) || concurrency < 1) {
    throw new ConfigError(`rolloutEpisodes concurrency must be a finite integer >= 1, got ${concurrency}`);
  }
  const granularity = options.granularity ?? 'turn';
  if (!TRAJECTORY_GRANULARITIES.includes(granularity)) {
    throw new ConfigError(`unknown trajectory granularity '${String(granularity)}'; valid: ${TRAJECTORY_GRANULARITIES.join(', ')}`);
  }
  const timeoutMs = options.episodeTimeoutMs;
  if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new ConfigError(`rolloutEpisodes episodeTimeoutMs must be a finite number > 0, got ${timeoutMs}`, {
      context: { key: 'episodeTimeoutMs' },
    });
  }
  const agents = agentMap(options.agents);
  for (const spec of agents.values()) {
    if (!engines.has(spec.policy)) {
      throw new ConfigError(
        `agent '${spec.name}' samples from policy '${spec.policy}', which has no engine; engines: ${[...engines.keys()].join(', ')}`,
        {
          context: { key: 'agents', agent: spec.name },
        },
      );
    }
  }
  const slots = episodeSlots(environment, agents, granularity);
  return (source) =>
    source.pipe(
      concatMap((task) => range(0, samplesPerTask).pipe(map((runId) => ({ task, runId })))),
      mergeMap(({ task, runId }) => episodeOnce(engines, agents, slots, task, runId, options), concurrency),
    );
}

/** Agent specs by name; a `ConfigError` names a duplicate. */
export function agentMap(specs: readonly AgentSpec[]): Map<AgentName, AgentSpec> {
  const map = new Map<AgentName, AgentSpec>();
  specs.forEach((spec, i) => {
    if (map.has(spec.name))
      throw new ConfigError(`agents[${i}].name: agent '${spec.name}' is listed twice`, { context: { key: `agents[${i}].name` } });
    map.set(spec.name, spec);
  });
  return map;
}

function episodeOnce(
  engines: ReadonlyMap<ModelTag, RolloutEngine>,
  agents: ReadonlyMap<AgentName, AgentSpec>,
  slots: readonly EpisodeSlot[],
  task: Task,
  runId: number,
  options: RolloutEpisodesOptions,
): Observable<RolloutOutput> {
  const taskGroup = groupIdOf(task);
  const ids = (slot: EpisodeSlot): { id: string; groupId: string } => ({
    id: `${taskGroup}${slot.suffix}/${runId}`,
    groupId: `${taskGroup}${slot.suffix}`,
  });
  const failure = (slot: EpisodeSlot, error: Error, skipped = false): RolloutOutput => ({
    kind: 'sample-failure',
    ...ids(slot),
    taskId: task.id,
    runId,
    modelTag: slot.modelTag,
    error,
    ...(skipped ? { skipped } : {}),
  });
  return runSample<RolloutOutput>(
    async (signal) => {
      const played = await playEpisode(engines, agents, task, runId, options, signal);
      return slots.map((slot) => {
        const trajectory = slotTrajectory(slot, played, task, runId, ids(slot));
        return trajectory ?? failure(slot, new Error(`episode ${taskGroup}/${runId} ended before ${slot.suffix.slice(1)}`), true);
      });
    },
    (error) => slots.map((slot) => failure(slot, error)),
    { signal: options.signal, timeoutMs: options.episodeTimeoutMs, kind: 'episode', id: `${taskGroup}/${runId}` },
  );
}

async function playEpisode(
  engines: ReadonlyMap<ModelTag, RolloutEngine>,
  agents: ReadonlyMap<AgentName, AgentSpec>,
  task: Task,
  runId: number,
  options: RolloutEpisodesOptions,
  signal: AbortSignal,
): Promise<PlayedTurn[]> {
  const { environment } = options;
  const taskGroup = groupIdOf(task);
  const seed = options.seed ?? 0;
  const fail = (what: string, cause?: unknown, turn?: number): EvaluationError =>
    new EvaluationError(`environment ${what} in episode ${taskGroup}/${runId}${turn === undefined ? '' : ` at turn ${turn}`}`, {
      cause,
      context: { taskId: task.id, runId, ...(turn === undefined ? {} : { turn }) },
    });
  let episode;
  try {
    episode = await environment.reset(task, hashSeed(seed, taskGroup, String(runId), 'episode'));
  } catch (cause) {
    throw fail('reset failed', cause);
  }
  const played: PlayedTurn[] = [];
  for (let turn = 0; turn < environment.maxTurns; turn++) {
    throwIfAborted(signal);
    const agent = environment.turnOrder[turn % environment.turnOrder.length];
    const spec = agents.get(agent) as AgentSpec;
    const engine = engines.get(spec.policy) as RolloutEngine;
    let observation: string;
    try {
      observation = episode.observe(agent, turn);
    } catch (cause) {
      throw fail('observe failed', cause, turn);
    }
    if (typeof observation !== 'string') throw fail(`observe returned ${typeof observation}, not a string`, undefined, turn);
    const promptTokens = engine.tokenizer.encode((spec.prompt ?? '') + observation, { addBos: true });
    const [response] = await engine.generate(
      [
        {
          promptTokens,
          maxTokens: options.maxTokens,
          temperature: options.temperature ?? 1,
          topP: options.topP ?? 1,
          stopTokens: options.ignoreEos === true ? [] : engine.tokenizer.stopIds,
          seed: hashSeed(seed, `${taskGroup}/${agent}/${turn}`, String(runId)),
        },
      ],
      signal,
    );
    let step: EpisodeStep;
    try {
      step = await episode.step(agent, engine.tokenizer.decode(response.tokens), turn, signal);
    } catch (cause) {
      if (signal.aborted && isAbortError(cause)) throw cause;
      throw fail('step failed', cause, turn);
    }
    for (const [name, reward] of Object.entries(step?.rewards ?? {})) {
      if (!agents.has(name)) throw fail(`rewarded '${name}', who is not an agent`, undefined, turn);
      if (!Number.isFinite(reward)) throw fail(`gave '${name}' a non-finite reward (${reward})`, undefined, turn);
    }
    played.push({ agent, promptTokens, response, step });
    if (step.done) break;
  }
  return played;
}

/** The slot's trajectory, or undefined when the episode never reached it. */
function slotTrajectory(
  slot: EpisodeSlot,
  played: readonly PlayedTurn[],
  task: Task,
  runId: number,
  ids: { id: string; groupId: string },
): Trajectory | undefined {
  const from = slot.turn ?? played.findIndex((turn) => turn.agent === slot.agent);
  if (from < 0 || from >= played.length) return undefined;
  // The agent's return from the slot's turn on (undiscounted): its own later rewards count, others' do not.
  let reward = 0;
  for (let t = from; t < played.length; t++) reward += played[t].step.rewards?.[slot.agent] ?? 0;
  const own = slot.turn === null ? played.filter((turn) => turn.agent === slot.agent) : [played[slot.turn]];
  const joined = joinTurns(own, ids.id);
  const metrics: Record<string, number> = { 'agent/turns': played.length };
  for (const turn of own) Object.assign(metrics, turn.step.metrics);
  return {
    ...ids,
    taskId: task.id,
    runId,
    modelTag: slot.modelTag,
    policyVersion: Math.min(...own.map((turn) => turn.response.policyVersion)),
    ...joined,
    reward,
    finishReason: own[own.length - 1].response.finishReason,
    metrics,
    task,
  };
}

/**
 * One agent's turns as one sequence: the first turn's prompt, then each response (trained on) followed by what
 * the next observation adds (masked out). Each observation must extend the previous prompt and response, as a
 * chat transcript does (a response's final stop token may be absent from it: the response text leaves it out);
 * an environment whose observations do not is an `EvaluationError` (use `turn` granularity).
 */
function joinTurns(
  turns: readonly PlayedTurn[],
  id: string,
): Pick<Trajectory, 'promptTokens' | 'responseTokens' | 'logprobs' | 'lossMask'> {
  const [first] = turns;
  const responseTokens: number[] = [];
  const logprobs: number[] = [];
  const lossMask: number[] = [];
  let context: readonly number[] = first.promptTokens;
  turns.forEach((turn, k) => {
    if (k > 0) {
      const previous = turns[k - 1].response;
      const withoutStop = previous.finishReason === 'stop' ? context.slice(0, -1) : context;
      const matched = [context, withoutStop].find((prefix) => startsWith(turn.promptTokens, prefix));
      if (matched === undefined) {
        throw new EvaluationError(
          `trajectory ${id}: the observation of the agent's turn ${k} does not extend its previous prompt and response`,
          {
            context: { id },
          },
        );
      }
      const added = turn.promptTokens.slice(matched.length);
      responseTokens.push(...added);
      logprobs.push(...added.map(() => 0));
      lossMask.push(...added.map(() => 0));
    }
    responseTokens.push(...turn.response.tokens);
    logprobs.push(...turn.response.logprobs);
    lossMask.push(...turn.response.tokens.map(() => 1));
    context = [...turn.promptTokens, ...turn.response.tokens];
  });
  return { promptTokens: first.promptTokens, responseTokens, logprobs, lossMask };
}

function startsWith(tokens: readonly number[], prefix: readonly number[]): boolean {
  return tokens.length >= prefix.length && prefix.every((token, i) => tokens[i] === token);
}
