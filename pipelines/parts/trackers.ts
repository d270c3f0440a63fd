/**
 * The dashboards a recipe asks for (`logging.tensorboard`, `logging.mlflow`), fed with every line the run writes
 * to `metrics.jsonl`.
 *
 * @packageDocumentation
 */
import { basename, join } from 'node:path';

import { redactSecrets } from '../../lib/config/redact.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import type { MetricsEntry } from '../../lib/observe/metricsFile.js';
import { MlflowTracker } from '../../lib/observe/mlflow.js';
import { TENSORBOARD_DIR, TensorBoardWriter } from '../../lib/observe/tensorboard.js';

/** Where a run's metrics lines go besides `metrics.jsonl`. */
export interface MetricsSink {
  write(entry: MetricsEntry): void;
  /** Flushes and releases it; `failed` ends an MLflow run as FAILED. */
  close(failed?: boolean): Promise<void>;
}

/** What {@link openTrackers} is told besides the configuration. */
export interface TrackerOptions {
  /** A resumed run's first version to log (its checkpoint's step + 1). */
  readonly resumeVersion?: number | undefined;
  /** Where a tracker's failures during the run are reported (training goes on). */
  readonly warn?: ((line: string) => void) | undefined;
  /** The run's stop signal: a tracker's call in flight ends with it, and its last flush takes seconds at most. */
  readonly signal?: AbortSignal | undefined;
}

/**
 * The run's trackers: TensorBoard event files under `<run-dir>/tensorboard`, an MLflow run (continued across
 * resumes through `<run-dir>/mlflow.json`). A tracker never stops the run once it is open: a failed write or close
 * (a full disk under TensorBoard's file, an MLflow server gone) is a warning, and a tracker whose write threw gets no
 * more lines (its file may end in a torn record).
 *
 * @param config - the run's configuration.
 * @param runDir - the run directory (TensorBoard needs one; MLflow keeps its run id there).
 * @param options - resume version, warnings, stop signal.
 * @throws ConfigError when the MLflow server cannot be reached at the start; the TensorBoard file's error when it
 * cannot be created (a `ForbiddenPathError` for a path that exists already, a planted link).
 */
export async function openTrackers(
  config: Pick<RxrlConfig, 'logging' | 'run'> & { readonly [key: string]: unknown },
  runDir: string | undefined,
  options: TrackerOptions = {},
): Promise<MetricsSink[]> {
  const warn = options.warn ?? (() => undefined);
  const sinks: MetricsSink[] = [];
  if (config.logging.tensorboard && runDir !== undefined) {
    const board = TensorBoardWriter.open(join(runDir, TENSORBOARD_DIR), { resumeStep: options.resumeVersion });
    sinks.push(guarded('tensorboard', { write: (entry) => board.write(entry), close: async () => board.close() }, warn));
  }
  const { trackingUri, experiment, timeoutSeconds, maxQueued } = config.logging.mlflow;
  if (trackingUri !== null) {
    const tracker = await MlflowTracker.open({
      trackingUri,
      experiment,
      runName: runDir === undefined ? undefined : basename(runDir),
      params: flatParams(redactSecrets(config)),
      stateFile: runDir === undefined ? undefined : join(runDir, 'mlflow.json'),
      timeoutMs: timeoutSeconds * 1000,
      maxQueued,
      signal: options.signal,
      onError: (error) => warn(`mlflow: ${error.message} (the metrics are sent again with the next ones)`),
      onDropped: (dropped, total) =>
        warn(`mlflow: ${dropped} metric values dropped unsent (${total} in all; a full queue drops its oldest)`),
    });
    const sink: MetricsSink = {
      write: (entry) => tracker.write(entry),
      close: (failed) => tracker.close(failed === true ? 'FAILED' : 'FINISHED'),
    };
    sinks.push(guarded('mlflow', sink, warn));
  }
  return sinks;
}

/** `sink`, whose failures are warnings: after a write threw it gets no more lines; a failed close is told too. */
function guarded(name: string, sink: MetricsSink, warn: (line: string) => void): MetricsSink {
  let broken = false;
  const told = (error: unknown, what: string): void => {
    const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
    warn(`${name}: ${text} (${what}; training goes on)`);
  };
  return {
    write: (entry) => {
      if (broken) return;
      try {
        sink.write(entry);
      } catch (error) {
        broken = true;
        told(error, 'no more metrics go to it in this run');
      }
    },
    close: async (failed) => {
      try {
        await sink.close(failed);
      } catch (error) {
        told(error, 'closing it failed');
      }
    },
  };
}

/** The configuration's leaves as `section.key` params (the configuration given redacted). */
function flatParams(config: Readonly<Record<string, unknown>>, prefix = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(config)) {
    const name = `${prefix}${key}`;
    if (value !== null && typeof value === 'object' && !Array.isArray(value))
      Object.assign(out, flatParams(value as Record<string, unknown>, `${name}.`));
    else out[name] = typeof value === 'string' ? value : JSON.stringify(value);
  }
  return out;
}
