/**
 * Observability: structured logs, instrumentation events, in-flight activity, the error policy, the metrics
 * stream of a run, progress display and the HTML report.
 *
 * @packageDocumentation
 */

// ── logs ───────────────────────────────────────────────────────────────────────
export { LOG_LEVELS, createLogger, formatPretty, moduleLogger, silentLogger } from './logger.js';
export type { CreateLoggerOptions, LogDestination, LogLevel, LogStream, Logger } from './logger.js';

// ── instrumentation events ─────────────────────────────────────────────────────
export { Instrumentation } from './events.js';
export type {
  AnyInstrumentationEvent,
  ErrorInfo,
  InstrumentationEvent,
  InstrumentationOptions,
  RxrlEventMap,
  RxrlEventType,
} from './events.js';

// ── activity and errors ────────────────────────────────────────────────────────
export {
  ActivityTracker,
  DEFAULT_ACTIVITY_CAPACITY,
  DEFAULT_WORKER_GONE_MS,
  MAX_ERROR_MESSAGE_LENGTH,
  MAX_TRACKED_WORKERS,
  watchStalls,
} from './activity.js';
export type {
  Activity,
  ActivityError,
  ActivitySnapshot,
  ActivityTrackerOptions,
  ModuleActivity,
  StallWatchOptions,
  WorkerActivity,
  WorkerBeat,
} from './activity.js';
export {
  DEFAULT_STATUS_MAX_BYTES,
  DEFAULT_STATUS_READ_BYTES,
  DEFAULT_STATUS_TIMEOUT_MS,
  boundedStatus,
  fetchStatus,
  formatStatus,
  prometheusText,
  serveStatus,
} from './status.js';
export type { FetchStatusOptions, RunInfo, RunStatus, ServeStatusOptions, StatusOmitted, StatusServer } from './status.js';
export { printable } from './terminal.js';
export { ERROR_POLICIES, ErrorReporter, REPORTER_MESSAGE_CAPACITY, describeError, parseErrorPolicy } from './errorReporter.js';
export type { ErrorAction, ErrorContext, ErrorPolicy, ErrorReporterOptions } from './errorReporter.js';
export { ActivityOverflowError, RunDirError, StalledError } from './errors.js';

// ── metrics stream ─────────────────────────────────────────────────────────────
export { spanSeconds } from './spans.js';
export { METRICS_FILE, METRICS_RESERVED_KEYS, MetricsWriter, metricsPath, parseMetricsLines, readRunMetrics } from './metricsFile.js';
export type { MetricsEntry, MetricsReadResult, MetricsRecord, MetricsWriterOptions, SkippedLine } from './metricsFile.js';

// ── progress ───────────────────────────────────────────────────────────────────
export { Progress, formatStepLine } from './progress.js';
export type { ProgressOptions, ProgressStep, ProgressStream, StepLineTiming } from './progress.js';

// ── report ─────────────────────────────────────────────────────────────────────
export { REPORT_PALETTE, REPORT_PLOTS, escapeHtml, renderReport, reportPlotsFor, writeReport } from './report.js';
export type { ReportInput, ReportPlot, ReportSeries, WriteReportOptions } from './report.js';

// ── dashboards ─────────────────────────────────────────────────────────────────
export { TENSORBOARD_DIR, TensorBoardWriter, crc32c } from './tensorboard.js';
export type { TensorBoardOptions } from './tensorboard.js';
export { MlflowTracker } from './mlflow.js';
export type { MlflowOptions } from './mlflow.js';
