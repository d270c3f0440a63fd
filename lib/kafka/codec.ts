/**
 * The binary codec of the Kafka bridge: tasks, trajectories (and failed samples), weight announcements and
 * workers' heartbeats.
 *
 * Every message starts with a 4-byte header — the magic bytes `r x`, the codec version (2) and the message
 * kind — followed by the fields in a fixed order, little-endian:
 *
 * | type | bytes |
 * | --- | --- |
 * | `u8`, `u32`, `f64` | 1, 4, 8 |
 * | string | `u32` byte length + UTF-8 (checked) |
 * | optional x | `u8` flag (0 or 1) + x |
 * | int32 / float32 / uint8 array | `u32` element count + raw elements (4, 4, 1 bytes each) |
 *
 * Token ids travel as int32 arrays and log-probs as float32 arrays, never as JSON number lists: a 64-token
 * response costs 256 bytes of ids and 256 of log-probs. Log-probs are rounded to float32 on the wire, which is
 * the precision the trainer computes in. Only a task's free-form `metadata` is JSON.
 *
 * Decoding checks the schema — header, kind, every length against the bytes left, UTF-8, enum values, that the
 * response arrays agree in length, finite rewards, no trailing bytes — and throws a {@link DecodeError} naming the
 * field, so a poison message can go to the dead-letter topic with a precise reason.
 *
 * @packageDocumentation
 */
import { AbortError, DecodeError, EngineError, EvaluationError, RxrlError } from '../core/errors.js';
import type { FinishReason, SampleFailure, Task, Trajectory } from '../core/types.js';
import { isSampleFailure } from '../core/types.js';
import { EncodeError } from './errors.js';
import type { HeartbeatMessage, TaskMessage, TrajectoryMessage, WeightsMessage } from './types.js';
import { WORKER_ID_MAX_LENGTH, workerIdProblem } from './workerId.js';

/**
 * Version of the wire format written by this module (the third header byte). 2: a task carries its reference output
 * (`response`, after `epoch`); a reader refuses any other version with a {@link DecodeError}.
 */
export const CODEC_VERSION = 2;

/** First two bytes of every message: `r`, `x`. */
const MAGIC = [0x72, 0x78] as const;
const HEADER_BYTES = 4;
/** Largest string accepted on decode (bytes). */
export const CODEC_MAX_STRING_BYTES = 16 * 1024 * 1024;
/** Largest array accepted on decode (elements). */
export const CODEC_MAX_ARRAY_LENGTH = 16 * 1024 * 1024;

/** Message kinds (the fourth header byte). */
export const MESSAGE_KINDS = {
  task: 1,
  trajectory: 2,
  sampleFailure: 3,
  weightsVersion: 4,
  runEnd: 5,
  heartbeat: 6,
} as const;

/** Name of a message kind. */
export type MessageKind = keyof typeof MESSAGE_KINDS;

const FINISH_REASONS: readonly FinishReason[] = ['stop', 'length', 'abort'];
const HEX_SHA256 = /^[0-9a-f]{64}$/;
const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

// ── public API ───────────────────────────────────────────────────────────────

/** Encodes an admitted task. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeTaskMessage(message: TaskMessage): Uint8Array {
  return encoding(MESSAGE_KINDS.task, (w) => {
    w.str(message.run, 'run');
    w.safeInteger(message.index, 'index');
    w.u32(message.minVersion, 'minVersion');
    w.u32(message.samples, 'samples');
    w.u32(message.sampling.maxTokens, 'sampling.maxTokens');
    w.finite(message.sampling.temperature, 'sampling.temperature');
    w.finite(message.sampling.topP, 'sampling.topP');
    w.finite(message.sampling.seed, 'sampling.seed');
    writeTask(w, message.task);
  });
}

/** Decodes an admitted task. @throws {@link DecodeError} naming the field that breaks the schema. */
export function decodeTaskMessage(bytes: Uint8Array): TaskMessage {
  const r = new Reader(bytes, ['task']);
  const run = r.str('run');
  const index = r.safeInteger('index');
  const minVersion = r.u32('minVersion');
  const samples = r.u32('samples');
  if (samples < 1) throw r.fail('samples', 'a task needs at least one sample');
  const maxTokens = r.u32('sampling.maxTokens');
  const temperature = r.finite('sampling.temperature');
  const topP = r.finite('sampling.topP');
  if (!(temperature >= 0)) throw r.fail('sampling.temperature', `temperature ${temperature} is negative`);
  if (!(topP > 0 && topP <= 1)) throw r.fail('sampling.topP', `topP ${topP} is not in (0, 1]`);
  const seed = r.finite('sampling.seed');
  const task = readTask(r);
  r.end();
  return { run, index, minVersion, samples, sampling: { maxTokens, temperature, topP, seed }, task };
}

/** Encodes a trajectory or a failed sample. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeTrajectoryMessage(message: TrajectoryMessage): Uint8Array {
  const { output } = message;
  if (isSampleFailure(output)) {
    return encoding(MESSAGE_KINDS.sampleFailure, (w) => {
      w.str(message.run, 'run');
      writeIds(w, output);
      w.str(output.error.name, 'error.name');
      w.str(output.error.message, 'error.message');
      // Flags: bit 0 the error is retriable, bit 1 the sample was skipped (a multi-agent slot never played).
      w.u8(((output.error as { retriable?: unknown }).retriable === true ? 1 : 0) | (output.skipped === true ? 2 : 0));
    });
  }
  const t = output;
  const n = t.responseTokens.length;
  if (t.logprobs.length !== n || t.lossMask.length !== n) {
    throw new EncodeError(
      `trajectory ${t.id}: responseTokens (${n}), logprobs (${t.logprobs.length}) and lossMask (${t.lossMask.length}) differ in length`,
      { context: { id: t.id } },
    );
  }
  if (!Number.isFinite(t.reward)) {
    throw new EncodeError(`trajectory ${t.id}: reward ${t.reward} is not finite`, { context: { id: t.id } });
  }
  return encoding(MESSAGE_KINDS.trajectory, (w) => {
    w.str(message.run, 'run');
    writeIds(w, t);
    w.u32(t.policyVersion, 'policyVersion');
    w.int32s(t.promptTokens, 'promptTokens');
    w.int32s(t.responseTokens, 'responseTokens');
    w.float32s(t.logprobs, 'logprobs');
    w.bits(t.lossMask, 'lossMask');
    w.f64(t.reward);
    const reason = FINISH_REASONS.indexOf(t.finishReason);
    if (reason < 0) {
      throw new EncodeError(`trajectory ${t.id}: unknown finishReason '${String(t.finishReason)}'`, { context: { id: t.id } });
    }
    w.u8(reason);
    const names = Object.keys(t.metrics);
    w.u32(names.length, 'metrics');
    for (const name of names) {
      w.str(name, 'metrics');
      w.f64(t.metrics[name]);
    }
    writeTask(w, t.task);
  });
}

/** Decodes a trajectory or a failed sample. @throws {@link DecodeError} naming the field that breaks the schema. */
export function decodeTrajectoryMessage(bytes: Uint8Array): TrajectoryMessage {
  const r = new Reader(bytes, ['trajectory', 'sampleFailure']);
  const run = r.str('run');
  const ids = readIds(r);
  if (r.kind === MESSAGE_KINDS.sampleFailure) {
    const name = r.str('error.name');
    const message = r.str('error.message');
    const flags = r.u8('error.flags');
    if (flags > 3) throw r.fail('error.flags', `flags must be within 0..3, got ${flags}`);
    r.end();
    const failure: SampleFailure = {
      kind: 'sample-failure',
      id: ids.id,
      taskId: ids.taskId,
      groupId: ids.groupId,
      runId: ids.runId,
      modelTag: ids.modelTag,
      error: remoteError(name, message, (flags & 1) === 1),
      ...((flags & 2) === 2 ? { skipped: true } : {}),
    };
    return { run, output: failure };
  }
  const policyVersion = r.u32('policyVersion');
  const promptTokens = r.int32s('promptTokens');
  const responseTokens = r.int32s('responseTokens');
  const logprobs = r.float32s('logprobs');
  const lossMask = r.bits('lossMask');
  if (logprobs.length !== responseTokens.length || lossMask.length !== responseTokens.length) {
    throw r.fail(
      'logprobs',
      `responseTokens (${responseTokens.length}), logprobs (${logprobs.length}) and lossMask (${lossMask.length}) differ in length`,
    );
  }
  const reward = r.f64('reward');
  if (!Number.isFinite(reward)) throw r.fail('reward', `reward ${reward} is not finite`);
  const reasonIndex = r.u8('finishReason');
  const finishReason = FINISH_REASONS[reasonIndex];
  if (finishReason === undefined) throw r.fail('finishReason', `unknown finish reason ${reasonIndex}`);
  const metricCount = r.count('metrics', 1 + 4 + 8);
  const metrics: Record<string, number> = {};
  for (let i = 0; i < metricCount; i++) {
    const name = r.str('metrics');
    metrics[name] = r.f64('metrics');
  }
  const task = readTask(r);
  r.end();
  if (task.id !== ids.taskId) throw r.fail('task.id', `task id '${task.id}' differs from taskId '${ids.taskId}'`);
  // Built field by field: object spread is an order of magnitude slower here, and this is the hot path.
  const trajectory: Trajectory = {
    id: ids.id,
    taskId: ids.taskId,
    groupId: ids.groupId,
    runId: ids.runId,
    modelTag: ids.modelTag,
    policyVersion,
    promptTokens,
    responseTokens,
    logprobs,
    lossMask,
    reward,
    finishReason,
    metrics,
    task,
  };
  return { run, output: trajectory };
}

/** Encodes a weight announcement or the end of a run. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeWeightsMessage(message: WeightsMessage): Uint8Array {
  if (message.kind === 'end') {
    return encoding(MESSAGE_KINDS.runEnd, (w) => {
      w.str(message.run, 'run');
      w.u32(message.version, 'version');
      w.f64(message.timestamp);
    });
  }
  if (!HEX_SHA256.test(message.sha256)) {
    throw new EncodeError(`sha256 must be 64 lower-case hex digits, got '${message.sha256}'`);
  }
  return encoding(MESSAGE_KINDS.weightsVersion, (w) => {
    w.str(message.run, 'run');
    w.u32(message.version, 'version');
    w.str(message.modelTag, 'modelTag');
    w.str(message.path, 'path');
    w.safeInteger(message.bytes, 'bytes');
    w.str(message.sha256, 'sha256');
    w.f64(message.timestamp);
  });
}

/** Decodes a weight announcement or the end of a run. @throws {@link DecodeError} naming the failing field. */
export function decodeWeightsMessage(bytes: Uint8Array): WeightsMessage {
  const r = new Reader(bytes, ['weightsVersion', 'runEnd']);
  const run = r.str('run');
  const version = r.u32('version');
  if (r.kind === MESSAGE_KINDS.runEnd) {
    const timestamp = r.f64('timestamp');
    r.end();
    return { kind: 'end', run, version, timestamp };
  }
  const modelTag = r.str('modelTag');
  const path = r.str('path');
  if (path.length === 0) throw r.fail('path', 'empty path');
  const size = r.safeInteger('bytes');
  const sha256 = r.str('sha256');
  if (!HEX_SHA256.test(sha256)) throw r.fail('sha256', 'not 64 lower-case hex digits');
  const timestamp = r.f64('timestamp');
  r.end();
  return { kind: 'version', run, version, modelTag, path, bytes: size, sha256, timestamp };
}

/** Encodes a worker's heartbeat. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeHeartbeatMessage(message: HeartbeatMessage): Uint8Array {
  return encoding(MESSAGE_KINDS.heartbeat, (w) => {
    w.str(message.worker, 'worker');
    w.str(message.run, 'run');
    w.u32(message.inFlight, 'inFlight');
    w.safeInteger(message.done, 'done');
    w.safeInteger(message.failed, 'failed');
    w.optional(message.version, (v) => w.u32(v, 'version'));
    w.u8(message.leaving ? 1 : 0);
    w.finite(message.timestamp, 'timestamp');
  });
}

/**
 * Decodes a worker's heartbeat. The worker id must be a valid one (`workerIdProblem`): an id over its bound is refused
 * from its length prefix, before it is read.
 *
 * @throws {@link DecodeError} naming the failing field.
 */
export function decodeHeartbeatMessage(bytes: Uint8Array): HeartbeatMessage {
  const r = new Reader(bytes, ['heartbeat']);
  const worker = r.str('worker', WORKER_ID_MAX_LENGTH);
  const problem = workerIdProblem(worker);
  if (problem !== undefined) throw r.fail('worker', problem);
  const run = r.str('run');
  const inFlight = r.u32('inFlight');
  const done = r.safeInteger('done');
  const failed = r.safeInteger('failed');
  const version = r.flag('version') ? r.u32('version') : undefined;
  const leaving = r.flag('leaving');
  const timestamp = r.finite('timestamp');
  r.end();
  return { worker, run, inFlight, done, failed, ...(version === undefined ? {} : { version }), leaving, timestamp };
}

/**
 * The kind of an encoded message, read from its header, or `undefined` when the header is not this codec's
 * (wrong magic, unknown version or kind).
 */
export function messageKindOf(bytes: Uint8Array): MessageKind | undefined {
  if (bytes.length < HEADER_BYTES || bytes[0] !== MAGIC[0] || bytes[1] !== MAGIC[1] || bytes[2] !== CODEC_VERSION) {
    return undefined;
  }
  return (Object.keys(MESSAGE_KINDS) as MessageKind[]).find((k) => MESSAGE_KINDS[k] === bytes[3]);
}

// ── shared structures ────────────────────────────────────────────────────────

type Ids = Pick<Trajectory, 'id' | 'taskId' | 'groupId' | 'runId' | 'modelTag'>;

function writeIds(w: Writer, ids: Ids): void {
  w.str(ids.id, 'id');
  w.str(ids.taskId, 'taskId');
  w.str(ids.groupId, 'groupId');
  w.u32(ids.runId, 'runId');
  w.str(ids.modelTag, 'modelTag');
}

function readIds(r: Reader): Ids {
  const id = r.nonEmptyStr('id');
  const taskId = r.nonEmptyStr('taskId');
  const groupId = r.nonEmptyStr('groupId');
  const runId = r.u32('runId');
  const modelTag = r.str('modelTag');
  return { id, taskId, groupId, runId, modelTag };
}

function writeTask(w: Writer, task: Task): void {
  w.str(task.id, 'task.id');
  w.str(task.prompt, 'task.prompt');
  w.optional(task.answer, (a) => w.str(a, 'task.answer'));
  w.optional(task.metadata, (m) => {
    let json: string | undefined;
    try {
      json = JSON.stringify(m);
    } catch (cause) {
      throw new EncodeError(`task ${task.id}: metadata is not JSON-serializable`, { cause, context: { taskId: task.id } });
    }
    w.str(json, 'task.metadata');
  });
  w.optional(task.epoch, (e) => w.u32(e, 'task.epoch'));
  w.optional(task.response, (r) => w.str(r, 'task.response'));
}

function readTask(r: Reader): Task {
  const id = r.nonEmptyStr('task.id');
  const prompt = r.str('task.prompt');
  const answer = r.flag('task.answer') ? r.str('task.answer') : undefined;
  let metadata: Record<string, unknown> | undefined;
  if (r.flag('task.metadata')) {
    const json = r.str('task.metadata');
    let parsed: unknown;
    try {
      parsed = JSON.parse(json);
    } catch (cause) {
      throw r.fail('task.metadata', 'metadata is not valid JSON', cause);
    }
    if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
      throw r.fail('task.metadata', 'metadata must be a JSON object');
    }
    metadata = parsed as Record<string, unknown>;
  }
  const epoch = r.flag('task.epoch') ? r.u32('task.epoch') : undefined;
  const response = r.flag('task.response') ? r.str('task.response') : undefined;
  const task: { -readonly [K in keyof Task]: Task[K] } = { id, prompt };
  if (answer !== undefined) task.answer = answer;
  if (response !== undefined) task.response = response;
  if (metadata !== undefined) task.metadata = metadata;
  if (epoch !== undefined) task.epoch = epoch;
  return task;
}

/** Rebuilds a typed error from a failed sample's name and message. */
function remoteError(name: string, message: string, retriable: boolean): Error {
  const options = { retriable, context: { remote: true, remoteName: name } };
  switch (name) {
    case 'EvaluationError':
      return new EvaluationError(message, options);
    case 'EngineError':
      return new EngineError(message, options);
    case 'AbortError':
      return new AbortError(message, options);
    default:
      return new RxrlError(message, options);
  }
}

// ── writer and reader ────────────────────────────────────────────────────────

/**
 * Encoding goes through one scratch buffer, reused across calls (a fresh `Uint8Array` per message costs more than
 * the encoding itself); `finish` copies the bytes out into a pooled `Buffer`. A nested encode (user code run from
 * inside one, such as a metadata `toJSON`) gets a private buffer.
 */
let scratch: Uint8Array = new Uint8Array(1 << 16);
let scratchView: DataView = new DataView(scratch.buffer);
let scratchBusy = false;

/** Runs `body` with a writer for a message of `kind` and returns the encoded bytes. */
function encoding(kind: number, body: (w: Writer) => void): Uint8Array {
  const owned = !scratchBusy;
  scratchBusy = true;
  const w = new Writer(kind, owned);
  try {
    body(w);
    return w.finish();
  } finally {
    if (owned) scratchBusy = false;
  }
}

class Writer {
  private buf: Uint8Array;
  private view: DataView;
  private at = HEADER_BYTES;

  constructor(
    kind: number,
    private readonly owned: boolean,
  ) {
    this.buf = owned ? scratch : new Uint8Array(1024);
    this.view = owned ? scratchView : new DataView(this.buf.buffer);
    const b = this.buf;
    b[0] = MAGIC[0];
    b[1] = MAGIC[1];
    b[2] = CODEC_VERSION;
    b[3] = kind;
  }

  private ensure(n: number): void {
    if (this.at + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.at + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.at));
    this.buf = next;
    this.view = new DataView(next.buffer);
    if (this.owned) {
      scratch = next;
      scratchView = this.view;
    }
  }

  u8(value: number): void {
    this.ensure(1);
    this.buf[this.at++] = value;
  }

  u32(value: number, field: string): void {
    if (value >>> 0 !== value) {
      throw new EncodeError(`${field} must be an integer in [0, 2^32), got ${value}`, { context: { field } });
    }
    this.ensure(4);
    this.view.setUint32(this.at, value, true);
    this.at += 4;
  }

  safeInteger(value: number, field: string): void {
    if (!(Number.isSafeInteger(value) && value >= 0)) {
      throw new EncodeError(`${field} must be a non-negative safe integer, got ${value}`, { context: { field } });
    }
    this.f64(value);
  }

  finite(value: number, field: string): void {
    if (!Number.isFinite(value)) throw new EncodeError(`${field} must be a finite number, got ${value}`, { context: { field } });
    this.f64(value);
  }

  f64(value: number): void {
    this.ensure(8);
    this.view.setFloat64(this.at, value, true);
    this.at += 8;
  }

  str(value: string, field: string): void {
    if (typeof value !== 'string') throw new EncodeError(`${field} must be a string`, { context: { field } });
    const n = value.length;
    // ASCII fast path (ids, prompts): one byte per UTF-16 unit, written in place.
    this.ensure(4 + n);
    const start = this.at + 4;
    let i = 0;
    for (; i < n; i++) {
      const c = value.charCodeAt(i);
      if (c > 0x7f) break;
      this.buf[start + i] = c;
    }
    if (i === n) {
      this.view.setUint32(this.at, n, true);
      this.at = start + n;
      return;
    }
    const bytes = utf8.encode(value);
    this.u32(bytes.length, field);
    this.ensure(bytes.length);
    this.buf.set(bytes, this.at);
    this.at += bytes.length;
  }

  optional<V>(value: V | undefined, write: (value: V) => void): void {
    if (value === undefined) {
      this.u8(0);
    } else {
      this.u8(1);
      write(value);
    }
  }

  int32s(values: readonly number[], field: string): void {
    const n = values.length;
    this.u32(n, field);
    this.ensure(4 * n);
    const view = this.view;
    let at = this.at;
    for (let i = 0; i < n; i++, at += 4) {
      const v = values[i];
      if ((v | 0) !== v) throw new EncodeError(`${field}[${i}] = ${v} is not an int32`, { context: { field, index: i } });
      view.setInt32(at, v, true);
    }
    this.at = at;
  }

  float32s(values: readonly number[], field: string): void {
    const n = values.length;
    this.u32(n, field);
    this.ensure(4 * n);
    const view = this.view;
    let at = this.at;
    for (let i = 0; i < n; i++, at += 4) {
      const v = values[i];
      if (typeof v !== 'number') throw new EncodeError(`${field}[${i}] is not a number`, { context: { field, index: i } });
      view.setFloat32(at, v, true);
    }
    this.at = at;
  }

  bits(values: readonly number[], field: string): void {
    const n = values.length;
    this.u32(n, field);
    this.ensure(n);
    const buf = this.buf;
    const at = this.at;
    for (let i = 0; i < n; i++) {
      const v = values[i];
      if (v !== 0 && v !== 1) throw new EncodeError(`${field}[${i}] = ${v} is not 0 or 1`, { context: { field, index: i } });
      buf[at + i] = v;
    }
    this.at = at + n;
  }

  /** The encoded bytes, copied into a pooled `Buffer` (a view: copy it before mutating it in place). */
  finish(): Uint8Array {
    const out = Buffer.allocUnsafe(this.at);
    out.set(this.buf.subarray(0, this.at));
    return out;
  }
}

class Reader {
  readonly kind: number;
  private readonly view: DataView;
  private at = HEADER_BYTES;

  constructor(
    private readonly bytes: Uint8Array,
    allowed: readonly MessageKind[],
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    if (bytes.length < HEADER_BYTES) throw this.fail('header', `message of ${bytes.length} bytes is shorter than its header`);
    if (bytes[0] !== MAGIC[0] || bytes[1] !== MAGIC[1]) throw this.fail('header', 'not an rxrl message (bad magic bytes)');
    if (bytes[2] !== CODEC_VERSION) {
      throw this.fail('header', `codec version ${bytes[2]} is not supported (this reader knows ${CODEC_VERSION})`);
    }
    this.kind = bytes[3];
    if (!allowed.some((k) => MESSAGE_KINDS[k] === this.kind)) {
      const name = (Object.keys(MESSAGE_KINDS) as MessageKind[]).find((k) => MESSAGE_KINDS[k] === this.kind);
      throw this.fail('header', `message kind ${name ?? this.kind} is not one of ${allowed.join(', ')}`);
    }
  }

  fail(field: string, reason: string, cause?: unknown): DecodeError {
    return new DecodeError(`cannot decode ${field}: ${reason}`, { cause, context: { field, offset: this.at } });
  }

  private need(n: number, field: string): void {
    if (this.at + n > this.bytes.length) {
      throw this.fail(field, `needs ${n} bytes at offset ${this.at}, message has ${this.bytes.length}`);
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

  finite(field: string): number {
    const v = this.f64(field);
    if (!Number.isFinite(v)) throw this.fail(field, `${v} is not finite`);
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
    if (n > CODEC_MAX_ARRAY_LENGTH || this.at + n * minBytes > this.bytes.length) {
      throw this.fail(field, `count ${n} does not fit in the ${this.bytes.length - this.at} bytes left`);
    }
    return n;
  }

  /** A string of at most `maxBytes` bytes (checked on its length prefix, before it is read). */
  str(field: string, maxBytes = CODEC_MAX_STRING_BYTES): string {
    const n = this.u32(field);
    if (n > maxBytes) throw this.fail(field, `string of ${n} bytes exceeds ${maxBytes}`);
    this.need(n, field);
    const bytes = this.bytes;
    const start = this.at;
    // ASCII fast path: short strings decode faster by hand than through TextDecoder.
    if (n <= 64) {
      let value = '';
      let i = start;
      for (; i < start + n; i++) {
        const c = bytes[i];
        if (c > 0x7f) break;
        value += String.fromCharCode(c);
      }
      if (i === start + n) {
        this.at += n;
        return value;
      }
    }
    let value: string;
    try {
      value = strictUtf8.decode(bytes.subarray(start, start + n));
    } catch (cause) {
      throw this.fail(field, 'invalid UTF-8', cause);
    }
    this.at += n;
    return value;
  }

  nonEmptyStr(field: string): string {
    const value = this.str(field);
    if (value.length === 0) throw this.fail(field, 'empty string');
    return value;
  }

  int32s(field: string): number[] {
    const n = this.count(field, 4);
    const out = new Array<number>(n);
    const view = this.view;
    let at = this.at;
    for (let i = 0; i < n; i++, at += 4) out[i] = view.getInt32(at, true);
    this.at = at;
    return out;
  }

  float32s(field: string): number[] {
    const n = this.count(field, 4);
    const out = new Array<number>(n);
    const view = this.view;
    let at = this.at;
    for (let i = 0; i < n; i++, at += 4) out[i] = view.getFloat32(at, true);
    this.at = at;
    return out;
  }

  bits(field: string): number[] {
    const n = this.count(field, 1);
    const out = new Array<number>(n);
    for (let i = 0; i < n; i++) {
      const v = this.bytes[this.at + i];
      if (v > 1) throw this.fail(field, `element ${i} is ${v}, not 0 or 1`);
      out[i] = v;
    }
    this.at += n;
    return out;
  }

  end(): void {
    if (this.at !== this.bytes.length) throw this.fail('end', `${this.bytes.length - this.at} trailing bytes`);
  }
}
