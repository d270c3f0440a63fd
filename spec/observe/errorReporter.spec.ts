import { describe, expect, it } from 'vitest';
import { AbortError, ConfigError, EngineError, EvaluationError } from '../../lib/errors.js';
import {
  createLogger,
  describeError,
  ErrorReporter,
  Instrumentation,
  parseErrorPolicy,
  type ErrorPolicy,
} from '../../lib/observe/index.js';

function captured(): { lines: Array<Record<string, unknown>>; logger: ReturnType<typeof createLogger> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = createLogger({ level: 'debug', destination: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) } });
  return { lines, logger };
}

describe('ErrorReporter', () => {
  it('stop_on_error: logs, counts and aborts its signal with the error as reason', () => {
    const { lines, logger } = captured();
    const reporter = new ErrorReporter({ policy: 'stop_on_error', logger });
    let abortedWith: unknown;
    reporter.signal.addEventListener('abort', () => (abortedWith = reporter.signal.reason));
    const error = new EngineError('server closed the connection', { retriable: true, context: { url: 'http://x' } });
    expect(reporter.report(error, { module: 'rollout', taskId: 't7' })).toBe('stop');
    expect(reporter.stopped).toBe(true);
    expect(abortedWith).toBe(error);
    expect(reporter.stopCause).toBe(error);
    expect(reporter.counts()).toEqual({ EngineError: 1 });
    expect(lines[0]).toMatchObject({
      level: 50,
      module: 'rollout',
      taskId: 't7',
      errorName: 'EngineError',
      action: 'stop',
      policy: 'stop_on_error',
      err: { type: 'EngineError', retriable: true, context: { url: 'http://x' } },
    });
  });

  it('stop_on_error: later reports and cancellations are counted but ignored', () => {
    const reporter = new ErrorReporter({ policy: 'stop_on_error' });
    expect(reporter.report(new AbortError('cancelled'))).toBe('ignore');
    expect(reporter.stopped).toBe(false);
    expect(reporter.report(new EvaluationError('reward is NaN'))).toBe('stop');
    expect(reporter.report(new EngineError('after the stop'))).toBe('ignore');
    expect(reporter.counts()).toEqual({ AbortError: 1, EngineError: 1, EvaluationError: 1 });
    expect(reporter.total).toBe(3);
    expect(reporter.stopCause).toBeInstanceOf(EvaluationError);
  });

  it('continue: only records, whatever the error', () => {
    const { lines, logger } = captured();
    const events = new Instrumentation({ newId: () => 'id' });
    const seen: unknown[] = [];
    events.on('error.reported', (e) => seen.push(e.payload));
    const reporter = new ErrorReporter({ policy: 'continue', logger, instrumentation: events });
    for (const error of [new EngineError('a'), new EngineError('b'), new TypeError('c'), 'a string']) {
      expect(reporter.report(error, { module: 'rollout' })).toBe('continue');
    }
    expect(reporter.stopped).toBe(false);
    expect(reporter.counts()).toEqual({ EngineError: 2, NonError: 1, TypeError: 1 });
    expect(lines).toHaveLength(4);
    expect(seen[0]).toEqual({
      error: { name: 'EngineError', message: 'a', retriable: false, context: {} },
      action: 'continue',
      context: { module: 'rollout' },
    });
  });

  it('follows a parent signal and can be stopped by hand', () => {
    const parent = new AbortController();
    const reporter = new ErrorReporter({ policy: 'continue', parentSignal: parent.signal });
    parent.abort('SIGINT');
    expect(reporter.signal.aborted).toBe(true);
    expect(reporter.signal.reason).toBe('SIGINT');
    const manual = new ErrorReporter();
    manual.stop('graceful');
    expect(manual.signal.reason).toBe('graceful');
    expect(manual.stopCause).toBeUndefined();
    const pre = new AbortController();
    pre.abort();
    expect(new ErrorReporter({ parentSignal: pre.signal }).stopped).toBe(true);
  });

  it('parses policies from configuration with a ConfigError naming the valid ones', () => {
    expect(parseErrorPolicy('continue')).toBe('continue');
    expect(() => parseErrorPolicy('retry_forever')).toThrow(ConfigError);
    expect(() => parseErrorPolicy('retry_forever')).toThrow(/valid: stop_on_error, continue/);
    expect(() => new ErrorReporter({ policy: 'panic' as ErrorPolicy })).toThrow(ConfigError);
  });

  it('describes any thrown value', () => {
    expect(describeError(new ConfigError('x', { context: { key: 'k' } }))).toEqual({ name: 'ConfigError', message: 'x', retriable: false, context: { key: 'k' } });
    expect(describeError(new RangeError('r'))).toEqual({ name: 'RangeError', message: 'r', retriable: false });
    expect(describeError(new DOMException('gone', 'AbortError'))).toMatchObject({ name: 'AbortError', message: 'gone' });
    expect(describeError({ name: 'Weird' })).toEqual({ name: 'Weird', message: '', retriable: false });
    expect(describeError(42)).toEqual({ name: 'NonError', message: '42', retriable: false });
  });
});
