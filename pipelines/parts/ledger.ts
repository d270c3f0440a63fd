/**
 * The run's ledger: what a lossless resume needs (the tasks admitted but not yet trained, the loader position after
 * the last one, the samples generated for groups not yet trained) and what each trained step leaves in the run
 * directory (a `trained.jsonl` line, a `metrics.jsonl` line, a checkpoint every `checkpoint.every` steps).
 *
 * @packageDocumentation
 */
import { appendFile } from 'node:fs/promises';
import { resolve } from 'node:path';

import type { BufferedSample, Checkpoint } from '../../lib/checkpoint/checkpoint.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import { loadTasks, type LoaderPosition, type TaskLoader } from '../../lib/data/loader.js';
import { asStorageError } from '../../lib/core/errors.js';
import type { ActivityTracker } from '../../lib/observe/activity.js';
import { MetricsWriter, metricsPath, type MetricsEntry } from '../../lib/observe/metricsFile.js';
import { openTrackers, type MetricsSink } from './trackers.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Batch, Metrics, Task } from '../../lib/core/types.js';
import type { RolloutWorker } from '../../lib/engine/worker.js';
import { groupIdOf } from '../../operators/rollout.js';
import { dropStepsFrom } from './runDir.js';

/** Writes a checkpoint of the trainer's current step with the given resume state. */
export type SaveCheckpoint = (pendingTasks: readonly Task[], loader: LoaderPosition, buffered: readonly BufferedSample[]) => Promise<void>;

/** What {@link RunLedger.open} is given. */
export interface RunLedgerOptions {
  /** The run directory; without one nothing is written. */
  readonly runDir: string | undefined;
  /** The training tasks (resumed at the checkpoint's position). */
  readonly loader: TaskLoader;
  /** The checkpoint the run resumes from. */
  readonly checkpoint: Checkpoint | undefined;
  /** Steps between checkpoints (`checkpoint.every`; 0: at the end only) and the run's budget (`run.steps`). */
  readonly every: number;
  readonly steps: number;
  /** Writes a checkpoint (called only with a run directory). */
  readonly save: SaveCheckpoint;
  /** Dashboards that get every metrics line too (TensorBoard, MLflow). */
  readonly trackers?: readonly MetricsSink[] | undefined;
}

/** The run's ledger over the recipe's training tasks, from the checkpoint's loader position. */
export async function openLedger(
  config: Pick<RxrlConfig, 'checkpoint' | 'data' | 'run' | 'logging'>,
  run: {
    readonly data: { readonly train: Parameters<typeof loadTasks>[0] };
    readonly checkpoint: Checkpoint | undefined;
    readonly runDir: string | undefined;
    /** Each checkpoint written is a unit of work of its module `checkpoint`. */
    readonly activity?: ActivityTracker | undefined;
    /** Where a tracker's failures during the run are told. */
    readonly warn?: ((line: string) => void) | undefined;
    /** The run's stop signal (a tracker's wait ends with it). */
    readonly signal?: AbortSignal | undefined;
  },
  write: SaveCheckpoint,
): Promise<RunLedger> {
  const { checkpoint, activity } = run;
  const save: SaveCheckpoint = activity ? (...args) => activity.track('checkpoint', () => write(...args)) : write;
  const loader = loadTasks(run.data.train, {
    epochs: config.data.epochs === 0 ? Infinity : config.data.epochs,
    shuffle: config.data.shuffle,
    seed: config.run.seed,
    ...(checkpoint ? { start: checkpoint.state.loader } : {}),
  });
  const resumeVersion = checkpoint === undefined ? undefined : checkpoint.state.step + 1;
  const trackers = await openTrackers(config, run.runDir, { resumeVersion, warn: run.warn, signal: run.signal });
  return RunLedger.open({
    runDir: run.runDir,
    loader,
    checkpoint,
    every: config.checkpoint.every,
    steps: config.run.steps,
    save,
    trackers,
  });
}

/** See the module comment. One per run; {@link RunLedger.close} when the run ends. */
export class RunLedger {
  /** Admitted tasks not yet trained, by group id. */
  private readonly admitted = new Map<string, Task>();
  /** Samples generated for groups not yet trained (kept in checkpoints). */
  private readonly generated = new Map<string, BufferedSample>();
  /** Samples a checkpoint handed back, used instead of generating them again. */
  private readonly restored: Map<string, BufferedSample>;
  private position: LoaderPosition;
  private lastCheckpointStep: number;
  /** The step being written (trained.jsonl, metrics, checkpoint), awaited before the run ends. */
  private training: Promise<unknown> = Promise.resolve();

  private constructor(
    private readonly options: RunLedgerOptions,
    private readonly metrics: MetricsWriter | undefined,
  ) {
    this.restored = new Map((options.checkpoint?.buffered ?? []).map((b) => [b.id, b] as const));
    this.position = options.loader.position;
    this.lastCheckpointStep = options.checkpoint?.state.step ?? -1;
  }

  /**
   * Opens the ledger: lines of steps past the checkpoint (a killed run's, or a fresh start's over an old
   * directory) are superseded by this run and dropped, so each step appears once in each file.
   */
  static async open(options: RunLedgerOptions): Promise<RunLedger> {
    const { runDir, checkpoint } = options;
    if (runDir) {
      const keepBelow = checkpoint?.state.step ?? -Infinity;
      await dropStepsFrom(resolve(runDir, 'trained.jsonl'), keepBelow);
      await dropStepsFrom(metricsPath(runDir), keepBelow);
    }
    return new RunLedger(options, runDir ? MetricsWriter.open(runDir) : undefined);
  }

  /** The tasks to admit: those a checkpoint had admitted but not trained, then the loader's. */
  tasks(): AsyncGenerator<Task> {
    const pendingFirst = this.options.checkpoint?.state.pendingTasks ?? [];
    const loader = this.options.loader;
    return (async function* (): AsyncGenerator<Task> {
      yield* pendingFirst;
      yield* loader;
    })();
  }

  /** Records an admitted task and the loader position after it. */
  admit(task: Task): void {
    this.admitted.set(groupIdOf(task), task);
    this.position = this.options.loader.position;
  }

  /** `worker`, with each sample recorded for checkpoints (and taken from the checkpoint when it has it). */
  recording(worker: RolloutWorker): RolloutWorker {
    return async (input, signal) => {
      const saved = this.restored.get(input.id);
      this.restored.delete(input.id);
      const sample = saved ? saved.sample : await worker(input, signal);
      this.generated.set(input.id, { id: input.id, groupId: input.groupId, sample });
      return sample;
    };
  }

  /**
   * Whether a checkpoint holds the step that made `version`, and so every step before it (the Kafka offsets of their
   * trajectories are committed then). Asked once that step is published, when the trainer may have trained further
   * steps (and written a later checkpoint) meanwhile: it asks about that step, not the trainer's current one.
   */
  checkpointed(version: number): boolean {
    return this.lastCheckpointStep >= version;
  }

  /** A metrics line of its own (validation scores before, between and after training). */
  writeMetrics(step: number, version: number, metrics: Metrics): void {
    this.log({ step, version, metrics });
  }

  /** The trainer as the pipeline sees it: each step is logged and checkpointed before the next can start. */
  checkpointing(trainer: Trainer): Trainer {
    const step = (batch: Batch, signal?: AbortSignal): Promise<StepResult> => {
      const run = this.trainAndRecord(trainer, batch, signal);
      this.training = run.catch(() => undefined);
      return run;
    };
    return {
      modelTag: trainer.modelTag,
      get step() {
        return trainer.step;
      },
      trainStep: step,
    };
  }

  /** Waits for the step being written; then, unless stopped without `onStop`, checkpoints an unsaved last step. */
  async finish(step: number, save: boolean): Promise<void> {
    await this.training;
    if (save && step > this.lastCheckpointStep)
      await this.save([...this.admitted.values()], this.position, [...this.generated.values()], step);
  }

  /** Closes the metrics file and the trackers (an MLflow run ends FAILED when `failed`). */
  async close(failed = false): Promise<void> {
    this.metrics?.close();
    for (const tracker of this.options.trackers ?? []) await tracker.close(failed);
  }

  /** One metrics line, to `metrics.jsonl` and every tracker. */
  private log(entry: MetricsEntry): void {
    this.metrics?.write(entry);
    for (const tracker of this.options.trackers ?? []) tracker.write(entry);
  }

  private async trainAndRecord(trainer: Trainer, batch: Batch, signal: AbortSignal | undefined): Promise<StepResult> {
    const result = await trainer.trainStep(batch, signal);
    // Snapshot synchronously: admissions may continue while files are written.
    const trainedGroups = new Set(batch.meta.groups ?? []);
    for (const group of trainedGroups) this.admitted.delete(group);
    for (const [id, b] of this.generated) if (trainedGroups.has(b.groupId)) this.generated.delete(id);
    const pending = [...this.admitted.values()];
    const buffered = [...this.generated.values()];
    const at = this.position;
    await this.appendTrained(result, batch);
    // The step's metrics line goes out before its checkpoint: a process killed between the two resumes past this
    // step, so a line written after the checkpoint could be lost for good.
    this.log({ step: result.step, version: result.version, metrics: result.metrics });
    // The last step of the budget is saved here too, inside the step, so a Kafka trainer can still commit the
    // offsets of its trajectories before it ends.
    const { every, steps } = this.options;
    if (every > 0 && (result.version % every === 0 || trainer.step === steps)) await this.save(pending, at, buffered, trainer.step);
    return result;
  }

  private async appendTrained(result: StepResult, batch: Batch): Promise<void> {
    if (this.options.runDir) await appendTrained(this.options.runDir, result, batch);
  }

  private async save(pending: readonly Task[], at: LoaderPosition, buffered: readonly BufferedSample[], step: number): Promise<void> {
    if (!this.options.runDir) return;
    await this.options.save(pending, at, buffered);
    this.lastCheckpointStep = step;
  }
}

/**
 * Appends a trained step's line to `<runDir>/trained.jsonl`: its step and version, the groups, task ids and
 * trajectory ids it trained on with their policy versions, and (in a multi-policy run) the policy.
 *
 * @throws {@link StorageError} naming the file when the device is full.
 */
export async function appendTrained(runDir: string, result: StepResult, batch: Batch, policy?: string): Promise<void> {
  const file = resolve(runDir, 'trained.jsonl');
  const line = {
    ...(policy === undefined ? {} : { policy }),
    step: result.step,
    version: result.version,
    groups: batch.meta.groups ?? [],
    taskIds: [...new Set(batch.meta.taskIds)],
    trajectoryIds: batch.meta.trajectoryIds,
    policyVersions: batch.meta.policyVersions,
  };
  await appendFile(file, `${JSON.stringify(line)}\n`).catch((error: unknown) => {
    throw asStorageError(error, file);
  });
}

/** `trainer`, with each trained step's line appended to `<runDir>/trained.jsonl` under the policy's name. */
export function loggingTrainer(trainer: Trainer, runDir: string, policy: string): Trainer {
  return {
    modelTag: trainer.modelTag,
    get step() {
      return trainer.step;
    },
    trainStep: async (batch, signal) => {
      const result = await trainer.trainStep(batch, signal);
      await appendTrained(runDir, result, batch, policy);
      return result;
    },
  };
}
