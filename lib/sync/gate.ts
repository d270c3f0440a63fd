/**
 * The admission gate: decides when the loader may be pulled, which is how staleness is bounded
 * (admission control, not discard-and-retry).
 *
 * @packageDocumentation
 */
import { AbortError, ConfigError } from '../core/errors.js';
import type { PolicyVersion } from '../core/types.js';

/** How far rollouts may run ahead of training. */
export type StalenessMode = 'sync' | 'batch-async' | 'fully-async';

/** Options of {@link AdmissionGate}. */
export interface AdmissionGateOptions {
  /** Staleness mode. */
  readonly mode: StalenessMode;
  /** Tasks (groups) per batch: tasks are admitted in whole batches. */
  readonly tasksPerBatch: number;
  /** η for `batch-async` (≥ 1). Ignored by the other modes. Default 1. */
  readonly stalenessThreshold?: number | undefined;
  /** `fully-async` only: most tasks admitted but not yet trained (in flight + buffered). Default 4 batches. */
  readonly capacity?: number | undefined;
  /**
   * The version the engines hold when admission starts (a resumed run's checkpoint version): batch 0 of this
   * gate is trained from it, so batch `b` may start once `startVersion + b − η` is published. Default 0.
   */
  readonly startVersion?: PolicyVersion;
}

interface Waiter {
  readonly ready: () => boolean;
  readonly resolve: () => void;
}

/**
 * Batch `b` (0-based) may start only when the published version is at least `startVersion + b − η`: η = 0 in `sync`,
 * η = `stalenessThreshold` in `batch-async`. In `fully-async` a task may start while fewer than `capacity`
 * admitted tasks are untrained.
 */
export class AdmissionGate {
  readonly mode: StalenessMode;
  readonly tasksPerBatch: number;
  /** η: how many versions a batch may start ahead of the weights (Infinity in fully-async). */
  readonly eta: number;
  readonly capacity: number;
  readonly startVersion: PolicyVersion;
  private published: PolicyVersion;
  private trainedTasks = 0;
  private closed = false;
  private waiters: Waiter[] = [];

  constructor(options: AdmissionGateOptions) {
    this.mode = options.mode;
    this.tasksPerBatch = options.tasksPerBatch;
    if (!Number.isInteger(this.tasksPerBatch) || this.tasksPerBatch < 1) {
      throw new ConfigError(`tasksPerBatch must be an integer >= 1, got ${this.tasksPerBatch}`);
    }
    switch (options.mode) {
      case 'sync':
        this.eta = 0;
        break;
      case 'batch-async': {
        const eta = options.stalenessThreshold ?? 1;
        if (!Number.isInteger(eta) || eta < 1) {
          throw new ConfigError(`stalenessThreshold must be an integer >= 1 in batch-async mode, got ${eta}`);
        }
        this.eta = eta;
        break;
      }
      case 'fully-async':
        this.eta = Infinity;
        break;
      default:
        throw new ConfigError(`unknown staleness mode '${String(options.mode)}'; valid: sync, batch-async, fully-async`);
    }
    this.startVersion = options.startVersion ?? 0;
    if (!(Number.isInteger(this.startVersion) && this.startVersion >= 0)) {
      throw new ConfigError(`startVersion must be an integer >= 0, got ${this.startVersion}`, { context: { key: 'startVersion' } });
    }
    this.published = this.startVersion;
    this.capacity = options.capacity ?? 4 * this.tasksPerBatch;
    if (!(Number.isInteger(this.capacity) && this.capacity >= this.tasksPerBatch)) {
      throw new ConfigError(
        `capacity must be an integer >= tasksPerBatch (${this.tasksPerBatch}), or no batch could ever fill; got ${this.capacity}`,
        { context: { key: 'capacity' } },
      );
    }
  }

  /** The latest published policy version. */
  get version(): PolicyVersion {
    return this.published;
  }

  /** Records that engines hold `version` and that `trainedTasks` more tasks have been trained. */
  publish(version: PolicyVersion, trainedTasks = this.tasksPerBatch): void {
    if (version > this.published) this.published = version;
    this.trainedTasks += trainedTasks;
    this.wake();
  }

  /**
   * The policy behind this gate stopped training (its step budget is spent): from now on the gate admits
   * everything, so admission shared with other policies no longer waits on it.
   */
  close(): void {
    this.closed = true;
    this.wake();
  }

  /** True when the task with 0-based admission index `index` may start now. */
  mayAdmit(index: number): boolean {
    if (this.closed) return true;
    if (this.mode === 'fully-async') return index - this.trainedTasks < this.capacity;
    return this.published >= (this.admissionVersion(index) as PolicyVersion);
  }

  /**
   * The version the admission batch of task `index` (0-based) waits for: `startVersion + b − η` for batch `b`, at
   * least 0, so a rollout of that task may use any version from it on. `undefined` in `fully-async`, where
   * admission waits for no version.
   */
  admissionVersion(index: number): PolicyVersion | undefined {
    if (this.mode === 'fully-async') return undefined;
    return Math.max(0, this.startVersion + Math.floor(index / this.tasksPerBatch) - this.eta);
  }

  /** Resolves once task `index` may start; rejects with {@link AbortError} if `signal` fires first. */
  waitToAdmit(index: number, signal?: AbortSignal): Promise<void> {
    if (this.mayAdmit(index)) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        this.waiters = this.waiters.filter((w) => w !== waiter);
        reject(new AbortError('admission wait aborted', { cause: signal?.reason }));
      };
      const waiter: Waiter = {
        ready: () => this.mayAdmit(index),
        resolve: () => {
          signal?.removeEventListener('abort', onAbort);
          resolve();
        },
      };
      if (signal?.aborted) return onAbort();
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(waiter);
    });
  }

  private wake(): void {
    const still: Waiter[] = [];
    for (const waiter of this.waiters) {
      if (waiter.ready()) waiter.resolve();
      else still.push(waiter);
    }
    this.waiters = still;
  }
}

/** The names a caller gives the sizes of {@link generationBatchProblem} (config keys, or option names). */
export interface GenerationBatchKeys {
  readonly batch: string;
  readonly generation: string;
  readonly filter: string;
}

/**
 * Why a generation batch (tasks admitted per step) does not go with its train batch, or `undefined` when it does: it
 * must be an integer ≥ the train batch, and larger only with the zero-variance filter (DAPO's dynamic sampling, which
 * trains the groups whose rewards differ). The message starts with `keys.generation`.
 */
export function generationBatchProblem(
  sizes: { readonly batch: number; readonly generation: number; readonly filter: boolean },
  keys: GenerationBatchKeys,
): string | undefined {
  if (!(Number.isInteger(sizes.generation) && sizes.generation >= sizes.batch))
    return `${keys.generation}: must be an integer >= ${keys.batch} (${sizes.batch}), got ${sizes.generation}`;
  if (sizes.generation > sizes.batch && !sizes.filter)
    return `${keys.generation}: larger than ${keys.batch} needs ${keys.filter} (dynamic sampling trains the groups whose rewards differ)`;
  return undefined;
}

/**
 * One admission over several gates, one per policy: a task may start once every gate admits it (a closed gate, of a
 * policy done training, admits everything). Gates only ever open further, so awaiting them in turn is enough.
 *
 * @param gates - the policies' gates.
 * @returns what `admit` needs.
 */
export function allGates(gates: readonly AdmissionGate[]): Pick<AdmissionGate, 'waitToAdmit'> {
  return {
    waitToAdmit: async (index, signal) => {
      for (const gate of gates) await gate.waitToAdmit(index, signal);
    },
  };
}
