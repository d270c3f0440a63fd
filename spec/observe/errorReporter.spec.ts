import { describe, expect, it } from 'vitest';
import { AbortError, ConfigError, EngineError, EvaluationError } from '../../lib/core/errors.js';
import {
  createLogger,
  describeError,
  ErrorReporter,
  Instrumentation,
  moduleLogger,
  parseErrorPolicy,
  REPORTER_MESSAGE_CAPACITY,
  type ErrorPolicy,
} from '../../lib/observe/index.js';

function captured(): { lines: Array<Record<string, unknown>>; logger: ReturnType<typeof createLogger> } {
  const lines: Array<Record<string, unknown>> = [];
  const logger = createLogger({
    level: 'debug',
    destination: { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) },
  });
  return { lines, logger };
}

/** The raw JSON lines a logger writes (JSON.parse would hide a repeated key: it keeps the last). */
function rawLines(): { raw: string[]; logger: ReturnType<typeof createLogger> } {
  const raw: string[] = [];
  return { raw, logger: createLogger({ level: 'debug', destination: { write: (l: string) => void raw.push(l) } }) };
}

/** How many times `"key":` occurs in a JSON line, at any depth. */
function keyCount(line: string, key: string): number {
  return line.split(`"${key}":`).length - 1;
}

/** The keys of a JSON object line's top level, in order and with repeats (a string followed by `:` at depth 1). */
function topLevelKeys(line: string): string[] {
  const keys: string[] = [];
  let depth = 0;
  for (let i = 0; i < line.length; i++) {
    const c = line[i];
    if (c === '{' || c === '[') depth++;
    else if (c === '}' || c === ']') depth--;
    else if (c === '"') {
      let end = i + 1;
      while (line[end] !== '"') end += line[end] === '\\' ? 2 : 1;
      if (depth === 1 && line[end + 1] === ':') keys.push(JSON.parse(line.slice(i, end + 1)) as string);
      i = end;
    }
  }
  return keys;
}

/** Keys that occur more than once at the top level of a JSON line. */
function repeatedKeys(line: string): string[] {
  const keys = topLevelKeys(line);
  return keys.filter((key, i) => keys.indexOf(key) !== i);
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
    expect(describeError(new ConfigError('x', { context: { key: 'k' } }))).toEqual({
      name: 'ConfigError',
      message: 'x',
      retriable: false,
      context: { key: 'k' },
    });
    expect(describeError(new RangeError('r'))).toEqual({ name: 'RangeError', message: 'r', retriable: false });
    expect(describeError(new DOMException('gone', 'AbortError'))).toMatchObject({ name: 'AbortError', message: 'gone' });
    expect(describeError({ name: 'Weird' })).toEqual({ name: 'Weird', message: '', retriable: false });
    expect(describeError(42)).toEqual({ name: 'NonError', message: '42', retriable: false });
  });

  it('logs each key once when its logger binds the module the report names', () => {
    const { raw, logger } = rawLines();
    const reporter = new ErrorReporter({ policy: 'continue', logger: moduleLogger(logger, 'rollout') });
    reporter.report(new EngineError('prompt too long'), { module: 'rollout', taskId: 't7', trajectoryId: 't7/0' });
    expect(raw).toHaveLength(1);
    expect(topLevelKeys(raw[0])).toContain('module');
    expect(repeatedKeys(raw[0])).toEqual([]);
    expect(keyCount(raw[0], 'module')).toBe(1);
    expect(JSON.parse(raw[0])).toMatchObject({ module: 'rollout', taskId: 't7', trajectoryId: 't7/0', errorName: 'EngineError' });
  });

  it('keeps a report field that differs from a binding under `reported`', () => {
    const { raw, logger } = rawLines();
    const reporter = new ErrorReporter({ policy: 'continue', logger: moduleLogger(logger, 'errors', { runId: 'r1' }) });
    reporter.report(new EvaluationError('reward is NaN'), { module: 'evaluator', runId: 'r1', taskId: 't1' });
    expect(repeatedKeys(raw[0])).toEqual([]);
    expect(JSON.parse(raw[0])).toMatchObject({ module: 'errors', runId: 'r1', reported: { module: 'evaluator' }, taskId: 't1' });
    // Without a bound module the report's module is the line's.
    const plain = rawLines();
    new ErrorReporter({ policy: 'continue', logger: plain.logger }).report(new EngineError('x'), { module: 'rollout' });
    expect(repeatedKeys(plain.raw[0])).toEqual([]);
    expect(JSON.parse(plain.raw[0])).toMatchObject({ module: 'rollout' });
  });

  it('finds repeated keys in a raw line (the check the specs above rely on)', () => {
    expect(topLevelKeys('{"a":1,"b":{"a":"x\\"y:","c":[{"d":2}]},"e":"f"}')).toEqual(['a', 'b', 'e']);
    expect(repeatedKeys('{"module":"rollout","x":1,"module":"rollout"}')).toEqual(['module']);
  });

  it('logs the stack once per distinct message; repeats carry the error without it and a count', () => {
    const { raw, logger } = rawLines();
    const reporter = new ErrorReporter({ policy: 'continue', logger: moduleLogger(logger, 'rollout') });
    for (let i = 0; i < 32; i++) {
      reporter.report(new EngineError('prompt (30) + maxTokens (8) exceeds maxSeqLen 32', { context: { request: i } }), {
        module: 'rollout',
        trajectoryId: `t/${i}`,
      });
    }
    reporter.report(new EngineError('server closed the connection'), { module: 'rollout' });
    const records = raw.map((line) => JSON.parse(line) as { occurrence: number; err: Record<string, unknown>; msg: string });
    expect(records).toHaveLength(33);
    expect(raw.filter((line) => line.includes('    at ')).length).toBe(2);
    expect(typeof records[0].err.stack).toBe('string');
    expect(records[0].occurrence).toBe(1);
    for (const [i, record] of records.slice(1, 32).entries()) {
      expect(record.err).toMatchObject({
        type: 'EngineError',
        message: 'prompt (30) + maxTokens (8) exceeds maxSeqLen 32',
        retriable: false,
        context: { request: i + 1 },
      });
      expect(record.err.stack || undefined).toBeUndefined();
      expect(record.occurrence).toBe(i + 2);
      expect(record.msg).toBe('EngineError: prompt (30) + maxTokens (8) exceeds maxSeqLen 32');
    }
    expect(records[32]).toMatchObject({ occurrence: 1, err: { type: 'EngineError', message: 'server closed the connection' } });
    expect(typeof records[32].err.stack).toBe('string');
    expect(reporter.counts()).toEqual({ EngineError: 33 });
  });

  it('remembers a bounded number of messages: one forgotten logs its stack again', () => {
    const { raw, logger } = rawLines();
    const reporter = new ErrorReporter({ policy: 'continue', logger });
    for (let i = 0; i <= REPORTER_MESSAGE_CAPACITY; i++) reporter.report(new TypeError(`m${i}`));
    reporter.report(new TypeError('m0'));
    reporter.report(new TypeError(`m${REPORTER_MESSAGE_CAPACITY}`));
    const last = raw.slice(-2).map((line) => JSON.parse(line) as { occurrence: number; err: Record<string, unknown> });
    expect(last[0]).toMatchObject({ occurrence: 1, err: { message: 'm0' } });
    expect(typeof last[0].err.stack).toBe('string');
    expect(last[1]).toMatchObject({ occurrence: 2, err: { type: 'TypeError', message: `m${REPORTER_MESSAGE_CAPACITY}` } });
    expect(last[1].err.stack || undefined).toBeUndefined();
  });
});
