/**
 * TensorBoard event files (`logging.tensorboard: true`): every metric of every step as a scalar, written as
 * TensorFlow's `events.out.tfevents.*` files — TFRecord framing (length, masked CRC-32C of it, the record, masked
 * CRC-32C of that) around `Event` protocol buffers (`wall_time`, `step`, `summary.value { tag, simple_value }`),
 * encoded here by hand: the format is a handful of fields, not worth a protobuf runtime.
 *
 * A resumed run opens a new file that starts with a `SessionLog START` at its first step, so TensorBoard's reader
 * drops what a killed run had logged past its checkpoint: each step appears once.
 *
 * @packageDocumentation
 */
import { closeSync, constants, mkdirSync, openSync, writeSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';

import { ForbiddenPathError, asStorageError } from '../core/errors.js';
import type { MetricsEntry } from './metricsFile.js';

/** Event files opened by this process (the last part of a file's name). */
let opened = 0;

/**
 * How an event file is opened: created here or not at all (`O_EXCL`: a file or link already at its path is refused,
 * never followed nor appended to; `O_NOFOLLOW` for systems where `O_EXCL` alone would follow a link).
 */
const CREATE_FLAGS = constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW | constants.O_APPEND;

/** Sub-directory of a run directory that holds the event files. */
export const TENSORBOARD_DIR = 'tensorboard';

/** Options of {@link TensorBoardWriter.open}. */
export interface TensorBoardOptions {
  /** A resumed run's first step: the file starts with a `SessionLog START` there, and TensorBoard drops later steps of older files. */
  readonly resumeStep?: number | undefined;
  /** Clock in ms. Default `Date.now`. */
  readonly now?: () => number;
}

/**
 * Writes one event file of a run. The TensorBoard step of an entry is its policy version (`step + 1` for the
 * step's own line: TRL's global step), so validation before training sits at 0.
 *
 * @example
 * ```ts
 * import { TensorBoardWriter } from 'rxrl';
 * const board = TensorBoardWriter.open('runs/a/tensorboard');
 * board.write({ step: 0, version: 1, metrics: { 'rollout/reward_mean': 0.4 } });
 * board.close();   // then: tensorboard --logdir runs/a/tensorboard
 * ```
 */
export class TensorBoardWriter {
  private constructor(
    private readonly fd: number,
    /** The event file. */
    readonly path: string,
    private readonly now: () => number,
  ) {}

  /**
   * Creates `dir` and a new event file in it, and writes its header (and a resumed run's `SessionLog START`).
   *
   * @param dir - the directory TensorBoard's `--logdir` names.
   * @param options - resume step and clock.
   * @throws StorageError when the file cannot be written; {@link ForbiddenPathError} when something (a planted link)
   * is at its path already.
   */
  static open(dir: string, options: TensorBoardOptions = {}): TensorBoardWriter {
    const now = options.now ?? Date.now;
    const path = join(dir, `events.out.tfevents.${Math.floor(now() / 1000)}.${hostname()}.${process.pid}.${++opened}.v2`);
    try {
      mkdirSync(dir, { recursive: true });
      const writer = new TensorBoardWriter(createFile(path), path, now);
      writer.record(eventBytes({ wallTime: now() / 1000, step: 0, fileVersion: 'brain.Event:2' }));
      if (options.resumeStep !== undefined)
        writer.record(eventBytes({ wallTime: now() / 1000, step: options.resumeStep, sessionStart: true }));
      return writer;
    } catch (error) {
      throw asStorageError(error, path);
    }
  }

  /**
   * Appends the finite metrics of one entry as scalars at its version.
   *
   * @param entry - a metrics line (a `StepResult` fits).
   */
  write(entry: MetricsEntry): void {
    const values = Object.entries(entry.metrics).filter(([, value]) => Number.isFinite(value));
    if (values.length === 0) return;
    const wallTime = (entry.time ?? this.now()) / 1000;
    this.record(eventBytes({ wallTime, step: Math.max(0, entry.version), scalars: values }));
  }

  /** Closes the file. */
  close(): void {
    closeSync(this.fd);
  }

  private record(data: Uint8Array): void {
    const header = new Uint8Array(12);
    const view = new DataView(header.buffer);
    view.setBigUint64(0, BigInt(data.length), true);
    view.setUint32(8, maskedCrc32c(header.subarray(0, 8)), true);
    const footer = new Uint8Array(4);
    new DataView(footer.buffer).setUint32(0, maskedCrc32c(data), true);
    const bytes = Buffer.concat([header, data, footer]);
    try {
      // A short write (a file size limit reached) is continued: the next write says why it cannot go on.
      for (let at = 0; at < bytes.length;) at += writeSync(this.fd, bytes, at);
    } catch (error) {
      throw asStorageError(error, this.path);
    }
  }
}

/** Creates `path` for writing ({@link CREATE_FLAGS}); what is there already is a {@link ForbiddenPathError}. */
function createFile(path: string): number {
  try {
    return openSync(path, CREATE_FLAGS, 0o644);
  } catch (error) {
    const code = (error as { code?: unknown }).code;
    if (code !== 'EEXIST' && code !== 'ELOOP') throw error;
    throw new ForbiddenPathError(`${path}: exists already; an event file is only ever a new file`, {
      cause: error,
      context: { path, code },
    });
  }
}

/** One `Event` message: the header (`file_version`), a `SessionLog START`, or a `Summary` of scalars. */
function eventBytes(event: {
  wallTime: number;
  step: number;
  fileVersion?: string;
  sessionStart?: boolean;
  scalars?: readonly (readonly [string, number])[];
}): Uint8Array {
  const out = new ProtoWriter();
  out.double(1, event.wallTime);
  out.varint(2, event.step);
  if (event.fileVersion !== undefined) out.string(3, event.fileVersion);
  if (event.scalars !== undefined) {
    const summary = new ProtoWriter();
    for (const [tag, value] of event.scalars) {
      const item = new ProtoWriter();
      item.string(1, tag);
      item.float(2, value);
      summary.message(1, item.bytes());
    }
    out.message(5, summary.bytes());
  }
  if (event.sessionStart === true) {
    const log = new ProtoWriter();
    log.varint(1, 1); // SessionLog.START
    out.message(7, log.bytes());
  }
  return out.bytes();
}

const UTF8 = new TextEncoder();

/** The few protobuf wire types an `Event` needs. */
class ProtoWriter {
  private readonly parts: Uint8Array[] = [];

  double(field: number, value: number): void {
    const bytes = new Uint8Array(8);
    new DataView(bytes.buffer).setFloat64(0, value, true);
    this.key(field, 1);
    this.parts.push(bytes);
  }

  float(field: number, value: number): void {
    const bytes = new Uint8Array(4);
    new DataView(bytes.buffer).setFloat32(0, value, true);
    this.key(field, 5);
    this.parts.push(bytes);
  }

  varint(field: number, value: number): void {
    this.key(field, 0);
    this.parts.push(varint(value));
  }

  string(field: number, value: string): void {
    this.message(field, UTF8.encode(value));
  }

  message(field: number, bytes: Uint8Array): void {
    this.key(field, 2);
    this.parts.push(varint(bytes.length), bytes);
  }

  bytes(): Uint8Array {
    return Buffer.concat(this.parts);
  }

  private key(field: number, wireType: number): void {
    this.parts.push(varint(field * 8 + wireType));
  }
}

/** A non-negative integer as a protobuf varint. */
function varint(value: number): Uint8Array {
  const out: number[] = [];
  let v = BigInt(Math.trunc(value));
  do {
    const low = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v > 0n ? low | 0x80 : low);
  } while (v > 0n);
  return Uint8Array.from(out);
}

const CRC32C_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let i = 0; i < 256; i++) {
    let c = i;
    for (let k = 0; k < 8; k++) c = c & 1 ? (c >>> 1) ^ 0x82f63b78 : c >>> 1;
    table[i] = c >>> 0;
  }
  return table;
})();

/** CRC-32C (Castagnoli) of `bytes`. */
export function crc32c(bytes: Uint8Array): number {
  let crc = 0xffffffff;
  for (const byte of bytes) crc = CRC32C_TABLE[(crc ^ byte) & 0xff] ^ (crc >>> 8);
  return (crc ^ 0xffffffff) >>> 0;
}

/** TFRecord's masked CRC: rotated right by 15 bits plus a constant. */
function maskedCrc32c(bytes: Uint8Array): number {
  const crc = crc32c(bytes);
  return ((((crc >>> 15) | (crc << 17)) >>> 0) + 0xa282ead8) >>> 0;
}
