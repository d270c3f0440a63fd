/**
 * Reads records of rxrl's first Kafka codec (`rx`, version 2), which topics written before the Protocol Buffers
 * schema (proto/rxrl/v1/records.proto) may still hold. Such a record starts with the bytes `r x 0x02` and its kind;
 * its fields follow in a fixed order, little-endian (`u32` lengths and counts, `f64` numbers, int32 / float32 / `u8`
 * arrays, a `u8` flag before each optional field). Each record is read into the schema's message, so that one set of
 * checks (lib/kafka/codec.ts) serves both formats. Nothing writes this format any more.
 *
 * @packageDocumentation
 */
import { DecodeError } from '../core/errors.js';
import type { Heartbeat, Task, TaskRecord, TrajectoryRecord, WeightsRecord } from './schema/records.js';
import { WORKER_ID_MAX_LENGTH } from './workerId.js';

/** The version byte of the legacy codec. */
export const LEGACY_CODEC_VERSION = 2;

/** Kinds of legacy records (their fourth byte). */
const KINDS = { task: 1, trajectory: 2, sampleFailure: 3, weightsVersion: 4, runEnd: 5, heartbeat: 6 } as const;
type Kind = keyof typeof KINDS;

const HEADER_BYTES = 4;
/** Largest string accepted (bytes). */
const MAX_STRING_BYTES = 16 * 1024 * 1024;
/** Largest array accepted (elements). */
const MAX_ARRAY_LENGTH = 16 * 1024 * 1024;
// ignoreBOM: a string that starts with U+FEFF keeps it (by default TextDecoder drops a leading BOM).
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** Whether `bytes` starts as a legacy record does: `r`, `x` (a Protocol Buffers record never starts with 0x72). */
export function isLegacyRecord(bytes: Uint8Array): boolean {
  return bytes.length >= 2 && bytes[0] === 0x72 && bytes[1] === 0x78;
}

/** Reads a legacy task record. @throws {@link DecodeError} naming the field. */
export function readLegacyTask(bytes: Uint8Array): TaskRecord {
  const r = new Reader(bytes, ['task']);
  const run = r.str('run');
  const index = r.safeInteger('index');
  const minVersion = r.u32('minVersion');
  const samples = r.u32('samples');
  const sampling = { maxTokens: r.u32('sampling.maxTokens'), temperature: r.f64('sampling.temperature') };
  const topP = r.f64('sampling.topP');
  const seed = r.f64('sampling.seed');
  const task = readTask(r);
  r.end();
  return { run, index, minVersion, samples, sampling: { ...sampling, topP, seed }, task };
}

/** Reads a legacy trajectory or failed-sample record. @throws {@link DecodeError} naming the field. */
export function readLegacyTrajectory(bytes: Uint8Array): TrajectoryRecord {
  const r = new Reader(bytes, ['trajectory', 'sampleFailure']);
  const run = r.str('run');
  const ids = { id: r.str('id'), taskId: r.str('taskId'), groupId: r.str('groupId'), runId: r.u32('runId'), modelTag: r.str('modelTag') };
  if (r.kind === KINDS.sampleFailure) {
    const errorName = r.str('error.name');
    const errorMessage = r.str('error.message');
    const flags = r.u8('error.flags');
    if (flags > 3) throw r.fail('error.flags', `flags must be within 0..3, got ${flags}`);
    r.end();
    const failure = { ...ids, errorName, errorMessage, retriable: (flags & 1) === 1, skipped: (flags & 2) === 2 };
    return { run, output: { case: 'failure', value: failure }, producedUnixMs: 0 };
  }
  const policyVersion = r.u32('policyVersion');
  const promptTokens = r.int32s('promptTokens');
  const responseTokens = r.int32s('responseTokens');
  const logprobs = r.float32s('logprobs');
  const lossMask = r.bits('lossMask');
  const reward = r.f64('reward');
  // The legacy order stop, length, abort is the schema's enum less one.
  const finishReason = r.u8('finishReason') + 1;
  const metricCount = r.count('metrics', 1 + 4 + 8);
  const metrics: Record<string, number> = {};
  for (let i = 0; i < metricCount; i++) {
    const name = r.str('metrics');
    metrics[name] = r.f64('metrics');
  }
  const task = readTask(r);
  r.end();
  const trajectory = { ...ids, policyVersion, promptTokens, responseTokens, logprobs, lossMask, reward, finishReason, metrics, task };
  return { run, output: { case: 'trajectory', value: trajectory }, producedUnixMs: 0 };
}

/** Reads a legacy weight announcement or run end. @throws {@link DecodeError} naming the field. */
export function readLegacyWeights(bytes: Uint8Array): WeightsRecord {
  const r = new Reader(bytes, ['weightsVersion', 'runEnd']);
  const run = r.str('run');
  const version = r.u32('version');
  if (r.kind === KINDS.runEnd) {
    const timestampUnixMs = r.f64('timestamp');
    r.end();
    return { run, event: { case: 'end', value: { version, timestampUnixMs } } };
  }
  const modelTag = r.str('modelTag');
  const path = r.str('path');
  const size = r.safeInteger('bytes');
  const sha256 = r.str('sha256');
  const timestampUnixMs = r.f64('timestamp');
  r.end();
  const value = { version, modelTag, path, bytes: size, sha256, timestampUnixMs };
  return { run, event: { case: 'version', value } };
}

/** Reads a legacy heartbeat; a worker id over its bound is refused from its length prefix. @throws {@link DecodeError}. */
export function readLegacyHeartbeat(bytes: Uint8Array): Heartbeat {
  const r = new Reader(bytes, ['heartbeat']);
  const worker = r.str('worker', WORKER_ID_MAX_LENGTH);
  const run = r.str('run');
  const inFlight = r.u32('inFlight');
  const done = r.safeInteger('done');
  const failed = r.safeInteger('failed');
  const version = r.flag('version') ? r.u32('version') : undefined;
  const leaving = r.flag('leaving');
  const timestampUnixMs = r.f64('timestamp');
  r.end();
  return { worker, run, inFlight, done, failed, ...(version === undefined ? {} : { version }), leaving, timestampUnixMs };
}

function readTask(r: Reader): Task {
  const id = r.str('task.id');
  const prompt = r.str('task.prompt');
  const answer = r.flag('task.answer') ? r.str('task.answer') : undefined;
  const metadataJson = r.flag('task.metadata') ? r.str('task.metadata') : undefined;
  const epoch = r.flag('task.epoch') ? r.u32('task.epoch') : undefined;
  const response = r.flag('task.response') ? r.str('task.response') : undefined;
  const task: Task = { id, prompt };
  if (answer !== undefined) task.answer = answer;
  if (response !== undefined) task.response = response;
  if (metadataJson !== undefined) task.metadataJson = metadataJson;
  if (epoch !== undefined) task.epoch = epoch;
  return task;
}

/** Reads a legacy record's fields in order, each bounded by the bytes left. */
class Reader {
  readonly kind: number;
  private readonly view: DataView;
  private at = HEADER_BYTES;

  constructor(
    private readonly bytes: Uint8Array,
    allowed: readonly Kind[],
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    if (bytes.length < HEADER_BYTES) throw this.fail('header', `record of ${bytes.length} bytes is shorter than its header`);
    if (bytes[2] !== LEGACY_CODEC_VERSION) {
      throw this.fail(
        'header',
        `'rx' codec version ${bytes[2]} is not one rxrl reads (it reads version ${LEGACY_CODEC_VERSION} and the rxrl.v1 Protocol Buffers records); it was written by another rxrl: read it with that version`,
      );
    }
    this.kind = bytes[3];
    if (!allowed.some((k) => KINDS[k] === this.kind)) {
      const name = (Object.keys(KINDS) as Kind[]).find((k) => KINDS[k] === this.kind);
      throw this.fail('header', `record kind ${name ?? this.kind} is not one of ${allowed.join(', ')}`);
    }
  }

  fail(field: string, reason: string, cause?: unknown): DecodeError {
    return new DecodeError(`cannot decode ${field}: ${reason}`, { cause, context: { field, offset: this.at, format: 'rx2' } });
  }

  private need(n: number, field: string): void {
    if (this.at + n > this.bytes.length) {
      throw this.fail(field, `needs ${n} bytes at offset ${this.at}, record has ${this.bytes.length}`);
    }
  }

  u8(field: string): number {
    this.need(1, field);
    return this.bytes[this.at++];
  }

  flag(field: string): boolean {
    const v = this.u8(field);
    if (v > 1) throw this.fail(field, `flag must be 0 or 1, got ${v}`);
    return v === 1;
  }

  u32(field: string): number {
    this.need(4, field);
    const v = this.view.getUint32(this.at, true);
    this.at += 4;
    return v;
  }

  f64(field: string): number {
    this.need(8, field);
    const v = this.view.getFloat64(this.at, true);
    this.at += 8;
    return v;
  }

  safeInteger(field: string): number {
    const v = this.f64(field);
    if (!(Number.isSafeInteger(v) && v >= 0)) throw this.fail(field, `${v} is not a non-negative safe integer`);
    return v;
  }

  /** An element count whose elements take at least `minBytes` each, checked against the bytes left. */
  count(field: string, minBytes: number): number {
    const n = this.u32(field);
    if (n > MAX_ARRAY_LENGTH || this.at + n * minBytes > this.bytes.length) {
      throw this.fail(field, `count ${n} does not fit in the ${this.bytes.length - this.at} bytes left`);
    }
    return n;
  }

  /** A string of at most `maxBytes` bytes (checked on its length prefix, before it is read). */
  str(field: string, maxBytes = MAX_STRING_BYTES): string {
    const n = this.u32(field);
    if (n > maxBytes) throw this.fail(field, `string of ${n} bytes exceeds ${maxBytes}`);
    this.need(n, field);
    let value: string;
    try {
      value = strictUtf8.decode(this.bytes.subarray(this.at, this.at + n));
    } catch (cause) {
      throw this.fail(field, 'invalid UTF-8', cause);
    }
    this.at += n;
    return value;
  }

  int32s(field: string): number[] {
    const n = this.count(field, 4);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++, this.at += 4) out[i] = this.view.getInt32(this.at, true);
    return out;
  }

  float32s(field: string): number[] {
    const n = this.count(field, 4);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++, this.at += 4) out[i] = this.view.getFloat32(this.at, true);
    return out;
  }

  bits(field: string): boolean[] {
    const n = this.count(field, 1);
    const out = new Array<boolean>(n);
    for (let i = 0; i < n; i++) {
      const v = this.bytes[this.at + i];
      if (v > 1) throw this.fail(field, `element ${i} is ${v}, not 0 or 1`);
      out[i] = v === 1;
    }
    this.at += n;
    return out;
  }

  end(): void {
    if (this.at !== this.bytes.length) throw this.fail('end', `${this.bytes.length - this.at} trailing bytes`);
  }
}
