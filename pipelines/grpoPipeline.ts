import {
  EMPTY,
  Observable,
  concatMap,
  filter,
  finalize,
  fromEvent,
  map,
  merge,
  share,
  take,
  takeUntil,
  tap,
  type OperatorFunction,
} from 'rxjs';
import type { StdKind } from '../lib/algos/advantages.js';
import { taskStream, type LoadTasksOptions, type TaskSource } from '../lib/data/loader.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Evaluator } from '../lib/core/evaluator.js';
import { AdmissionGate, allGates, generationBatchProblem, type StalenessMode } from '../lib/sync/gate.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import {
  isSampleFailure,
  type Batch,
  type Group,
  type Metrics,
  type ModelTag,
  type PolicyVersion,
  type ReferencePolicy,
  type RolloutOutput,
  type SampleFailure,
  type Task,
} from '../lib/core/types.js';
import type { RolloutWorker } from '../lib/engine/worker.js';
import { admit } from '../operators/admit.js';
import { batchGroups } from '../operators/batchGroups.js';
import { groupTrajectories } from '../operators/groupTrajectories.js';
import { grpoPrepare, type GrpoPrepareOptions, type KlInRewardOptions } from '../operators/grpoPrepare.js';
import { groupIdOf, rollout } from '../operators/rollout.js';
import { sftPrepare } from '../operators/sftPrepare.js';
import { distillPrepare } from '../operators/distillPrepare.js';
import { syncWeights } from '../operators/syncWeights.js';
import { train } from '../operators/train.js';
import type { ActivityTracker, TrackWork } from '../lib/observe/activity.js';
import { SampleTracking, batcherTracking, trackedTasks } from './parts/tracking.js';

/**
 * What a loop of any transport is told: the data's loader options, the staleness mode, the sizes, sampling, the
 * advantages, group timeouts, the step budget, the admission hook and cancellation.
 */
export interface LoopSettings {
  /** Loader options when `tasks` is not a loader already (epochs, seeded shuffle, resume position). */
  readonly loader?: LoadTasksOptions | undefined;
  /** Staleness mode. Default `sync`. */
  readonly mode?: StalenessMode | undefined;
  /** η of `batch-async`. Default 1. */
  readonly stalenessThreshold?: number | undefined;
  /** `fully-async`: most tasks admitted but untrained. Default 4 batches. */
  readonly capacity?: number | undefined;
  /** Tasks (groups) per train step. */
  readonly batchSize: number;
  /**
   * Tasks rolled out per train step (verl's `gen_batch_size`), at least `batchSize`; larger needs
   * `advantage.filterZeroVariance`: each step then trains the first `batchSize` groups, in admission order, whose
   * rewards differ — DAPO's dynamic sampling. Default `batchSize`.
   */
  readonly generationBatchSize?: number | undefined;
  /** Samples per task (GRPO group size). */
  readonly groupSize: number;
  /** Largest response length in tokens. */
  readonly maxTokens: number;
  /**
   * The trained model's context length: a trajectory longer than it (a reference output, a served rollout) fails its
   * step with a `ContextLengthError` naming its task, before its batch is built. Default: no bound.
   */
  readonly maxSeqLen?: number | undefined;
  /** Sampling temperature. Default 1. */
  readonly temperature?: number | undefined;
  /** Nucleus mass. Default 1. */
  readonly topP?: number | undefined;
  /**
   * Stop tokens end no response: every sample generates exactly `maxTokens` tokens (finish reason `length`), as
   * vLLM's `ignore_eos`. Default false.
   */
  readonly ignoreEos?: boolean | undefined;
  /** Stop after this many train steps, admitting at most `steps · generationBatchSize` tasks (0 or absent: when the loader is exhausted). */
  readonly steps?: number | undefined;
  /** Base seed of the sampling streams. Default 0. */
  readonly seed?: number | undefined;
  /** Advantage settings and the zero-variance filter. */
  readonly advantage?:
    | {
        readonly normalizeByStd?: boolean | undefined;
        readonly std?: StdKind | undefined;
        readonly epsilon?: number | undefined;
        readonly filterZeroVariance?: boolean | undefined;
      }
    | undefined;
  /** Close incomplete groups after this many ms (see `groupTrajectories`). Default: wait for every sample. */
  readonly groupTimeoutMs?: number | undefined;
  /** What a group timeout does: `release` the partial group (default) or `drop` it (counted). */
  readonly onGroupTimeout?: 'release' | 'drop' | undefined;
  /** Optional KL penalty in the reward. */
  readonly klInReward?: KlInRewardOptions | undefined;
  /**
   * Supervised fine-tuning (`trainer.algorithm: sft`, with a trainer that minimizes the cross-entropy): batches are
   * prepared by `sftPrepare` instead of `grpoPrepare` — every row, or with `minReward` only the rows that reached it
   * (imitation of the rollouts that scored). Default: GRPO.
   */
  readonly sft?: { readonly minReward?: number | undefined } | undefined;
  /**
   * On-policy distillation (`trainer.algorithm: distill`): batches are prepared by `distillPrepare` — each response
   * token's advantage is the teacher's log-prob minus the student's, plus `rewardCoef` times the reward. Default: GRPO.
   */
  readonly distill?: { readonly teacher: ReferencePolicy; readonly rewardCoef?: number | undefined } | undefined;
  /** Sees each admitted task with its 0-based admission index. */
  readonly onAdmit?: ((task: Task, index: number) => void) | undefined;
  /**
   * The run's activity tracker: the loop reports to it each loader read (`loader`), each sample (`rollout`), the groups
   * the store and the batcher hold (`store`, `batcher`), each train step (`trainer`) and each weight publication
   * (`sync`) — per policy (`trainer/<modelTag>`, …) when the loop trains several.
   */
  readonly activity?: ActivityTracker | undefined;
  /** Cancels the run: rollouts stop, the loader is closed, the stream completes. */
  readonly signal?: AbortSignal | undefined;
}

/** Configuration of {@link grpoPipeline}. */
export interface GrpoPipelineConfig extends LoopSettings {
  /** Training tasks: an array, an (async) iterable, `{ jsonl }`, or a ready loader (`AsyncIterable<Task>`). */
  readonly tasks: TaskSource | AsyncIterable<Task>;
  /** Rollout engines; the first one samples, and all of them receive every new version. */
  readonly engines: readonly RolloutEngine[];
  /** Takes the train steps. */
  readonly trainer: Trainer;
  /** Scores responses. */
  readonly evaluator: Evaluator;
  /** Version the engines hold at the start (a resumed run's checkpoint version). Default: the first engine's. */
  readonly startVersion?: PolicyVersion | undefined;
  /** Most samples in flight. Default: every sample the mode may admit (`(η+1)·batchSize·groupSize`, or `capacity·groupSize`). */
  readonly concurrency?: number | undefined;
  /** A sample running this long (ms) fails with an `EngineError` (see `rollout`). Default: no limit. */
  readonly sampleTimeoutMs?: number | undefined;
  /** Custom rollout worker (multi-turn agents, remote tools); default single-turn generate + evaluate. */
  readonly worker?: RolloutWorker | undefined;
  /** Sees each sample that failed (engine or evaluator error); the run goes on with its group shrunk. */
  readonly onSampleFailure?: ((failure: SampleFailure) => void) | undefined;
  /** Sees each sample as it ends: a trajectory, a failure (before `onSampleFailure`) or a skipped episode. */
  readonly onSample?: ((output: RolloutOutput) => void) | undefined;
  /** Sees each batch as it enters the trainer. */
  readonly onBatch?: ((batch: Batch) => void) | undefined;
  /**
   * Runs after each step's weights are published to the engines and before the admission gate is credited
   * (checkpoints, validation); metrics it returns are merged into the step's metrics.
   */
  readonly afterStep?: ((step: StepResult) => Promise<Metrics | void>) | undefined;
}

/**
 * The ready-made GRPO loop: loader ─admit─▶ rollout ─▶ groupTrajectories ─▶ batchGroups ─▶ grpoPrepare ─▶
 * train ─▶ syncWeights, with the admission gate fed by each published version.
 *
 * @example
 * ```ts
 * import { grpoPipeline } from 'rxrl/pipelines';
 * grpoPipeline({ tasks, engines: [engine], trainer, evaluator, batchSize: 16, groupSize: 8, maxTokens: 8, steps: 100 })
 *   .subscribe((step) => console.log(step.step, step.metrics['rollout/reward_mean']));
 * ```
 * @param config - tasks, engines, trainer, evaluator, staleness mode and sizes.
 * @returns a cold Observable of step results (one per train step); each subscription runs the loop once.
 */
export function grpoPipeline(config: GrpoPipelineConfig): Observable<StepResult> {
  const [engine] = config.engines;
  if (engine === undefined) throw new ConfigError('grpoPipeline needs at least one rollout engine');
  const { modelTag } = config.trainer;
  return policyLoop(config, {
    lanes: [
      {
        trainer: config.trainer,
        engines: config.engines,
        afterStep: config.afterStep,
        onBatch: config.onBatch,
        ...(config.startVersion === undefined ? {} : { startVersion: config.startVersion }),
      },
    ],
    slots: [{ suffix: '', modelTag }],
    rollout: ({ concurrency }) =>
      rollout(engine, {
        samplesPerTask: config.groupSize,
        concurrency,
        evaluator: config.evaluator,
        maxTokens: config.maxTokens,
        temperature: config.temperature,
        topP: config.topP,
        ignoreEos: config.ignoreEos,
        seed: config.seed,
        modelTag,
        ...(config.worker ? { worker: config.worker } : {}),
        ...(config.sampleTimeoutMs === undefined ? {} : { sampleTimeoutMs: config.sampleTimeoutMs }),
      }),
    namespaceMetrics: false,
  });
}

/** Settings every policy of one loop shares: the data, the staleness mode, the sizes and the hooks. */
export type PolicyLoopConfig = Omit<
  GrpoPipelineConfig,
  'engines' | 'trainer' | 'evaluator' | 'worker' | 'afterStep' | 'onBatch' | 'startVersion'
>;

/** One policy of a loop: its trainer and the engines that sample for it. */
export interface PolicyLane {
  readonly trainer: Trainer;
  readonly engines: readonly RolloutEngine[];
  readonly afterStep?: ((step: PolicyStepResult) => Promise<Metrics | void>) | undefined;
  readonly onBatch?: ((batch: Batch) => void) | undefined;
  /**
   * Version the engines hold at the start: admission counts this policy's batches from there (a resumed run's
   * checkpoint version). Default: the first engine's.
   */
  readonly startVersion?: PolicyVersion | undefined;
}

/**
 * One policy of a loop whose samplers live elsewhere (Kafka workers): its trainer, and where each new version goes
 * in place of engines.
 */
export interface PublishingLane {
  readonly trainer: Trainer;
  /** Publishes the weights of a trained step; resolves once the samplers can load them. */
  readonly publish: (step: StepResult, signal?: AbortSignal) => Promise<void>;
  /** Version the samplers hold at the start: admission counts this policy's batches from there. */
  readonly startVersion: PolicyVersion;
  /** Token id written on padding in this policy's batches. */
  readonly padId: number;
  readonly afterStep?: ((step: PolicyStepResult) => Promise<Metrics | void>) | undefined;
  readonly onBatch?: ((batch: Batch) => void) | undefined;
}

/** What a loop tells its rollout stage about admission. */
export interface LoopAdmission {
  /** Most samples in flight: `concurrency`, or every sample the mode may admit. */
  readonly concurrency: number;
  /**
   * The lowest version, over every policy, that the admission batch of task `index` (0-based) waited for
   * (`startVersion + b − η`); `undefined` in `fully-async`, where admission waits for no version.
   */
  readonly admissionVersion: (index: number) => PolicyVersion | undefined;
}

/** Where the tasks a loop admits are rolled out, and what that stage hears of them afterwards. */
export interface RolloutStage {
  /** The operator from admitted tasks, in admission order, to their rollout outputs. */
  readonly rollout: (admission: LoopAdmission) => OperatorFunction<Task, RolloutOutput>;
  /** Sees each group the group store releases (complete or timed out). */
  readonly released?: (group: Group) => void;
  /**
   * Sees each step, with the ids of every group its batch was made from, once `afterStep` ran and before the gate is
   * credited (a Kafka stage acknowledges their records here).
   */
  readonly trained?: (step: PolicyStepResult, groupIds: readonly string[]) => void;
}

/** A step result of one policy of a multi-policy loop. */
export interface PolicyStepResult extends StepResult {
  /** The policy (trainer's `modelTag`) that took the step. */
  readonly modelTag: ModelTag;
}

/** What {@link policyLoop} runs: its policies, the groups each task feeds, and the rollout stage. */
export interface LoopStage extends RolloutStage {
  readonly lanes: readonly (PolicyLane | PublishingLane)[];
  /** Every group a task feeds, with its policy: group id `groupIdOf(task) + suffix`. */
  readonly slots: readonly { readonly suffix: string; readonly modelTag: ModelTag }[];
  /** Prefix each step's metrics with `<modelTag>/`. */
  readonly namespaceMetrics: boolean;
  /** Extra metrics of a prepared batch (for example per agent), merged into its step's metrics. */
  readonly batchMetrics?: (batch: Batch) => Metrics;
}

/**
 * The loop behind {@link grpoPipeline}, `multiAgentPipeline` and `kafkaTrainer`: one loader and one rollout stage,
 * then per policy (`modelTag`) its own group store, batching, `grpoPrepare`, trainer, weight publication and
 * admission gate, so each policy has its own version, staleness and step count. A task is admitted when every
 * policy still training admits it; with `steps`, at most `steps · generationBatchSize` tasks are admitted.
 *
 * @internal
 */
export function policyLoop(config: PolicyLoopConfig, stage: LoopStage): Observable<PolicyStepResult> {
  const { groupSize } = config;
  const perStep = generationBatchSize(config);
  const tags = stage.lanes.map((lane) => lane.trainer.modelTag);
  if (new Set(tags).size !== tags.length)
    throw new ConfigError(`two trainers share a modelTag: ${tags.join(', ')}`, { context: { key: 'policies' } });
  return new Observable<PolicyStepResult>((subscriber) => {
    const lanes = stage.lanes.map((lane) => loopLane(lane, config, stage.slots, stage.lanes.length > 1));
    const [first] = lanes;
    const gates = lanes.map((lane) => lane.gate);
    const aborted = config.signal ? fromEvent(config.signal, 'abort') : EMPTY;
    // In sync and batch-async modes a train batch of a policy holds exactly its groups of one admission batch (see
    // batchGroups' batchOf): that is what keeps staleness ≤ η.
    const ordered = first.gate.mode !== 'fully-async';
    const admissions = ordered || perStep > config.batchSize ? new Admissions(perStep) : undefined;
    const onAdmit = (task: Task, index: number): void => {
      for (const slot of admissions ? stage.slots : []) admissions?.admit(groupIdOf(task) + slot.suffix, index);
      config.onAdmit?.(task, index);
    };
    const admission: LoopAdmission = {
      concurrency: config.concurrency ?? admittable(first.gate) * groupSize,
      admissionVersion: (index) => lowest(gates.map((gate) => gate.admissionVersion(index))),
    };
    // The step budget bounds admission too: no task is rolled out that no step would train.
    const { activity } = config;
    const tasks = taskStream(config.tasks, config.loader);
    const loader = limit(activity ? trackedTasks(tasks, activity) : tasks, config.steps ? config.steps * perStep : Infinity);
    const samples = activity
      ? new SampleTracking(
          activity,
          stage.slots.map((slot) => slot.suffix),
          groupSize,
        )
      : undefined;
    const groups$ = admit(loader, allGates(gates), { onAdmit }).pipe(
      tap((task) => samples?.admitted(task)),
      stage.rollout(admission),
      tap((output) => samples?.ended(output)),
      tap(sampleListener(config)),
      groupTrajectories({
        keys: ['groupId'],
        groupSize,
        ...(config.groupTimeoutMs === undefined ? {} : { timeoutMs: config.groupTimeoutMs }),
        onTimeout: config.onGroupTimeout,
      }),
      tap((group) => {
        samples?.released(group);
        stage.released?.(group);
      }),
      share(),
    );
    const steps$ = merge(
      ...lanes.map((lane) =>
        laneSteps(lane, groups$.pipe(filter((group) => group.modelTag === lane.modelTag)), {
          config,
          stage,
          admissions,
          ordered,
        }),
      ),
    ).pipe(takeUntil(aborted));
    if (config.signal?.aborted) {
      subscriber.complete();
      return undefined;
    }
    return steps$.subscribe(subscriber);
  });
}

/** A policy of a loop as it runs: its gate, the groups each task feeds it, and where its weights go. */
interface LoopLane {
  readonly trainer: Trainer;
  readonly modelTag: ModelTag;
  readonly gate: AdmissionGate;
  readonly slotsPerTask: number;
  readonly padId: number;
  /** Publishes each trained step's weights (to engines, or through the lane's `publish`). */
  readonly publish: OperatorFunction<StepResult, StepResult>;
  readonly afterStep?: ((step: PolicyStepResult) => Promise<Metrics | void>) | undefined;
  readonly onBatch?: ((batch: Batch) => void) | undefined;
  /** Name of this lane's module `name` for the activity tracker: `name`, or `name/<modelTag>` in a loop of several. */
  readonly moduleName: (name: string) => string;
}

/** A lane of `policyLoop` with its gate; refuses a policy without engines or without trajectories. */
function loopLane(lane: PolicyLane | PublishingLane, config: PolicyLoopConfig, slots: LoopStage['slots'], several: boolean): LoopLane {
  const { trainer, afterStep, onBatch } = lane;
  const { modelTag } = trainer;
  const moduleName = (name: string): string => (several ? `${name}/${modelTag}` : name);
  const track = config.activity?.tracking(moduleName('sync'));
  const sink =
    'engines' in lane
      ? engineSink(lane, track, config.signal)
      : { startVersion: lane.startVersion, padId: lane.padId, publish: publishWith(lane.publish, config.signal, track) };
  const gate = new AdmissionGate({
    mode: config.mode ?? 'sync',
    tasksPerBatch: generationBatchSize(config),
    stalenessThreshold: config.stalenessThreshold,
    capacity: config.capacity,
    startVersion: sink.startVersion,
  });
  const slotsPerTask = slots.filter((slot) => slot.modelTag === modelTag).length;
  if (slotsPerTask === 0)
    throw new ConfigError(`policy '${modelTag}' gets no trajectories: no agent samples from it`, {
      context: { key: 'policies', modelTag },
    });
  return { trainer, modelTag, gate, slotsPerTask, padId: sink.padId, publish: sink.publish, afterStep, onBatch, moduleName };
}

/** Where an in-process lane's weights go: to every engine of it (`syncWeights`). */
function engineSink(
  lane: PolicyLane,
  track: TrackWork | undefined,
  signal: AbortSignal | undefined,
): { startVersion: PolicyVersion; padId: number; publish: OperatorFunction<StepResult, StepResult> } {
  const { modelTag } = lane.trainer;
  const [engine] = lane.engines;
  if (engine === undefined) throw new ConfigError(`policy '${modelTag}' has no rollout engine`, { context: { key: 'policies', modelTag } });
  return {
    startVersion: lane.startVersion ?? engine.version,
    padId: engine.tokenizer.padId,
    publish: syncWeights(lane.engines, { track, signal }),
  };
}

/** Each step once `publish` resolved for it. */
function publishWith(
  publish: PublishingLane['publish'],
  signal: AbortSignal | undefined,
  track: TrackWork | undefined,
): OperatorFunction<StepResult, StepResult> {
  return concatMap(async (step) => {
    const work = (): Promise<void> => publish(step, signal);
    await (track ? track(work) : work());
    return step;
  });
}

/**
 * One policy's steps: its groups batched (one admission batch per train batch when `batchOf` is given), prepared,
 * trained and published; then its `afterStep`, the stage's `trained`, and last the gate's credit.
 */
function laneSteps(
  lane: LoopLane,
  groups$: Observable<Group>,
  loop: {
    readonly config: PolicyLoopConfig;
    readonly stage: LoopStage;
    readonly admissions: Admissions | undefined;
    readonly ordered: boolean;
  },
): Observable<PolicyStepResult> {
  const { config, stage, admissions } = loop;
  const perStep = generationBatchSize(config) * lane.slotsPerTask;
  const trains = config.batchSize * lane.slotsPerTask;
  const batchOf = loop.ordered ? admissions?.batchOf : undefined;
  // Training and publishing take one batch at a time, in order: each step is of the oldest batch sent on.
  const sent: Batch[] = [];
  const batcher = config.activity ? batcherTracking(config.activity, lane.moduleName('batcher')) : undefined;
  return groups$.pipe(
    // Each task feeds this policy slotsPerTask groups, all of one admission batch. Dynamic sampling keeps the first
    // groups in admission order, not in the order their rollouts happened to end.
    (groups) =>
      groups.pipe(
        tap(() => batcher?.received()),
        batchGroups({ batchSize: perStep, ...(batchOf ? { batchOf } : {}) }),
        tap((batch) => batcher?.sent(batch.length)),
        map((batch) => admissions?.settle(batch, perStep > trains) ?? batch),
      ),
    prepareStage(config, lane, perStep > trains ? trains : undefined),
    // The step budget limits the batches that reach the trainer, so no extra step starts on a ready batch.
    config.steps === undefined || config.steps === 0 ? (s: Observable<Batch>) => s : take<Batch>(config.steps),
    map((batch) => (stage.batchMetrics ? { ...batch, metrics: { ...batch.metrics, ...stage.batchMetrics(batch) } } : batch)),
    tap((batch) => {
      lane.onBatch?.(batch);
      sent.push(batch);
    }),
    train(lane.trainer, { signal: config.signal, track: config.activity?.tracking(lane.moduleName('trainer')) }),
    lane.publish,
    concatMap(async (trained) => {
      const batch = sent.shift() as Batch;
      const groups = trained.metrics['batch/groups'] ?? perStep;
      const step: PolicyStepResult = {
        ...trained,
        modelTag: lane.modelTag,
        ...(stage.namespaceMetrics ? { metrics: prefixed(lane.modelTag, trained.metrics) } : {}),
      };
      const extra = lane.afterStep ? await lane.afterStep(step) : undefined;
      const result = extra ? { ...step, metrics: { ...step.metrics, ...extra } } : step;
      stage.trained?.(result, batch.meta.groups ?? []);
      // The gate is credited last: checkpoints and validation in afterStep see nothing admitted beyond this step.
      lane.gate.publish(step.version, groups / lane.slotsPerTask);
      return result;
    }),
    finalize(() => lane.gate.close()),
  );
}

/** How a lane's batches are prepared: by the run's algorithm (SFT, distillation, else GRPO). */
function prepareStage(config: PolicyLoopConfig, lane: LoopLane, maxGroups: number | undefined): OperatorFunction<readonly Group[], Batch> {
  const { padId, modelTag } = lane;
  const { maxSeqLen } = config;
  if (config.sft) return sftPrepare({ padId, minReward: config.sft.minReward, modelTag, maxSeqLen });
  if (config.distill) return distillPrepare({ padId, ...config.distill, modelTag, signal: config.signal, maxSeqLen });
  return grpoPrepare({
    ...prepareOptions(config, padId, modelTag, config.signal),
    maxSeqLen,
    ...(maxGroups === undefined ? {} : { maxGroups }),
  });
}

/** The listener of each rollout output: `onSample`, then `onSampleFailure` for a failure that was not skipped. */
function sampleListener(config: PolicyLoopConfig): (output: RolloutOutput) => void {
  return (output) => {
    config.onSample?.(output);
    if (isSampleFailure(output) && output.skipped !== true) config.onSampleFailure?.(output);
  };
}

/**
 * `grpoPrepare`'s options from a loop's advantage and KL settings.
 *
 * @internal
 */
export function prepareOptions(
  config: Pick<GrpoPipelineConfig, 'advantage' | 'klInReward'>,
  padId: number,
  modelTag: ModelTag,
  signal: AbortSignal | undefined,
): GrpoPrepareOptions {
  return {
    padId,
    normalizeByStd: config.advantage?.normalizeByStd,
    std: config.advantage?.std,
    epsilon: config.advantage?.epsilon,
    filterZeroVariance: config.advantage?.filterZeroVariance,
    klInReward: config.klInReward,
    modelTag,
    signal,
  };
}

/**
 * Metrics under `<tag>/`.
 *
 * @internal
 */
export function prefixed(tag: string, metrics: Metrics): Metrics {
  const out: Metrics = {};
  for (const [key, value] of Object.entries(metrics)) out[`${tag}/${key}`] = value;
  return out;
}

/**
 * Tasks admitted per train step: `generationBatchSize` (at least `batchSize`; more needs the zero-variance filter).
 *
 * @internal
 */
export function generationBatchSize(config: Pick<LoopSettings, 'batchSize' | 'generationBatchSize' | 'advantage'>): number {
  const { batchSize, generationBatchSize: perStep = batchSize } = config;
  const problem = generationBatchProblem(
    { batch: batchSize, generation: perStep, filter: config.advantage?.filterZeroVariance === true },
    { batch: 'batchSize', generation: 'generationBatchSize', filter: 'advantage.filterZeroVariance' },
  );
  if (problem !== undefined) throw new ConfigError(problem, { context: { key: 'generationBatchSize' } });
  return perStep;
}

/**
 * Each admitted group's admission index, from admission until its group is batched: the admission batch it trains
 * in (`batchOf`), and its place in a batch under dynamic sampling.
 */
class Admissions {
  private readonly index = new Map<string, number>();

  constructor(private readonly perBatch: number) {}

  admit(groupId: string, index: number): void {
    this.index.set(groupId, index);
  }

  readonly batchOf = (group: Group): number => Math.floor((this.index.get(group.key[0]) ?? 0) / this.perBatch);

  /** A batch's groups, in admission order when `sort`; their entries go. */
  settle(groups: Group[], sort: boolean): Group[] {
    const rank = (group: Group): number => this.index.get(group.key[0]) ?? 0;
    const out = sort ? [...groups].sort((a, b) => rank(a) - rank(b)) : groups;
    for (const group of groups) this.index.delete(group.key[0]);
    return out;
  }
}

/** Most tasks the gate lets in flight at once. */
function admittable(gate: AdmissionGate): number {
  return gate.mode === 'fully-async' ? gate.capacity : (gate.eta + 1) * gate.tasksPerBatch;
}

/** The lowest of some versions; `undefined` when any is (a gate that awaits no version). */
function lowest(versions: readonly (PolicyVersion | undefined)[]): PolicyVersion | undefined {
  let low: PolicyVersion | undefined;
  for (const version of versions) {
    if (version === undefined) return undefined;
    low = low === undefined ? version : Math.min(low, version);
  }
  return low;
}

/** The first `n` items of an async iterable; closes it (its `finally` runs) after the last one. */
async function* limit<T>(source: AsyncIterable<T>, n: number): AsyncGenerator<T> {
  if (n <= 0) return;
  let count = 0;
  for await (const item of source) {
    yield item;
    if (++count >= n) return;
  }
}
