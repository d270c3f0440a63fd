import { from, lastValueFrom, reduce, tap } from 'rxjs';
import { episodeSlots, type AgentName, type AgentSpec, type MultiAgentEnvironment } from '../lib/agent/environment.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { Evaluator } from '../lib/core/evaluator.js';
import { isSampleFailure, type Metrics, type ModelTag, type RolloutOutput, type Task } from '../lib/core/types.js';
import type { RolloutWorker } from '../lib/engine/worker.js';
import { groupIdOf, rollout } from '../operators/rollout.js';
import { agentMap, rolloutEpisodes } from '../operators/rolloutEpisodes.js';

/** Options of {@link validate}. */
export interface ValidateOptions {
  /** Largest response length in tokens. */
  readonly maxTokens: number;
  /** Sampling temperature; 0 (greedy, the default) makes validation deterministic. */
  readonly temperature?: number;
  /** Samples per task. Default 1. */
  readonly samplesPerTask?: number;
  /** Most samples in flight. Default 256. */
  readonly concurrency?: number;
  /** Seed of the sampling streams. Default 0. */
  readonly seed?: number;
  /** Cancels the validation. */
  readonly signal?: AbortSignal;
  /** Produces each sample (a chat-formatted or multi-turn worker, as in training). Default: `singleTurnWorker`. */
  readonly worker?: RolloutWorker;
  /** Receives every sample as it is scored, a failed one included (to keep the generations). */
  readonly onSample?: (output: RolloutOutput) => void;
}

/**
 * Scores an engine on held-out tasks: one rollout per task (greedy by default) through the same `rollout`
 * operator as training, with `val/`-prefixed metrics: `val/reward_mean`, `val/<metric>_mean` for each evaluator
 * metric, `val/samples`, `val/failures`.
 *
 * @param engine - the engine to score.
 * @param tasks - held-out tasks.
 * @param evaluator - scores each response.
 * @param options - sampling settings.
 * @returns the metrics.
 */
export async function validate(
  engine: RolloutEngine,
  tasks: readonly Task[],
  evaluator: Evaluator,
  options: ValidateOptions,
): Promise<Metrics> {
  const totals = await lastValueFrom(
    from(tasks).pipe(
      rollout(engine, {
        samplesPerTask: options.samplesPerTask ?? 1,
        concurrency: options.concurrency ?? 256,
        evaluator,
        maxTokens: options.maxTokens,
        temperature: options.temperature ?? 0,
        seed: options.seed,
        signal: options.signal,
        ...(options.worker ? { worker: options.worker } : {}),
      }),
      tap((output) => options.onSample?.(output)),
      reduce(
        (acc, output) => {
          if (isSampleFailure(output)) {
            acc.failures++;
            return acc;
          }
          acc.samples++;
          acc.sums.reward = (acc.sums.reward ?? 0) + output.reward;
          for (const [key, value] of Object.entries(output.metrics)) acc.sums[key] = (acc.sums[key] ?? 0) + value;
          return acc;
        },
        { samples: 0, failures: 0, sums: {} as Record<string, number> },
      ),
    ),
    { defaultValue: { samples: 0, failures: 0, sums: {} as Record<string, number> } },
  );
  const metrics: Metrics = { 'val/samples': totals.samples, 'val/failures': totals.failures };
  for (const [key, value] of Object.entries(totals.sums)) {
    metrics[`val/${key}_mean`] = totals.samples > 0 ? value / totals.samples : 0;
  }
  return metrics;
}

/** Options of {@link validateAgents}. */
export interface ValidateAgentsOptions extends Omit<ValidateOptions, 'worker' | 'samplesPerTask'> {
  /** The environment. */
  readonly environment: MultiAgentEnvironment;
  /** Every agent of its turn order, with its policy. */
  readonly agents: readonly AgentSpec[];
}

/**
 * Scores agents on held-out tasks: one episode per task (greedy by default) through the same `rolloutEpisodes`
 * operator as training. Per agent: `val/<agent>/reward_mean` (its return over the episode),
 * `val/<agent>/<metric>_mean` for each step metric of its turns; and `val/episodes`, `val/failures`.
 *
 * @param engines - the engine of each policy.
 * @param tasks - held-out tasks.
 * @param options - environment, agents and sampling settings.
 * @returns the metrics.
 */
export async function validateAgents(
  engines: ReadonlyMap<ModelTag, RolloutEngine>,
  tasks: readonly Task[],
  options: ValidateAgentsOptions,
): Promise<Metrics> {
  const sums = new Map<AgentName, { samples: number; values: Record<string, number> }>();
  const failed = new Set<string>();
  const episodes = new Set<string>();
  const slots = episodeSlots(options.environment, agentMap(options.agents), 'turn');
  const agentOf = new Map(slots.map((slot) => [slot.suffix, slot]));
  // An agent's first turn carries its whole return (rewards from that turn on).
  const firstTurns = new Set(slots.filter((slot, i) => slots.findIndex((s) => s.agent === slot.agent) === i));
  await lastValueFrom(
    from(tasks).pipe(
      rolloutEpisodes(engines, {
        environment: options.environment,
        agents: options.agents,
        samplesPerTask: 1,
        concurrency: options.concurrency ?? 256,
        maxTokens: options.maxTokens,
        temperature: options.temperature ?? 0,
        seed: options.seed,
        ...(options.signal ? { signal: options.signal } : {}),
      }),
      tap((output) => {
        const episode = JSON.stringify([output.taskId, output.runId]);
        episodes.add(episode);
        if (isSampleFailure(output)) {
          if (output.skipped !== true) failed.add(episode);
          return;
        }
        const slot = agentOf.get(output.groupId.slice(groupIdOf(output.task).length));
        if (slot === undefined) return;
        const entry = sums.get(slot.agent) ?? { samples: 0, values: {} };
        sums.set(slot.agent, entry);
        if (firstTurns.has(slot)) {
          entry.samples++;
          entry.values.reward = (entry.values.reward ?? 0) + output.reward;
        }
        for (const [key, value] of Object.entries(output.metrics)) {
          if (key !== 'agent/turns') entry.values[`turn:${key}`] = (entry.values[`turn:${key}`] ?? 0) + value;
        }
        entry.values['turn:count'] = (entry.values['turn:count'] ?? 0) + 1;
      }),
    ),
    { defaultValue: undefined },
  );
  const metrics: Metrics = { 'val/episodes': episodes.size, 'val/failures': failed.size };
  for (const [agent, { samples, values }] of sums) {
    metrics[`val/${agent}/reward_mean`] = samples > 0 ? (values.reward ?? 0) / samples : 0;
    const turns = values['turn:count'] ?? 0;
    for (const [key, value] of Object.entries(values)) {
      if (key.startsWith('turn:') && key !== 'turn:count') metrics[`val/${agent}/${key.slice(5)}_mean`] = turns > 0 ? value / turns : 0;
    }
  }
  return metrics;
}
