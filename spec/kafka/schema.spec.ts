/**
 * The record schema (proto/rxrl/v1/records.proto) and the codec generated from it (lib/kafka/schema/records.ts):
 * the generated file is what the .proto gives (`scripts/proto-gen.mjs --check`), the .proto passes `buf lint` and is
 * compatible with its released copy (`buf breaking`, which refuses a renumbered or retyped field), and the generated
 * codec writes and reads the bytes the reference implementation (@bufbuild/protobuf) does.
 */
import { spawnSync } from 'node:child_process';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { createFileRegistry, fromBinary, fromJson, toBinary, toJson, type DescMessage, type JsonValue } from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DecodeError } from '../../lib/core/errors.js';
import {
  RECORD_SCHEMA_PACKAGE,
  RECORD_TYPES,
  decodeHeartbeatMessage,
  decodeTrajectoryMessage,
  encodeHeartbeatMessage,
  encodeTaskMessage,
  encodeTrajectoryMessage,
  encodeWeightsMessage,
} from '../../lib/kafka/codec.js';
import { MESSAGE_INDEXES, PACKAGE, RECORDS_PROTO } from '../../lib/kafka/schema/records.js';
import { failure, traj } from '../helpers/fixtures.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const buf = join(root, 'node_modules/.bin/buf');
const PROTO = join(root, 'proto/rxrl/v1/records.proto');
const RELEASED = join(root, 'proto/released/rxrl-v1.binpb');

/** Runs a command; its exit status and what it printed. */
function run(command: string, args: readonly string[], cwd = root): { status: number | null; output: string } {
  const result = spawnSync(command, args, { cwd, encoding: 'utf8', timeout: 60_000, maxBuffer: 1 << 24 });
  if (result.error !== undefined) throw result.error;
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

/** `text` with `from` replaced by `to` (the spec fails when `from` is not there, once). */
function edit(text: string, from: string, to: string): string {
  expect(text.split(from)).toHaveLength(2);
  return text.replace(from, to);
}

/** The .proto with `field` declared last in message Trajectory. */
function withTrajectoryField(text: string, field: string): string {
  const start = text.indexOf('message Trajectory {');
  const end = text.indexOf('\n}', start);
  expect(start).toBeGreaterThanOrEqual(0);
  return `${text.slice(0, end)}\n  ${field}${text.slice(end)}`;
}

describe('the record schema: proto/rxrl/v1/records.proto', () => {
  let scratch: string;
  beforeAll(() => {
    scratch = mkdtempSync(join(tmpdir(), 'rxrl-schema-'));
  });
  afterAll(() => {
    rmSync(scratch, { recursive: true, force: true });
  });

  it('is what lib/kafka/schema/records.ts was generated from, and carries its text and message indexes', () => {
    const check = run(process.execPath, ['scripts/proto-gen.mjs', '--check']);
    expect(check).toEqual({ status: 0, output: '' });
    const text = readFileSync(PROTO, 'utf8');
    expect(RECORDS_PROTO).toBe(text);
    expect(PACKAGE).toBe('rxrl.v1');
    expect(RECORD_SCHEMA_PACKAGE).toBe(PACKAGE);
    // A schema registry's message index is the message's position among the file's top-level messages.
    const messages = [...text.matchAll(/^message (\w+) \{/gm)].map((m) => `rxrl.v1.${m[1]}`);
    expect(Object.keys(MESSAGE_INDEXES)).toEqual(messages);
    expect(Object.values(MESSAGE_INDEXES)).toEqual(messages.map((_, i) => i));
    for (const type of Object.values(RECORD_TYPES)) expect(messages).toContain(type);
  });

  it("keeps every message of its released copy at the released position (a registry's framing names it by position)", () => {
    const released = createFileRegistry(fromBinary(FileDescriptorSetSchema, readFileSync(RELEASED))).getFile('rxrl/v1/records.proto');
    expect(released).toBeDefined();
    const positions = Object.fromEntries(released!.messages.map((m, i) => [m.typeName, i]));
    expect(Object.keys(positions).length).toBeGreaterThan(0);
    for (const [name, index] of Object.entries(positions))
      expect([name, MESSAGE_INDEXES[name as keyof typeof MESSAGE_INDEXES]]).toEqual([name, index]);
  });

  it('passes buf lint and is compatible with its released copy (buf breaking)', () => {
    expect(run(buf, ['lint'])).toEqual({ status: 0, output: '' });
    expect(run(buf, ['breaking', 'proto', '--against', 'proto/released/rxrl-v1.binpb'])).toEqual({ status: 0, output: '' });
  });

  it('buf breaking refuses a renumbered and a retyped field, naming each', () => {
    // A copy of the module with the repository's buf.yaml (its rules), given to buf as a workspace directory.
    const copy = join(scratch, 'breaking');
    cpSync(join(root, 'proto'), join(copy, 'proto'), { recursive: true });
    cpSync(join(root, 'buf.yaml'), join(copy, 'buf.yaml'));
    const copied = join(copy, 'proto/rxrl/v1/records.proto');
    expect(run(buf, ['breaking', copy, '--against', RELEASED]).status).toBe(0);
    const text = readFileSync(PROTO, 'utf8');
    writeFileSync(copied, edit(edit(text, 'double reward = 11;', 'double reward = 31;'), 'uint32 in_flight = 3;', 'double in_flight = 3;'));
    const broken = run(buf, ['breaking', copy, '--against', RELEASED]);
    expect(broken.status).not.toBe(0);
    expect(broken.output).toContain('Previously present field "11" with name "reward" on message "Trajectory" was deleted');
    expect(broken.output).toContain('Field "3" with name "in_flight" on message "Heartbeat" changed type from "uint32" to "double"');
    // Appending a field is compatible.
    writeFileSync(copied, withTrajectoryField(text, 'optional string probe = 17;'));
    expect(run(buf, ['breaking', copy, '--against', RELEASED]).status).toBe(0);
  });

  it('proto-gen --check fails when the .proto changes, and the generator refuses field kinds the codec lacks', () => {
    // A copy of the generator, the schema and the generated file: proto-gen works relative to its own directory.
    const copy = join(scratch, 'generate');
    mkdirSync(join(copy, 'scripts'), { recursive: true });
    mkdirSync(join(copy, 'lib/kafka/schema'), { recursive: true });
    cpSync(join(root, 'scripts/proto-gen.mjs'), join(copy, 'scripts/proto-gen.mjs'));
    cpSync(join(root, 'proto'), join(copy, 'proto'), { recursive: true });
    cpSync(join(root, 'buf.yaml'), join(copy, 'buf.yaml'));
    cpSync(join(root, 'lib/kafka/schema/records.ts'), join(copy, 'lib/kafka/schema/records.ts'));
    symlinkSync(join(root, 'node_modules'), join(copy, 'node_modules'));
    const generate = (...args: string[]): { status: number | null; output: string } =>
      run(process.execPath, [join(copy, 'scripts/proto-gen.mjs'), ...args], copy);
    expect(generate('--check').status).toBe(0);
    const proto = join(copy, 'proto/rxrl/v1/records.proto');
    const text = readFileSync(proto, 'utf8');
    writeFileSync(proto, withTrajectoryField(text, 'optional string probe = 17;'));
    const stale = generate('--check');
    expect(stale.status).toBe(1);
    expect(stale.output).toContain('is not what proto/rxrl/v1/records.proto generates; run `npm run proto`');
    expect(generate().status).toBe(0);
    const generated = readFileSync(join(copy, 'lib/kafka/schema/records.ts'), 'utf8');
    expect(generated).toContain('probe?: string | undefined;');
    expect(generated).toContain("m.probe = r.string('rxrl.v1.Trajectory.probe');");
    expect(generate('--check').status).toBe(0);
    for (const [field, reason] of [
      ['repeated string tags = 17;', 'rxrl.v1.Trajectory.tags: only packed repeated int32, bool and float are supported'],
      ['int64 offset = 17;', 'rxrl.v1.Trajectory.offset: scalar type 3 is not supported by scripts/proto-gen.mjs'],
      ['map<uint32, double> by_id = 17;', 'rxrl.v1.Trajectory.by_id: only map<string, scalar> is supported'],
    ]) {
      writeFileSync(proto, withTrajectoryField(text, field));
      const refused = generate();
      expect(refused.status).not.toBe(0);
      expect(refused.output).toContain(reason);
    }
  });
});

// ── the reference implementation ─────────────────────────────────────────────

/** One encoded record of each kind, and its message type. */
function referenceRecords(): [string, Uint8Array][] {
  const t = traj('g@2', 1, {
    promptTokens: [1, -2, 300, 2 ** 31 - 1],
    responseTokens: [4, 5, 2],
    logprobs: [-0.5, -1.5, -0.1],
    lossMask: [1, 0, 1],
    metrics: { accuracy: 1, format: 0.5 },
    task: { id: 'g', prompt: 'p', answer: '', metadata: { k: [1] }, epoch: 0 },
    responseText: 'hé',
  });
  return [
    [
      RECORD_TYPES.tasks,
      encodeTaskMessage({
        run: 'r',
        index: 2 ** 40,
        minVersion: 1,
        samples: 4,
        sampling: { maxTokens: 8, temperature: 0.7, topP: 1, seed: 3 },
        task: t.task,
      }),
    ],
    [
      RECORD_TYPES.trajectories,
      encodeTrajectoryMessage({ run: 'r', output: t, producedAt: 9, times: { generateStart: 1, generateEnd: 2, rewardEnd: 3 } }),
    ],
    [RECORD_TYPES.trajectories, encodeTrajectoryMessage({ run: 'r', output: { ...failure('g@2', 3), skipped: true } })],
    [
      RECORD_TYPES.weights,
      encodeWeightsMessage({
        kind: 'version',
        run: 'r',
        version: 2,
        modelTag: 'm',
        path: '/w',
        bytes: 2 ** 33,
        sha256: 'c'.repeat(64),
        timestamp: 5,
      }),
    ],
    [RECORD_TYPES.weights, encodeWeightsMessage({ kind: 'end', run: 'r', version: 3, timestamp: 6 })],
    [
      RECORD_TYPES.heartbeats,
      encodeHeartbeatMessage({ worker: 'w', run: 'r', inFlight: 1, done: 2, failed: 0, version: 0, leaving: true, timestamp: 7 }),
    ],
  ];
}

describe('the generated codec and the reference implementation (@bufbuild/protobuf)', () => {
  let message: (name: string) => DescMessage;
  beforeAll(() => {
    const image = spawnSync(buf, ['build', 'proto', '--as-file-descriptor-set', '-o', '-'], { cwd: root, maxBuffer: 1 << 24 });
    expect(image.status).toBe(0);
    const registry = createFileRegistry(fromBinary(FileDescriptorSetSchema, image.stdout));
    message = (name) => {
      const desc = registry.getMessage(name);
      if (desc === undefined) throw new Error(`no message ${name}`);
      return desc;
    };
  });

  it('writes the bytes the reference writes, for every record kind', () => {
    const records = referenceRecords();
    for (const [type, bytes] of records) {
      const desc = message(type);
      expect(Buffer.from(toBinary(desc, fromBinary(desc, bytes)))).toEqual(Buffer.from(bytes));
    }
    const heartbeat = fromBinary(message(RECORD_TYPES.heartbeats), records[5][1]);
    expect(toJson(message(RECORD_TYPES.heartbeats), heartbeat)).toEqual({
      worker: 'w',
      run: 'r',
      inFlight: 1,
      done: '2',
      version: 0,
      leaving: true,
      timestampUnixMs: 7,
    });
  });

  it('reads what the reference writes', () => {
    const desc = message(RECORD_TYPES.trajectories);
    const json: JsonValue = {
      run: 'run-1',
      trajectory: {
        id: 'g@0/1',
        taskId: 'g',
        groupId: 'g@0',
        runId: 1,
        modelTag: 'policy',
        policyVersion: 2,
        promptTokens: [1, -2, 300],
        responseTokens: [4, 5],
        logprobs: [-0.5, -1.5],
        lossMask: [true, false],
        reward: 0.5,
        finishReason: 'FINISH_REASON_LENGTH',
        metrics: { acc: 1 },
        task: { id: 'g', prompt: 'p', epoch: 0 },
        responseText: 'hi',
        times: { generateStartUnixMs: 1, generateEndUnixMs: 2, rewardEndUnixMs: 3 },
      },
      producedUnixMs: 9,
    };
    expect(decodeTrajectoryMessage(toBinary(desc, fromJson(desc, json)))).toEqual({
      run: 'run-1',
      output: traj('g@0', 1, {
        policyVersion: 2,
        promptTokens: [1, -2, 300],
        responseTokens: [4, 5],
        logprobs: [-0.5, -1.5],
        lossMask: [1, 0],
        reward: 0.5,
        finishReason: 'length',
        metrics: { acc: 1 },
        task: { id: 'g', prompt: 'p', epoch: 0 },
        responseText: 'hi',
      }),
      times: { generateStart: 1, generateEnd: 2, rewardEnd: 3 },
      producedAt: 9,
    });
    const beats = message(RECORD_TYPES.heartbeats);
    const beat = (done: string): Uint8Array => toBinary(beats, fromJson(beats, { worker: 'w', done, timestampUnixMs: 1 }));
    expect(decodeHeartbeatMessage(beat('9007199254740991')).done).toBe(Number.MAX_SAFE_INTEGER);
    expect(() => decodeHeartbeatMessage(beat('9007199254740992'))).toThrow(DecodeError);
  });
});
