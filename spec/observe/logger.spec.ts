import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../lib/core/errors.js';
import { createLogger, formatPretty, moduleLogger, silentLogger, type LogLevel } from '../../lib/observe/index.js';

function memory(): { lines: string[]; write(line: string): void } {
  const lines: string[] = [];
  return { lines, write: (line: string) => void lines.push(line) };
}

describe('createLogger', () => {
  it('writes JSON lines with the module of each child logger', () => {
    const out = memory();
    const logger = createLogger({ destination: out, base: { runId: 'r1' } });
    moduleLogger(logger, 'trainer').info({ step: 3 }, 'step done');
    moduleLogger(logger, 'rollout', { engine: 'local' }).warn('slow');
    const records = out.lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(records[0]).toMatchObject({ level: 30, runId: 'r1', module: 'trainer', step: 3, msg: 'step done' });
    expect(records[1]).toMatchObject({ level: 40, module: 'rollout', engine: 'local', msg: 'slow' });
    expect(typeof records[0].time).toBe('number');
  });

  it('honours the level and serializes typed errors with their context', () => {
    const out = memory();
    const logger = createLogger({ destination: out, level: 'warn' });
    logger.info('hidden');
    logger.error({ err: new ConfigError('bad key', { context: { key: 'x' } }) }, 'failed');
    expect(out.lines).toHaveLength(1);
    const record = JSON.parse(out.lines[0]) as { err: { type: string; message: string; context: unknown } };
    expect(record.err).toMatchObject({ type: 'ConfigError', message: 'bad key', context: { key: 'x' } });
  });

  it('pretty-prints one readable line per record', () => {
    const out = memory();
    const logger = createLogger({ destination: out, pretty: true, base: {} });
    moduleLogger(logger, 'trainer').info({ step: 3, note: 'two words' }, 'step done');
    expect(out.lines[0]).toMatch(/^\d\d:\d\d:\d\d\.\d{3} INFO {2}\[trainer\] step done step=3 note="two words"\n$/);
    expect(formatPretty('not json\n')).toBe('not json\n');
    const withError = formatPretty(
      JSON.stringify({ level: 50, time: 0, msg: 'x', err: { type: 'EngineError', message: 'down', stack: 'EngineError: down\n    at f' } }),
    );
    expect(withError).toBe('00:00:00.000 ERROR x err=EngineError: down\n    at f\n');
    // A repeated report's error has no stack: still one line.
    const noStack = formatPretty(
      JSON.stringify({ level: 50, time: 0, msg: 'x', err: { type: 'EngineError', message: 'down', stack: '' } }),
    );
    expect(noStack).toBe('00:00:00.000 ERROR x err=EngineError: down\n');
  });

  it('appends to a file, creating its directory, synchronously', () => {
    const file = join(mkdtempSync(join(tmpdir(), 'rxrl-log-')), 'nested', 'run.log');
    const logger = createLogger({ destination: { file } });
    logger.info({ a: 1 }, 'first');
    logger.info('second');
    const lines = readFileSync(file, 'utf8').trim().split('\n');
    expect(lines.map((l) => (JSON.parse(l) as { msg: string }).msg)).toEqual(['first', 'second']);
  });

  it('rejects an unknown level with a ConfigError, and the silent logger writes nothing', () => {
    expect(() => createLogger({ level: 'loud' as LogLevel })).toThrow(ConfigError);
    expect(() => createLogger({ level: 'loud' as LogLevel })).toThrow(/valid: fatal, error/);
    expect(silentLogger.isLevelEnabled('fatal')).toBe(false);
    expect(() => silentLogger.child({ module: 'x' }).error('nothing')).not.toThrow();
  });
});
