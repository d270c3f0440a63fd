/**
 * The records of the Kafka bridge — tasks, trajectories (and failed samples), weight announcements and workers'
 * heartbeats — as the Protocol Buffers messages of `proto/rxrl/v1/records.proto` (package `rxrl.v1`), so that any
 * consumer can read them: Python, Java, Flink or ksqlDB with classes generated from that file. The message types
 * and their encoders and decoders (lib/kafka/schema/records.ts) are generated from it by `npm run proto`
 * (scripts/proto-gen.mjs); this module maps them to rxrl's types and checks
 * what the wire cannot say (non-empty ids, arrays of one length, finite rewards, a digest of 64 hex digits).
 *
 * Every decoder reads three formats, told apart by the first byte:
 *
 * | first byte | format |
 * | --- | --- |
 * | `0x00` | the Confluent wire format of a schema registry: magic byte, 4-byte schema id, message indexes, then the message |
 * | `0x72` (`r`) | rxrl's earlier binary codec (`rx`, version 2): topics written before the schema |
 * | anything else | the message's plain Protocol Buffers encoding |
 *
 * Encoders write the plain encoding; `lib/kafka/schemaRegistry.ts` frames it for a registry.
 *
 * Token ids travel as packed `int32`, log-probs as packed `float` (rounded to float32, the precision the trainer
 * computes in). A task's free-form `metadata` travels as JSON text.
 *
 * A record that breaks the schema throws a {@link DecodeError} naming the field, so a poison message can go to the
 * dead-letter topic with a precise reason.
 *
 * @packageDocumentation
 */
import { AbortError, DecodeError, EngineError, EvaluationError, RxrlError } from '../core/errors.js';
import type { FinishReason, SampleFailure, Task, Trajectory } from '../core/types.js';
import { isSampleFailure } from '../core/types.js';
import { EncodeError } from './errors.js';
import { isLegacyRecord, readLegacyHeartbeat, readLegacyTask, readLegacyTrajectory, readLegacyWeights } from './legacyCodec.js';
import * as pb from './schema/records.js';
import type { HeartbeatMessage, RolloutTimes, TaskMessage, TrajectoryMessage, WeightsMessage } from './types.js';
import { WORKER_ID_MAX_LENGTH, workerIdProblem } from './workerId.js';

/** The schema's package: the `rxrl.v1` messages of `proto/rxrl/v1/records.proto`. */
export const RECORD_SCHEMA_PACKAGE = pb.PACKAGE;

/** The message type of each topic's records (full Protocol Buffers names). */
export const RECORD_TYPES = {
  tasks: 'rxrl.v1.TaskRecord',
  trajectories: 'rxrl.v1.TrajectoryRecord',
  weights: 'rxrl.v1.WeightsRecord',
  heartbeats: 'rxrl.v1.Heartbeat',
} as const;

const FINISH_REASONS: Readonly<Record<FinishReason, pb.FinishReason>> = {
  stop: pb.FinishReason.STOP,
  length: pb.FinishReason.LENGTH,
  abort: pb.FinishReason.ABORT,
};
const FINISH_REASON_NAMES: readonly (FinishReason | undefined)[] = [undefined, 'stop', 'length', 'abort'];
const HEX_SHA256 = /^[0-9a-f]{64}$/;
/** First byte of a record in a schema registry's wire format. */
const CONFLUENT_MAGIC = 0;

// ── public API ───────────────────────────────────────────────────────────────

/** Encodes an admitted task. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeTaskMessage(message: TaskMessage): Uint8Array {
  const { sampling } = message;
  return pb.encodeTaskRecord({
    run: message.run,
    index: uint64(message.index, 'index'),
    minVersion: uint32(message.minVersion, 'minVersion'),
    samples: uint32(message.samples, 'samples'),
    sampling: {
      maxTokens: uint32(sampling.maxTokens, 'sampling.maxTokens'),
      temperature: finite(sampling.temperature, 'sampling.temperature'),
      topP: finite(sampling.topP, 'sampling.topP'),
      seed: finite(sampling.seed, 'sampling.seed'),
      // Written only when set, so a record without it is byte for byte what writers before the field wrote.
      ...(sampling.ignoreEos === true ? { ignoreEos: true } : {}),
    },
    task: taskInit(message.task),
  });
}

/** Decodes an admitted task. @throws {@link DecodeError} naming the field that breaks the schema. */
export function decodeTaskMessage(bytes: Uint8Array): TaskMessage {
  const record = parse(bytes, 'rxrl.v1.TaskRecord', pb.decodeTaskRecord, readLegacyTask);
  const { sampling } = record;
  if (record.samples < 1) throw fail('samples', 'a task needs at least one sample');
  if (sampling === undefined) throw fail('sampling', 'missing');
  const { maxTokens, temperature, topP, seed, ignoreEos } = sampling;
  if (!(temperature >= 0 && Number.isFinite(temperature))) {
    throw fail('sampling.temperature', `temperature ${temperature} is negative or not finite`);
  }
  if (!(topP > 0 && topP <= 1)) throw fail('sampling.topP', `topP ${topP} is not in (0, 1]`);
  if (!Number.isFinite(seed)) throw fail('sampling.seed', `${seed} is not finite`);
  return {
    run: record.run,
    index: record.index,
    minVersion: record.minVersion,
    samples: record.samples,
    sampling: { maxTokens, temperature, topP, seed, ...(ignoreEos === true ? { ignoreEos } : {}) },
    task: taskOf(record.task, 'task'),
  };
}

/** Encodes a trajectory or a failed sample. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeTrajectoryMessage(message: TrajectoryMessage): Uint8Array {
  const { output } = message;
  const producedUnixMs = message.producedAt === undefined ? 0 : finite(message.producedAt, 'producedAt');
  if (isSampleFailure(output)) {
    const failure: pb.SampleFailure = {
      ...idsInit(output),
      errorName: output.error.name,
      errorMessage: output.error.message,
      retriable: (output.error as { retriable?: unknown }).retriable === true,
      skipped: output.skipped === true,
    };
    return pb.encodeTrajectoryRecord({ run: message.run, output: { case: 'failure', value: failure }, producedUnixMs });
  }
  const value = trajectoryInit(output, message.times);
  return pb.encodeTrajectoryRecord({ run: message.run, output: { case: 'trajectory', value }, producedUnixMs });
}

/** Decodes a trajectory or a failed sample. @throws {@link DecodeError} naming the field that breaks the schema. */
export function decodeTrajectoryMessage(bytes: Uint8Array): TrajectoryMessage {
  const record = parse(bytes, 'rxrl.v1.TrajectoryRecord', pb.decodeTrajectoryRecord, readLegacyTrajectory);
  const { output } = record;
  let message: { -readonly [K in keyof TrajectoryMessage]: TrajectoryMessage[K] };
  if (output?.case === 'failure') {
    const f = output.value;
    const failure: SampleFailure = {
      kind: 'sample-failure',
      ...idsOf(f),
      error: remoteError(f.errorName, f.errorMessage, f.retriable),
      ...(f.skipped ? { skipped: true } : {}),
    };
    message = { run: record.run, output: failure };
  } else if (output?.case === 'trajectory') {
    message = { run: record.run, output: trajectoryOf(output.value) };
    if (output.value.times !== undefined) message.times = timesOf(output.value.times);
  } else {
    throw fail('output', 'neither a trajectory nor a failed sample');
  }
  if (record.producedUnixMs !== 0) message.producedAt = finiteRead(record.producedUnixMs, 'producedUnixMs');
  return message;
}

/** Encodes a weight announcement or the end of a run. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeWeightsMessage(message: WeightsMessage): Uint8Array {
  const version = uint32(message.version, 'version');
  const timestampUnixMs = finite(message.timestamp, 'timestamp');
  if (message.kind === 'end') {
    return pb.encodeWeightsRecord({ run: message.run, event: { case: 'end', value: { version, timestampUnixMs } } });
  }
  if (!HEX_SHA256.test(message.sha256)) {
    throw new EncodeError(`sha256 must be 64 lower-case hex digits, got '${message.sha256}'`);
  }
  const value = {
    version,
    modelTag: message.modelTag,
    path: message.path,
    bytes: uint64(message.bytes, 'bytes'),
    sha256: message.sha256,
    timestampUnixMs,
  };
  return pb.encodeWeightsRecord({ run: message.run, event: { case: 'version', value } });
}

/** Decodes a weight announcement or the end of a run. @throws {@link DecodeError} naming the failing field. */
export function decodeWeightsMessage(bytes: Uint8Array): WeightsMessage {
  const { run, event } = parse(bytes, 'rxrl.v1.WeightsRecord', pb.decodeWeightsRecord, readLegacyWeights);
  if (event?.case === 'end') {
    return { kind: 'end', run, version: event.value.version, timestamp: finiteRead(event.value.timestampUnixMs, 'timestamp') };
  }
  if (event?.case !== 'version') throw fail('event', 'neither a weights version nor a run end');
  const v = event.value;
  if (v.path.length === 0) throw fail('path', 'empty path');
  if (!HEX_SHA256.test(v.sha256)) throw fail('sha256', 'not 64 lower-case hex digits');
  const timestamp = finiteRead(v.timestampUnixMs, 'timestamp');
  return { kind: 'version', run, version: v.version, modelTag: v.modelTag, path: v.path, bytes: v.bytes, sha256: v.sha256, timestamp };
}

/** Encodes a worker's heartbeat. @throws {@link EncodeError} when a field breaks the schema. */
export function encodeHeartbeatMessage(message: HeartbeatMessage): Uint8Array {
  return pb.encodeHeartbeat({
    worker: message.worker,
    run: message.run,
    inFlight: uint32(message.inFlight, 'inFlight'),
    done: uint64(message.done, 'done'),
    failed: uint64(message.failed, 'failed'),
    ...(message.version === undefined ? {} : { version: uint32(message.version, 'version') }),
    leaving: message.leaving,
    timestampUnixMs: finite(message.timestamp, 'timestamp'),
  });
}

/**
 * Decodes a worker's heartbeat. The worker id must be a valid one (`workerIdProblem`); in a legacy record an id over
 * its bound is refused from its length prefix, before it is read.
 *
 * @throws {@link DecodeError} naming the failing field.
 */
export function decodeHeartbeatMessage(bytes: Uint8Array): HeartbeatMessage {
  const beat = parse(bytes, 'rxrl.v1.Heartbeat', pb.decodeHeartbeat, readLegacyHeartbeat);
  if (beat.worker.length > WORKER_ID_MAX_LENGTH)
    throw fail('worker', `string of ${beat.worker.length} characters exceeds ${WORKER_ID_MAX_LENGTH}`);
  const problem = workerIdProblem(beat.worker);
  if (problem !== undefined) throw fail('worker', problem);
  const version = beat.version === undefined ? {} : { version: beat.version };
  return {
    worker: beat.worker,
    run: beat.run,
    inFlight: beat.inFlight,
    done: beat.done,
    failed: beat.failed,
    ...version,
    leaving: beat.leaving,
    timestamp: finiteRead(beat.timestampUnixMs, 'timestamp'),
  };
}

/**
 * The format of a record, read from its first bytes: `protobuf` (plain), `confluent` (a schema registry's wire
 * format), `rx2` (the earlier codec), or `undefined` for an empty value.
 */
export function recordFormatOf(bytes: Uint8Array): 'protobuf' | 'confluent' | 'rx2' | undefined {
  if (bytes.length === 0) return undefined;
  if (bytes[0] === CONFLUENT_MAGIC) return 'confluent';
  return isLegacyRecord(bytes) ? 'rx2' : 'protobuf';
}

// ── parsing ──────────────────────────────────────────────────────────────────

/** Parses `bytes` as a `type` record in any of the three formats. */
function parse<T>(
  bytes: Uint8Array,
  type: keyof typeof pb.MESSAGE_INDEXES,
  decode: (bytes: Uint8Array) => T,
  legacy: (bytes: Uint8Array) => T,
): T {
  if (bytes.length === 0) throw fail('value', `an empty value is not a ${type} record`);
  if (isLegacyRecord(bytes)) return legacy(bytes);
  const body = bytes[0] === CONFLUENT_MAGIC ? unframe(bytes, type) : bytes;
  try {
    return decode(body);
  } catch (error) {
    if (!(error instanceof DecodeError)) throw error;
    throw new DecodeError(`not a ${type} record (${error.message})`, { cause: error, context: { ...error.context, type } });
  }
}

/**
 * The message inside a schema registry's framing: magic byte 0, the schema id (4 bytes, big-endian), the message's
 * indexes in its file (a zigzag varint count, then each index; a lone 0 means `[0]`).
 */
function unframe(bytes: Uint8Array, type: keyof typeof pb.MESSAGE_INDEXES): Uint8Array {
  if (bytes.length < 6) throw fail('value', `a schema registry record needs at least 6 bytes, got ${bytes.length}`);
  let at = 5;
  const varint = (): number => {
    let value = 0;
    for (let shift = 0; shift < 35; shift += 7) {
      if (at >= bytes.length) throw fail('value', 'the message indexes run past the record');
      const b = bytes[at++];
      value |= (b & 0x7f) << shift;
      if ((b & 0x80) === 0) return (value >>> 1) ^ -(value & 1);
    }
    throw fail('value', 'a message index is not a varint');
  };
  const count = varint();
  if (count < 0 || count > 8) throw fail('value', `a message index path of ${count} elements`);
  const path = count === 0 ? [0] : Array.from({ length: count }, varint);
  const expected = pb.MESSAGE_INDEXES[type];
  if (path.length !== 1 || path[0] !== expected) {
    throw fail('value', `schema registry record of message index [${path.join(', ')}], not ${type} (index [${expected}])`);
  }
  return bytes.subarray(at);
}

// ── mapping ──────────────────────────────────────────────────────────────────

type Ids = Pick<Trajectory, 'id' | 'taskId' | 'groupId' | 'runId' | 'modelTag'>;

function idsInit(ids: Ids): Ids {
  return { id: ids.id, taskId: ids.taskId, groupId: ids.groupId, runId: uint32(ids.runId, 'runId'), modelTag: ids.modelTag };
}

function idsOf(ids: Ids): Ids {
  return {
    id: nonEmpty(ids.id, 'id'),
    taskId: nonEmpty(ids.taskId, 'taskId'),
    groupId: nonEmpty(ids.groupId, 'groupId'),
    runId: ids.runId,
    modelTag: ids.modelTag,
  };
}

function trajectoryInit(t: Trajectory, times: RolloutTimes | undefined): pb.Trajectory {
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
  const finishReason = FINISH_REASONS[t.finishReason];
  if (finishReason === undefined) {
    throw new EncodeError(`trajectory ${t.id}: unknown finishReason '${String(t.finishReason)}'`, { context: { id: t.id } });
  }
  // Built field by field: object spread is an order of magnitude slower, and this is the hot path.
  return {
    id: t.id,
    taskId: t.taskId,
    groupId: t.groupId,
    runId: uint32(t.runId, 'runId'),
    modelTag: t.modelTag,
    policyVersion: uint32(t.policyVersion, 'policyVersion'),
    promptTokens: int32s(t.promptTokens, 'promptTokens'),
    responseTokens: int32s(t.responseTokens, 'responseTokens'),
    logprobs: t.logprobs as number[],
    // Checked to be 0 or 1 and passed on as they are: the writer writes a 0 or 1 as false or true.
    lossMask: bits(t.lossMask, 'lossMask') as unknown as boolean[],
    reward: t.reward,
    finishReason,
    metrics: t.metrics as Record<string, number>,
    task: taskInit(t.task),
    responseText: t.responseText,
    times:
      times === undefined
        ? undefined
        : {
            generateStartUnixMs: finite(times.generateStart, 'times.generateStart'),
            generateEndUnixMs: finite(times.generateEnd, 'times.generateEnd'),
            rewardEndUnixMs: finite(times.rewardEnd, 'times.rewardEnd'),
          },
  };
}

function trajectoryOf(t: pb.Trajectory): Trajectory {
  const n = t.responseTokens.length;
  if (t.logprobs.length !== n || t.lossMask.length !== n) {
    throw fail('logprobs', `responseTokens (${n}), logprobs (${t.logprobs.length}) and lossMask (${t.lossMask.length}) differ in length`);
  }
  if (!Number.isFinite(t.reward)) throw fail('reward', `reward ${t.reward} is not finite`);
  const finishReason = FINISH_REASON_NAMES[t.finishReason];
  if (finishReason === undefined) throw fail('finishReason', `unknown finish reason ${t.finishReason}`);
  const task = taskOf(t.task, 'task');
  if (task.id !== t.taskId) throw fail('task.id', `task id '${task.id}' differs from taskId '${t.taskId}'`);
  const lossMask = new Array<number>(n);
  for (let i = 0; i < n; i++) lossMask[i] = t.lossMask[i] ? 1 : 0;
  const trajectory: { -readonly [K in keyof Trajectory]: Trajectory[K] } = {
    id: nonEmpty(t.id, 'id'),
    taskId: nonEmpty(t.taskId, 'taskId'),
    groupId: nonEmpty(t.groupId, 'groupId'),
    runId: t.runId,
    modelTag: t.modelTag,
    policyVersion: t.policyVersion,
    promptTokens: t.promptTokens,
    responseTokens: t.responseTokens,
    logprobs: t.logprobs,
    lossMask,
    reward: t.reward,
    finishReason,
    metrics: t.metrics,
    task,
  };
  if (t.responseText !== undefined) trajectory.responseText = t.responseText;
  return trajectory;
}

function timesOf(times: pb.RolloutTimes): RolloutTimes {
  return {
    generateStart: finiteRead(times.generateStartUnixMs, 'times.generateStart'),
    generateEnd: finiteRead(times.generateEndUnixMs, 'times.generateEnd'),
    rewardEnd: finiteRead(times.rewardEndUnixMs, 'times.rewardEnd'),
  };
}

function taskInit(task: Task): pb.Task {
  let metadataJson: string | undefined;
  if (task.metadata !== undefined) {
    try {
      metadataJson = JSON.stringify(task.metadata);
    } catch (cause) {
      throw new EncodeError(`task ${task.id}: metadata is not JSON-serializable`, { cause, context: { taskId: task.id } });
    }
  }
  return {
    id: task.id,
    prompt: task.prompt,
    answer: task.answer,
    response: task.response,
    metadataJson,
    epoch: task.epoch === undefined ? undefined : uint32(task.epoch, 'task.epoch'),
  };
}

function taskOf(task: pb.Task | undefined, field: string): Task {
  if (task === undefined) throw fail(field, 'missing');
  nonEmpty(task.id, `${field}.id`);
  // Without metadata the decoded message is the task already (the same fields, absent ones left out).
  if (task.metadataJson === undefined) return task as Task;
  const out: { -readonly [K in keyof Task]: Task[K] } = { id: task.id, prompt: task.prompt };
  if (task.answer !== undefined) out.answer = task.answer;
  if (task.response !== undefined) out.response = task.response;
  if (task.metadataJson !== undefined) out.metadata = metadataOf(task.metadataJson, `${field}.metadata`);
  if (task.epoch !== undefined) out.epoch = task.epoch;
  return out;
}

function metadataOf(json: string, field: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(json);
  } catch (cause) {
    throw fail(field, 'metadata is not valid JSON', cause);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) throw fail(field, 'metadata must be a JSON object');
  return parsed as Record<string, unknown>;
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

// ── field checks ─────────────────────────────────────────────────────────────

function fail(field: string, reason: string, cause?: unknown): DecodeError {
  return new DecodeError(`cannot decode ${field}: ${reason}`, { cause, context: { field } });
}

function finiteRead(value: number, field: string): number {
  if (!Number.isFinite(value)) throw fail(field, `${value} is not finite`);
  return value;
}

function nonEmpty(value: string, field: string): string {
  if (value.length === 0) throw fail(field, 'empty string');
  return value;
}

function uint32(value: number, field: string): number {
  if (value >>> 0 !== value) throw new EncodeError(`${field} must be an integer in [0, 2^32), got ${value}`, { context: { field } });
  return value;
}

function uint64(value: number, field: string): number {
  if (!(Number.isSafeInteger(value) && value >= 0)) {
    throw new EncodeError(`${field} must be a non-negative safe integer, got ${value}`, { context: { field } });
  }
  return value;
}

function finite(value: number, field: string): number {
  if (!Number.isFinite(value)) throw new EncodeError(`${field} must be a finite number, got ${value}`, { context: { field } });
  return value;
}

function int32s(values: readonly number[], field: string): number[] {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if ((v | 0) !== v) throw new EncodeError(`${field}[${i}] = ${v} is not an int32`, { context: { field, index: i } });
  }
  return values as number[];
}

function bits(values: readonly number[], field: string): readonly number[] {
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (v !== 0 && v !== 1) throw new EncodeError(`${field}[${i}] = ${v} is not 0 or 1`, { context: { field, index: i } });
  }
  return values;
}
