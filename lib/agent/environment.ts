/**
 * Turn-based multi-agent environments (PettingLLMs' setting): several agents take turns in one episode, each
 * sampling from the policy it is mapped to, and the environment scores every agent.
 *
 * @packageDocumentation
 */
import { ConfigError } from '../core/errors.js';
import type { ModelTag, Task } from '../core/types.js';

/** Names an agent (a role in the episode, such as `writer` or `editor`). */
export type AgentName = string;

/** One agent of a multi-agent episode and the policy it samples from. */
export interface AgentSpec {
  /** The agent's name, as the environment's `turnOrder` spells it. */
  readonly name: AgentName;
  /** The policy (`modelTag`) that samples this agent's turns and is trained on them. */
  readonly policy: ModelTag;
  /**
   * Prompt specialization (PettingLLMs' L1): text put before each of this agent's observations, so agents that
   * share one policy can still tell their roles apart. Default none.
   */
  readonly prompt?: string;
}

/** What one step of an episode returns. */
export interface EpisodeStep {
  /** Rewards given at this step, by agent; an agent not named gets 0. */
  readonly rewards?: Readonly<Record<AgentName, number>>;
  /** True when the episode is over; it also ends after the environment's `maxTurns`. */
  readonly done: boolean;
  /** Scalar metrics of the step, merged into the acting agent's trajectory (`env/*`). */
  readonly metrics?: Readonly<Record<string, number>>;
}

/** One running episode: what the acting agent sees, and what its response does. */
export interface Episode {
  /** The prompt text `agent` sees at 0-based turn `turn` (the tokenizer's BOS is added by the rollout). */
  observe(agent: AgentName, turn: number): string;
  /** Applies `agent`'s response at `turn`; rejects (or throws) to fail the whole episode. */
  step(agent: AgentName, response: string, turn: number, signal: AbortSignal): EpisodeStep | Promise<EpisodeStep>;
}

/**
 * A turn-based environment for several agents. Turn `t` (0-based) belongs to `turnOrder[t mod n]`; an episode
 * ends when a step says `done` or after `maxTurns` turns.
 *
 * @example
 * ```ts
 * const environment: MultiAgentEnvironment = {
 *   turnOrder: ['writer', 'editor'],
 *   maxTurns: 2,
 *   reset: (task) => {
 *     let draft = '';
 *     return {
 *       observe: (agent) => (agent === 'writer' ? task.prompt : `${task.prompt}${draft}>`),
 *       step: (agent, response) => {
 *         if (agent === 'writer') draft = response;
 *         return { rewards: { [agent]: response === task.answer ? 1 : 0 }, done: agent === 'editor' };
 *       },
 *     };
 *   },
 * };
 * ```
 */
export interface MultiAgentEnvironment {
  /** Agents in the order they act. */
  readonly turnOrder: readonly AgentName[];
  /** Most turns of an episode (≥ 1). */
  readonly maxTurns: number;
  /** Starts an episode of `task`; `seed` is the episode's own (for environments with chance). */
  reset(task: Task, seed: number): Episode | Promise<Episode>;
}

/**
 * What a multi-agent rollout emits per episode: `turn`, one trajectory per (agent, turn), each rewarded with the
 * agent's return from that turn on; or `agent`, one trajectory per agent, its turns joined into one sequence
 * (the text between them masked out), rewarded with the agent's whole return.
 */
export type TrajectoryGranularity = 'turn' | 'agent';

/** Valid {@link TrajectoryGranularity} names. */
export const TRAJECTORY_GRANULARITIES: readonly TrajectoryGranularity[] = ['turn', 'agent'];

/** One GRPO group an episode feeds: every episode of a task fills one member of each of its slots. */
export interface EpisodeSlot {
  /** The agent the slot's trajectories come from. */
  readonly agent: AgentName;
  /** The policy trained on them. */
  readonly modelTag: ModelTag;
  /** The turn (`turn` granularity), or null (`agent` granularity: the agent's turns joined). */
  readonly turn: number | null;
  /** Suffix of the slot's group id after the task's group id (`/editor/1`, or `/editor`). */
  readonly suffix: string;
}

/**
 * The slots an episode of `environment` fills, in turn order: one per turn with `turn` granularity, one per agent
 * that acts within `maxTurns` with `agent` granularity. They are the same for every task, which is what lets each
 * policy's batch boundaries be counted in advance.
 *
 * @param environment - the turn order and turn budget.
 * @param agents - agent → policy map.
 * @param granularity - per turn or per agent.
 * @returns the slots; a `ConfigError` names the first agent of the turn order that has no spec.
 */
export function episodeSlots(
  environment: Pick<MultiAgentEnvironment, 'turnOrder' | 'maxTurns'>,
  agents: ReadonlyMap<AgentName, AgentSpec>,
  granularity: TrajectoryGranularity,
): EpisodeSlot[] {
  const { turnOrder, maxTurns } = environment;
  if (turnOrder.length === 0)
    throw new ConfigError('a multi-agent environment needs at least one agent in turnOrder', { context: { key: 'turnOrder' } });
  if (!(Number.isInteger(maxTurns) && maxTurns >= 1)) {
    throw new ConfigError(`environment maxTurns must be an integer >= 1, got ${maxTurns}`, { context: { key: 'maxTurns' } });
  }
  const slots: EpisodeSlot[] = [];
  const seen = new Set<AgentName>();
  for (let turn = 0; turn < maxTurns; turn++) {
    const agent = turnOrder[turn % turnOrder.length];
    const spec = agents.get(agent);
    if (spec === undefined) {
      throw new ConfigError(
        `agent '${agent}' of the environment's turnOrder has no agent spec; given: ${[...agents.keys()].join(', ') || 'none'}`,
        {
          context: { key: 'agents', agent },
        },
      );
    }
    if (granularity === 'turn') slots.push({ agent, modelTag: spec.policy, turn, suffix: `/${agent}/${turn}` });
    else if (!seen.has(agent)) slots.push({ agent, modelTag: spec.policy, turn: null, suffix: `/${agent}` });
    seen.add(agent);
  }
  return slots;
}
