/**
 * The metrics stream of a run on disk: `<run-dir>/metrics.jsonl`, one JSON object per line,
 * `{ "step": 3, "version": 4, "time": 1732262400123, "actor/pg_loss": 0.012, … }`.
 *
 * Crash safety: each record is one `write(2)` of a complete line on a file opened for appending, issued before
 * {@link MetricsWriter.write} returns, so a killed process loses at most the line being written and never
 * leaves half of one in the middle of the file: when the writer opens a file whose last line has no newline (a
 * crash mid-write), it ends that fragment first, so the next record starts on a line of its own.
 * {@link MetricsWriter.sync} (or `fsync: true`) also flushes the page cache, against a machine crash.
 *
 * {@link readRunMetrics} reads the file back, skipping and counting lines that do not parse (such a fragment).
 * Non-finite values are written as `null` (JSON has no NaN) and read back as `NaN`.
 *
 * @packageDocumentation
 */
import { closeSync, existsSync, fstatSync, fsyncSync, mkdirSync, openSync, readSync, writeSync } from 'node:fs';
import { readFile, stat } from 'node:fs/promises';
import { join } from 'node:path';
import type { Metrics, PolicyVersion } from '../core/types.js';
import { asStorageError } from '../core/errors.js';
import { RunDirError } from './errors.js';

/** File name of the metrics stream inside a run directory. */
export const METRICS_FILE = 'metrics.jsonl';

/** Fields of every line besides the metrics; metrics with these names are not written. */
export const METRICS_RESERVED_KEYS = ['step', 'version', 'time'] as const;

/** The path of the metrics stream of `runDir`. */
export function metricsPath(runDir: string): string {
  return join(runDir, METRICS_FILE);
}

/** What {@link MetricsWriter.write} takes; a `StepResult` fits. */
export interface MetricsEntry {
  /** 0-based train step the metrics belong to (validation: the step it follows). */
  readonly step: number;
  /** Policy version at that point. */
  readonly version: PolicyVersion;
  /** Namespaced scalars. */
  readonly metrics: Readonly<Metrics>;
  /** Wall time in ms since the epoch. Default: the writer's clock. */
  readonly time?: number;
}

/** One record read back by {@link readRunMetrics}. */
export interface MetricsRecord {
  /** Train step. */
  readonly step: number;
  /** Policy version. */
  readonly version: PolicyVersion;
  /** Wall time in ms since the epoch (`NaN` when the line had none). */
  readonly time: number;
  /** The metrics of the line; `null` values come back as `NaN`. */
  readonly metrics: Metrics;
}

/** A line {@link readRunMetrics} could not use. */
export interface SkippedLine {
  /** 1-based line number. */
  readonly line: number;
  /** `truncated`: the last line, without newline, does not parse (a killed writer); `invalid`: any other. */
  readonly reason: 'truncated' | 'invalid';
}

/** What {@link readRunMetrics} returns. */
export interface MetricsReadResult {
  /** The file read. */
  readonly path: string;
  /** False when the run directory has no metrics file yet (then `records` is empty). */
  readonly found: boolean;
  /** Records in file order (a resumed run may repeat steps: later lines are newer). */
  readonly records: readonly MetricsRecord[];
  /** How many non-empty lines were skipped. */
  readonly skipped: number;
  /** Which lines were skipped, and why. */
  readonly skippedLines: readonly SkippedLine[];
}

/** Options of {@link MetricsWriter.open}. */
export interface MetricsWriterOptions {
  /** `fsync` after every line. Default `false` (each line still reaches the OS before `write` returns). */
  readonly fsync?: boolean;
  /** Clock for `time`, in ms. Default `Date.now`. */
  readonly now?: () => number;
}

/**
 * Appends one JSON line per step to `<run-dir>/metrics.jsonl`.
 *
 * @example
 * ```ts
 * import { MetricsWriter } from 'rxrl';
 * const metrics = MetricsWriter.open('runs/reverse');
 * pipeline.subscribe((result) => metrics.write(result));   // { step, version, metrics }
 * // on exit: metrics.close();
 * ```
 */
export class MetricsWriter {
  /** The file written. */
  readonly path: string;
  private fd: number | undefined;
  private readonly fsyncEach: boolean;
  private readonly now: () => number;

  private constructor(path: string, fd: number, options: MetricsWriterOptions) {
    this.path = path;
    this.fd = fd;
    this.fsyncEach = options.fsync ?? false;
    this.now = options.now ?? Date.now;
  }

  /**
   * Opens (creating the run directory and the file when needed) the metrics stream of `runDir` for appending.
   *
   * @param runDir - the run directory.
   * @param options - fsync policy and clock.
   */
  static open(runDir: string, options: MetricsWriterOptions = {}): MetricsWriter {
    mkdirSync(runDir, { recursive: true });
    const path = metricsPath(runDir);
    const fd = openSync(path, 'a+');
    try {
      const size = fstatSync(fd).size;
      if (size > 0) {
        const last = Buffer.alloc(1);
        readSync(fd, last, 0, 1, size - 1);
        if (last[0] !== 0x0a) writeSync(fd, '\n'); // end a fragment left by a killed writer
      }
    } catch (error) {
      closeSync(fd);
      throw asStorageError(error, path);
    }
    return new MetricsWriter(path, fd, options);
  }

  /** True until {@link MetricsWriter.close}. */
  get isOpen(): boolean {
    return this.fd !== undefined;
  }

  /**
   * Appends one record as one complete line.
   *
   * @param entry - step, version and metrics (a `StepResult` fits).
   * @throws RunDirError when the writer is closed or `step`/`version` is not a finite number.
   * @throws StorageError naming the file when the device is full or the quota spent.
   */
  write(entry: MetricsEntry): void {
    const fd = this.fd;
    if (fd === undefined) throw new RunDirError('metrics writer is closed', { context: { path: this.path } });
    for (const field of ['step', 'version'] as const) {
      if (typeof entry[field] !== 'number' || !Number.isFinite(entry[field])) {
        throw new RunDirError(`metrics record: ${field} must be a finite number, got ${String(entry[field])}`, {
          context: { path: this.path, field },
        });
      }
    }
    const line: Record<string, number> = { step: entry.step, version: entry.version, time: entry.time ?? this.now() };
    for (const [key, value] of Object.entries(entry.metrics)) {
      if (!(METRICS_RESERVED_KEYS as readonly string[]).includes(key)) line[key] = value;
    }
    try {
      writeAllSync(fd, Buffer.from(`${JSON.stringify(line)}\n`));
    } catch (error) {
      throw asStorageError(error, this.path);
    }
    if (this.fsyncEach) this.fsync(fd);
  }

  /** Flushes written lines to the disk (`fsync`). */
  sync(): void {
    if (this.fd !== undefined) this.fsync(this.fd);
  }

  /** Flushes and closes the file. Idempotent. */
  close(): void {
    const fd = this.fd;
    if (fd === undefined) return;
    this.fd = undefined;
    try {
      this.fsync(fd);
    } finally {
      closeSync(fd);
    }
  }

  /** `fsync`, a full device reported as a StorageError naming the file. */
  private fsync(fd: number): void {
    try {
      fsyncSync(fd);
    } catch (error) {
      throw asStorageError(error, this.path);
    }
  }
}

/** Writes all of `bytes` (one `write(2)` may take part of them), so a full disk fails the write that tore the line. */
function writeAllSync(fd: number, bytes: Buffer): void {
  for (let at = 0; at < bytes.length;) at += writeSync(fd, bytes, at);
}

/**
 * Reads `<run-dir>/metrics.jsonl`. Lines that do not parse as a JSON object with a numeric `step` and `version`
 * are skipped and reported, so a run killed mid-write still reads.
 *
 * @param runDir - the run directory.
 * @returns the records in file order and the skipped lines.
 * @throws RunDirError when `runDir` is not a directory.
 */
export async function readRunMetrics(runDir: string): Promise<MetricsReadResult> {
  const info = await stat(runDir).catch(() => undefined);
  if (info === undefined || !info.isDirectory()) {
    throw new RunDirError(`not a run directory: ${runDir}`, { context: { path: runDir } });
  }
  const path = metricsPath(runDir);
  if (!existsSync(path)) return { path, found: false, records: [], skipped: 0, skippedLines: [] };
  return { path, found: true, ...parseMetricsLines(await readFile(path, 'utf8')) };
}

/**
 * Parses the text of a metrics stream (see {@link readRunMetrics}).
 *
 * @param text - the file's contents.
 */
export function parseMetricsLines(text: string): Pick<MetricsReadResult, 'records' | 'skipped' | 'skippedLines'> {
  const lines = text.split('\n');
  const records: MetricsRecord[] = [];
  const skippedLines: SkippedLine[] = [];
  lines.forEach((line, index) => {
    if (line.trim() === '') return;
    const record = parseRecord(line);
    if (record !== undefined) records.push(record);
    else skippedLines.push({ line: index + 1, reason: index === lines.length - 1 ? 'truncated' : 'invalid' });
  });
  return { records, skipped: skippedLines.length, skippedLines };
}

function parseRecord(line: string): MetricsRecord | undefined {
  let parsed: unknown;
  try {
    parsed = JSON.parse(line);
  } catch {
    return undefined;
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return undefined;
  const { step, version, time, ...rest } = parsed as Record<string, unknown>;
  if (typeof step !== 'number' || typeof version !== 'number') return undefined;
  const metrics: Metrics = {};
  for (const [key, value] of Object.entries(rest)) {
    if (typeof value === 'number') metrics[key] = value;
    else if (value === null) metrics[key] = Number.NaN;
  }
  return { step, version, time: typeof time === 'number' ? time : Number.NaN, metrics };
}
