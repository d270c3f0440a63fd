/**
 * What every module of a run is doing: work in flight, done and failed per module, the oldest open unit, the last
 * error, and — for Kafka rollout workers — their last heartbeat. A module with work in flight and nothing ended
 * for `stallSeconds` is *stalled*; {@link watchStalls} warns of it and, past a second bound, fails the run with a
 * {@link StalledError} naming the module.
 *
 * A module calls `begin(module)` when it starts a unit of work (a rollout sample, a train step, a checkpoint
 * write) and `done()` or `fail(error)` on the returned handle when it ends; `track` does both around a promise.
 * Only work being done counts as in flight, never waiting for input: a buffer (the trajectory store's open groups,
 * the batcher's groups) reports what it holds with `hold`, which no stall is judged on. `quiescent()` resolves once
 * nothing is in flight. Memory is bounded: counters per module plus the open activities, at most `capacity`;
 * opening one more is an {@link ActivityOverflowError}, which almost always means a forgotten `done()`.
 *
 * @packageDocumentation
 */
import { AbortError, ConfigError } from '../core/errors.js';
import { workerIdProblem } from '../kafka/workerId.js';
import { ActivityOverflowError, StalledError } from './errors.js';

/** Default {@link ActivityTrackerOptions.capacity}. */
export const DEFAULT_ACTIVITY_CAPACITY = 100_000;
/** Default {@link ActivityTrackerOptions.workerGoneMs}. */
export const DEFAULT_WORKER_GONE_MS = 15_000;
/** Most Kafka workers a tracker remembers; beyond it the one heard from longest ago is forgotten. */
export const MAX_TRACKED_WORKERS = 1024;
/** Most characters of a module's last error message kept (an error may carry a remote peer's text). */
export const MAX_ERROR_MESSAGE_LENGTH = 1000;

/** Options of {@link ActivityTracker}. */
export interface ActivityTrackerOptions {
  /** Most activities open at once, over all modules (≥ 1). Default {@link DEFAULT_ACTIVITY_CAPACITY}. */
  readonly capacity?: number;
  /** Clock in ms. Default `Date.now`. */
  readonly now?: () => number;
  /** A module with work in flight and nothing ended for this many seconds is stalled (> 0). Default: never. */
  readonly stallSeconds?: number;
  /** A Kafka worker unheard of for this many ms is gone (> 0). Default {@link DEFAULT_WORKER_GONE_MS}. */
  readonly workerGoneMs?: number;
}

/** One unit of work in flight. */
export interface Activity {
  /** Module that does the work. */
  readonly module: string;
  /** When it began (tracker clock, ms). */
  readonly startedAt: number;
  /** Marks it finished. Idempotent: later calls (of `done` or `fail`) do nothing. */
  done(): void;
  /** Marks it failed with `error`, the module's last error from now on. Idempotent like `done`. */
  fail(error: unknown): void;
}

/** The last error of a module. */
export interface ActivityError {
  /** The error's `name` (`EngineError`, …). */
  readonly name: string;
  readonly message: string;
  /** When it was reported (tracker clock, ms). */
  readonly at: number;
}

/** Runs `work` as one unit of work of some module (see {@link ActivityTracker.tracking}). */
export type TrackWork = <T>(work: () => Promise<T>) => Promise<T>;

/** Counters of one module in a {@link ActivitySnapshot}. */
export interface ModuleActivity {
  /** Activities open now. */
  readonly inFlight: number;
  /** Activities begun since the tracker was created. */
  readonly started: number;
  /** Activities done since the tracker was created. */
  readonly completed: number;
  /** Activities failed since the tracker was created. */
  readonly failed: number;
  /** Items the module holds while waiting for more input (a buffer's size); absent for a module that holds none. */
  readonly held?: number;
  /** Start time of the oldest open activity; absent when none is open. */
  readonly oldestStartedAt?: number;
  /** When an activity of the module last ended (done or failed); absent before the first. */
  readonly lastEndedAt?: number;
  /** Seconds without any of its activities ending while some are in flight (0 when none is). */
  readonly idleSeconds: number;
  /** Work in flight and `idleSeconds` ≥ the tracker's `stallSeconds`. */
  readonly stalled: boolean;
  /** Its most recent failure. */
  readonly lastError?: ActivityError;
}

/** A Kafka rollout worker's heartbeat, as {@link ActivityTracker.heartbeat} takes it. */
export interface WorkerBeat {
  /** The worker's id. */
  readonly worker: string;
  /** The run it follows (empty before it heard of one). */
  readonly run: string;
  /** Tasks it rolls out now. */
  readonly inFlight: number;
  /** Tasks it finished since it started. */
  readonly done: number;
  /** Samples that failed on it since it started. */
  readonly failed: number;
  /** Lowest policy version it holds, when it holds one. */
  readonly version?: number | undefined;
  /** True on its last beat, sent as it stops. */
  readonly leaving?: boolean | undefined;
}

/** A Kafka worker in a {@link ActivitySnapshot}. */
export interface WorkerActivity {
  readonly run: string;
  readonly inFlight: number;
  readonly done: number;
  readonly failed: number;
  readonly version?: number;
  /** When its last heartbeat arrived (tracker clock, ms). */
  readonly lastBeatAt: number;
  /** Seconds since. */
  readonly beatAgeSeconds: number;
  /** `up`; `left` after its last beat said so; `gone` when unheard of for `workerGoneMs` (killed, cut off). */
  readonly state: 'up' | 'left' | 'gone';
}

/** What a run is doing at one moment. */
export interface ActivitySnapshot {
  /** When it was taken (tracker clock, ms). */
  readonly at: number;
  /** Open activities over all modules. */
  readonly inFlight: number;
  /** Counters per module, keys in alphabetical order. */
  readonly modules: Readonly<Record<string, ModuleActivity>>;
  /** Kafka rollout workers heard of, by id in alphabetical order. */
  readonly workers: Readonly<Record<string, WorkerActivity>>;
  /** The stalled modules, longest idle first. */
  readonly stalled: readonly string[];
}

interface ModuleState {
  started: number;
  completed: number;
  failed: number;
  held?: number;
  lastEndedAt?: number;
  lastError?: ActivityError;
  /** Open activities in start order (a `Set` keeps insertion order). */
  readonly open: Set<Activity>;
}

/**
 * Tracks the work of every module of a run, and the heartbeats of its Kafka workers.
 *
 * @example
 * ```ts
 * import { ActivityTracker } from 'rxrl';
 * const activity = new ActivityTracker({ stallSeconds: 300 });
 * const sample = activity.begin('rollout');
 * try { await generate(); sample.done(); } catch (error) { sample.fail(error); }
 * await activity.track('checkpoint', saveCheckpoint());
 * activity.snapshot().stalled;             // [] while every module makes progress
 * await activity.quiescent();              // nothing in flight
 * ```
 */
export class ActivityTracker {
  private readonly capacity: number;
  private readonly now: () => number;
  private readonly stallMs: number;
  private readonly goneMs: number;
  private readonly modules = new Map<string, ModuleState>();
  private readonly workers = new Map<string, WorkerBeat & { lastBeatAt: number }>();
  private waiters: Array<() => void> = [];
  private open = 0;

  /** @param options - capacity, clock, stall bound and worker timeout. */
  constructor(options: ActivityTrackerOptions = {}) {
    this.capacity = options.capacity ?? DEFAULT_ACTIVITY_CAPACITY;
    this.now = options.now ?? Date.now;
    this.stallMs = (options.stallSeconds ?? Infinity) * 1000;
    this.goneMs = options.workerGoneMs ?? DEFAULT_WORKER_GONE_MS;
    if (!Number.isInteger(this.capacity) || this.capacity < 1) {
      throw new ConfigError(`capacity must be a positive integer, got ${this.capacity}`, {
        context: { key: 'capacity', value: this.capacity },
      });
    }
    for (const [key, value] of [
      ['stallSeconds', this.stallMs],
      ['workerGoneMs', this.goneMs],
    ] as const) {
      if (!(value > 0)) throw new ConfigError(`${key} must be > 0, got ${value}`, { context: { key, value } });
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
   * @returns the handle whose `done()` or `fail()` closes it.
   * @throws ActivityOverflowError when `capacity` activities are already open.
   */
  begin(module: string): Activity {
    if (this.open >= this.capacity) {
      throw new ActivityOverflowError(`more than ${this.capacity} activities in flight (a missing done()?)`, {
        context: { module, inFlight: this.open, capacity: this.capacity },
      });
    }
    const owner = this.state(module);
    let finished = false;
    const end = (error?: { value: unknown }): void => {
      if (finished) return;
      finished = true;
      owner.open.delete(activity);
      owner.lastEndedAt = this.now();
      if (error === undefined) owner.completed += 1;
      else {
        owner.failed += 1;
        owner.lastError = errorOf(error.value, owner.lastEndedAt);
      }
      this.open -= 1;
      if (this.open === 0) this.wake();
    };
    const activity: Activity = {
      module,
      startedAt: this.now(),
      done: () => end(),
      fail: (error) => end({ value: error }),
    };
    owner.open.add(activity);
    owner.started += 1;
    this.open += 1;
    return activity;
  }

  /**
   * Runs `work` as one activity of `module`: begun before, done when it resolves, failed when it rejects.
   *
   * @param module - module name.
   * @param work - a promise, or a function returning one (called after the activity began).
   * @returns what `work` resolves to.
   */
  async track<T>(module: string, work: Promise<T> | (() => Promise<T>)): Promise<T> {
    const activity = this.begin(module);
    try {
      const value = await (typeof work === 'function' ? work() : work);
      activity.done();
      return value;
    } catch (error) {
      activity.fail(error);
      throw error;
    }
  }

  /**
   * `track` bound to `module`, for an operator that runs one unit of work at a time (a train step, a weight sync).
   *
   * @param module - module name.
   * @returns a function running its argument as one activity of `module`.
   */
  tracking(module: string): TrackWork {
    return (work) => this.track(module, work);
  }

  /**
   * Says how many items `module` holds while waiting for more input (a buffer's size). Held items are shown, never
   * judged stalled: waiting is not work.
   *
   * @param module - module name.
   * @param count - items held now (≥ 0).
   */
  hold(module: string, count: number): void {
    this.state(module).held = count;
  }

  /**
   * Records a Kafka worker's heartbeat (at the tracker's clock, not the worker's). A beat whose worker id is not a
   * valid one (`workerIdProblem`), or that names a run other than `run`, is ignored. At most
   * {@link MAX_TRACKED_WORKERS} workers are remembered: past that, the one heard from longest ago is forgotten.
   *
   * @param beat - what the worker said.
   * @param run - the run this tracker follows, when it follows one: beats of any other run are ignored (a worker
   *   that follows no run yet, `run: ''`, is kept).
   * @returns whether the beat was recorded.
   */
  heartbeat(beat: WorkerBeat, run?: string): boolean {
    if (workerIdProblem(beat.worker) !== undefined) return false;
    if (run !== undefined && beat.run !== '' && beat.run !== run) return false;
    this.workers.delete(beat.worker);
    this.workers.set(beat.worker, { ...beat, lastBeatAt: this.now() });
    if (this.workers.size > MAX_TRACKED_WORKERS) this.workers.delete(this.workers.keys().next().value as string);
    return true;
  }

  /** Counters per module, the Kafka workers, and the stalled modules, as a plain object. */
  snapshot(): ActivitySnapshot {
    const at = this.now();
    const modules: Record<string, ModuleActivity> = {};
    for (const name of [...this.modules.keys()].sort()) modules[name] = this.moduleActivity(this.modules.get(name)!, at);
    const workers: Record<string, WorkerActivity> = {};
    for (const id of [...this.workers.keys()].sort()) {
      const { worker: _id, leaving, lastBeatAt, version, ...counts } = this.workers.get(id)!;
      const age = at - lastBeatAt;
      workers[id] = {
        ...counts,
        ...(version === undefined ? {} : { version }),
        lastBeatAt,
        beatAgeSeconds: age / 1000,
        state: leaving === true ? 'left' : age >= this.goneMs ? 'gone' : 'up',
      };
    }
    const stalled = Object.keys(modules)
      .filter((name) => modules[name].stalled)
      .sort((a, b) => modules[b].idleSeconds - modules[a].idleSeconds);
    return { at, inFlight: this.open, modules, workers, stalled };
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

  private state(module: string): ModuleState {
    let state = this.modules.get(module);
    if (state === undefined) {
      state = { started: 0, completed: 0, failed: 0, open: new Set() };
      this.modules.set(module, state);
    }
    return state;
  }

  private moduleActivity(state: ModuleState, at: number): ModuleActivity {
    const oldest = state.open.values().next();
    const oldestStartedAt = oldest.done === true ? undefined : oldest.value.startedAt;
    // Idle since the later of the last end and the oldest open start: a module that just got work is not idle.
    const idleMs = oldestStartedAt === undefined ? 0 : at - Math.max(oldestStartedAt, state.lastEndedAt ?? -Infinity);
    return {
      inFlight: state.open.size,
      started: state.started,
      completed: state.completed,
      failed: state.failed,
      ...(state.held === undefined ? {} : { held: state.held }),
      ...(oldestStartedAt === undefined ? {} : { oldestStartedAt }),
      ...(state.lastEndedAt === undefined ? {} : { lastEndedAt: state.lastEndedAt }),
      idleSeconds: idleMs / 1000,
      stalled: oldestStartedAt !== undefined && idleMs >= this.stallMs,
      ...(state.lastError === undefined ? {} : { lastError: state.lastError }),
    };
  }

  private wake(): void {
    const waiters = this.waiters;
    this.waiters = [];
    for (const wake of waiters) wake();
  }
}

/** Options of {@link watchStalls}. */
export interface StallWatchOptions {
  /** Fail after a module was idle with work in flight this many seconds (0 or absent: never; else > the tracker's `stallSeconds`). */
  readonly failSeconds?: number | undefined;
  /** How often the tracker is looked at (ms). Default 1000. */
  readonly intervalMs?: number | undefined;
  /** A module became stalled (once per stall). */
  readonly onStall?: ((module: string, activity: ModuleActivity) => void) | undefined;
  /** A stalled module made progress again. */
  readonly onRecover?: ((module: string) => void) | undefined;
  /**
   * A module was idle `failSeconds`: the error names it — of several stalled modules the one stalled last, since
   * work nests (a train step waits on the checkpoint it writes) — once per watch.
   */
  readonly onFail?: ((error: StalledError) => void) | undefined;
}

/**
 * Looks at `tracker` every `intervalMs` and reports stalls as they begin and end, and the first module idle past
 * `failSeconds` as a {@link StalledError}. The timer does not keep the process alive.
 *
 * @param tracker - the run's tracker (its `stallSeconds` says when a module is stalled).
 * @param options - the fail bound and the callbacks.
 * @returns a function that stops watching.
 */
export function watchStalls(tracker: ActivityTracker, options: StallWatchOptions): () => void {
  const failSeconds = options.failSeconds ?? 0;
  let stalled = new Set<string>();
  let failed = false;
  const look = (): void => {
    const snapshot = tracker.snapshot();
    const now = new Set(snapshot.stalled);
    for (const name of snapshot.stalled) if (!stalled.has(name)) options.onStall?.(name, snapshot.modules[name]);
    for (const name of stalled) if (!now.has(name)) options.onRecover?.(name);
    stalled = now;
    const longest = snapshot.stalled[0];
    if (failed || failSeconds <= 0 || longest === undefined || snapshot.modules[longest].idleSeconds < failSeconds) return;
    // Work nests (a train step writes a checkpoint): of the stalled modules, the one stalled last is where it hangs.
    const culprit = snapshot.stalled[snapshot.stalled.length - 1];
    const activity = snapshot.modules[culprit];
    failed = true;
    options.onFail?.(
      new StalledError(
        `module '${culprit}' stalled: ${activity.inFlight} in flight and nothing ended for ${Math.round(activity.idleSeconds)} s (activity.stallFailSeconds ${failSeconds})`,
        { context: { module: culprit, inFlight: activity.inFlight, idleSeconds: activity.idleSeconds, failSeconds } },
      ),
    );
  };
  const timer = setInterval(look, options.intervalMs ?? 1000);
  timer.unref();
  return () => clearInterval(timer);
}

/** An {@link ActivityError} of anything thrown, its name and message cut to {@link MAX_ERROR_MESSAGE_LENGTH}. */
function errorOf(error: unknown, at: number): ActivityError {
  const [name, message] = error instanceof Error ? [String(error.name), String(error.message)] : ['NonError', String(error)];
  const cut = (text: string): string => (text.length > MAX_ERROR_MESSAGE_LENGTH ? `${text.slice(0, MAX_ERROR_MESSAGE_LENGTH)}…` : text);
  return { name: cut(name), message: cut(message), at };
}
