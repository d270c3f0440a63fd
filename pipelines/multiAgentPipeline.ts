import type { Observable } from 'rxjs';
import {
  episodeSlots,
  type AgentSpec,
  type EpisodeSlot,
  type MultiAgentEnvironment,
  type TrajectoryGranularity,
} from '../lib/agent/environment.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Batch, Metrics, ModelTag } from '../lib/core/types.js';
import { agentMap, rolloutEpisodes } from '../operators/rolloutEpisodes.js';
import { policyLoop, type PolicyLane, type PolicyLoopConfig, type PolicyStepResult } from './grpoPipeline.js';

/**
 * One policy of a multi-agent run: the trainer that updates it (its `modelTag` names the policy), its rollout
 * engines (the first one samples, all receive every new version) and the version they hold at the start.
 */
export type PolicySpec = Pick<PolicyLane, 'trainer' | 'engines' | 'startVersion'>;

/** Configuration of {@link multiAgentPipeline}: the loop settings of `grpoPipeline`, with agents and policies. */
export interface MultiAgentPipelineConfig extends PolicyLoopConfig {
  /** The turn-based environment. */
  readonly environment: MultiAgentEnvironment;
  /** Every agent of the turn order, mapped to a policy. */
  readonly agents: readonly AgentSpec[];
  /** Every policy an agent maps to (L1: one policy for all; L2/L3: one per agent). */
  readonly policies: readonly PolicySpec[];
  /** One trajectory per (agent, turn) or per agent. Default `turn`. */
  readonly granularity?: TrajectoryGranularity;
  /** An episode running this long (ms) fails all its slots. Default: no limit. */
  readonly episodeTimeoutMs?: number;
  /** Sees each batch as it enters its policy's trainer. */
  readonly onBatch?: (batch: Batch) => void;
  /**
   * Runs after each step of a policy, once its weights are published and before its gate is credited
   * (checkpoints, validation); metrics it returns are merged into the step's metrics.
   */
  readonly afterStep?: (step: PolicyStepResult) => Promise<Metrics | void>;
}

/**
 * Multi-agent, multi-policy GRPO: agents take turns in a shared environment (`rolloutEpisodes`), each sampling from
 * its policy; each policy (`modelTag`) then has its own group store, batches, `grpoPrepare`, trainer, weight sync,
 * version and admission gate, so its staleness stays within the mode's bound counted in its own versions. Policies
 * train concurrently where their data is ready; a task is admitted once every policy still training admits it.
 * `steps` counts each policy's steps. Step metrics are namespaced by policy (`writer/actor/pg_loss`).
 *
 * ```
 * tasks ─admit─▶ rolloutEpisodes ─▶ groupTrajectories ─┬─ writer: batchGroups ▶ grpoPrepare ▶ train ▶ syncWeights ─┐
 *                                                      └─ editor: batchGroups ▶ grpoPrepare ▶ train ▶ syncWeights ─┴▶
 * ```
 *
 * @example
 * ```ts
 * import { multiAgentPipeline } from 'rxrl/pipelines';
 * multiAgentPipeline({
 *   tasks, environment, batchSize: 16, groupSize: 8, maxTokens: 8, steps: 100,
 *   agents: [{ name: 'writer', policy: 'writer' }, { name: 'editor', policy: 'editor' }],
 *   policies: [{ trainer: writerTrainer, engines: [writerEngine] }, { trainer: editorTrainer, engines: [editorEngine] }],
 * }).subscribe((step) => console.log(step.modelTag, step.step, step.metrics[`${step.modelTag}/rollout/reward_mean`]));
 * ```
 * @param config - tasks, environment, agents, policies, staleness mode and sizes.
 * @returns a cold Observable of every policy's step results, tagged with `modelTag`.
 * @see grpoPipeline
 */
export function multiAgentPipeline(config: MultiAgentPipelineConfig): Observable<PolicyStepResult> {
  const agents = agentMap(config.agents);
  const granularity = config.granularity ?? 'turn';
  const tags = new Set(config.policies.map((policy) => policy.trainer.modelTag));
  config.agents.forEach((agent, i) => {
    if (!tags.has(agent.policy)) {
      throw new ConfigError(
        `agents[${i}].policy: agent '${agent.name}' maps to unknown policy '${agent.policy}'; policies: ${[...tags].join(', ')}`,
        {
          context: { key: `agents[${i}].policy` },
        },
      );
    }
  });
  const slots = episodeSlots(config.environment, agents, granularity);
  const engines = new Map<ModelTag, RolloutEngine>();
  for (const policy of config.policies) {
    const [engine] = policy.engines;
    if (engine !== undefined) engines.set(policy.trainer.modelTag, engine);
  }
  return policyLoop(config, {
    lanes: config.policies.map((policy) => ({ ...policy, afterStep: config.afterStep, onBatch: config.onBatch })),
    slots,
    rollout: ({ concurrency }) =>
      rolloutEpisodes(engines, {
        environment: config.environment,
        agents: config.agents,
        samplesPerTask: config.groupSize,
        concurrency,
        maxTokens: config.maxTokens,
        temperature: config.temperature,
        topP: config.topP,
        ignoreEos: config.ignoreEos,
        seed: config.seed,
        granularity,
        ...(config.episodeTimeoutMs === undefined ? {} : { episodeTimeoutMs: config.episodeTimeoutMs }),
      }),
    namespaceMetrics: true,
    batchMetrics: (batch) => agentMetrics(batch, slots),
  });
}

/**
 * Per agent of a batch (a policy several agents share has rows of each): `agents/<name>/reward_mean` and
 * `agents/<name>/rows`, read from each row's group id suffix.
 */
function agentMetrics(batch: Batch, slots: readonly EpisodeSlot[]): Metrics {
  const sums = new Map<string, { reward: number; rows: number }>();
  batch.meta.groupIds.forEach((groupId, row) => {
    const slot = slots.find((s) => groupId.endsWith(s.suffix));
    if (slot === undefined) return;
    const entry = sums.get(slot.agent) ?? { reward: 0, rows: 0 };
    entry.reward += batch.meta.rewards[row];
    entry.rows++;
    sums.set(slot.agent, entry);
  });
  const metrics: Metrics = {};
  for (const [agent, { reward, rows }] of sums) {
    metrics[`agents/${agent}/reward_mean`] = reward / rows;
    metrics[`agents/${agent}/rows`] = rows;
  }
  return metrics;
}
