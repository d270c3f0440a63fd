import { appendFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { METRICS_FILE, MetricsWriter, parseMetricsLines, readRunMetrics, RunDirError } from '../../lib/observe/index.js';

function runDir(): string {
  return join(mkdtempSync(join(tmpdir(), 'rxrl-metrics-')), 'run');
}

describe('MetricsWriter and readRunMetrics', () => {
  it('appends one complete JSON line per step and reads them back', async () => {
    const dir = runDir();
    let t = 1000;
    const writer = MetricsWriter.open(dir, { now: () => t++ });
    writer.write({ step: 0, version: 1, metrics: { 'actor/pg_loss': 0.5, 'rollout/reward_mean': 0.25 } });
    writer.write({ step: 1, version: 2, metrics: { 'actor/pg_loss': 0.25 }, time: 5000 });
    writer.close();
    writer.close(); // idempotent
    const text = readFileSync(join(dir, METRICS_FILE), 'utf8');
    expect(text).toBe(
      '{"step":0,"version":1,"time":1000,"actor/pg_loss":0.5,"rollout/reward_mean":0.25}\n' +
        '{"step":1,"version":2,"time":5000,"actor/pg_loss":0.25}\n',
    );
    const read = await readRunMetrics(dir);
    expect(read).toMatchObject({ found: true, skipped: 0, skippedLines: [] });
    expect(read.records).toEqual([
      { step: 0, version: 1, time: 1000, metrics: { 'actor/pg_loss': 0.5, 'rollout/reward_mean': 0.25 } },
      { step: 1, version: 2, time: 5000, metrics: { 'actor/pg_loss': 0.25 } },
    ]);
  });

  it('takes a StepResult-shaped value, writes non-finite values as null and reads them as NaN', async () => {
    const dir = runDir();
    const writer = MetricsWriter.open(dir, { fsync: true });
    const stepResult = { step: 4, version: 5, skipped: true, trajectoryIds: ['a'], metrics: { 'actor/pg_loss': Number.NaN, step: 99 } };
    writer.write(stepResult);
    writer.sync();
    writer.close();
    const line = JSON.parse(readFileSync(join(dir, METRICS_FILE), 'utf8')) as Record<string, unknown>;
    expect(line).toMatchObject({ step: 4, version: 5, 'actor/pg_loss': null });
    expect(Object.keys(line)).toEqual(['step', 'version', 'time', 'actor/pg_loss']);
    const [record] = (await readRunMetrics(dir)).records;
    expect(record.metrics['actor/pg_loss']).toBeNaN();
  });

  it('tolerates a truncated last line (a killed writer) and reports it', async () => {
    const dir = runDir();
    const writer = MetricsWriter.open(dir);
    writer.write({ step: 0, version: 1, metrics: { a: 1 } });
    writer.write({ step: 1, version: 2, metrics: { a: 2 } });
    writer.close();
    appendFileSync(join(dir, METRICS_FILE), '{"step":2,"version":3,"ti');
    const read = await readRunMetrics(dir);
    expect(read.records.map((r) => r.step)).toEqual([0, 1]);
    expect(read.skipped).toBe(1);
    expect(read.skippedLines).toEqual([{ line: 3, reason: 'truncated' }]);
  });

  it('reopening after a crash ends the fragment, so the next record is a line of its own', async () => {
    const dir = runDir();
    const first = MetricsWriter.open(dir);
    first.write({ step: 0, version: 1, metrics: { a: 1 } });
    first.close();
    appendFileSync(join(dir, METRICS_FILE), '{"step":1,"vers');
    const resumed = MetricsWriter.open(dir);
    resumed.write({ step: 1, version: 2, metrics: { a: 2 } });
    resumed.close();
    const read = await readRunMetrics(dir);
    expect(read.records.map((r) => r.step)).toEqual([0, 1]);
    expect(read.skippedLines).toEqual([{ line: 2, reason: 'invalid' }]);
  });

  it('skips invalid lines anywhere and ignores blank ones', () => {
    const parsed = parseMetricsLines(
      [
        '{"step":0,"version":1,"time":1,"x":1}',
        '',
        '[1,2]',
        '{"version":1}',
        'garbage',
        '{"step":1,"version":2,"x":"text","y":2}',
        '',
      ].join('\n'),
    );
    expect(parsed.records).toEqual([
      { step: 0, version: 1, time: 1, metrics: { x: 1 } },
      { step: 1, version: 2, time: Number.NaN, metrics: { y: 2 } },
    ]);
    expect(parsed.skippedLines.map((s) => [s.line, s.reason])).toEqual([
      [3, 'invalid'],
      [4, 'invalid'],
      [5, 'invalid'],
    ]);
  });

  it('reports a missing file as not found and a missing run dir as a RunDirError', async () => {
    const dir = runDir();
    MetricsWriter.open(dir).close();
    writeFileSync(join(dir, METRICS_FILE), '');
    expect(await readRunMetrics(dir)).toMatchObject({ found: true, records: [], skipped: 0 });
    const empty = mkdtempSync(join(tmpdir(), 'rxrl-metrics-'));
    expect(await readRunMetrics(empty)).toMatchObject({ found: false, records: [] });
    await expect(readRunMetrics(join(empty, 'nope'))).rejects.toBeInstanceOf(RunDirError);
  });

  it('rejects writes after close and records without a finite step', () => {
    const writer = MetricsWriter.open(runDir());
    expect(() => writer.write({ step: Number.NaN, version: 1, metrics: {} })).toThrow(RunDirError);
    writer.close();
    expect(writer.isOpen).toBe(false);
    let error: unknown;
    try {
      writer.write({ step: 0, version: 1, metrics: {} });
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(RunDirError);
    expect((error as RunDirError).context).toMatchObject({ path: writer.path });
  });
});
