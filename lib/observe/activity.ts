/**
 * In-flight work per module: who is busy right now, and a promise that resolves when nobody is.
 *
 * A module calls `begin(module)` when it starts a unit of work (a rollout, a train step, a checkpoint write)
 * and `done()` on the returned handle when it ends, however it ends; `track` does both around a promise.
 * `quiescent()` resolves once nothing is in flight, for a graceful stop or a checkpoint that must not race
 * running work. Memory is bounded: counters per module plus the open activities, at most `capacity`; opening
 * one more is an {@link ActivityOverflowError}, which almost always means a forgotten `done()`.
 *
 * @packageDocumentation
 */
import { AbortError, ConfigError } from '../core/errors.js';
import { ActivityOverflowError } from './errors.js';

/** Default {@link ActivityTrackerOptions.capacity}. */
export const DEFAULT_ACTIVITY_CAPACITY = 100_000;

/** Options of {@link ActivityTracker}. */
export interface ActivityTrackerOptions {
  /** Most activities open at once, over all modules (≥ 1). Default {@link DEFAULT_ACTIVITY_CAPACITY}. */
  readonly capacity?: number;
  /** Clock for `startedAt`, in ms. Default `Date.now`. */
  readonly now?: () => number;
}

/** One unit of work in flight. */
export interface Activity {
  /** Module that does the work. */
  readonly module: string;
  /** When it began (tracker clock, ms). */
  readonly startedAt: number;
  /** Marks it finished. Idempotent: later calls do nothing. */
  done(): void;
}

/** Counters of one module in a {@link ActivitySnapshot}. */
export interface ModuleActivity {
  /** Activities open now. */
  readonly inFlight: number;
  /** Activities begun since the tracker was created. */
  readonly started: number;
  /** Activities done since the tracker was created. */
  readonly completed: number;
  /** Start time of the oldest open activity; absent when none is open. */
  readonly oldestStartedAt?: number;
}

/** What is in flight at one moment. */
export interface ActivitySnapshot {
  /** Open activities over all modules. */
  readonly inFlight: number;
  /** Counters per module, keys in alphabetical order. */
  readonly modules: Readonly<Record<string, ModuleActivity>>;
}

interface ModuleState {
  started: number;
  completed: number;
  /** Open activities in start order (a `Set` keeps insertion order). */
  readonly open: Set<Activity>;
}

/**
 * Tracks in-flight work per module.
 *
 * @example
 * ```ts
 * import { ActivityTracker } from 'rxrl';
 * const activity = new ActivityTracker();
 * const rollout = activity.begin('rollout');
 * try { await generate(); } finally { rollout.done(); }
 * await activity.track('checkpoint', saveCheckpoint());
 * await activity.quiescent();              // nothing in flight
 * ```
 */
export class ActivityTracker {
  private readonly capacity: number;
  private readonly now: () => number;
  private readonly modules = new Map<string, ModuleState>();
  private waiters: Array<() => void> = [];
  private open = 0;

  /** @param options - capacity and clock. */
  constructor(options: ActivityTrackerOptions = {}) {
    this.capacity = options.capacity ?? DEFAULT_ACTIVITY_CAPACITY;
    this.now = options.now ?? Date.now;
    if (!Number.isInteger(this.capacity) || this.capacity < 1) {
      throw new ConfigError(`capacity must be a positive integer, got ${this.capacity}`, {
        context: { key: 'capacity', value: this.capacity },
      });
    }
  }

  /** Activities open now, over all modules. */
  get inFlight(): number {
    return this.open;
  }

  /**
   * Opens an activity of `module`.
   *
   * @param module - module name.
   * @returns the handle whose `done()` closes it.
   * @throws ActivityOverflowError when `capacity` activities are already open.
   */
  begin(module: string): Activity {
    if (this.open >= this.capacity) {
      throw new ActivityOverflowError(`more than ${this.capacity} activities in flight (a missing done()?)`, {
        context: { module, inFlight: this.open, capacity: this.capacity },
      });
    }
    let state = this.modules.get(module);
    if (state === undefined) {
      state = { started: 0, completed: 0, open: new Set() };
      this.modules.set(module, state);
    }
    const owner = state;
    let finished = false;
    const activity: Activity = {
      module,
      startedAt: this.now(),
      done: () => {
        if (finished) return;
        finished = true;
        owner.open.delete(activity);
        owner.completed += 1;
        this.open -= 1;
        if (this.open === 0) this.wake();
      },
    };
    owner.open.add(activity);
    owner.started += 1;
    this.open += 1;
    return activity;
  }

  /**
   * Runs `work` as one activity of `module`: begun before, done when it settles (either way).
   *
   * @param module - module name.
   * @param work - a promise, or a function returning one (called after the activity began).
   * @returns what `work` resolves to.
   */
  async track<T>(module: string, work: Promise<T> | (() => Promise<T>)): Promise<T> {
    const activity = this.begin(module);
    try {
      return await (typeof work === 'function' ? work() : work);
    } finally {
      activity.done();
    }
  }

  /** Counters per module and the total in flight, as a plain object. */
  snapshot(): ActivitySnapshot {
    const modules: Record<string, ModuleActivity> = {};
    for (const name of [...this.modules.keys()].sort()) {
      const state = this.modules.get(name)!;
      const oldest = state.open.values().next();
      modules[name] = {
        inFlight: state.open.size,
        started: state.started,
        completed: state.completed,
        ...(oldest.done === true ? {} : { oldestStartedAt: oldest.value.startedAt }),
      };
    }
    return { inFlight: this.open, modules };
  }

  /**
   * Resolves when nothing is in flight: at once if that is already so, else when the last open activity is done.
   *
   * @param signal - stops waiting; the promise then rejects with an `AbortError`.
   */
  quiescent(signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(new AbortError('quiescent() aborted', { cause: signal.reason }));
    if (this.open === 0) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const onAbort = (): void => {
        this.waiters = this.waiters.filter((waiter) => waiter !== wake);
        reject(new AbortError('quiescent() aborted', { cause: signal?.reason, context: { inFlight: this.open } }));
      };
      const wake = (): void => {
        signal?.removeEventListener('abort', onAbort);
        resolve();
      };
      signal?.addEventListener('abort', onAbort, { once: true });
      this.waiters.push(wake);
    });
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}
