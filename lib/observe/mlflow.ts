/**
 * Metrics to an MLflow tracking server (`logging.mlflow`), over its REST API (`/api/2.0/mlflow/…`): the run's settings
 * as params once, each step's metrics in `runs/log-batch` calls, the run's end as its status. The MLflow run id is kept
 * in `<run-dir>/mlflow.json` with the last version logged, so a resumed run continues the same MLflow run and logs no
 * step twice. Logging never stops training: a failed call is reported (`onError`) and its metrics are tried again with
 * the next ones, after a back-off. Every wait is bounded: one deadline per flush (all its calls together), the run's
 * stop signal, a queue of at most `maxQueued` values (the oldest dropped, counted), answers read up to 1 MiB, and
 * redirects followed only on the tracking server's own origin. Secrets never leave as params.
 *
 * @packageDocumentation
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';

import { redactSecrets } from '../config/redact.js';
import { AbortError, ConfigError, DecodeError, EngineError } from '../core/errors.js';
import { readBoundedText } from '../core/http.js';
import type { MetricsEntry } from './metricsFile.js';

/** Options of {@link MlflowTracker.open}. */
export interface MlflowOptions {
  /** The tracking server, `http://host:5000`. */
  readonly trackingUri: string;
  /** Experiment name (created when missing). */
  readonly experiment: string;
  /** Name of a new MLflow run. */
  readonly runName?: string | undefined;
  /**
   * Settings logged as params of a new run (values as text, at most 6000 characters each). Secrets never leave:
   * each is redacted by the rule of `lib/config/redact.ts` (every `env` map, every key that names a secret).
   */
  readonly params?: Readonly<Record<string, string>> | undefined;
  /** Where the MLflow run id and the last version logged are kept (`<run-dir>/mlflow.json`); absent: a new run each time. */
  readonly stateFile?: string | undefined;
  /** Sees each failed call after the run started (the metrics are kept for the next try). */
  readonly onError?: ((error: Error) => void) | undefined;
  /** Told each time metric values are dropped unsent (the queue full: its oldest; the run's end: the rest): how many now, in all. */
  readonly onDropped?: ((dropped: number, total: number) => void) | undefined;
  /**
   * Deadline in ms of the start (every call that opens the run), of one flush (every `log-batch` call that sends
   * what is queued) and of the end (the last flush and the run's status together). Default 30 000.
   */
  readonly timeoutMs?: number | undefined;
  /** Most metric values kept for sending; past it the oldest are dropped. Default 20 000. */
  readonly maxQueued?: number | undefined;
  /** The run's stop signal: cancels a call in flight; after it, the end has {@link STOP_GRACE_MS} in all. */
  readonly signal?: AbortSignal | undefined;
  /** Clock in ms. Default `Date.now`. */
  readonly now?: () => number;
}

/** What `mlflow.json` holds. */
interface MlflowState {
  readonly runId: string;
  readonly experimentId: string;
  /** Highest policy version whose metrics reached the server. */
  readonly lastVersion: number;
}

/** One metric value waiting to be sent, with the policy version of its line. */
interface QueuedMetric {
  readonly metric: { key: string; value: number; timestamp: number; step: number };
  readonly version: number;
}

const MAX_METRICS_PER_BATCH = 1000;
const MAX_PARAMS_PER_BATCH = 100;
const DEFAULT_TIMEOUT_MS = 30_000;
const DEFAULT_MAX_QUEUED = 20_000;
/** How long the end of a stopped run may take (its last flush and status), in ms. */
export const STOP_GRACE_MS = 2_000;
/** The most bytes of an answer read: MLflow's answers to these calls are a few hundred bytes. */
const MAX_ANSWER_BYTES = 1 << 20;
/** Same-origin redirects followed in one call. */
const MAX_REDIRECTS = 3;
/** Waits before sending again after a failed flush, in ms: doubled per failure up to the last. */
const BACKOFF_MS = { first: 1_000, max: 60_000 } as const;

/** One MLflow run fed with a training run's metrics. */
export class MlflowTracker {
  /** Metrics not sent yet, oldest first (at most `maxQueued`). */
  private queue: QueuedMetric[] = [];
  private dropped = 0;
  /** The flush in flight (one at a time). */
  private flushing: Promise<void> | undefined;
  /** No flush starts before this time (ms of `now`) after a failed one. */
  private retryAt = 0;
  private backoffMs = 0;
  /** Versions an earlier process of the run logged: a resumed run does not log them again. */
  private readonly loggedBefore: number;

  private constructor(
    private readonly options: MlflowOptions,
    private state: MlflowState,
  ) {
    this.loggedBefore = state.lastVersion;
  }

  /** The MLflow run id. */
  get runId(): string {
    return this.state.runId;
  }

  /**
   * Starts (or, with a state file from an earlier process, continues) the MLflow run, within `timeoutMs` in all.
   *
   * @throws ConfigError when the server cannot be reached or refuses the experiment or the run.
   */
  static async open(options: MlflowOptions): Promise<MlflowTracker> {
    const saved = options.stateFile !== undefined && existsSync(options.stateFile) ? readState(options.stateFile) : undefined;
    const deadline = withStop(AbortSignal.timeout(options.timeoutMs ?? DEFAULT_TIMEOUT_MS), options.signal);
    const call = (route: string, body?: Record<string, unknown>): Promise<unknown> =>
      mlflowCall(options.trackingUri, route, deadline, body);
    const now = options.now ?? Date.now;
    try {
      if (saved) {
        await call('runs/update', { run_id: saved.runId, status: 'RUNNING' });
        return new MlflowTracker(options, saved);
      }
      const experimentId = await experimentIdOf(call, options.experiment);
      const created = (await call('runs/create', {
        experiment_id: experimentId,
        start_time: now(),
        ...(options.runName ? { run_name: options.runName } : {}),
      })) as { run: { info: { run_id: string } } };
      const runId = created.run.info.run_id;
      const params = Object.entries(redactSecrets(options.params ?? {})).map(([key, value]) => ({ key, value: value.slice(0, 6000) }));
      for (let i = 0; i < params.length; i += MAX_PARAMS_PER_BATCH)
        await call('runs/log-batch', { run_id: runId, params: params.slice(i, i + MAX_PARAMS_PER_BATCH) });
      const tracker = new MlflowTracker(options, { runId, experimentId, lastVersion: -1 });
      tracker.save();
      return tracker;
    } catch (cause) {
      if (options.signal?.aborted) throw new AbortError('logging.mlflow: stopped while starting the MLflow run', { cause });
      throw new ConfigError(`logging.mlflow.trackingUri: ${options.trackingUri}: ${(cause as Error).message}`, {
        cause,
        context: { key: 'logging.mlflow.trackingUri', trackingUri: options.trackingUri },
      });
    }
  }

  /**
   * Queues the finite metrics of an entry at its version (steps a resumed run already logged are skipped; past
   * `maxQueued` the oldest are dropped) and sends them in the background, unless a flush is in flight or the last
   * one failed a moment ago (they go with the next).
   */
  write(entry: MetricsEntry): void {
    if (entry.version <= this.loggedBefore) return;
    const timestamp = Math.round(entry.time ?? this.now());
    for (const [key, value] of Object.entries(entry.metrics)) {
      if (Number.isFinite(value))
        this.queue.push({ metric: { key, value, timestamp, step: Math.max(0, entry.version) }, version: entry.version });
    }
    this.bound();
    if (this.flushing === undefined && this.now() >= this.retryAt && !this.options.signal?.aborted) this.startFlush(this.flushDeadline());
  }

  /**
   * Waits for the flush in flight, then sends what is queued and ends the MLflow run with `status`, within `timeoutMs`
   * in all ({@link STOP_GRACE_MS} once the run's stop signal has fired). Never throws: failures go to `onError`.
   *
   * @param status - `FINISHED`, `FAILED` or `KILLED`.
   */
  async close(status: 'FINISHED' | 'FAILED' | 'KILLED' = 'FINISHED'): Promise<void> {
    // The flush in flight ends by its own deadline (or the stop); the end has its own from then on.
    await this.flushing;
    const stopped = this.options.signal?.aborted === true;
    const timeoutMs = this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    const deadline = stopped ? AbortSignal.timeout(Math.min(STOP_GRACE_MS, timeoutMs)) : this.flushDeadline();
    this.startFlush(deadline);
    await this.flushing;
    const end = { run_id: this.runId, status, end_time: this.now() };
    await mlflowCall(this.options.trackingUri, 'runs/update', deadline, end).catch((error: unknown) =>
      this.options.onError?.(error as Error),
    );
    // What the server never took is dropped with the run's end, and counted.
    if (this.queue.length > 0) {
      this.dropped += this.queue.length;
      this.options.onDropped?.(this.queue.length, this.dropped);
      this.queue = [];
    }
  }

  /** The deadline of one flush: `timeoutMs`, or the run's stop. */
  private flushDeadline(): AbortSignal {
    return withStop(AbortSignal.timeout(this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS), this.options.signal);
  }

  private startFlush(deadline: AbortSignal): void {
    // A flush never rejects: what fails past the calls (writing mlflow.json) is told like a failed call.
    this.flushing = this.flush(deadline)
      .catch((error: unknown) => this.options.onError?.(error as Error))
      .finally(() => (this.flushing = undefined));
  }

  /** Sends the queue in batches until it is empty, all within `deadline`; a failed batch goes back to the queue's head. */
  private async flush(deadline: AbortSignal): Promise<void> {
    while (this.queue.length > 0) {
      const batch = this.queue.splice(0, MAX_METRICS_PER_BATCH);
      try {
        await mlflowCall(this.options.trackingUri, 'runs/log-batch', deadline, { run_id: this.runId, metrics: batch.map((m) => m.metric) });
      } catch (error) {
        this.queue.unshift(...batch);
        this.bound();
        this.backoffMs = Math.min(BACKOFF_MS.max, this.backoffMs === 0 ? BACKOFF_MS.first : this.backoffMs * 2);
        this.retryAt = this.now() + this.backoffMs;
        this.options.onError?.(error as Error);
        return;
      }
      this.backoffMs = 0;
      this.retryAt = 0;
      // Every version below the oldest one still queued has reached the server.
      const sent = Math.max(...batch.map((m) => m.version));
      const below = this.queue.length === 0 ? sent : Math.min(sent, Math.min(...this.queue.map((m) => m.version)) - 1);
      if (below > this.state.lastVersion) {
        this.state = { ...this.state, lastVersion: below };
        this.save();
      }
    }
  }

  /** Drops the oldest queued metrics past `maxQueued`, and says so. */
  private bound(): void {
    const excess = this.queue.length - (this.options.maxQueued ?? DEFAULT_MAX_QUEUED);
    if (excess <= 0) return;
    this.queue.splice(0, excess);
    this.dropped += excess;
    this.options.onDropped?.(excess, this.dropped);
  }

  private save(): void {
    if (this.options.stateFile !== undefined) writeFileSync(this.options.stateFile, `${JSON.stringify(this.state)}\n`);
  }

  private now(): number {
    return (this.options.now ?? Date.now)();
  }
}

/** `deadline`, or also the run's stop when there is one. */
function withStop(deadline: AbortSignal, stop: AbortSignal | undefined): AbortSignal {
  return stop === undefined ? deadline : AbortSignal.any([deadline, stop]);
}

function readState(file: string): MlflowState {
  const state = JSON.parse(readFileSync(file, 'utf8')) as Partial<MlflowState>;
  if (typeof state.runId !== 'string' || typeof state.experimentId !== 'string' || typeof state.lastVersion !== 'number') {
    throw new ConfigError(`${file}: not an MLflow run record (runId, experimentId, lastVersion)`, { context: { file } });
  }
  return state as MlflowState;
}

/** The id of the experiment named `name`, created when missing. */
async function experimentIdOf(call: (route: string, body?: Record<string, unknown>) => Promise<unknown>, name: string): Promise<string> {
  try {
    const found = (await call(`experiments/get-by-name?experiment_name=${encodeURIComponent(name)}`)) as {
      experiment: { experiment_id: string };
    };
    return found.experiment.experiment_id;
  } catch (error) {
    if (!(error instanceof EngineError && error.context.errorCode === 'RESOURCE_DOES_NOT_EXIST')) throw error;
    return ((await call('experiments/create', { name })) as { experiment_id: string }).experiment_id;
  }
}

/**
 * One REST call: GET without a body, POST with one, until `signal` fires; an MLflow error is an EngineError with its
 * `error_code`. Redirects are followed only to the tracking server's own origin (the body goes nowhere else), the
 * answer is read up to {@link MAX_ANSWER_BYTES}.
 */
async function mlflowCall(trackingUri: string, route: string, signal: AbortSignal, body?: Record<string, unknown>): Promise<unknown> {
  let url = new URL(`${trackingUri.replace(/\/$/, '')}/api/2.0/mlflow/${route}`);
  const origin = url.origin;
  const method = body === undefined ? 'GET' : 'POST';
  const init: RequestInit = {
    method,
    headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    redirect: 'manual',
    signal,
  };
  let response = await fetch(url, init);
  for (let hops = 0; response.status >= 300 && response.status < 400; hops++) {
    await response.body?.cancel().catch(() => undefined);
    const location = response.headers.get('location');
    const target = location === null ? undefined : new URL(location, url);
    // A 301/302/303 turns a POST into a GET without its body: only 307/308 keep both.
    const keepsRequest = method === 'GET' || response.status === 307 || response.status === 308;
    if (target === undefined || target.origin !== origin || !keepsRequest || hops >= MAX_REDIRECTS) {
      throw new EngineError(
        `${route.split('?')[0]}: redirect ${response.status} to ${target?.origin ?? 'nowhere'} refused (only to ${origin})`,
        {
          retriable: false,
          context: { route, status: response.status, location: target?.origin },
        },
      );
    }
    url = target;
    response = await fetch(url, init);
  }
  const text = await readBoundedText(response, MAX_ANSWER_BYTES, `mlflow ${route.split('?')[0]}`);
  let answer: { error_code?: string; message?: string } = {};
  try {
    answer = text === '' ? {} : (JSON.parse(text) as typeof answer);
  } catch (cause) {
    if (response.ok) throw new DecodeError(`mlflow ${route.split('?')[0]}: the answer is not JSON`, { cause, context: { route } });
  }
  if (!response.ok) {
    throw new EngineError(
      `${route.split('?')[0]}: ${response.status} ${answer.error_code ?? ''} ${answer.message ?? text.slice(0, 200)}`.trim(),
      {
        retriable: response.status >= 500,
        context: { route, status: response.status, errorCode: answer.error_code },
      },
    );
  }
  return answer;
}
