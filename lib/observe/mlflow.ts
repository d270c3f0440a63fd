/**
 * Metrics to an MLflow tracking server (`logging.mlflow`), over its REST API (`/api/2.0/mlflow/…`): the run's settings
 * as params once, each step's metrics in `runs/log-batch` calls, the run's end as its status. The MLflow run id is kept
 * in `<run-dir>/mlflow.json` with the last version logged, so a resumed run continues the same MLflow run and logs no
 * step twice. Logging never stops training: a failed call is reported (`onError`) and its metrics are tried again with
 * the next ones.
 *
 * @packageDocumentation
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';

import { ConfigError, EngineError } from '../core/errors.js';
import type { MetricsEntry } from './metricsFile.js';

/** Options of {@link MlflowTracker.open}. */
export interface MlflowOptions {
  /** The tracking server, `http://host:5000`. */
  readonly trackingUri: string;
  /** Experiment name (created when missing). */
  readonly experiment: string;
  /** Name of a new MLflow run. */
  readonly runName?: string | undefined;
  /** Settings logged as params of a new run (values as text, at most 6000 characters each). */
  readonly params?: Readonly<Record<string, string>> | undefined;
  /** Where the MLflow run id and the last version logged are kept (`<run-dir>/mlflow.json`); absent: a new run each time. */
  readonly stateFile?: string | undefined;
  /** Sees each failed call after the run started (the metrics are kept for the next try). */
  readonly onError?: ((error: Error) => void) | undefined;
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

const MAX_METRICS_PER_BATCH = 1000;
const MAX_PARAMS_PER_BATCH = 100;

/** One MLflow run fed with a training run's metrics. */
export class MlflowTracker {
  private pending: { key: string; value: number; timestamp: number; step: number }[] = [];
  private pendingVersion = -1;
  private flushing: Promise<void> = Promise.resolve();
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
   * Starts (or, with a state file from an earlier process, continues) the MLflow run.
   *
   * @throws ConfigError when the server cannot be reached or refuses the experiment or the run.
   */
  static async open(options: MlflowOptions): Promise<MlflowTracker> {
    const saved = options.stateFile !== undefined && existsSync(options.stateFile) ? readState(options.stateFile) : undefined;
    const call = (route: string, body?: Record<string, unknown>): Promise<unknown> => mlflowCall(options.trackingUri, route, body);
    const now = options.now ?? Date.now;
    try {
      if (saved) {
        await call('runs/update', { run_id: saved.runId, status: 'RUNNING' });
        return new MlflowTracker(options, saved);
      }
      const experimentId = await experimentIdOf(options.trackingUri, options.experiment);
      const created = (await call('runs/create', {
        experiment_id: experimentId,
        start_time: now(),
        ...(options.runName ? { run_name: options.runName } : {}),
      })) as { run: { info: { run_id: string } } };
      const runId = created.run.info.run_id;
      const params = Object.entries(options.params ?? {}).map(([key, value]) => ({ key, value: value.slice(0, 6000) }));
      for (let i = 0; i < params.length; i += MAX_PARAMS_PER_BATCH)
        await call('runs/log-batch', { run_id: runId, params: params.slice(i, i + MAX_PARAMS_PER_BATCH) });
      const tracker = new MlflowTracker(options, { runId, experimentId, lastVersion: -1 });
      tracker.save();
      return tracker;
    } catch (cause) {
      throw new ConfigError(`logging.mlflow.trackingUri: ${options.trackingUri}: ${(cause as Error).message}`, {
        cause,
        context: { key: 'logging.mlflow.trackingUri', trackingUri: options.trackingUri },
      });
    }
  }

  /**
   * Queues the finite metrics of an entry at its version (steps a resumed run already logged are skipped) and
   * sends them in the background.
   */
  write(entry: MetricsEntry): void {
    if (entry.version <= this.loggedBefore) return;
    const timestamp = Math.round(entry.time ?? this.now());
    for (const [key, value] of Object.entries(entry.metrics)) {
      if (Number.isFinite(value)) this.pending.push({ key, value, timestamp, step: Math.max(0, entry.version) });
    }
    this.pendingVersion = Math.max(this.pendingVersion, entry.version);
    this.flushing = this.flushing.then(() => this.flush());
  }

  /**
   * Sends what is queued and ends the MLflow run with `status`.
   *
   * @param status - `FINISHED`, `FAILED` or `KILLED`.
   */
  async close(status: 'FINISHED' | 'FAILED' | 'KILLED' = 'FINISHED'): Promise<void> {
    await this.flushing;
    await this.flush();
    await mlflowCall(this.options.trackingUri, 'runs/update', { run_id: this.runId, status, end_time: this.now() }).catch(
      (error: unknown) => this.options.onError?.(error as Error),
    );
  }

  private async flush(): Promise<void> {
    if (this.pending.length === 0) return;
    const batch = this.pending;
    const version = this.pendingVersion;
    this.pending = [];
    try {
      for (let i = 0; i < batch.length; i += MAX_METRICS_PER_BATCH)
        await mlflowCall(this.options.trackingUri, 'runs/log-batch', {
          run_id: this.runId,
          metrics: batch.slice(i, i + MAX_METRICS_PER_BATCH),
        });
      this.state = { ...this.state, lastVersion: Math.max(this.state.lastVersion, version) };
      this.save();
    } catch (error) {
      this.pending = [...batch, ...this.pending];
      this.options.onError?.(error as Error);
    }
  }

  private save(): void {
    if (this.options.stateFile !== undefined) writeFileSync(this.options.stateFile, `${JSON.stringify(this.state)}\n`);
  }

  private now(): number {
    return (this.options.now ?? Date.now)();
  }
}

function readState(file: string): MlflowState {
  const state = JSON.parse(readFileSync(file, 'utf8')) as Partial<MlflowState>;
  if (typeof state.runId !== 'string' || typeof state.experimentId !== 'string' || typeof state.lastVersion !== 'number') {
    throw new ConfigError(`${file}: not an MLflow run record (runId, experimentId, lastVersion)`, { context: { file } });
  }
  return state as MlflowState;
}

/** The id of the experiment named `name`, created when missing. */
async function experimentIdOf(trackingUri: string, name: string): Promise<string> {
  try {
    const found = (await mlflowCall(trackingUri, `experiments/get-by-name?experiment_name=${encodeURIComponent(name)}`)) as {
      experiment: { experiment_id: string };
    };
    return found.experiment.experiment_id;
  } catch (error) {
    if (!(error instanceof EngineError && error.context.errorCode === 'RESOURCE_DOES_NOT_EXIST')) throw error;
    return ((await mlflowCall(trackingUri, 'experiments/create', { name })) as { experiment_id: string }).experiment_id;
  }
}

/** One REST call: GET without a body, POST with one; an MLflow error is an EngineError with its `error_code`. */
async function mlflowCall(trackingUri: string, route: string, body?: Record<string, unknown>): Promise<unknown> {
  const url = `${trackingUri.replace(/\/$/, '')}/api/2.0/mlflow/${route}`;
  const response = await fetch(url, {
    method: body === undefined ? 'GET' : 'POST',
    headers: { 'content-type': 'application/json' },
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
    signal: AbortSignal.timeout(30_000),
  });
  const text = await response.text();
  const answer = text === '' ? {} : (JSON.parse(text) as { error_code?: string; message?: string });
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
