/**
 * The run's error policy in one place: every module reports the errors it cannot handle to one
 * {@link ErrorReporter}, which logs them, counts them by name and, under `stop_on_error`, aborts the signal the
 * pipeline runs with. Under `continue` it only records. Cancellations (`AbortError`) are counted and logged at
 * `debug` but never stop anything by themselves: they are what a stop looks like from inside.
 *
 * @packageDocumentation
 */
import { ConfigError, RxrlError, isAbortError } from '../core/errors.js';
import type { ErrorInfo, Instrumentation } from './events.js';
import type { Logger } from './logger.js';
import { silentLogger } from './logger.js';

/** What the run does when a module reports an error. */
export const ERROR_POLICIES = ['stop_on_error', 'continue'] as const;

/** One of {@link ERROR_POLICIES}. */
export type ErrorPolicy = (typeof ERROR_POLICIES)[number];

/**
 * Distinct error messages whose stack the reporter remembers having logged; past this, the oldest is forgotten
 * (and its next report logs the stack again).
 */
export const REPORTER_MESSAGE_CAPACITY = 1024;

/** What {@link ErrorReporter.report} decided. */
export type ErrorAction = 'stop' | 'continue' | 'ignore';

/**
 * Where an error happened: the module and any ids that help (task, step, path). A field the reporter's logger
 * already binds (its `module`, say) is not repeated on the line: with the same value it is dropped; with another
 * it goes under `reported` (`reported.module`), so every log line has each key once.
 */
export interface ErrorContext {
  /** Module that reports. */
  readonly module?: string;
  /** Further fields for the log line. */
  readonly [key: string]: unknown;
}

/** Options of {@link ErrorReporter}. */
export interface ErrorReporterOptions {
  /** The policy. Default `stop_on_error`. */
  readonly policy?: ErrorPolicy;
  /** Where reports are logged. Default {@link silentLogger}. */
  readonly logger?: Logger;
  /** Emits an `error.reported` event per report when given. */
  readonly instrumentation?: Instrumentation;
  /** A signal that stops the run too (for example `SIGINT`); the reporter's `signal` follows it. */
  readonly parentSignal?: AbortSignal;
}

/**
 * Checks a policy name from configuration.
 *
 * @param value - the configured value.
 * @returns the policy.
 * @throws ConfigError naming the valid policies.
 */
export function parseErrorPolicy(value: unknown): ErrorPolicy {
  if (typeof value === 'string' && (ERROR_POLICIES as readonly string[]).includes(value)) return value as ErrorPolicy;
  throw new ConfigError(`unknown error policy '${String(value)}'; valid: ${ERROR_POLICIES.join(', ')}`, {
    context: { key: 'errorPolicy', value },
  });
}

/**
 * A plain description of any thrown value.
 *
 * @param error - what was thrown.
 */
export function describeError(error: unknown): ErrorInfo {
  if (error instanceof RxrlError) {
    return { name: error.name, message: error.message, retriable: error.retriable, context: error.context };
  }
  if (error instanceof Error) return { name: error.name, message: error.message, retriable: false };
  if (typeof error === 'object' && error !== null && typeof (error as { name?: unknown }).name === 'string') {
    const { name, message } = error as { name: string; message?: unknown };
    return { name, message: typeof message === 'string' ? message : '', retriable: false };
  }
  return { name: 'NonError', message: String(error), retriable: false };
}

/**
 * Applies the error policy of a run.
 *
 * Each report is one log line. The first report of a message (`name: message`) carries the error's stack in
 * `err`; later reports of the same message carry `err` without the stack, and `occurrence` counts them (1 on
 * the first), so a batch of samples failing alike logs one stack, not one per sample.
 *
 * @example
 * ```ts
 * import { ErrorReporter, EngineError } from 'rxrl';
 * const errors = new ErrorReporter({ policy: 'stop_on_error', logger });
 * grpoPipeline({ ...config, signal: errors.signal });
 * errors.report(new EngineError('server closed the connection'), { module: 'rollout', taskId: 't7' });
 * errors.signal.aborted;   // true: the pipeline stops
 * errors.counts();         // { EngineError: 1 }
 * ```
 */
export class ErrorReporter {
  /** The policy in force. */
  readonly policy: ErrorPolicy;
  private readonly controller = new AbortController();
  private readonly logger: Logger;
  private readonly instrumentation: Instrumentation | undefined;
  private readonly byName = new Map<string, number>();
  /** Reports per distinct `name: message`, oldest first, at most {@link REPORTER_MESSAGE_CAPACITY}. */
  private readonly byMessage = new Map<string, number>();
  private reported = 0;
  private stopError: unknown = undefined;

  /** @param options - policy, logger, events and parent signal. */
  constructor(options: ErrorReporterOptions = {}) {
    this.policy = parseErrorPolicy(options.policy ?? 'stop_on_error');
    this.logger = options.logger ?? silentLogger;
    this.instrumentation = options.instrumentation;
    const parent = options.parentSignal;
    if (parent !== undefined) {
      if (parent.aborted) this.controller.abort(parent.reason);
      else parent.addEventListener('abort', () => this.controller.abort(parent.reason), { once: true });
    }
  }

  /** Aborted when the run must stop: an error under `stop_on_error`, {@link ErrorReporter.stop}, or the parent. */
  get signal(): AbortSignal {
    return this.controller.signal;
  }

  /** True once {@link ErrorReporter.signal} has been aborted. */
  get stopped(): boolean {
    return this.controller.signal.aborted;
  }

  /** The error that stopped the run, if an error did. */
  get stopCause(): unknown {
    return this.stopError;
  }

  /** Errors reported so far, cancellations included. */
  get total(): number {
    return this.reported;
  }

  /**
   * Records an error, logs it with its context and applies the policy.
   *
   * @param error - what was thrown.
   * @param context - where it happened.
   * @returns `stop` when this report aborted the signal, `ignore` for a cancellation or a report after the
   *   stop, `continue` otherwise.
   */
  report(error: unknown, context: ErrorContext = {}): ErrorAction {
    const info = describeError(error);
    this.reported += 1;
    this.byName.set(info.name, (this.byName.get(info.name) ?? 0) + 1);
    const action: ErrorAction = isAbortError(error) || this.stopped ? 'ignore' : this.policy === 'stop_on_error' ? 'stop' : 'continue';
    const occurrence = this.countMessage(`${info.name}: ${info.message}`);
    const err = occurrence === 1 || !(error instanceof Error) ? error : withoutStack(info);
    const fields = { ...this.unbound(context), err, errorName: info.name, occurrence, action, policy: this.policy };
    if (action === 'ignore') this.logger.debug(fields, `${info.name} reported after stop or as cancellation`);
    else this.logger.error(fields, `${info.name}: ${info.message}`);
    this.instrumentation?.emit('error.reported', { error: info, action, context: { ...context } });
    if (action === 'stop') {
      this.stopError = error;
      this.controller.abort(error);
    }
    return action;
  }

  /**
   * Aborts the signal without an error (a graceful stop).
   *
   * @param reason - the abort reason. Default: an `AbortError`-named `DOMException`.
   */
  stop(reason?: unknown): void {
    if (!this.stopped) this.controller.abort(reason);
  }

  /** Counts one more report of `key` and returns how many there have been (1 for the first). */
  private countMessage(key: string): number {
    const occurrence = (this.byMessage.get(key) ?? 0) + 1;
    this.byMessage.delete(key); // re-inserted last: the map forgets the message reported longest ago
    this.byMessage.set(key, occurrence);
    if (this.byMessage.size > REPORTER_MESSAGE_CAPACITY) this.byMessage.delete(this.byMessage.keys().next().value!);
    return occurrence;
  }

  /** The context without the fields the logger binds already (a differing value moves under `reported`). */
  private unbound(context: ErrorContext): Record<string, unknown> {
    const bound: Record<string, unknown> = typeof this.logger.bindings === 'function' ? this.logger.bindings() : {};
    const fields: Record<string, unknown> = {};
    const reported: Record<string, unknown> = {};
    for (const [key, value] of Object.entries(context)) {
      if (!Object.hasOwn(bound, key)) fields[key] = value;
      else if (bound[key] !== value) reported[key] = value;
    }
    if (Object.keys(reported).length > 0) fields.reported = reported;
    return fields;
  }

  /** Reports per error name, names in alphabetical order. */
  counts(): Readonly<Record<string, number>> {
    const counts: Record<string, number> = {};
    for (const name of [...this.byName.keys()].sort()) counts[name] = this.byName.get(name)!;
    return counts;
  }
}

/**
 * What the log line of a repeated error holds instead of the error: its name, message, `retriable` and context,
 * without a stack or causes. A null-prototype object, so pino's `err` serializer takes `type` from `name` (not
 * from `Object`) and finds no stack.
 */
function withoutStack(info: ErrorInfo): Record<string, unknown> {
  return Object.assign(Object.create(null) as Record<string, unknown>, {
    name: info.name,
    message: info.message,
    retriable: info.retriable,
    ...(info.context === undefined ? {} : { context: info.context }),
  });
}
