/**
 * A run's status over HTTP (`rxrl run … --status-port N`): `GET /status` is the run's {@link RunStatus} as JSON,
 * `GET /metrics` the same in the Prometheus text format (version 0.0.4), for a scraper or a dashboard. `rxrl status
 * URL` reads the first and prints it as tables ({@link formatStatus}).
 *
 * @packageDocumentation
 */
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { ConfigError, EngineError } from '../core/errors.js';
import type { Metrics } from '../core/types.js';
import type { ActivitySnapshot, ActivityTracker, ModuleActivity, WorkerActivity } from './activity.js';
import { PrometheusText } from './prometheus.js';

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

/** The document of `GET /status`. */
export interface RunStatus {
  readonly run: RunInfo;
  readonly activity: ActivitySnapshot;
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
 * @throws ConfigError when the port cannot be listened on (in use, not allowed).
 */
export async function serveStatus(options: ServeStatusOptions): Promise<StatusServer> {
  const host = options.host ?? '127.0.0.1';
  const status = (): RunStatus => ({ run: options.info?.() ?? {}, activity: options.tracker.snapshot() });
  const server = createServer((request, response) => answer(request, response, status));
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

function answer(request: IncomingMessage, response: ServerResponse, status: () => RunStatus): void {
  const path = (request.url ?? '/').split('?')[0];
  if (request.method !== 'GET' && request.method !== 'HEAD') {
    response.writeHead(405, { allow: 'GET, HEAD', 'content-type': 'text/plain' }).end('method not allowed\n');
    return;
  }
  if (path === '/status') {
    response.writeHead(200, { 'content-type': 'application/json' }).end(`${JSON.stringify(status())}\n`);
    return;
  }
  if (path === '/metrics') {
    response.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' }).end(prometheusText(status()));
    return;
  }
  response.writeHead(404, { 'content-type': 'text/plain' }).end('not found: try /status or /metrics\n');
}

/**
 * A run's status in the Prometheus text format: per module `rxrl_module_*{module}` (in flight, held, started,
 * completed, failed, idle seconds, stalled), per Kafka worker `rxrl_worker_*{worker}` (up, in flight, done, failed,
 * heartbeat age), the step, and each metric of the last step as `rxrl_metric{name}`.
 *
 * @param status - the run's status.
 * @returns the exposition text, ending in a newline.
 */
export function prometheusText(status: RunStatus): string {
  const out = new PrometheusText();
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
  const workers = Object.entries(status.activity.workers);
  for (const [name, type, help, value] of WORKER_FAMILIES) {
    out.family(
      name,
      type,
      help,
      workers.map(([worker, w]) => [{ worker, run: w.run }, value(w)] as const),
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

/**
 * Reads a run's status from its server.
 *
 * @param url - the server's base URL, or its `/status` URL.
 * @param signal - cancels the request.
 * @returns the status document.
 * @throws ConfigError for a URL that is not http(s); EngineError when the server cannot be reached or answers
 *   other than a status document.
 */
export async function fetchStatus(url: string, signal?: AbortSignal): Promise<RunStatus> {
  let target: URL;
  try {
    target = new URL(url);
  } catch (cause) {
    throw new ConfigError(`'${url}' is not a URL (want http://HOST:PORT)`, { cause, context: { url } });
  }
  if (target.protocol !== 'http:' && target.protocol !== 'https:')
    throw new ConfigError(`'${url}' is not an http(s) URL`, { context: { url } });
  if (!target.pathname.endsWith('/status')) target.pathname = `${target.pathname.replace(/\/$/, '')}/status`;
  let response: Response;
  try {
    response = await fetch(target, { ...(signal ? { signal } : {}) });
  } catch (cause) {
    const reason = cause instanceof Error && cause.cause instanceof Error ? cause.cause.message : String(cause);
    throw new EngineError(`cannot reach ${target.href}: ${reason}`, { cause, retriable: true, context: { url: target.href } });
  }
  const body = await response.text();
  if (!response.ok)
    throw new EngineError(`${target.href} answered ${response.status}`, { context: { url: target.href, status: response.status } });
  try {
    const status = JSON.parse(body) as RunStatus;
    if (typeof status.activity?.modules !== 'object') throw new TypeError('no activity.modules');
    return status;
  } catch (cause) {
    throw new EngineError(`${target.href} did not answer a run status`, { cause, context: { url: target.href } });
  }
}

/**
 * A run's status as text tables: one row per module (in flight, held, done, failed, oldest in flight, idle, state,
 * last error) and one per Kafka worker (run, in flight, done, failed, last heartbeat, state).
 *
 * @param status - the status document.
 * @returns lines of text, ending in a newline.
 */
export function formatStatus(status: RunStatus): string {
  const { run, activity } = status;
  const out: string[] = [];
  const step = run.step === undefined ? '' : `step ${run.step}${run.steps ? `/${run.steps}` : ''}`;
  const reward = run.metrics?.['rollout/reward_mean'];
  const head = [step, run.mode, reward === undefined ? '' : `reward ${reward.toFixed(3)}`].filter(Boolean).join('  ');
  const stalled = activity.stalled.length > 0 ? `stalled: ${activity.stalled.join(', ')}` : 'no stall';
  out.push(head ? `${head}  ${stalled}` : stalled, '');
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
  return `${out.join('\n')}\n`;
}

function table(header: readonly string[], rows: readonly (readonly string[])[]): string[] {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((row) => row[i].length)));
  const line = (cells: readonly string[]): string =>
    cells
      .map((cell, i) => cell.padEnd(widths[i]))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)];
}
