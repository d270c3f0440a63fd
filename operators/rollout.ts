import { concatMap, mergeMap, range, map, type Observable, type OperatorFunction } from 'rxjs';
import type { RolloutEngine } from '../lib/engine/types.js';
import { ConfigError, EvaluationError } from '../lib/core/errors.js';
import type { Evaluator } from '../lib/core/evaluator.js';
import { hashSeed } from '../lib/core/random.js';
import type { ModelTag, RolloutOutput, Task, Trajectory } from '../lib/core/types.js';
import { singleTurnWorker, type RolloutWorker } from '../lib/engine/worker.js';
import { runSample } from './internal/runSample.js';

/** Options of {@link rollout}. */
export interface RolloutOptions {
  /** Samples per task: the GRPO group size (≥ 1). */
  readonly samplesPerTask: number;
  /** Most samples in flight at once across all tasks (≥ 1, finite). */
  readonly concurrency: number;
  /** Scores each response. */
  readonly evaluator: Evaluator;
  /** Largest number of new tokens per response. */
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
  /** Base seed; each sample's seed is derived from it, its group id and run id. Default 0. */
  readonly seed?: number | undefined;
  /** Tag written on trajectories. Default `engine.modelTag`. */
  readonly modelTag?: ModelTag;
  /** Cancels every rollout; the stream then errors with the abort. */
  readonly signal?: AbortSignal | undefined;
  /**
   * A sample still running this long (ms) is cancelled and emitted as a failure (`EngineError`), so its group
   * shrinks instead of waiting on a stuck engine or tool. Default: no limit.
   */
  readonly sampleTimeoutMs?: number;
  /**
   * Produces each sample (for example a multi-turn `agentWorker`). Default {@link singleTurnWorker}: one
   * completion of the task's prompt, every response token trained on.
   */
  readonly worker?: RolloutWorker;
}

/**
 * Expands each task into its GRPO group and samples every member from `engine`, with at most `concurrency`
 * samples in flight. Each response is scored by the evaluator; each trajectory records when it was generated and
 * scored (`timing`, which `grpoPrepare` turns into the batch's `timing/generate_s` and `timing/reward_s`). A
 * sample that fails (engine error, evaluator error, non-finite reward) is emitted as a {@link rxrl!SampleFailure} so its
 * group can shrink instead of waiting; the stream goes on.
 *
 * ```
 * task:     --a---------b-------|
 * rollout(engine, { samplesPerTask: 2, concurrency: 4, … })
 * output:   ------a0-a1------b1-b0|        (aN = trajectory runId N of task a; completion order)
 * ```
 *
 * @example
 * ```ts
 * import { from } from 'rxjs';
 * import { rollout } from 'rxrl/operators';
 * from(tasks).pipe(rollout(engine, { samplesPerTask: 8, concurrency: 64, maxTokens: 16, evaluator }))
 *   .subscribe((t) => console.log(t.id));
 * ```
 * @param engine - the rollout engine sampling responses.
 * @param options - group size, concurrency, evaluator and sampling parameters.
 * @returns an operator from tasks to trajectories (and sample failures), in completion order.
 * @see groupTrajectories
 */
export function rollout(engine: RolloutEngine, options: RolloutOptions): OperatorFunction<Task, RolloutOutput> {
  const { samplesPerTask, concurrency } = options;
  if (!Number.isInteger(samplesPerTask) || samplesPerTask < 1) {
    throw new ConfigError(`rollout samplesPerTask must be an integer >= 1, got ${samplesPerTask}`);
  }
  if (!Number.isInteger(concurrency) || concurrency < 1) {
    throw new ConfigError(`rollout concurrency must be a finite integer >= 1, got ${concurrency}`);
  }
  const timeoutMs = options.sampleTimeoutMs;
  if (timeoutMs !== undefined && !(Number.isFinite(timeoutMs) && timeoutMs > 0)) {
    throw new ConfigError(`rollout sampleTimeoutMs must be a finite number > 0, got ${timeoutMs}`, { context: { key: 'sampleTimeoutMs' } });
  }
  return (source) =>
    source.pipe(
      concatMap((task) => range(0, samplesPerTask).pipe(map((runId) => ({ task, runId })))),
      mergeMap(({ task, runId }) => sampleOnce(engine, task, runId, options), concurrency),
    );
}

/** Group id of a task in its epoch: samples of one task in one epoch share it. */
export function groupIdOf(task: Task): string {
  return `${task.id}@${task.epoch ?? 0}`;
}

function sampleOnce(engine: RolloutEngine, task: Task, runId: number, options: RolloutOptions): Observable<RolloutOutput> {
  const groupId = groupIdOf(task);
  const modelTag = options.modelTag ?? engine.modelTag;
  const id = `${groupId}/${runId}`;
  return runSample<RolloutOutput>(
    async (signal) => [await generateAndScore(engine, task, { id, groupId, runId, modelTag }, options, signal)],
    (error) => [{ kind: 'sample-failure', id, taskId: task.id, groupId, runId, modelTag, error }],
    { signal: options.signal, timeoutMs: options.sampleTimeoutMs, kind: 'sample', id },
  );
}

async function generateAndScore(
  engine: RolloutEngine,
  task: Task,
  ids: { id: string; groupId: string; runId: number; modelTag: ModelTag },
  options: RolloutOptions,
  signal: AbortSignal,
): Promise<Trajectory> {
  const worker = options.worker ?? singleTurnWorker;
  const generating = performance.now();
  const sample = await worker(
    {
      engine,
      task,
      ...ids,
      seed: hashSeed(options.seed ?? 0, ids.groupId, String(ids.runId)),
      maxTokens: options.maxTokens,
      temperature: options.temperature ?? 1,
      topP: options.topP ?? 1,
      ignoreEos: options.ignoreEos ?? false,
    },
    signal,
  );
  const text = sample.response;
  const scoring = performance.now();
  let result;
  try {
    result =
      sample.reward !== undefined
        ? { reward: sample.reward }
        : await options.evaluator.evaluate(task, text, signal, { finishReason: sample.finishReason, tokens: sample.responseTokens });
  } catch (cause) {
    throw new EvaluationError(`evaluator failed on task ${task.id}`, { cause, context: { taskId: task.id } });
  }
  const scored = performance.now();
  if (!Number.isFinite(result.reward)) {
    throw new EvaluationError(`evaluator returned a non-finite reward (${result.reward}) for task ${task.id}`, {
      context: { taskId: task.id, reward: result.reward },
    });
  }
  return {
    ...ids,
    taskId: task.id,
    policyVersion: sample.policyVersion,
    promptTokens: sample.promptTokens,
    responseTokens: sample.responseTokens,
    logprobs: sample.logprobs,
    lossMask: sample.lossMask,
    reward: result.reward,
    finishReason: sample.finishReason,
    metrics: { ...sample.metrics, ...result.metrics },
    task,
    responseText: text,
    timing: { generate: [generating, scoring], reward: [scoring, scored] },
  };
}
