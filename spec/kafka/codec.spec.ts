/**
 * The Kafka record codec (lib/kafka/codec.ts): the rxrl.v1 Protocol Buffers records of proto/rxrl/v1/records.proto,
 * read in their three formats (plain protobuf, a schema registry's Confluent framing, the earlier `rx` codec version
 * 2), and what it refuses on either side. Hostile bytes are built by hand with the helpers below.
 */
import { readFileSync } from 'node:fs';

import { describe, expect, it } from 'vitest';

import { AbortError, DecodeError, EngineError, EvaluationError, RxrlError, isRetriable } from '../../lib/core/errors.js';
import { isSampleFailure, type SampleFailure, type Trajectory } from '../../lib/core/types.js';
import {
  decodeHeartbeatMessage,
  decodeTaskMessage,
  decodeTrajectoryMessage,
  decodeWeightsMessage,
  encodeHeartbeatMessage,
  encodeTaskMessage,
  encodeTrajectoryMessage,
  encodeWeightsMessage,
  recordFormatOf,
} from '../../lib/kafka/codec.js';
import { EncodeError } from '../../lib/kafka/errors.js';
import * as pb from '../../lib/kafka/schema/records.js';
import { framed as frameWith } from '../../lib/kafka/schemaRegistry.js';
import type { HeartbeatMessage, TaskMessage, TrajectoryMessage, WeightsMessage } from '../../lib/kafka/types.js';
import { WORKER_ID_MAX_LENGTH, workerIdOf, workerIdProblem } from '../../lib/kafka/workerId.js';
import { failure, traj } from '../helpers/fixtures.js';

// ── helpers ──────────────────────────────────────────────────────────────────

const f32 = (x: number): number => Math.fround(x);

/** The DecodeError `f` throws (the spec fails when it throws nothing or anything else). */
function decodeError(f: () => unknown): DecodeError {
  try {
    f();
  } catch (error) {
    expect(error).toBeInstanceOf(DecodeError);
    return error as DecodeError;
  }
  throw new Error('expected a DecodeError');
}

/** What a DecodeError of the Protocol Buffers layer says: the record type expected, then the wire reader's reason. */
const notA = (type: string, reason: string): string => `not a rxrl.v1.${type} record (cannot decode ${reason})`;

/** The field a DecodeError names. */
const fieldOf = (f: () => unknown): unknown => decodeError(f).context.field;

/** A non-negative integer (up to 2^64) as a protobuf varint. */
function varint(value: number | bigint): number[] {
  let v = BigInt(value);
  const out: number[] = [];
  while (v > 0x7fn) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

/** A field's tag. */
const tag = (field: number, wire: number): number[] => varint(field * 8 + wire);

/** A length-delimited field. */
const delimited = (field: number, bytes: ArrayLike<number>): number[] => [...tag(field, 2), ...varint(bytes.length), ...Array.from(bytes)];

/** A double field. */
function double(field: number, value: number): number[] {
  const bytes = new Uint8Array(8);
  new DataView(bytes.buffer).setFloat64(0, value, true);
  return [...tag(field, 1), ...bytes];
}

const ascii = (text: string): number[] => Array.from(Buffer.from(text, 'utf8'));
const cat = (...parts: ArrayLike<number>[]): Uint8Array => Uint8Array.from(parts.flatMap((p) => Array.from(p)));
const fromHex = (hex: string): Uint8Array => Uint8Array.from(Buffer.from(hex, 'hex'));

/** A seeded linear congruential generator in [0, 1) (32-bit products: `Math.imul`, so no bits are lost to rounding). */
function lcg(seed: number): () => number {
  let s = seed;
  return () => {
    s = (Math.imul(s, 1103515245) + 12345) & 0x7fffffff;
    return s / 0x80000000;
  };
}

/** A record framed as a schema registry frames it: magic 0, schema id 7, the zigzag message-index array, the message. */
function framed(indexes: readonly number[], plain: Uint8Array, schemaId = 7): Uint8Array {
  const zigzag = (n: number): number[] => varint((n << 1) ^ (n >> 31));
  const path = indexes.length === 1 && indexes[0] === 0 ? [0] : [...zigzag(indexes.length), ...indexes.flatMap(zigzag)];
  const id = [(schemaId >>> 24) & 0xff, (schemaId >>> 16) & 0xff, (schemaId >>> 8) & 0xff, schemaId & 0xff];
  return cat([0], id, path, plain);
}

// ── fixtures ─────────────────────────────────────────────────────────────────

const taskMessage: TaskMessage = {
  run: 'run-1',
  index: 17,
  minVersion: 3,
  samples: 8,
  sampling: { maxTokens: 5, temperature: 0.7, topP: 0.95, seed: 42 },
  task: { id: 'täsk-1', prompt: 'abcd=', answer: 'dcba', response: 'dcba!', metadata: { level: 2, tags: ['x'] }, epoch: 1 },
};

const trajectory: Trajectory = traj('t1@0', 3, {
  policyVersion: 7,
  promptTokens: [1, 5, 6, 7],
  responseTokens: [8, 9, 2],
  logprobs: [-0.1, -2.5, -0.001],
  lossMask: [1, 0, 1],
  reward: 0.75,
  finishReason: 'length',
  metrics: { accuracy: 0.5, format: 1 },
  task: { id: 't1', prompt: 'ab=', answer: 'ba' },
});

const fullTrajectory: TrajectoryMessage = {
  run: 'run-1',
  output: { ...trajectory, responseText: 'ba' },
  producedAt: 1_700_000_000_123,
  times: { generateStart: 1_700_000_000_000, generateEnd: 1_700_000_000_050.5, rewardEnd: 1_700_000_000_100 },
};

const weightsVersion: WeightsMessage = {
  kind: 'version',
  run: 'run-1',
  version: 4,
  modelTag: 'policy',
  path: '/shared/run-1/v4.safetensors',
  bytes: 400_128,
  sha256: 'a'.repeat(64),
  timestamp: 1_700_000_000_000,
};

const beat: HeartbeatMessage = {
  worker: 'host-12-ab',
  run: 'run-1',
  inFlight: 3,
  done: 41,
  failed: 2,
  version: 7,
  leaving: false,
  timestamp: 1_700_000_000_000,
};

/** A plain trajectory record field by field (for hand-built variants): `extra` bytes are appended inside the Trajectory. */
function trajectoryRecordBytes(overrides: Partial<pb.Trajectory> = {}, extra: number[] = []): Uint8Array {
  const value: pb.Trajectory = {
    id: 'g@0/0',
    taskId: 'g',
    groupId: 'g@0',
    runId: 0,
    modelTag: 'policy',
    policyVersion: 1,
    promptTokens: [1, 2],
    responseTokens: [3, 4],
    logprobs: [-0.5, -0.25],
    lossMask: [true, true],
    reward: 1,
    finishReason: pb.FinishReason.STOP,
    metrics: {},
    task: { id: 'g', prompt: 'p' },
    ...overrides,
  };
  return cat(delimited(1, ascii('r')), delimited(2, cat(pb.encodeTrajectory(value), extra)));
}

// ── tasks ────────────────────────────────────────────────────────────────────

describe('codec: tasks', () => {
  it('round-trips every field, optional ones included and omitted (no keys for absent ones)', () => {
    expect(decodeTaskMessage(encodeTaskMessage(taskMessage))).toEqual(taskMessage);
    const bare: TaskMessage = { ...taskMessage, run: 'r', index: 0, minVersion: 0, task: { id: 't', prompt: '' } };
    const decoded = decodeTaskMessage(encodeTaskMessage(bare));
    expect(decoded).toEqual(bare);
    expect(Object.keys(decoded.task)).toEqual(['id', 'prompt']);
    // An optional field set to its zero value is present, not absent.
    const zeros: TaskMessage = { ...bare, task: { id: 't', prompt: '', answer: '', response: '', metadata: {}, epoch: 0 } };
    expect(decodeTaskMessage(encodeTaskMessage(zeros))).toEqual(zeros);
    const big: TaskMessage = { ...taskMessage, index: Number.MAX_SAFE_INTEGER, minVersion: 2 ** 32 - 1 };
    expect(decodeTaskMessage(encodeTaskMessage(big))).toEqual(big);
  });

  it('carries sampling.ignoreEos when set; without it (or false) the record is what writers before the field wrote', () => {
    const ignoring: TaskMessage = { ...taskMessage, sampling: { ...taskMessage.sampling, ignoreEos: true } };
    expect(decodeTaskMessage(encodeTaskMessage(ignoring))).toEqual(ignoring);
    expect(decodeTaskMessage(encodeTaskMessage(ignoring)).sampling.ignoreEos).toBe(true);
    const before = encodeTaskMessage(taskMessage);
    expect(encodeTaskMessage({ ...taskMessage, sampling: { ...taskMessage.sampling, ignoreEos: false } })).toEqual(before);
    expect(Object.keys(decodeTaskMessage(before).sampling)).toEqual(['maxTokens', 'temperature', 'topP', 'seed']);
    // Field 5 of Sampling, a varint: the only bytes the field adds.
    expect(encodeTaskMessage(ignoring).length - before.length).toBe(2);
    expect(pb.decodeTaskRecord(encodeTaskMessage(ignoring)).sampling).toMatchObject({ ignoreEos: true });
    // Written as false by another writer: read as not set.
    const explicitFalse = pb.encodeTaskRecord({
      ...pb.decodeTaskRecord(before),
      sampling: { ...pb.decodeTaskRecord(before).sampling!, ignoreEos: false },
    });
    expect(decodeTaskMessage(explicitFalse)).toEqual(taskMessage);
  });

  it('keeps text as it was: non-ASCII, long, and a leading U+FEFF (a byte-order mark is not dropped)', () => {
    for (const prompt of ['\uFEFFabc', '\uFEFF', 'é'.repeat(100), `\uFEFF${'x'.repeat(100)}`, '😀 ∑ \u0000 end']) {
      const message: TaskMessage = { ...taskMessage, task: { id: 't', prompt, answer: prompt } };
      expect(decodeTaskMessage(encodeTaskMessage(message)).task).toEqual(message.task);
    }
  });

  it('refuses values that break the schema on encode', () => {
    expect(() => encodeTaskMessage({ ...taskMessage, minVersion: -1 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...taskMessage, index: 1.5 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...taskMessage, index: 2 ** 53 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...taskMessage, samples: 2 ** 32 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...taskMessage, sampling: { ...taskMessage.sampling, temperature: Number.NaN } })).toThrow(
      EncodeError,
    );
    expect(() => encodeTaskMessage({ ...taskMessage, sampling: { ...taskMessage.sampling, maxTokens: 1.5 } })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...taskMessage, task: { id: 't', prompt: 'p', epoch: -1 } })).toThrow(EncodeError);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(() => encodeTaskMessage({ ...taskMessage, task: { id: 't', prompt: 'p', metadata: cyclic } })).toThrow(EncodeError);
  });

  it('checks the schema on decode and names the failing field', () => {
    const record = (overrides: Partial<pb.TaskRecord>): Uint8Array =>
      pb.encodeTaskRecord({
        run: 'r',
        index: 0,
        minVersion: 0,
        samples: 1,
        sampling: { maxTokens: 1, temperature: 1, topP: 1, seed: 0 },
        task: { id: 't', prompt: 'p' },
        ...overrides,
      });
    const sampling = (s: Partial<pb.Sampling>): pb.Sampling => ({ maxTokens: 1, temperature: 1, topP: 1, seed: 0, ...s });
    expect(decodeTaskMessage(record({})).task).toEqual({ id: 't', prompt: 'p' });
    expect(fieldOf(() => decodeTaskMessage(record({ samples: 0 })))).toBe('samples');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: undefined })))).toBe('sampling');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: sampling({ temperature: -1 }) })))).toBe('sampling.temperature');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: sampling({ temperature: Infinity }) })))).toBe('sampling.temperature');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: sampling({ topP: 0 }) })))).toBe('sampling.topP');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: sampling({ topP: 1.5 }) })))).toBe('sampling.topP');
    expect(fieldOf(() => decodeTaskMessage(record({ sampling: sampling({ seed: Number.NaN }) })))).toBe('sampling.seed');
    expect(fieldOf(() => decodeTaskMessage(record({ task: undefined })))).toBe('task');
    expect(fieldOf(() => decodeTaskMessage(record({ task: { id: '', prompt: 'p' } })))).toBe('task.id');
    expect(fieldOf(() => decodeTaskMessage(record({ task: { id: 't', prompt: 'p', metadataJson: '{' } })))).toBe('task.metadata');
    expect(fieldOf(() => decodeTaskMessage(record({ task: { id: 't', prompt: 'p', metadataJson: '[1]' } })))).toBe('task.metadata');
  });
});

// ── trajectories ─────────────────────────────────────────────────────────────

describe('codec: trajectories', () => {
  it('round-trips a trajectory with its response text, times and production time; log-probs are rounded to float32', () => {
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage(fullTrajectory));
    expect(decoded).toEqual({ ...fullTrajectory, output: { ...fullTrajectory.output, logprobs: trajectory.logprobs.map(f32) } });
    expect(Object.keys(decoded).sort()).toEqual(['output', 'producedAt', 'run', 'times']);
  });

  it('leaves out what was not given: no keys for responseText, times or producedAt (producedAt 0 means not given)', () => {
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: trajectory }));
    expect(decoded).toEqual({ run: 'r', output: { ...trajectory, logprobs: trajectory.logprobs.map(f32) } });
    expect(Object.keys(decoded)).toEqual(['run', 'output']);
    expect(Object.keys(decoded.output)).not.toContain('responseText');
    expect(Object.keys((decoded.output as Trajectory).task)).toEqual(['id', 'prompt', 'answer']);
    expect(Object.keys(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: trajectory, producedAt: 0 })))).toEqual([
      'run',
      'output',
    ]);
    // An empty response text and all-zero times are given, so they are kept.
    const zero = decodeTrajectoryMessage(
      encodeTrajectoryMessage({
        run: '',
        output: { ...trajectory, responseText: '' },
        times: { generateStart: 0, generateEnd: 0, rewardEnd: 0 },
      }),
    );
    expect((zero.output as Trajectory).responseText).toBe('');
    expect(zero.times).toEqual({ generateStart: 0, generateEnd: 0, rewardEnd: 0 });
    expect(zero.run).toBe('');
  });

  it('round-trips negative and large token ids, empty arrays and every finish reason', () => {
    const ids = [-1, -(2 ** 31), 2 ** 31 - 1, 0, 127, 128, 16_384, 151_643];
    const wide = traj('w@0', 0, { promptTokens: ids, responseTokens: [], logprobs: [], lossMask: [], finishReason: 'abort' });
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: wide })).output).toEqual(wide);
    const stop = traj('s@0', 1, { promptTokens: [], finishReason: 'stop', reward: -0 });
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: stop })).output).toEqual({ ...stop, reward: 0 });
  });

  it('packs token ids as varints: 1000 prompt and 1000 response ids under 128, 1000 log-probs and mask bits stay under 8.5 KB', () => {
    const long = traj('t1@0', 0, {
      responseTokens: Array.from({ length: 1000 }, (_, i) => i % 50),
      logprobs: Array.from({ length: 1000 }, () => -1.25),
      lossMask: Array.from({ length: 1000 }, () => 1),
      promptTokens: Array.from({ length: 1000 }, (_, i) => i % 128),
    });
    const bytes = encodeTrajectoryMessage({ run: 'r', output: long });
    // 1000 × (1 prompt + 1 response + 4 log-prob + 1 mask) bytes, plus ids, tags and lengths.
    expect(bytes.length).toBeGreaterThan(7_000);
    expect(bytes.length).toBeLessThan(8_500);
    expect(decodeTrajectoryMessage(bytes).output).toEqual(long);
  });

  it('refuses inconsistent trajectories on encode', () => {
    const refuses = (output: Partial<Trajectory>): void =>
      expect(() => encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, ...output } })).toThrow(EncodeError);
    refuses({ logprobs: [-1] });
    refuses({ lossMask: [1, 1] });
    refuses({ reward: Number.NaN });
    refuses({ reward: Infinity });
    refuses({ responseTokens: [8, 9.5, 2] });
    refuses({ promptTokens: [2 ** 31] });
    refuses({ lossMask: [1, 2, 1] });
    refuses({ runId: -1 });
    refuses({ policyVersion: 0.5 });
    refuses({ finishReason: 'eos' as Trajectory['finishReason'] });
    // Times and the production time are finite numbers, of a trajectory and of a failed sample.
    const times = { generateStart: 1, generateEnd: 2, rewardEnd: 3 };
    for (const bad of [Number.NaN, Infinity, -Infinity]) {
      expect(() => encodeTrajectoryMessage({ run: 'r', output: trajectory, times: { ...times, generateEnd: bad } })).toThrow(EncodeError);
      expect(() => encodeTrajectoryMessage({ run: 'r', output: trajectory, producedAt: bad })).toThrow(EncodeError);
      expect(() => encodeTrajectoryMessage({ run: 'r', output: failure('f@0', 0), producedAt: bad })).toThrow(EncodeError);
    }
  });

  it('checks the schema on decode and names the failing field', () => {
    const good = trajectoryRecordBytes();
    expect(decodeTrajectoryMessage(good).output.id).toBe('g@0/0');
    expect(fieldOf(() => decodeTrajectoryMessage(cat(delimited(1, ascii('r')))))).toBe('output');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ logprobs: [-1] })))).toBe('logprobs');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ lossMask: [true, true, false] })))).toBe('logprobs');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ reward: Number.NaN })))).toBe('reward');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ finishReason: pb.FinishReason.UNSPECIFIED })))).toBe(
      'finishReason',
    );
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ finishReason: 9 as pb.FinishReason })))).toBe('finishReason');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ task: undefined })))).toBe('task');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ task: { id: 'other', prompt: 'p' } })))).toBe('task.id');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ id: '' })))).toBe('id');
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryRecordBytes({ groupId: '' })))).toBe('groupId');
  });
});

describe('codec: failed samples', () => {
  it('round-trips a failed sample as a typed error', () => {
    const failed: SampleFailure = { ...failure('t2@1', 4), error: new EvaluationError('evaluator exploded') };
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: failed })).output;
    expect(isSampleFailure(decoded)).toBe(true);
    const out = decoded as SampleFailure;
    expect(out).toMatchObject({ kind: 'sample-failure', id: 't2@1/4', taskId: 't2', groupId: 't2@1', runId: 4, modelTag: 'policy' });
    expect(Object.keys(out)).toEqual(['kind', 'id', 'taskId', 'groupId', 'runId', 'modelTag', 'error']);
    expect(out.error).toBeInstanceOf(EvaluationError);
    expect(out.error.message).toBe('evaluator exploded');
    expect(isRetriable(out.error)).toBe(false);
    const aborted = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: { ...failed, error: new AbortError('stop') } }));
    expect((aborted.output as SampleFailure).error).toBeInstanceOf(AbortError);
    // An error rxrl has no class for comes back as an RxrlError that remembers its name.
    const other = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: failure('t3@0', 0), producedAt: 5 }));
    expect(other.producedAt).toBe(5);
    const error = (other.output as SampleFailure).error as RxrlError;
    expect(error).toBeInstanceOf(RxrlError);
    expect([error.message, error.context.remoteName]).toEqual(['boom', 'Error']);
  });

  it('round-trips a skipped multi-agent slot (its group shrinks without an error to report) and the retriable flag', () => {
    const skipped: SampleFailure = {
      ...failure('t2@1/editor/1', 0),
      modelTag: 'editor',
      error: new EngineError('timeout', { retriable: true }),
      skipped: true,
    };
    const out = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: skipped })).output as SampleFailure;
    expect(out).toMatchObject({ kind: 'sample-failure', groupId: 't2@1/editor/1', modelTag: 'editor', skipped: true });
    expect(out.error).toBeInstanceOf(EngineError);
    expect(isRetriable(out.error)).toBe(true);
    const plain = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: { ...skipped, skipped: undefined } }))
      .output as SampleFailure;
    expect(plain.skipped).toBeUndefined();
    expect(Object.keys(plain)).not.toContain('skipped');
  });

  it('refuses a failed sample without ids on decode', () => {
    const record = (f: Partial<pb.SampleFailure>): Uint8Array =>
      pb.encodeTrajectoryRecord({
        run: 'r',
        producedUnixMs: 0,
        output: {
          case: 'failure',
          value: {
            id: 'g@0/0',
            taskId: 'g',
            groupId: 'g@0',
            runId: 0,
            modelTag: '',
            errorName: '',
            errorMessage: '',
            retriable: false,
            skipped: false,
            ...f,
          },
        },
      });
    expect((decodeTrajectoryMessage(record({})).output as SampleFailure).error).toBeInstanceOf(RxrlError);
    expect(fieldOf(() => decodeTrajectoryMessage(record({ id: '' })))).toBe('id');
    expect(fieldOf(() => decodeTrajectoryMessage(record({ taskId: '' })))).toBe('taskId');
    expect(fieldOf(() => decodeTrajectoryMessage(record({ groupId: '' })))).toBe('groupId');
  });
});

// ── weights and heartbeats ───────────────────────────────────────────────────

describe('codec: weights', () => {
  it('round-trips announcements and run ends', () => {
    expect(decodeWeightsMessage(encodeWeightsMessage(weightsVersion))).toEqual(weightsVersion);
    const large: WeightsMessage = { ...weightsVersion, version: 0, bytes: 2 ** 40 + 3, timestamp: 0 };
    expect(decodeWeightsMessage(encodeWeightsMessage(large))).toEqual(large);
    const end: WeightsMessage = { kind: 'end', run: 'run-1', version: 9, timestamp: 5 };
    expect(decodeWeightsMessage(encodeWeightsMessage(end))).toEqual(end);
    const bareEnd: WeightsMessage = { kind: 'end', run: '', version: 0, timestamp: 0 };
    expect(decodeWeightsMessage(encodeWeightsMessage(bareEnd))).toEqual(bareEnd);
  });

  it('refuses on encode what the schema cannot hold', () => {
    expect(() => encodeWeightsMessage({ ...weightsVersion, sha256: 'xyz' })).toThrow(EncodeError);
    expect(() => encodeWeightsMessage({ ...weightsVersion, sha256: 'A'.repeat(64) })).toThrow(EncodeError);
    expect(() => encodeWeightsMessage({ ...weightsVersion, bytes: 1.5 })).toThrow(EncodeError);
    expect(() => encodeWeightsMessage({ ...weightsVersion, version: -1 })).toThrow(EncodeError);
    expect(() => encodeWeightsMessage({ kind: 'end', run: 'r', version: 1, timestamp: Number.NaN })).toThrow(EncodeError);
  });

  it('checks the digest, the path and the event on decode', () => {
    const bytes = Uint8Array.from(encodeWeightsMessage(weightsVersion));
    const digest = Buffer.from(bytes).indexOf('a'.repeat(64));
    expect(digest).toBeGreaterThan(0);
    bytes[digest + 63] = 'G'.charCodeAt(0);
    expect(fieldOf(() => decodeWeightsMessage(bytes))).toBe('sha256');
    const version = (v: Partial<pb.WeightsVersion>): Uint8Array =>
      pb.encodeWeightsRecord({
        run: 'r',
        event: {
          case: 'version',
          value: { version: 1, modelTag: 'm', path: '/w', bytes: 1, sha256: 'b'.repeat(64), timestampUnixMs: 1, ...v },
        },
      });
    expect(decodeWeightsMessage(version({})).kind).toBe('version');
    expect(fieldOf(() => decodeWeightsMessage(version({ path: '' })))).toBe('path');
    expect(fieldOf(() => decodeWeightsMessage(version({ sha256: '' })))).toBe('sha256');
    expect(fieldOf(() => decodeWeightsMessage(pb.encodeWeightsRecord({ run: 'r' })))).toBe('event');
  });
});

describe('codec: heartbeats', () => {
  it('round-trips a heartbeat, with and without a version, and the last one', () => {
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage(beat))).toEqual(beat);
    const { version: _v, ...first } = beat;
    const decoded = decodeHeartbeatMessage(encodeHeartbeatMessage({ ...first, run: '', leaving: true }));
    expect(decoded).toEqual({ ...first, run: '', leaving: true });
    expect(Object.keys(decoded)).not.toContain('version');
    // Version 0 is a version (proto3 `optional`): present, not absent.
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, version: 0 })).version).toBe(0);
    const counts = { ...beat, done: Number.MAX_SAFE_INTEGER, failed: 2 ** 32, inFlight: 2 ** 32 - 1, timestamp: 0 };
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage(counts))).toEqual(counts);
  });

  it('refuses a broken heartbeat with a DecodeError naming the field, and another record type', () => {
    expect(() => encodeHeartbeatMessage({ ...beat, inFlight: -1 })).toThrow(EncodeError);
    expect(() => encodeHeartbeatMessage({ ...beat, done: 2 ** 53 })).toThrow(EncodeError);
    expect(() => encodeHeartbeatMessage({ ...beat, timestamp: Infinity })).toThrow(EncodeError);
    expect(fieldOf(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: '' })))).toBe('worker');
    const bytes = encodeHeartbeatMessage(beat);
    expect(() => decodeHeartbeatMessage(bytes.subarray(0, bytes.length - 3))).toThrow(DecodeError);
    const nan = pb.encodeHeartbeat({ worker: 'w', run: '', inFlight: 0, done: 0, failed: 0, leaving: false, timestampUnixMs: Number.NaN });
    expect(fieldOf(() => decodeHeartbeatMessage(nan))).toBe('timestamp');
    // A run end is not a heartbeat: its field 3 (a message) is the heartbeat's in_flight (a varint).
    const end = encodeWeightsMessage({ kind: 'end', run: 'r', version: 1, timestamp: 0 });
    const error = decodeError(() => decodeHeartbeatMessage(end));
    expect(error.message).toBe(notA('Heartbeat', 'rxrl.v1.Heartbeat field 3: wire type 2 is not the one its type takes'));
    expect(error.context).toMatchObject({ field: 'rxrl.v1.Heartbeat field 3', type: 'rxrl.v1.Heartbeat' });
  });

  it('bounds the worker id: over WORKER_ID_MAX_LENGTH or outside [A-Za-z0-9._:@-] is a DecodeError with the exact reason', () => {
    const longest = 'w'.repeat(WORKER_ID_MAX_LENGTH);
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: longest })).worker).toBe(longest);
    const huge = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: 'w'.repeat(540 * 1024) })));
    expect(huge.message).toBe(`cannot decode worker: string of ${540 * 1024} characters exceeds ${WORKER_ID_MAX_LENGTH}`);
    expect(huge.context).toMatchObject({ field: 'worker' });
    const over = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: `${longest}w` })));
    expect(over.message).toBe(`cannot decode worker: string of ${WORKER_ID_MAX_LENGTH + 1} characters exceeds ${WORKER_ID_MAX_LENGTH}`);
    for (const [worker, reason] of [
      ['w-1\u001b]0;owned\u0007', 'U+001B at index 3'],
      ['w 1', 'U+0020 at index 1'],
      ['wé', 'U+00E9 at index 1'],
      ['w\n', 'U+000A at index 1'],
      ['\uFEFFw', 'U+FEFF at index 0'],
    ] as const) {
      const error = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker })));
      expect(error.message).toBe(`cannot decode worker: ${workerIdProblem(worker)}`);
      expect(error.message).toBe(`cannot decode worker: worker id has ${reason}, outside [A-Za-z0-9._:@-]`);
    }
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: 'host-1.lan:9@pod_7' })).worker).toBe('host-1.lan:9@pod_7');
  });
});

describe('workerIdOf', () => {
  it('makes a host name into a valid worker id', () => {
    expect(workerIdOf('my host\u001b[2J.local')).toBe('my-host--2J.local');
    expect(workerIdProblem(workerIdOf('x'.repeat(1000)))).toBeUndefined();
    expect(workerIdOf('', 10)).toBe('worker');
  });
});

// ── malformed protobuf ───────────────────────────────────────────────────────

describe('codec: malformed Protocol Buffers records', () => {
  it('refuses a truncated record: every prefix but one cut between top-level fields (protobuf has no end marker)', () => {
    const good = encodeTrajectoryMessage({ run: 'r', output: trajectory });
    for (let n = 0; n < good.length; n++) expect(() => decodeTrajectoryMessage(good.subarray(0, n))).toThrow(DecodeError);
    // With a production time after the trajectory, the record cut just before it is a valid record without one.
    const timed = encodeTrajectoryMessage({ run: 'r', output: trajectory, producedAt: 7 });
    const valid = [];
    for (let n = 0; n < timed.length; n++) {
      try {
        decodeTrajectoryMessage(timed.subarray(0, n));
        valid.push(n);
      } catch (error) {
        expect(error).toBeInstanceOf(DecodeError);
      }
    }
    expect(valid).toEqual([timed.length - 9]);
  });

  it('refuses trailing garbage that is not a field', () => {
    const good = encodeTrajectoryMessage({ run: 'r', output: trajectory });
    const after = (...bytes: number[]): DecodeError => decodeError(() => decodeTrajectoryMessage(cat(good, bytes)));
    expect(after(0).message).toMatch(
      /^not a rxrl.v1.TrajectoryRecord record \(cannot decode rxrl.v1.TrajectoryRecord: field number 0 at offset/,
    );
    expect(after(...tag(99, 0)).message).toMatch(/a varint runs past the record/); // field 99, no value
    expect(after(0x2a, 0x05, 1).message).toMatch(/a part of 5 bytes runs past the record/); // field 5, 5 bytes, 1 there
    expect(after(0x29, 1, 2).message).toMatch(/needs 8 bytes/); // field 5, a double cut short
    expect(after(0x2c).message).toMatch(/wire type 4 is not one protobuf knows here/); // an end-group with no start
    expect(after(0x2f).message).toMatch(/wire type 7/);
    expect(after(0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01).message).toMatch(/a varint longer than ten bytes/);
  });

  it('refuses invalid UTF-8 in a string field, naming the field', () => {
    const run = Uint8Array.from(encodeTrajectoryMessage({ run: 'rr', output: trajectory }));
    expect([run[0], run[1], run[2]]).toEqual([0x0a, 2, 0x72]); // field 1 (run), 2 bytes, 'r'
    run[2] = 0xff;
    expect(decodeError(() => decodeTrajectoryMessage(run)).message).toBe(
      notA('TrajectoryRecord', 'rxrl.v1.TrajectoryRecord.run: invalid UTF-8'),
    );
    // Past the short-string fast path, in a nested message, and a lone continuation byte.
    const prompt = 'p'.repeat(80);
    const bytes = Uint8Array.from(encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, task: { id: 't1', prompt } } }));
    bytes[Buffer.from(bytes).indexOf(prompt) + 40] = 0xc3;
    expect(fieldOf(() => decodeTrajectoryMessage(bytes))).toBe('rxrl.v1.Task.prompt');
    expect(fieldOf(() => decodeHeartbeatMessage(cat(delimited(1, ascii('w')), delimited(2, [0x80]))))).toBe('rxrl.v1.Heartbeat.run');
  });

  it('refuses an empty value', () => {
    for (const [decode, type] of [
      [decodeTaskMessage, 'TaskRecord'],
      [decodeTrajectoryMessage, 'TrajectoryRecord'],
      [decodeWeightsMessage, 'WeightsRecord'],
      [decodeHeartbeatMessage, 'Heartbeat'],
    ] as const) {
      const error = decodeError(() => decode(new Uint8Array(0)));
      expect(error.message).toBe(`cannot decode value: an empty value is not a rxrl.v1.${type} record`);
      expect(error.context.field).toBe('value');
    }
  });

  it('refuses a record of another type: its fields have other wire types', () => {
    // Every task record has samples >= 1, its field 4 (a varint), which is a trajectory record's produced_unix_ms (a
    // double); a task with an index has field 2 (a varint), which is the trajectory (a message).
    const task = (index: number): Uint8Array =>
      encodeTaskMessage({ ...taskMessage, run: 'r', index, minVersion: 0, task: { id: 't', prompt: 'p' } });
    expect(decodeError(() => decodeTrajectoryMessage(task(0))).message).toBe(
      notA('TrajectoryRecord', 'rxrl.v1.TrajectoryRecord field 4: wire type 0 is not the one its type takes'),
    );
    expect(decodeError(() => decodeTrajectoryMessage(task(5))).message).toBe(
      notA('TrajectoryRecord', 'rxrl.v1.TrajectoryRecord field 2: wire type 0 is not the one its type takes'),
    );
    expect(() => decodeTaskMessage(encodeTrajectoryMessage({ run: 'r', output: trajectory }))).toThrow(DecodeError);
    expect(() => decodeWeightsMessage(encodeHeartbeatMessage(beat))).toThrow(DecodeError);
    expect(() => decodeTrajectoryMessage(encodeHeartbeatMessage(beat))).toThrow(DecodeError);
    expect(() => decodeTrajectoryMessage(new TextEncoder().encode('{"json": true}'))).toThrow(DecodeError);
  });
});

describe('codec: malformed fields', () => {
  it('refuses a packed varint array that runs past its length', () => {
    // response_tokens (field 8): 2 bytes, the second starts a varint that ends in the next field's tag.
    const bytes = trajectoryRecordBytes({ responseTokens: [], logprobs: [], lossMask: [] }, [...tag(8, 2), 2, 0x05, 0x85, 0x01]);
    const error = decodeError(() => decodeTrajectoryMessage(bytes));
    expect(error.message).toBe(notA('TrajectoryRecord', 'rxrl.v1.Trajectory.response_tokens: a packed varint runs past its length'));
    const bits = trajectoryRecordBytes({ lossMask: [] }, [...tag(10, 2), 2, 0x01, 0x81, 0x00]);
    expect(fieldOf(() => decodeTrajectoryMessage(bits))).toBe('rxrl.v1.Trajectory.loss_mask');
    const floats = trajectoryRecordBytes({ logprobs: [] }, [...tag(9, 2), 5, 0, 0, 0, 0, 0]);
    expect(decodeError(() => decodeTrajectoryMessage(floats)).message).toMatch(/logprobs: a packed float run of 5 bytes/);
  });

  it('refuses times that are not finite, from writers other than rxrl', () => {
    const t = traj('t1@0', 0);
    const base = {
      ...t,
      promptTokens: [1],
      responseTokens: [2],
      logprobs: [-1],
      lossMask: [true],
      finishReason: pb.FinishReason.STOP,
      task: { id: 't1', prompt: 'p' },
    };
    const produced = pb.encodeTrajectoryRecord({ run: 'r', output: { case: 'trajectory', value: base }, producedUnixMs: Number.NaN });
    expect(fieldOf(() => decodeTrajectoryMessage(produced))).toBe('producedUnixMs');
    const times = { generateStartUnixMs: 1, generateEndUnixMs: Number.POSITIVE_INFINITY, rewardEndUnixMs: 3 };
    const timed = pb.encodeTrajectoryRecord({ run: 'r', output: { case: 'trajectory', value: { ...base, times } }, producedUnixMs: 5 });
    expect(fieldOf(() => decodeTrajectoryMessage(timed))).toBe('times.generateEnd');
    const announced = pb.encodeWeightsRecord({ run: 'r', event: { case: 'end', value: { version: 1, timestampUnixMs: Number.NaN } } });
    expect(fieldOf(() => decodeWeightsMessage(announced))).toBe('timestamp');
  });

  it('refuses a uint64 over 2^53 - 1, naming the field', () => {
    const heartbeat = (done: bigint): Uint8Array => cat(delimited(1, ascii('w')), tag(4, 0), varint(done), double(8, 1));
    expect(decodeHeartbeatMessage(heartbeat(2n ** 53n - 1n)).done).toBe(Number.MAX_SAFE_INTEGER);
    for (const done of [2n ** 53n, 2n ** 53n + 1n, 2n ** 64n - 1n]) {
      const error = decodeError(() => decodeHeartbeatMessage(heartbeat(done)));
      expect(error.context.field).toBe('rxrl.v1.Heartbeat.done');
      expect(error.message).toMatch(/^not a rxrl.v1.Heartbeat record \(cannot decode rxrl.v1.Heartbeat.done: \d+ is over 2\^53 - 1\)$/);
    }
    const task = cat(delimited(1, ascii('r')), tag(2, 0), varint(2n ** 60n));
    expect(fieldOf(() => decodeTaskMessage(task))).toBe('rxrl.v1.TaskRecord.index');
  });

  it('refuses a field of a known number with another wire type than its own', () => {
    const good = encodeHeartbeatMessage(beat);
    const fixed32 = cat(good, tag(1, 5), [1, 2, 3, 4]); // worker is a string, not a fixed32
    expect(decodeError(() => decodeHeartbeatMessage(fixed32)).message).toBe(
      notA('Heartbeat', 'rxrl.v1.Heartbeat field 1: wire type 5 is not the one its type takes'),
    );
    const varintTime = cat(good, tag(8, 0), [1]); // timestamp_unix_ms is a double
    expect(fieldOf(() => decodeHeartbeatMessage(varintTime))).toBe('rxrl.v1.Heartbeat field 8');
    // In a nested message too: Task.epoch (a varint) as a length-delimited part.
    const task = encodeTaskMessage({ ...taskMessage, task: { id: 't', prompt: 'p' } });
    const nested = cat(task, delimited(6, [...delimited(1, ascii('t')), ...delimited(6, [1])]));
    expect(fieldOf(() => decodeTaskMessage(nested))).toBe('rxrl.v1.Task field 6');
  });

  it('refuses a nested message whose fields run past its length, and groups nested too deep', () => {
    // A Sampling of 2 bytes whose double (field 2) needs 9: it reads on into the next field.
    const sampling = cat(delimited(1, ascii('r')), tag(4, 0), [1], tag(5, 2), [2], double(2, 1));
    expect(decodeError(() => decodeTaskMessage(sampling)).message).toMatch(
      /^not a rxrl.v1.TaskRecord record \(cannot decode rxrl.v1.Sampling: a field runs past the message/,
    );
    const deep = cat(
      encodeHeartbeatMessage(beat),
      Array.from({ length: 70 }, () => tag(99, 3)).flat(),
      Array.from({ length: 70 }, () => tag(99, 4)).flat(),
    );
    expect(decodeError(() => decodeHeartbeatMessage(deep)).message).toMatch(/groups nested over 64 deep/);
    const unclosed = cat(encodeHeartbeatMessage(beat), tag(99, 3), tag(98, 0), [1]);
    expect(decodeError(() => decodeHeartbeatMessage(unclosed)).message).toMatch(/a group runs past the record/);
    const mismatched = cat(encodeHeartbeatMessage(beat), tag(99, 3), tag(98, 4));
    expect(decodeError(() => decodeHeartbeatMessage(mismatched)).message).toMatch(/a group ends with another field number/);
  });
});

// ── forward compatibility ────────────────────────────────────────────────────

describe('codec: fields this reader does not know', () => {
  const unknown = [
    [...tag(99, 0), ...varint(300)],
    delimited(99, ascii('a field from a newer schema')),
    [...tag(99, 5), 1, 2, 3, 4],
    [...tag(99, 1), 1, 2, 3, 4, 5, 6, 7, 8],
    [...tag(99, 3), ...tag(1, 0), 1, ...delimited(2, ascii('x')), ...tag(99, 4)],
    [...tag(536_870_911, 0), 0], // the largest field number
  ];

  it('skips unknown fields of every wire type in every record, which still decodes (forward compatibility)', () => {
    const records = [
      [encodeTaskMessage(taskMessage), decodeTaskMessage],
      [encodeTrajectoryMessage(fullTrajectory), decodeTrajectoryMessage],
      [encodeWeightsMessage(weightsVersion), decodeWeightsMessage],
      [encodeHeartbeatMessage(beat), decodeHeartbeatMessage],
    ] as const;
    for (const [bytes, decode] of records) {
      const expected = (decode as (b: Uint8Array) => unknown)(bytes);
      for (const field of unknown) {
        expect((decode as (b: Uint8Array) => unknown)(cat(bytes, field))).toEqual(expected);
        expect((decode as (b: Uint8Array) => unknown)(cat(field, bytes))).toEqual(expected);
      }
    }
  });

  it('skips unknown fields inside nested messages (a trajectory, its task)', () => {
    const expected = decodeTrajectoryMessage(trajectoryRecordBytes());
    for (const field of unknown) {
      expect(decodeTrajectoryMessage(trajectoryRecordBytes({}, field))).toEqual(expected);
      const task = cat(pb.encodeTask({ id: 'g', prompt: 'p' }), field);
      expect(decodeTrajectoryMessage(trajectoryRecordBytes({ task: undefined }, delimited(14, task)))).toEqual(expected);
    }
  });

  it('reads repeated scalars packed or not, and the last occurrence of a singular field', () => {
    const expected = decodeTrajectoryMessage(trajectoryRecordBytes());
    const unpacked = [
      ...[1, 2].flatMap((t) => [...tag(7, 0), t]),
      ...[3, 4].flatMap((t) => [...tag(8, 0), t]),
      ...[-0.5, -0.25].flatMap((p) => {
        const b = new Uint8Array(4);
        new DataView(b.buffer).setFloat32(0, p, true);
        return [...tag(9, 5), ...b];
      }),
      ...tag(10, 0),
      1,
      ...tag(10, 0),
      1,
    ];
    const bytes = trajectoryRecordBytes({ promptTokens: [], responseTokens: [], logprobs: [], lossMask: [] }, unpacked);
    expect(decodeTrajectoryMessage(bytes)).toEqual(expected);
    // Two packed runs of one field are one array.
    const split = trajectoryRecordBytes({ promptTokens: [1] }, delimited(7, [2]));
    expect((decodeTrajectoryMessage(split).output as Trajectory).promptTokens).toEqual([1, 2]);
    const twice = cat(encodeHeartbeatMessage(beat), delimited(2, ascii('run-2')));
    expect(decodeHeartbeatMessage(twice).run).toBe('run-2');
  });
});

// ── fuzz ─────────────────────────────────────────────────────────────────────

const legacy = (
  JSON.parse(readFileSync(new URL('../fixtures/kafka/legacy-v2.json', import.meta.url), 'utf8')) as {
    records: { kind: string; hex: string; message: Record<string, unknown> }[];
  }
).records;

const decoders = [decodeTaskMessage, decodeTrajectoryMessage, decodeWeightsMessage, decodeHeartbeatMessage] as const;

/** Decodes mutations of `seeds` with every decoder; returns how many decoded. Anything thrown must be a DecodeError. */
function fuzz(seeds: readonly Uint8Array[], cases: number, seed: number, keep: number): number {
  const rand = lcg(seed);
  let decoded = 0;
  for (let i = 0; i < cases; i++) {
    const good = seeds[i % seeds.length];
    // A copy: the encoders return Buffers, whose slice() is a view.
    const bytes = Uint8Array.from(good.subarray(0, rand() < 0.3 ? Math.floor(rand() * good.length) : good.length));
    const flips = 1 + Math.floor(rand() * 3);
    for (let j = 0; j < flips && bytes.length > keep; j++) {
      bytes[keep + Math.floor(rand() * (bytes.length - keep))] = Math.floor(rand() * 256);
    }
    for (const decode of decoders) {
      try {
        decode(bytes);
        decoded++;
      } catch (error) {
        if (!(error instanceof DecodeError))
          throw new Error(`not a DecodeError on ${Buffer.from(bytes).toString('hex')}`, { cause: error });
      }
    }
  }
  return decoded;
}

describe('codec: random and truncated input', () => {
  it('never throws anything but a DecodeError on mutated Protocol Buffers records', () => {
    const seeds = [
      encodeTaskMessage(taskMessage),
      encodeTrajectoryMessage(fullTrajectory),
      encodeTrajectoryMessage({ run: 'r', output: { ...failure('f@0', 1), skipped: true } }),
      encodeWeightsMessage(weightsVersion),
      encodeHeartbeatMessage(beat),
    ];
    // Some mutations still decode (a changed number, a changed letter): the rest are DecodeErrors.
    expect(fuzz(seeds, 1000, 12345, 0)).toBeGreaterThan(50);
    const indexes = [2, 6, 6, 9, 10];
    expect(
      fuzz(
        seeds.map((s, i) => framed([indexes[i]], s)),
        500,
        777,
        0,
      ),
    ).toBeGreaterThan(20);
  });

  it('never throws anything but a DecodeError on mutated legacy records (header kept or not)', () => {
    const seeds = legacy.map((r) => fromHex(r.hex));
    expect(fuzz(seeds, 600, 4242, 4)).toBeGreaterThan(20);
    expect(fuzz(seeds, 600, 99, 0)).toBeGreaterThan(20);
  });
});

// ── legacy records ───────────────────────────────────────────────────────────

describe('codec: records of the earlier rx codec (version 2)', () => {
  it('reads every record of spec/fixtures/kafka/legacy-v2.json through the public decoders', () => {
    expect(legacy.map((r) => r.kind)).toEqual(['task', 'trajectory', 'sampleFailure', 'weightsVersion', 'runEnd', 'heartbeat']);
    for (const { kind, hex, message } of legacy) {
      const bytes = fromHex(hex);
      expect(recordFormatOf(bytes)).toBe('rx2');
      if (kind === 'task') expect(decodeTaskMessage(bytes)).toEqual(message);
      if (kind === 'weightsVersion' || kind === 'runEnd') expect(decodeWeightsMessage(bytes)).toEqual(message);
      if (kind === 'heartbeat') expect(decodeHeartbeatMessage(bytes)).toEqual(message);
      if (kind === 'trajectory') {
        const expected = message as unknown as TrajectoryMessage & { output: Trajectory };
        const decoded = decodeTrajectoryMessage(bytes);
        expect(decoded).toEqual({ ...expected, output: { ...expected.output, logprobs: expected.output.logprobs.map(f32) } });
      }
      if (kind === 'sampleFailure') {
        const { error: expectedError, ...expected } = (message as { output: { error: { message: string } } }).output;
        const decoded = decodeTrajectoryMessage(bytes);
        const { error, ...rest } = decoded.output as SampleFailure;
        expect({ run: decoded.run, output: rest }).toEqual({ run: message.run, output: expected });
        expect(rest.skipped).toBe(true);
        expect(error).toBeInstanceOf(EngineError);
        expect(isRetriable(error)).toBe(true);
        expect(error.message).toBe(expectedError.message);
      }
    }
  });

  it('refuses another version of the rx codec, saying which versions rxrl reads and what to do', () => {
    for (const { hex } of legacy) {
      const bytes = fromHex(hex);
      bytes[2] = 3;
      const error = decodeError(() => decodeTrajectoryMessage(bytes));
      expect(error.message).toBe(
        "cannot decode header: 'rx' codec version 3 is not one rxrl reads (it reads version 2 and the rxrl.v1 Protocol Buffers records); it was written by another rxrl: read it with that version",
      );
      expect(error.context).toMatchObject({ field: 'header', format: 'rx2' });
    }
    const task = fromHex(legacy[0].hex);
    expect(decodeError(() => decodeTrajectoryMessage(task)).message).toBe(
      'cannot decode header: record kind task is not one of trajectory, sampleFailure',
    );
  });

  it('refuses legacy poison, naming the field', () => {
    const [task, trajectoryHex, failed, , , heartbeat] = legacy.map((r) => fromHex(r.hex));
    for (let n = 2; n < trajectoryHex.length; n++) expect(() => decodeTrajectoryMessage(trajectoryHex.subarray(0, n))).toThrow(DecodeError);
    expect(fieldOf(() => decodeTrajectoryMessage(trajectoryHex.subarray(0, 3)))).toBe('header');
    expect(fieldOf(() => decodeTrajectoryMessage(cat(trajectoryHex, [0])))).toBe('end');
    // The failed sample's last byte holds its flags (retriable, skipped): 4 is not one.
    const flags = Uint8Array.from(failed);
    expect(flags[flags.length - 1]).toBe(3);
    flags[flags.length - 1] = 4;
    expect(fieldOf(() => decodeTrajectoryMessage(flags))).toBe('error.flags');
    // The heartbeat's version flag: after the header, worker, run (u32 length + UTF-8), inFlight (u32), done, failed (f64).
    const at = 4 + 4 + 'host-1:42'.length + 4 + 'run-a'.length + 4 + 8 + 8;
    const version = Uint8Array.from(heartbeat);
    expect(version[at]).toBe(1);
    version[at] = 2;
    expect(decodeError(() => decodeHeartbeatMessage(version)).message).toBe('cannot decode version: flag must be 0 or 1, got 2');
    // A worker id over its bound is refused from its length prefix, before it is read.
    const worker = Uint8Array.from(heartbeat);
    new DataView(worker.buffer).setUint32(4, 0xfffffff0, true);
    expect(decodeError(() => decodeHeartbeatMessage(worker)).message).toBe(
      `cannot decode worker: string of ${0xfffffff0} bytes exceeds 255`,
    );
    // An absurd array length is caught before any allocation: promptTokens' count, after the ids and policyVersion.
    const counted = Uint8Array.from(trajectoryHex);
    const count = 4 + 4 + 5 + 4 + 10 + 4 + 6 + 4 + 8 + 4 + 4 + 6 + 4;
    expect(new DataView(counted.buffer).getUint32(count, true)).toBe(6);
    new DataView(counted.buffer).setUint32(count, 0xfffffff0, true);
    expect(fieldOf(() => decodeTrajectoryMessage(counted))).toBe('promptTokens');
    const utf8 = Uint8Array.from(task);
    utf8[8] = 0xff; // first byte of the run
    expect(fieldOf(() => decodeTaskMessage(utf8))).toBe('run');
  });

  it('keeps a leading U+FEFF in a legacy string', () => {
    const run = Buffer.from('\uFEFFrun', 'utf8');
    const bytes = new Uint8Array(4 + 4 + run.length + 4 + 8);
    const view = new DataView(bytes.buffer);
    bytes.set([0x72, 0x78, 2, 5]); // a run end
    view.setUint32(4, run.length, true);
    bytes.set(run, 8);
    view.setUint32(8 + run.length, 3, true);
    view.setFloat64(12 + run.length, 9, true);
    expect(decodeWeightsMessage(bytes)).toEqual({ kind: 'end', run: '\uFEFFrun', version: 3, timestamp: 9 });
  });
});

// ── schema registry framing ──────────────────────────────────────────────────

describe("codec: a schema registry's framing (Confluent wire format)", () => {
  const plain = encodeTrajectoryMessage(fullTrajectory);

  it('reads a record framed with its message index', () => {
    expect(pb.MESSAGE_INDEXES['rxrl.v1.TrajectoryRecord']).toBe(6);
    const bytes = cat([0, 0, 0, 0, 7, 0x02, 0x0c], plain);
    expect(framed([6], plain)).toEqual(bytes);
    // What a process writes with a schema registry (lib/kafka/schemaRegistry.ts) is the same framing.
    expect(Uint8Array.from(frameWith(encodeTrajectoryMessage, 7, 6)(fullTrajectory))).toEqual(bytes);
    expect(Uint8Array.from(frameWith(pb.encodeTask, 0x01020304, 0)({ id: 't', prompt: 'p' }))).toEqual(
      framed([0], pb.encodeTask({ id: 't', prompt: 'p' }), 0x01020304),
    );
    expect(recordFormatOf(bytes)).toBe('confluent');
    expect(decodeTrajectoryMessage(bytes)).toEqual(decodeTrajectoryMessage(plain));
    // Any schema id: the reader knows its own schema.
    expect(decodeTrajectoryMessage(framed([6], plain, 0x7fffffff))).toEqual(decodeTrajectoryMessage(plain));
    const task = encodeTaskMessage(taskMessage);
    expect(decodeTaskMessage(framed([pb.MESSAGE_INDEXES['rxrl.v1.TaskRecord']], task))).toEqual(taskMessage);
    const weights = encodeWeightsMessage(weightsVersion);
    expect(decodeWeightsMessage(framed([pb.MESSAGE_INDEXES['rxrl.v1.WeightsRecord']], weights))).toEqual(weightsVersion);
    const heartbeat = encodeHeartbeatMessage(beat);
    expect(decodeHeartbeatMessage(framed([pb.MESSAGE_INDEXES['rxrl.v1.Heartbeat']], heartbeat))).toEqual(beat);
  });

  it('refuses a record of another message index, the [0] shortcut for a type at another index, and a nested path', () => {
    const wrong = decodeError(() => decodeTrajectoryMessage(cat([0, 0, 0, 0, 7, 0x02, 0x04], plain)));
    expect(wrong.message).toBe(
      'cannot decode value: schema registry record of message index [2], not rxrl.v1.TrajectoryRecord (index [6])',
    );
    expect(wrong.context.field).toBe('value');
    expect(decodeError(() => decodeTrajectoryMessage(cat([0, 0, 0, 0, 7, 0x00], plain))).message).toMatch(/message index \[0\], not/);
    expect(decodeError(() => decodeTrajectoryMessage(cat([0, 0, 0, 0, 7, 0x04, 0x0c, 0x00], plain))).message).toMatch(/\[6, 0\], not/);
    expect(() => decodeHeartbeatMessage(framed([6], encodeHeartbeatMessage(beat)))).toThrow(DecodeError);
  });

  it('refuses broken framing', () => {
    expect(decodeError(() => decodeTrajectoryMessage(Uint8Array.from([0, 0, 0, 0, 7]))).message).toBe(
      'cannot decode value: a schema registry record needs at least 6 bytes, got 5',
    );
    expect(decodeError(() => decodeTrajectoryMessage(Uint8Array.from([0, 0, 0, 0, 7, 0x02]))).message).toMatch(/indexes run past/);
    expect(decodeError(() => decodeTrajectoryMessage(Uint8Array.from([0, 0, 0, 0, 7, 0x01, 0x0c]))).message).toMatch(/path of -1/);
    expect(decodeError(() => decodeTrajectoryMessage(Uint8Array.from([0, 0, 0, 0, 7, 0x7e]))).message).toMatch(/path of 63/);
    const long = Uint8Array.from([0, 0, 0, 0, 7, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01]);
    expect(decodeError(() => decodeTrajectoryMessage(long)).message).toMatch(/not a varint/);
    // A framed record whose message is broken names the field, as a plain one does.
    expect(fieldOf(() => decodeTrajectoryMessage(framed([6], plain.subarray(0, plain.length - 1))))).toBe(
      'rxrl.v1.TrajectoryRecord.produced_unix_ms',
    );
  });
});

describe('recordFormatOf', () => {
  it('tells the three formats apart by their first bytes, and an empty value from all', () => {
    expect(recordFormatOf(encodeTrajectoryMessage(fullTrajectory))).toBe('protobuf');
    expect(recordFormatOf(encodeHeartbeatMessage(beat))).toBe('protobuf');
    expect(recordFormatOf(framed([6], encodeTrajectoryMessage(fullTrajectory)))).toBe('confluent');
    expect(recordFormatOf(Uint8Array.from([0]))).toBe('confluent');
    expect(recordFormatOf(fromHex(legacy[0].hex))).toBe('rx2');
    expect(recordFormatOf(Uint8Array.from([0x72, 0x78]))).toBe('rx2');
    // Field 14, length-delimited, is 0x72 too: a protobuf record unless 'x' follows.
    expect(recordFormatOf(Uint8Array.from([0x72]))).toBe('protobuf');
    expect(recordFormatOf(Uint8Array.from([0x72, 0x01, 0x78]))).toBe('protobuf');
    expect(recordFormatOf(new Uint8Array(0))).toBeUndefined();
  });
});

// ── buffers ──────────────────────────────────────────────────────────────────

describe('codec: inputs that are views into a larger buffer', () => {
  it('decodes a record at any offset of a shared buffer (as kafkajs hands out Buffer views), in every format', () => {
    const t = traj('v@0', 1, { promptTokens: [1, 2, 3], responseTokens: [4, 5], logprobs: [-1, -2], lossMask: [1, 1] });
    const plain = encodeTrajectoryMessage({
      run: 'r',
      output: t,
      producedAt: 3,
      times: { generateStart: 1, generateEnd: 2, rewardEnd: 3 },
    });
    const expected = decodeTrajectoryMessage(plain);
    expect(expected.output).toEqual(t);
    const legacyTrajectory = fromHex(legacy[1].hex);
    for (const [bytes, wanted] of [
      [plain, expected],
      [framed([6], plain), expected],
      [legacyTrajectory, decodeTrajectoryMessage(legacyTrajectory)],
    ] as const) {
      for (const shift of [1, 2, 3, 5, 7]) {
        const pool = Buffer.alloc(bytes.length + 64, 0xee);
        pool.set(bytes, shift);
        const view = pool.subarray(shift, shift + bytes.length);
        expect(view.byteOffset % 8).not.toBe(0);
        expect(decodeTrajectoryMessage(view)).toEqual(wanted);
        const shared = new Uint8Array(pool.buffer, pool.byteOffset + shift, bytes.length);
        expect(decodeTrajectoryMessage(shared)).toEqual(wanted);
      }
    }
  });
});

describe('codec: the shared encoding buffer', () => {
  it('returns independent bytes from consecutive encodes', () => {
    const a = encodeTrajectoryMessage({ run: 'r', output: traj('a@0', 0) });
    const copy = Uint8Array.from(a);
    const b = encodeTrajectoryMessage({
      run: 'r',
      output: traj('b@0', 1, { responseTokens: [9, 9, 9], logprobs: [0, 0, 0], lossMask: [1, 1, 1] }),
    });
    b.fill(0);
    encodeHeartbeatMessage(beat);
    expect(Uint8Array.from(a)).toEqual(copy);
    expect(decodeTrajectoryMessage(a).output).toEqual(traj('a@0', 0));
  });

  it('recovers after an encode fails, before writing and half-way through', () => {
    expect(() => encodeTrajectoryMessage({ run: 'r', output: traj('a@0', 0, { promptTokens: [1, 2.5] }) })).toThrow(EncodeError);
    // A metric that throws when read stops the writer half-way, with the scratch buffer in use.
    const metrics = Object.defineProperty({ first: 1 }, 'boom', {
      enumerable: true,
      get: () => {
        throw new Error('half-way');
      },
    }) as Record<string, number>;
    expect(() => encodeTrajectoryMessage({ run: 'r', output: traj('a@0', 0, { metrics }) })).toThrow('half-way');
    const t = traj('c@0', 2);
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: t })).output).toEqual(t);
    const u = traj('d@0', 3, { metrics: { x: 1 } });
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: u })).output).toEqual(u);
  });

  it('encodes a nested record from metadata toJSON without corrupting the outer one', () => {
    const inner = traj('in@0', 0);
    let nested: Uint8Array | undefined;
    const metadata = {
      toJSON: () => {
        nested = encodeTrajectoryMessage({ run: 'inner', output: inner });
        return { ok: true };
      },
    };
    const outer = traj('out@0', 1, { task: { id: 'out', prompt: 'p', metadata } });
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'outer', output: outer }));
    expect((decoded.output as typeof outer).task.metadata).toEqual({ ok: true });
    expect(decoded.output.id).toBe('out@0/1');
    expect(decodeTrajectoryMessage(nested!).output).toEqual(inner);
  });

  it('encodes a record from inside the writer (a metric getter) into a buffer of its own', () => {
    const inner = traj('in@0', 0, {
      responseTokens: Array.from({ length: 3000 }, (_, i) => i),
      logprobs: Array(3000).fill(-1),
      lossMask: Array(3000).fill(1),
    });
    let nested: Uint8Array | undefined;
    const metrics = Object.defineProperty({}, 'score', {
      enumerable: true,
      get: () => {
        nested = encodeTrajectoryMessage({ run: 'inner', output: inner });
        return 0.5;
      },
    }) as Record<string, number>;
    const outer = traj('out@0', 1, { metrics });
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'outer', output: outer }));
    expect(decoded).toEqual({ run: 'outer', output: { ...outer, metrics: { score: 0.5 } } });
    expect(decodeTrajectoryMessage(nested!)).toEqual({ run: 'inner', output: inner });
  });

  it('grows for large records (200k tokens) and goes on encoding small ones', () => {
    const n = 200_000;
    const big = traj('big@0', 0, {
      promptTokens: Array.from({ length: n }, (_, i) => (i * 7919) % 151_936),
      responseTokens: Array.from({ length: n }, (_, i) => i),
      logprobs: Array.from({ length: n }, (_, i) => -(i % 64) / 8),
      lossMask: Array.from({ length: n }, (_, i) => i % 2),
    });
    const bytes = encodeTrajectoryMessage({ run: 'r', output: big });
    expect(bytes.length).toBeGreaterThan(n * 7);
    expect(decodeTrajectoryMessage(bytes).output).toEqual(big);
    const small = traj('s@0', 0);
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: small })).output).toEqual(small);
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: big }))).toEqual(decodeTrajectoryMessage(bytes));
  });
});
