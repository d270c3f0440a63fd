/**
 * The dashboards a recipe asks for (`logging.tensorboard`, `logging.mlflow`), fed with every line the run writes
 * to `metrics.jsonl`.
 *
 * @packageDocumentation
 */
import { basename, join } from 'node:path';

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

/**
 * The run's trackers: TensorBoard event files under `<run-dir>/tensorboard`, an MLflow run (continued across
 * resumes through `<run-dir>/mlflow.json`). A resumed run passes the first version it logs again.
 *
 * @param config - the run's configuration.
 * @param runDir - the run directory (TensorBoard needs one; MLflow keeps its run id there).
 * @param resumeVersion - a resumed run's first version to log (its checkpoint's step + 1).
 * @param warn - where a tracker's failures during the run are reported (training goes on).
 * @throws ConfigError when the MLflow server cannot be reached at the start.
 */
export async function openTrackers(
  config: Pick<RxrlConfig, 'logging' | 'run'> & { readonly [key: string]: unknown },
  runDir: string | undefined,
  resumeVersion: number | undefined,
  warn: (line: string) => void = () => undefined,
): Promise<MetricsSink[]> {
  const sinks: MetricsSink[] = [];
  if (config.logging.tensorboard && runDir !== undefined) {
    const board = TensorBoardWriter.open(join(runDir, TENSORBOARD_DIR), { resumeStep: resumeVersion });
    sinks.push({ write: (entry) => board.write(entry), close: async () => board.close() });
  }
  const { trackingUri, experiment } = config.logging.mlflow;
  if (trackingUri !== null) {
    const tracker = await MlflowTracker.open({
      trackingUri,
      experiment,
      runName: runDir === undefined ? undefined : basename(runDir),
      params: flatParams(config),
      stateFile: runDir === undefined ? undefined : join(runDir, 'mlflow.json'),
      onError: (error) => warn(`mlflow: ${error.message} (the metrics are sent again with the next ones)`),
    });
    sinks.push({ write: (entry) => tracker.write(entry), close: (failed) => tracker.close(failed === true ? 'FAILED' : 'FINISHED') });
  }
  return sinks;
}

/** The configuration's leaves as `section.key` params, secrets left out. */
function flatParams(config: Readonly<Record<string, unknown>>, prefix = ''): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [key, value] of Object.entries(config)) {
    const name = `${prefix}${key}`;
    if (/apiKey$/i.test(key)) continue;
    if (value !== null && typeof value === 'object' && !Array.isArray(value))
      Object.assign(out, flatParams(value as Record<string, unknown>, `${name}.`));
    else out[name] = typeof value === 'string' ? value : JSON.stringify(value);
  }
  return out;
}
