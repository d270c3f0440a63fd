/**
 * Structured logs: one pino logger per process, a child logger per module (`logger.child({ module })`).
 *
 * Lines are JSON (pino's format) and written synchronously by default, so the last lines before a crash or a
 * `SIGKILL` are on disk. `pretty: true` turns each line into one human-readable line instead
 * (`12:00:01.250 INFO  [trainer] step done step=3`), without pino-pretty.
 *
 * @packageDocumentation
 */
import { pino, type DestinationStream, type Logger } from 'pino';
import { ConfigError } from '../core/errors.js';

export type { Logger } from 'pino';

/** Log levels, most to least severe; `silent` logs nothing. */
export const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;

/** One of {@link LOG_LEVELS}. */
export type LogLevel = (typeof LOG_LEVELS)[number];

/** Anything lines can be written to: a stream, a test double. */
export interface LogStream {
  /** Receives one complete log line (ending in `\n`) per call. */
  write(line: string): unknown;
}

/** Where {@link createLogger} writes: a standard stream, a file (appended, parent directories created), or a stream. */
export type LogDestination = 'stderr' | 'stdout' | { readonly file: string } | LogStream;

/** Options of {@link createLogger}. */
export interface CreateLoggerOptions {
  /** Lowest level written. Default `info`. */
  readonly level?: LogLevel;
  /** One human-readable line per record instead of JSON. Default `false`. */
  readonly pretty?: boolean;
  /** Where lines go. Default `stderr`. */
  readonly destination?: LogDestination;
  /**
   * Write each line before returning (standard streams and files). Default `true`: slower than buffering, but a
   * killed process loses no line.
   */
  readonly sync?: boolean;
  /** Fields on every line (for example `{ runId }`). Default: pino's `pid` and `hostname`. */
  readonly base?: Readonly<Record<string, unknown>>;
}

/**
 * Creates the process logger.
 *
 * @example
 * ```ts
 * import { createLogger, moduleLogger } from 'rxrl';
 * const logger = createLogger({ level: 'debug', destination: { file: 'runs/a/rxrl.log' } });
 * moduleLogger(logger, 'trainer').info({ step: 3 }, 'step done');
 * ```
 * @param options - level, format and destination.
 * @returns a pino logger.
 */
export function createLogger(options: CreateLoggerOptions = {}): Logger {
  const level = options.level ?? 'info';
  const sync = options.sync ?? true;
  if (!(LOG_LEVELS as readonly string[]).includes(level)) {
    throw new ConfigError(`unknown log level '${String(level)}'; valid: ${LOG_LEVELS.join(', ')}`, {
      context: { key: 'level', value: level },
    });
  }
  const target = openDestination(options.destination ?? 'stderr', sync);
  const stream: DestinationStream = options.pretty === true ? prettyStream(target) : target;
  return pino({ level, ...(options.base === undefined ? {} : { base: { ...options.base } }) }, stream);
}

/**
 * The child logger of one module: every line carries `module`.
 *
 * @param parent - the process logger.
 * @param module - module name (`trainer`, `rollout`, `checkpoint`, …).
 * @param bindings - further fields on every line of the child.
 */
export function moduleLogger(parent: Logger, module: string, bindings: Readonly<Record<string, unknown>> = {}): Logger {
  return parent.child({ ...bindings, module });
}

/** A logger that writes nothing, for tests and library callers that pass none. */
export const silentLogger: Logger = pino({ level: 'silent' });

function openDestination(destination: LogDestination, sync: boolean): DestinationStream {
  if (destination === 'stderr') return pino.destination({ dest: 2, sync });
  if (destination === 'stdout') return pino.destination({ dest: 1, sync });
  if ('file' in destination) return pino.destination({ dest: destination.file, sync, mkdir: true, append: true });
  return { write: (line: string) => void destination.write(line) };
}

const LEVEL_LABELS: Readonly<Record<number, string>> = {
  10: 'TRACE',
  20: 'DEBUG',
  30: 'INFO',
  40: 'WARN',
  50: 'ERROR',
  60: 'FATAL',
};

/** Fields the pretty format shows in its fixed columns, or drops. */
const PRETTY_OMITTED = new Set(['level', 'time', 'msg', 'module', 'pid', 'hostname', 'err']);

/**
 * Wraps a destination so each JSON line becomes `HH:MM:SS.mmm LEVEL [module] message key=value …` (UTC time);
 * an `err` field adds `err=Name: message` and its stack on the following lines. A line that is not JSON passes
 * through unchanged.
 */
function prettyStream(target: DestinationStream): DestinationStream {
  return {
    write(line: string): void {
      target.write(formatPretty(line));
    },
  };
}

/**
 * Formats one pino JSON line for people (see {@link createLogger}'s `pretty`).
 *
 * @param line - one JSON log line.
 * @returns the human-readable line, ending in `\n`.
 */
export function formatPretty(line: string): string {
  let record: Record<string, unknown>;
  try {
    const parsed: unknown = JSON.parse(line);
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return line;
    record = parsed as Record<string, unknown>;
  } catch {
    return line;
  }
  const time = typeof record.time === 'number' ? new Date(record.time).toISOString().slice(11, 23) : '--:--:--.---';
  const level = (typeof record.level === 'number' ? LEVEL_LABELS[record.level] : undefined) ?? String(record.level);
  const module = typeof record.module === 'string' ? ` [${record.module}]` : '';
  const message = typeof record.msg === 'string' ? ` ${record.msg}` : '';
  const fields = Object.keys(record)
    .filter((key) => !PRETTY_OMITTED.has(key))
    .map((key) => ` ${key}=${inline(record[key])}`)
    .join('');
  let text = `${time} ${level.padEnd(5)}${module}${message}${fields}`;
  const err = record.err;
  if (typeof err === 'object' && err !== null) {
    const { type, message: errMessage, stack } = err as { type?: unknown; message?: unknown; stack?: unknown };
    text += ` err=${String(type ?? 'Error')}: ${String(errMessage ?? '')}`;
    const frames = typeof stack === 'string' ? stack.split('\n').slice(1).join('\n') : '';
    if (frames !== '') text += `\n${frames}`;
  }
  return `${text}\n`;
}

function inline(value: unknown): string {
  return typeof value === 'string' && /^[^\s"=]+$/.test(value) ? value : JSON.stringify(value);
}
