/**
 * A run's status over HTTP (`rxrl run … --status-port N`): `GET /status` is the run's {@link RunStatus} as JSON,
 * `GET /metrics` the same in the Prometheus text format (version 0.0.4), for a scraper or a dashboard. `rxrl status
 * URL` reads the first and prints it as tables ({@link formatStatus}).
 *
 * Both answers are bounded in size (`maxBytes`): past it, Kafka workers (those heard from longest ago first), then
 * metrics, then modules are left out and counted in `omitted` (`rxrl_status_omitted` in `/metrics`), never failed.
 * A request whose answer throws gets a 500; the run goes on.
 *
 * @packageDocumentation
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { readBoundedText } from '../core/http.js';
import { AbortError, ConfigError, DecodeError, EngineError } from '../core/errors.js';
import type { Metrics } from '../core/types.js';
import type { ActivitySnapshot, ActivityTracker, ModuleActivity, WorkerActivity } from './activity.js';
import { PrometheusText } from './prometheus.js';
import { printable } from './terminal.js';

/** Default most bytes of a `/status` or `/metrics` answer ({@link ServeStatusOptions.maxBytes}). */
export const DEFAULT_STATUS_MAX_BYTES = 1 << 20;
/** Default deadline of {@link fetchStatus} (ms). */
export const DEFAULT_STATUS_TIMEOUT_MS = 10_000;
/** Default most bytes {@link fetchStatus} reads. */
export const DEFAULT_STATUS_READ_BYTES = 8 << 20;

/** What a run says of itself beside its activity. */
export interface RunInfo {
  /** Train steps taken. */
  readonly step?: number | undefined;
  /** The step budget (0: until the data ends). */
  readonly steps?: number | undefined;
  /** Staleness mode. */
  readonly mode?: string | undefined;
  /** The last step's metrics. */
  readonly metrics?: Readonly<Metrics> | undefined;
}

/** What a bounded status left out, by kind (present only when something was). */
export interface StatusOmitted {
  readonly workers: number;
  readonly metrics: number;
  readonly modules: number;
}

/** The document of `GET /status`. */
export interface RunStatus {
  readonly run: RunInfo;
  readonly activity: ActivitySnapshot;
  /** Entries left out to keep the answer within its bound ({@link boundedStatus}). */
  readonly omitted?: StatusOmitted;
}

/** Options of {@link serveStatus}. */
export interface ServeStatusOptions {
  /** The run's tracker. */
  readonly tracker: ActivityTracker;
  /** The run's step and last metrics, read on each request. */
  readonly info?: (() => RunInfo) | undefined;
  /** Interface to listen on. Default `127.0.0.1` (loopback: the status is for this machine unless asked). */
  readonly host?: string | undefined;
  /** Port (0: any free one). */
  readonly port: number;
  /** Most bytes of one answer (≥ 4096). Default {@link DEFAULT_STATUS_MAX_BYTES}. */
  readonly maxBytes?: number | undefined;
}

/** A listening status server. */
export interface StatusServer {
  /** Its base URL, `http://HOST:PORT`. */
  readonly url: string;
  /** Stops listening. */
  close(): Promise<void>;
}

/**
 * Serves `GET /status` and `GET /metrics` of a run until closed.
 *
 * @param options - tracker, run info, host and port.
 * @returns the server once it listens.
 * @throws ConfigError when the port cannot be listened on (in use, not allowed), or for a `maxBytes` under 4096.
 */
export async function serveStatus(options: ServeStatusOptions): Promise<StatusServer> {
  const host = options.host ?? '127.0.0.1';
  const maxBytes = options.maxBytes ?? DEFAULT_STATUS_MAX_BYTES;
  if (!(Number.isInteger(maxBytes) && maxBytes >= 4096))
    throw new ConfigError(`maxBytes must be an integer >= 4096, got ${maxBytes}`, { context: { key: 'maxBytes', value: maxBytes } });
  const status = (): RunStatus => boundedStatus({ run: options.info?.() ?? {}, activity: options.tracker.snapshot() }, maxBytes);
  const server = createServer((request, response) => {
    try {
      answer(request, response, status, maxBytes);
    } catch (error) {
      // Whatever went wrong in building an answer is this request's, never the run's.
      if (response.headersSent) response.destroy();
      else response.writeHead(500, { 'content-type': 'text/plain' }).end(`status failed: ${errorName(error)}\n`);
    }
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', (error: NodeJS.ErrnoException) =>
      reject(
        new ConfigError(`--status-port: cannot listen on ${host}:${options.port} (${error.code ?? error.message})`, {
          cause: error,
          context: { key: 'status-port', host, port: options.port },
        }),
      ),
    );
    server.listen(options.port, host, () => resolve());
  });
  server.unref();
  const { port } = server.address() as AddressInfo;
  const shown = host.includes(':') ? `[${host}]` : host;
  return {
    url: `http://${shown}:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

/** The answer to one request, built whole before anything is sent (so a failure can still be a 500). */
function answer(request: IncomingMessage, response: ServerResponse, status: () => RunStatus, maxBytes: number): void {
  const path = (request.url ?? '/').split('?')[0];
  if (request.method !== 'GET' && request.method !== 'HEAD') {
    response.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
    return;
  }
  if (path === '/status') {
    const body = `${JSON.stringify(status())}\n`;
    response.writeHead(200, { 'content-type': 'application/json' }).end(body);
    return;
  }
  if (path === '/metrics') {
    const body = prometheusText(status(), maxBytes);
    response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }).end(body);
    return;
  }
  response.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /status or /metrics\n');
}

/** The `name` of anything thrown, printable and short. */
function errorName(error: unknown): string {
  const name = error instanceof Error ? error.name : typeof error;
  return printable(String(name)).slice(0, 100);
}

/**
 * `status` with as many entries as fit in `maxBytes` of JSON (with its newline): every module, metric and worker
 * while they fit; past that, workers heard from longest ago, then metrics, then modules are left out, and
 * `omitted` counts them. The rest (the step, the mode, the stalled module names) is the run's own and kept. Each
 * entry is measured apart, so no oversized text is ever built.
 *
 * @param status - the run's status.
 * @param maxBytes - most bytes of its JSON.
 * @returns `status` itself when it fits, else a trimmed copy.
 */
export function boundedStatus(status: RunStatus, maxBytes: number): RunStatus {
  const { run, activity } = status;
  const metrics = Object.entries(run.metrics ?? {});
  const modules = Object.entries(activity.modules);
  // Kept first: modules (the run's own parts), the last step's metrics, then workers heard from most recently.
  const workers = Object.entries(activity.workers).sort(([, a], [, b]) => b.lastBeatAt - a.lastBeatAt);
  const bare: RunStatus = {
    run: { ...run, ...(run.metrics === undefined ? {} : { metrics: {} }) },
    activity: { ...activity, modules: {}, workers: {} },
    omitted: { workers: workers.length, metrics: metrics.length, modules: modules.length },
  };
  let left = maxBytes - jsonBytes(bare) - 1;
  const fit = <T>(entries: readonly (readonly [string, T])[]): Map<string, T> => {
    const kept = new Map<string, T>();
    for (const [key, value] of entries) {
      const bytes = jsonBytes(key) + jsonBytes(value) + 2; // the colon and the comma
      if (bytes > left) continue;
      left -= bytes;
      kept.set(key, value);
    }
    return kept;
  };
  const keptModules = fit(modules);
  const keptMetrics = fit(metrics);
  const keptWorkers = fit(workers);
  const omitted = {
    workers: workers.length - keptWorkers.size,
    metrics: metrics.length - keptMetrics.size,
    modules: modules.length - keptModules.size,
  };
  if (omitted.workers + omitted.metrics + omitted.modules === 0) return status;
  // Kept entries in the snapshot's order (alphabetical), not in the order they were chosen.
  const inOrder = <T>(all: Readonly<Record<string, T>>, kept: Map<string, T>): Record<string, T> =>
    Object.fromEntries(Object.entries(all).filter(([key]) => kept.has(key)));
  return {
    run: { ...run, ...(run.metrics === undefined ? {} : { metrics: inOrder(run.metrics, keptMetrics) }) },
    activity: { ...activity, modules: inOrder(activity.modules, keptModules), workers: inOrder(activity.workers, keptWorkers) },
    omitted,
  };
}

/** Bytes of `value` as JSON (a value JSON cannot write, `undefined`, counts 0). */
function jsonBytes(value: unknown): number {
  const text = JSON.stringify(value) as string | undefined;
  return text === undefined ? 0 : Buffer.byteLength(text);
}

/**
 * A run's status in the Prometheus text format: what a bounded status left out as `rxrl_status_omitted{what}`, per
 * module `rxrl_module_*{module}` (in flight, held, started, completed, failed, idle seconds, stalled), the step,
 * each metric of the last step as `rxrl_metric{name}`, and per Kafka worker `rxrl_worker_*{worker}` (up, in flight,
 * done, failed, heartbeat age).
 *
 * @param status - the run's status.
 * @param maxBytes - most bytes of the text: past it, samples are left out and a comment counts them. Default: no bound.
 * @returns the exposition text, ending in a newline.
 */
export function prometheusText(status: RunStatus, maxBytes?: number): string {
  const out = new PrometheusText(maxBytes === undefined ? {} : { maxBytes });
  const omitted = Object.entries(status.omitted ?? {});
  out.family(
    'rxrl_status_omitted',
    'gauge',
    'Entries left out of this answer to keep it within its size bound.',
    omitted.map(([what, count]) => [{ what }, count] as const),
  );
  const modules = Object.entries(status.activity.modules);
  for (const [name, type, help, value] of MODULE_FAMILIES) {
    out.family(
      name,
      type,
      help,
      modules.flatMap(([module, m]) => {
        const v = value(m);
        return v === undefined ? [] : [[{ module }, v] as const];
      }),
    );
  }
  const { run } = status;
  out.family('rxrl_step', 'gauge', 'Train steps taken.', run.step === undefined ? [] : [[{}, run.step]]);
  const metrics = Object.entries(run.metrics ?? {}).filter(([, value]) => Number.isFinite(value));
  out.family(
    'rxrl_metric',
    'gauge',
    'A metric of the last step.',
    metrics.map(([name, value]) => [{ name }, value] as const),
  );
  const workers = Object.entries(status.activity.workers);
  for (const [name, type, help, value] of WORKER_FAMILIES) {
    out.family(
      name,
      type,
      help,
      workers.map(([worker, w]) => [{ worker, run: w.run }, value(w)] as const),
    );
  }
  return out.toString();
}

type Family<T> = readonly [name: string, type: 'gauge' | 'counter', help: string, value: (item: T) => number | undefined];

const MODULE_FAMILIES: readonly Family<ModuleActivity>[] = [
  ['rxrl_module_in_flight', 'gauge', 'Units of work the module has in flight.', (m) => m.inFlight],
  ['rxrl_module_held', 'gauge', 'Items the module holds while waiting for input.', (m) => m.held],
  ['rxrl_module_started_total', 'counter', 'Units of work begun.', (m) => m.started],
  ['rxrl_module_completed_total', 'counter', 'Units of work done.', (m) => m.completed],
  ['rxrl_module_failed_total', 'counter', 'Units of work failed.', (m) => m.failed],
  ['rxrl_module_idle_seconds', 'gauge', 'Seconds with work in flight and none of it ending.', (m) => m.idleSeconds],
  ['rxrl_module_stalled', 'gauge', '1 while the module is stalled.', (m) => (m.stalled ? 1 : 0)],
];

const WORKER_FAMILIES: readonly (readonly [string, 'gauge' | 'counter', string, (w: WorkerActivity) => number])[] = [
  ['rxrl_worker_up', 'gauge', '1 while the Kafka worker heartbeats.', (w) => (w.state === 'up' ? 1 : 0)],
  ['rxrl_worker_in_flight', 'gauge', 'Tasks the worker rolls out.', (w) => w.inFlight],
  ['rxrl_worker_done_total', 'counter', 'Tasks the worker finished.', (w) => w.done],
  ['rxrl_worker_failed_total', 'counter', 'Samples that failed on the worker.', (w) => w.failed],
  ['rxrl_worker_heartbeat_age_seconds', 'gauge', 'Seconds since the last heartbeat.', (w) => w.beatAgeSeconds],
];

/** Options of {@link fetchStatus}. */
export interface FetchStatusOptions {
  /** Cancels the request (the run's or the command's stop signal): an {@link AbortError}. */
  readonly signal?: AbortSignal | undefined;
  /** Deadline of the whole request, answer read included (ms, > 0). Default {@link DEFAULT_STATUS_TIMEOUT_MS}. */
  readonly timeoutMs?: number | undefined;
  /** Most bytes of the answer read (> 0). Default {@link DEFAULT_STATUS_READ_BYTES}. */
  readonly maxBytes?: number | undefined;
}

/**
 * Reads a run's status from its server, within a deadline and a size bound.
 *
 * @param url - the server's base URL, or its `/status` URL.
 * @param options - stop signal, deadline and size bound.
 * @returns the status document, checked to have the shape {@link formatStatus} reads.
 * @throws ConfigError for a URL that is not http(s) or a bad option; AbortError when `signal` fires; DecodeError
 *   when it answers more than `maxBytes` (`context.limit`); EngineError when the server cannot be reached, does not
 *   answer within `timeoutMs` (`context.timeoutMs`, retriable) or answers other than a status document.
 */
export async function fetchStatus(url: string, options: FetchStatusOptions = {}): Promise<RunStatus> {
  const target = statusUrl(url);
  const timeoutMs = options.timeoutMs ?? DEFAULT_STATUS_TIMEOUT_MS;
  const maxBytes = options.maxBytes ?? DEFAULT_STATUS_READ_BYTES;
  for (const [key, value] of [
    ['timeoutMs', timeoutMs],
    ['maxBytes', maxBytes],
  ] as const) {
    if (!(Number.isSafeInteger(value) && value > 0))
      throw new ConfigError(`${key} must be a positive integer, got ${value}`, { context: { key, value } });
  }
  const context = { url: target.href };
  const deadline = AbortSignal.timeout(timeoutMs);
  const signal = options.signal ? AbortSignal.any([options.signal, deadline]) : deadline;
  let body: string;
  let response: Response;
  try {
    response = await fetch(target, { signal, redirect: 'error' });
    body = await readBoundedText(response, maxBytes);
  } catch (cause) {
    if (options.signal?.aborted) throw new AbortError(`reading ${target.href} aborted`, { cause, context });
    if (deadline.aborted)
      throw new EngineError(`${target.href} did not answer within ${timeoutMs} ms`, {
        cause,
        retriable: true,
        context: { ...context, timeoutMs },
      });
    if (cause instanceof DecodeError) throw cause; // an answer past maxBytes
    const reason = cause instanceof Error && cause.cause instanceof Error ? cause.cause.message : String(cause);
    throw new EngineError(`cannot reach ${target.href}: ${reason}`, { cause, retriable: true, context });
  }
  if (!response.ok)
    throw new EngineError(`${target.href} answered ${response.status}`, { context: { ...context, status: response.status } });
  try {
    return checkStatus(JSON.parse(body));
  } catch (cause) {
    const why = cause instanceof Error ? `: ${cause.message}` : '';
    throw new EngineError(`${target.href} did not answer a run status${why}`, { cause, context });
  }
}

/** The `/status` URL of `url` (a base URL or the status URL itself). */
function statusUrl(url: string): URL {
  let target: URL;
  try {
    target = new URL(url);
  } catch (cause) {
    throw new ConfigError(`'${url}' is not a URL (want http://HOST:PORT)`, { cause, context: { url } });
  }
  if (target.protocol !== 'http:' && target.protocol !== 'https:')
    throw new ConfigError(`'${url}' is not an http(s) URL`, { context: { url } });
  if (!target.pathname.endsWith('/status')) target.pathname = `${target.pathname.replace(/\/$/, '')}/status`;
  return target;
}

/** A field's expected JSON type; `?` when it may be absent, `|null` when it may be null (a NaN metric). */
type FieldType = 'number' | 'number?' | 'number|null' | 'string' | 'string?' | 'boolean';

const RUN_FIELDS: Readonly<Record<string, FieldType>> = { step: 'number?', steps: 'number?', mode: 'string?' };
const ACTIVITY_FIELDS: Readonly<Record<string, FieldType>> = { at: 'number', inFlight: 'number' };
const MODULE_FIELDS: Readonly<Record<string, FieldType>> = {
  inFlight: 'number',
  completed: 'number',
  failed: 'number',
  held: 'number?',
  oldestStartedAt: 'number?',
  idleSeconds: 'number',
  stalled: 'boolean',
};
const ERROR_FIELDS: Readonly<Record<string, FieldType>> = { name: 'string', message: 'string' };
const WORKER_FIELDS: Readonly<Record<string, FieldType>> = {
  run: 'string',
  inFlight: 'number',
  done: 'number',
  failed: 'number',
  beatAgeSeconds: 'number',
  state: 'string',
};

/**
 * `doc` as a {@link RunStatus}, once every field {@link formatStatus} reads has its type.
 *
 * @throws TypeError naming the first field that has not.
 */
function checkStatus(doc: unknown): RunStatus {
  const status = objectAt(doc, 'document');
  const run = fields(status.run, 'run', RUN_FIELDS);
  if (run.metrics !== undefined) {
    const metrics = objectAt(run.metrics, 'run.metrics');
    for (const name of Object.keys(metrics)) fields({ value: metrics[name] }, `run.metrics`, { value: 'number|null' });
  }
  const activity = fields(status.activity, 'activity', ACTIVITY_FIELDS);
  const modules = objectAt(activity.modules, 'activity.modules');
  for (const [name, module] of Object.entries(modules)) {
    const m = fields(module, `activity.modules[${name}]`, MODULE_FIELDS);
    if (m.lastError !== undefined) fields(m.lastError, `activity.modules[${name}].lastError`, ERROR_FIELDS);
  }
  const workers = objectAt(activity.workers, 'activity.workers');
  for (const [id, worker] of Object.entries(workers)) fields(worker, `activity.workers[${id}]`, WORKER_FIELDS);
  if (!Array.isArray(activity.stalled) || !activity.stalled.every((name) => typeof name === 'string'))
    throw new TypeError('activity.stalled is not a list of names');
  if (status.omitted !== undefined) fields(status.omitted, 'omitted', { workers: 'number', metrics: 'number', modules: 'number' });
  return status as unknown as RunStatus;
}

function objectAt(value: unknown, path: string): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) throw new TypeError(`${path} is not an object`);
  return value as Record<string, unknown>;
}

function fields(value: unknown, path: string, types: Readonly<Record<string, FieldType>>): Record<string, unknown> {
  const object = objectAt(value, path);
  for (const [key, type] of Object.entries(types)) {
    const field = object[key];
    const ok =
      typeof field === type.replace(/[?]|\|null$/g, '') ||
      (type.endsWith('?') && field === undefined) ||
      (type.endsWith('|null') && field === null);
    if (!ok) throw new TypeError(`${path}.${key} is not a ${type}`);
  }
  return object;
}

/**
 * A run's status as text tables: one row per module (in flight, held, done, failed, oldest in flight, idle, state,
 * last error) and one per Kafka worker (run, in flight, done, failed, last heartbeat, state), and what the server
 * left out. Every name, id and message is made {@link printable}: the text holds no escape sequence.
 *
 * @param status - the status document.
 * @returns lines of text, ending in a newline.
 */
export function formatStatus(status: RunStatus): string {
  const { run, activity } = status;
  const out: string[] = [];
  const step = run.step === undefined ? '' : `step ${run.step}${run.steps ? `/${run.steps}` : ''}`;
  // A metric that was NaN is null in JSON.
  const reward: unknown = run.metrics?.['rollout/reward_mean'];
  const head = [step, run.mode, typeof reward === 'number' ? `reward ${reward.toFixed(3)}` : ''].filter(Boolean).join('  ');
  const stalled = activity.stalled.length > 0 ? `stalled: ${activity.stalled.join(', ')}` : 'no stall';
  out.push(printable(head ? `${head}  ${stalled}` : stalled), '');
  const seconds = (s: number): string => (s >= 100 ? `${Math.round(s)}s` : `${s.toFixed(1)}s`);
  const rows = Object.entries(activity.modules).map(([name, m]) => [
    name,
    String(m.inFlight),
    m.held === undefined ? '' : String(m.held),
    String(m.completed),
    String(m.failed),
    m.oldestStartedAt === undefined ? '' : seconds((activity.at - m.oldestStartedAt) / 1000),
    m.inFlight > 0 ? seconds(m.idleSeconds) : '',
    m.stalled ? 'STALLED' : m.inFlight > 0 ? 'busy' : 'idle',
    m.lastError ? `${m.lastError.name}: ${m.lastError.message}`.replace(/\s+/g, ' ').slice(0, 80) : '',
  ]);
  out.push(...table(['module', 'in flight', 'held', 'done', 'failed', 'oldest', 'idle', 'state', 'last error'], rows));
  const workers = Object.entries(activity.workers);
  if (workers.length > 0) {
    out.push('');
    const workerRows = workers.map(([id, w]) => [
      id,
      w.run,
      String(w.inFlight),
      String(w.done),
      String(w.failed),
      `${seconds(w.beatAgeSeconds)} ago`,
      w.state,
    ]);
    out.push(...table(['worker', 'run', 'in flight', 'done', 'failed', 'heartbeat', 'state'], workerRows));
  }
  const { omitted } = status;
  if (omitted !== undefined) {
    const left = (['modules', 'metrics', 'workers'] as const).filter((kind) => omitted[kind] > 0).map((kind) => `${omitted[kind]} ${kind}`);
    out.push('', `(left out by the server to bound its answer: ${left.join(', ')})`);
  }
  return `${out.join('\n')}\n`;
}

/** Aligned columns; every cell made printable and one line first (names and ids are what a peer chose). */
function table(header: readonly string[], cellRows: readonly (readonly string[])[]): string[] {
  const rows = cellRows.map((row) => row.map((cell) => printable(cell).replace(/\s+/g, ' ')));
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, i) => cell.padEnd(widths[i]))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)];
}
