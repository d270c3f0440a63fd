import { describe, expect, it } from 'vitest';

import { DecodeError, EngineError, EvaluationError, isRetriable } from '../../lib/core/errors.js';
import {
  CODEC_VERSION,
  decodeHeartbeatMessage,
  decodeTaskMessage,
  decodeTrajectoryMessage,
  decodeWeightsMessage,
  encodeHeartbeatMessage,
  encodeTaskMessage,
  encodeTrajectoryMessage,
  encodeWeightsMessage,
  messageKindOf,
} from '../../lib/kafka/codec.js';
import { EncodeError } from '../../lib/kafka/errors.js';
import { WORKER_ID_MAX_LENGTH, workerIdOf, workerIdProblem } from '../../lib/kafka/workerId.js';
import type { TaskMessage, WeightsMessage } from '../../lib/kafka/types.js';
import { isSampleFailure, type SampleFailure, type Trajectory } from '../../lib/core/types.js';
import { failure, traj } from '../helpers/fixtures.js';

const f32 = (x: number): number => Math.fround(x);

function decodeError(f: () => unknown): DecodeError {
  try {
    f();
  } catch (error) {
    expect(error).toBeInstanceOf(DecodeError);
    return error as DecodeError;
  }
  throw new Error('expected a DecodeError');
}

describe('codec: tasks', () => {
  const message: TaskMessage = {
    run: 'run-1',
    index: 17,
    minVersion: 3,
    samples: 8,
    sampling: { maxTokens: 5, temperature: 0.7, topP: 0.95, seed: 42 },
    task: { id: 'täsk-1', prompt: 'abcd=', answer: 'dcba', response: 'dcba!', metadata: { level: 2, tags: ['x'] }, epoch: 1 },
  };

  it('round-trips every field, optional ones included and omitted', () => {
    expect(decodeTaskMessage(encodeTaskMessage(message))).toEqual(message);
    const bare: TaskMessage = { ...message, run: 'r', index: 0, minVersion: 0, task: { id: 't', prompt: '' } };
    const decoded = decodeTaskMessage(encodeTaskMessage(bare));
    expect(decoded).toEqual(bare);
    expect(Object.keys(decoded.task)).toEqual(['id', 'prompt']);
  });

  it('starts with the magic bytes, the codec version and the kind', () => {
    const bytes = encodeTaskMessage(message);
    expect([...bytes.subarray(0, 4)]).toEqual([0x72, 0x78, CODEC_VERSION, 1]);
    expect(messageKindOf(bytes)).toBe('task');
    expect(messageKindOf(new Uint8Array([1, 2, 3, 4]))).toBeUndefined();
  });

  it('rejects values that break the schema on encode', () => {
    expect(() => encodeTaskMessage({ ...message, minVersion: -1 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...message, index: 1.5 })).toThrow(EncodeError);
    expect(() => encodeTaskMessage({ ...message, sampling: { ...message.sampling, temperature: Number.NaN } })).toThrow(EncodeError);
    const cyclic: Record<string, unknown> = {};
    cyclic.self = cyclic;
    expect(() => encodeTaskMessage({ ...message, task: { id: 't', prompt: 'p', metadata: cyclic } })).toThrow(EncodeError);
  });
});

describe('codec: trajectories', () => {
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

  it('round-trips a trajectory; log-probs are rounded to float32', () => {
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: trajectory }));
    expect(decoded.run).toBe('r');
    expect(decoded.output).toEqual({ ...trajectory, logprobs: trajectory.logprobs.map(f32) });
  });

  it('stores token ids and log-probs as 4-byte elements, not JSON', () => {
    const long = traj('t1@0', 0, {
      responseTokens: Array.from({ length: 1000 }, (_, i) => i % 50),
      logprobs: Array.from({ length: 1000 }, () => -1.25),
      lossMask: Array.from({ length: 1000 }, () => 1),
      promptTokens: Array.from({ length: 1000 }, (_, i) => i),
    });
    const bytes = encodeTrajectoryMessage({ run: 'r', output: long });
    // 1000 × (4 prompt + 4 response + 4 log-prob + 1 mask) bytes, plus ids and headers.
    expect(bytes.length).toBeGreaterThan(13_000);
    expect(bytes.length).toBeLessThan(13_300);
  });

  it('round-trips a failed sample as a typed error', () => {
    const failed: SampleFailure = { ...failure('t2@1', 4), error: new EvaluationError('evaluator exploded') };
    const decoded = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: failed })).output;
    expect(isSampleFailure(decoded)).toBe(true);
    const out = decoded as SampleFailure;
    expect(out).toMatchObject({ kind: 'sample-failure', id: 't2@1/4', taskId: 't2', groupId: 't2@1', runId: 4 });
    expect(out.error).toBeInstanceOf(EvaluationError);
    expect(out.error.message).toBe('evaluator exploded');
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
    expect(isRetriable(out.error)).toBe(true);
    const plain = decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: { ...skipped, skipped: undefined } }))
      .output as SampleFailure;
    expect(plain.skipped).toBeUndefined();
    const bytes = encodeTrajectoryMessage({ run: 'r', output: skipped });
    const bad = Uint8Array.from(bytes);
    bad[bad.length - 1] = 4;
    expect(decodeError(() => decodeTrajectoryMessage(bad)).context.field).toBe('error.flags');
  });

  it('rejects inconsistent trajectories on encode', () => {
    expect(() => encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, logprobs: [-1] } })).toThrow(EncodeError);
    expect(() => encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, reward: Number.NaN } })).toThrow(EncodeError);
    expect(() => encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, responseTokens: [8, 9.5, 2] } })).toThrow(EncodeError);
    expect(() => encodeTrajectoryMessage({ run: 'r', output: { ...trajectory, lossMask: [1, 2, 1] } })).toThrow(EncodeError);
  });

  it('checks the schema on decode and names the failing field', () => {
    const good = encodeTrajectoryMessage({ run: 'r', output: trajectory });
    expect(decodeError(() => decodeTrajectoryMessage(good.subarray(0, good.length - 1))).context.field).toBeDefined();
    expect(decodeError(() => decodeTrajectoryMessage(new Uint8Array([...good, 0]))).context.field).toBe('end');
    expect(decodeError(() => decodeTrajectoryMessage(new TextEncoder().encode('{"json": true}'))).context.field).toBe('header');
    const future = Uint8Array.from(good);
    future[2] = CODEC_VERSION + 1;
    expect(decodeError(() => decodeTrajectoryMessage(future)).message).toMatch(/version/);
    // A task message is not a trajectory.
    const task = encodeTaskMessage({
      run: 'r',
      index: 0,
      minVersion: 0,
      samples: 1,
      sampling: { maxTokens: 1, temperature: 1, topP: 1, seed: 0 },
      task: { id: 't', prompt: 'p' },
    });
    expect(decodeError(() => decodeTrajectoryMessage(task)).context.field).toBe('header');
    // An absurd array length is caught before any allocation.
    const huge = Uint8Array.from(good);
    const at = 4 + 4 + 'r'.length; // header, run length and 'r': the id's length
    new DataView(huge.buffer).setUint32(at, 0xfffffff0, true);
    expect(decodeError(() => decodeTrajectoryMessage(huge))).toBeInstanceOf(DecodeError);
  });

  it('never throws anything but a DecodeError on random and truncated input', () => {
    const good = encodeTrajectoryMessage({ run: 'r', output: trajectory });
    let seed = 12345;
    const rand = (): number => {
      seed = (seed * 1103515245 + 12345) & 0x7fffffff;
      return seed / 0x7fffffff;
    };
    for (let i = 0; i < 500; i++) {
      const bytes = good.slice(0, Math.floor(rand() * good.length));
      if (rand() < 0.5 && bytes.length > 4) bytes[4 + Math.floor(rand() * (bytes.length - 4))] = Math.floor(rand() * 256);
      try {
        decodeTrajectoryMessage(bytes);
      } catch (error) {
        expect(error).toBeInstanceOf(DecodeError);
      }
    }
  });

  it('rejects invalid UTF-8 in strings', () => {
    const bytes = Uint8Array.from(encodeTrajectoryMessage({ run: 'rr', output: trajectory }));
    bytes[8] = 0xff; // first byte of the run id
    expect(decodeError(() => decodeTrajectoryMessage(bytes)).context.field).toBe('run');
  });
});

describe('codec: weights', () => {
  const version: WeightsMessage = {
    kind: 'version',
    run: 'run-1',
    version: 4,
    modelTag: 'policy',
    path: '/shared/run-1/v4.safetensors',
    bytes: 400_128,
    sha256: 'a'.repeat(64),
    timestamp: 1_700_000_000_000,
  };

  it('round-trips announcements and run ends', () => {
    expect(decodeWeightsMessage(encodeWeightsMessage(version))).toEqual(version);
    const end: WeightsMessage = { kind: 'end', run: 'run-1', version: 9, timestamp: 5 };
    expect(decodeWeightsMessage(encodeWeightsMessage(end))).toEqual(end);
  });

  it('checks the digest on both sides', () => {
    expect(() => encodeWeightsMessage({ ...version, sha256: 'xyz' })).toThrow(EncodeError);
    const bytes = Uint8Array.from(encodeWeightsMessage(version));
    bytes[bytes.length - 9] = 'G'.charCodeAt(0); // last hex digit of the digest
    expect(decodeError(() => decodeWeightsMessage(bytes)).context.field).toBe('sha256');
  });
});

describe('codec: heartbeats', () => {
  const beat = {
    worker: 'host-12-ab',
    run: 'run-1',
    inFlight: 3,
    done: 41,
    failed: 2,
    version: 7,
    leaving: false,
    timestamp: 1_700_000_000_000,
  };

  it('round-trips a heartbeat, with and without a version, and the last one', () => {
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage(beat))).toEqual(beat);
    const { version: _v, ...first } = beat;
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage({ ...first, run: '', leaving: true }))).toEqual({
      ...first,
      run: '',
      leaving: true,
    });
    expect(messageKindOf(encodeHeartbeatMessage(beat))).toBe('heartbeat');
  });

  it('refuses a broken heartbeat with a DecodeError naming the field, and another kind', () => {
    expect(() => encodeHeartbeatMessage({ ...beat, inFlight: -1 })).toThrow(EncodeError);
    expect(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: '' }))).toThrow(/worker/);
    const bytes = encodeHeartbeatMessage(beat);
    expect(() => decodeHeartbeatMessage(bytes.subarray(0, bytes.length - 3))).toThrow(DecodeError);
    expect(() => decodeHeartbeatMessage(encodeWeightsMessage({ kind: 'end', run: 'r', version: 1, timestamp: 0 }))).toThrow(/kind runEnd/);
  });

  it('bounds the worker id: over WORKER_ID_MAX_LENGTH bytes or outside [A-Za-z0-9._:@-] is a DecodeError with the exact reason', () => {
    const longest = 'w'.repeat(WORKER_ID_MAX_LENGTH);
    expect(decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: longest })).worker).toBe(longest);
    const huge = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: 'w'.repeat(540 * 1024) })));
    expect(huge.message).toBe(`cannot decode worker: string of ${540 * 1024} bytes exceeds ${WORKER_ID_MAX_LENGTH}`);
    expect(huge.context).toMatchObject({ field: 'worker' });
    const over = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker: `${longest}w` })));
    expect(over.message).toBe(`cannot decode worker: string of ${WORKER_ID_MAX_LENGTH + 1} bytes exceeds ${WORKER_ID_MAX_LENGTH}`);
    for (const [worker, reason] of [
      ['w-1\u001b]0;owned\u0007', 'U+001B at index 3'],
      ['w 1', 'U+0020 at index 1'],
      ['wé', 'U+00E9 at index 1'],
      ['w\n', 'U+000A at index 1'],
    ] as const) {
      const error = decodeError(() => decodeHeartbeatMessage(encodeHeartbeatMessage({ ...beat, worker })));
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

describe('codec: inputs that are views into a larger buffer', () => {
  it('decodes a message at any offset of a shared buffer (as kafkajs hands out Buffer views)', () => {
    const t = traj('v@0', 1, { promptTokens: [1, 2, 3], responseTokens: [4, 5], logprobs: [-1, -2], lossMask: [1, 1] });
    const bytes = encodeTrajectoryMessage({ run: 'r', output: t });
    for (const shift of [1, 2, 3, 5]) {
      const pool = Buffer.alloc(bytes.length + 64, 0xee);
      pool.set(bytes, shift);
      const view = pool.subarray(shift, shift + bytes.length);
      expect(decodeTrajectoryMessage(view).output).toEqual(t);
    }
  });
});

describe('codec: the shared encoding buffer', () => {
  it('returns independent bytes from consecutive encodes', () => {
    const a = encodeTrajectoryMessage({ run: 'r', output: traj('a@0', 0) });
    const copy = Uint8Array.from(a);
    encodeTrajectoryMessage({ run: 'r', output: traj('b@0', 1, { responseTokens: [9, 9, 9], logprobs: [0, 0, 0], lossMask: [1, 1, 1] }) });
    expect(Uint8Array.from(a)).toEqual(copy);
  });

  it('recovers after an encode fails half-way', () => {
    expect(() => encodeTrajectoryMessage({ run: 'r', output: traj('a@0', 0, { promptTokens: [1, 2.5] }) })).toThrow(EncodeError);
    const t = traj('c@0', 2);
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: t })).output).toEqual(t);
  });

  it('encodes a nested message from metadata toJSON without corrupting the outer one', () => {
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

  it('grows for large messages', () => {
    const big = traj('big@0', 0, {
      responseTokens: Array.from({ length: 40_000 }, (_, i) => i),
      logprobs: Array.from({ length: 40_000 }, () => -0.5),
      lossMask: Array.from({ length: 40_000 }, () => 1),
    });
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: big })).output).toEqual(big);
    const small = traj('s@0', 0);
    expect(decodeTrajectoryMessage(encodeTrajectoryMessage({ run: 'r', output: small })).output).toEqual(small);
  });
});
