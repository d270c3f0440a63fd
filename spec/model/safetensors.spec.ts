import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { NamedWeights, WeightArray } from '../../lib/model/types.js';
import { DecodeError, ShapeError } from '../../lib/core/errors.js';
import { decodeSafetensors, encodeSafetensors, loadSafetensors, saveSafetensors } from '../../lib/model/safetensors.js';

function weights(): NamedWeights {
  return new Map<string, WeightArray>([
    ['blocks.0.attn.wq', { shape: [2, 3], data: Float32Array.from([1, -2, 3.5, 1e-8, -0, Math.PI]) }],
    ['scalar', { shape: [], data: Float32Array.from([7]) }],
    ['empty', { shape: [0, 4], data: new Float32Array(0) }],
    ['v', { shape: [3], data: Float32Array.from([Infinity, -Infinity, 0.1]) }],
  ]);
}

/** Builds a file the way Python's writer lays it out: u64 LE length, space-padded JSON, data. */
function handMade(header: string, data: Uint8Array): Uint8Array {
  const json = new TextEncoder().encode(header);
  const out = new Uint8Array(8 + json.length + data.length);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, 8);
  out.set(data, 8 + json.length);
  return out;
}

describe('safetensors', () => {
  let dir: string;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rxrl-st-'));
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('round-trips weights and metadata exactly (bit for bit)', () => {
    const w = weights();
    const bytes = encodeSafetensors(w, { format: 'pt', step: '3' });
    const { weights: back, metadata } = decodeSafetensors(bytes);
    expect(metadata).toEqual({ format: 'pt', step: '3' });
    expect([...back.keys()]).toEqual([...w.keys()]);
    for (const [name, { shape, data }] of w) {
      const got = back.get(name) as WeightArray;
      expect(got.shape).toEqual(shape);
      expect(new Uint8Array(got.data.buffer)).toEqual(new Uint8Array(data.buffer, data.byteOffset, data.byteLength));
    }
  });

  it('writes the standard layout: u64 LE header length, 8-byte aligned JSON header, F32 entries', () => {
    const bytes = encodeSafetensors(weights(), { a: 'b' });
    const n = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
    expect(n % 8).toBe(0);
    const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n))) as Record<string, unknown>;
    expect(header['__metadata__']).toEqual({ a: 'b' });
    expect(header['blocks.0.attn.wq']).toEqual({ dtype: 'F32', shape: [2, 3], data_offsets: [0, 24] });
    expect(header['scalar']).toEqual({ dtype: 'F32', shape: [], data_offsets: [24, 28] });
    expect(bytes.length).toBe(8 + n + 24 + 4 + 0 + 12);
  });

  it('reads a file laid out by another writer (offsets out of key order, no padding)', () => {
    const data = new Uint8Array(new Float32Array([5, 6, 1, 2, 3]).buffer);
    const header = '{"b":{"dtype":"F32","shape":[3],"data_offsets":[8,20]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}';
    const { weights: w, metadata } = decodeSafetensors(handMade(header, data));
    expect(metadata).toEqual({});
    expect(Array.from(w.get('a')?.data ?? [])).toEqual([5, 6]);
    expect(Array.from(w.get('b')?.data ?? [])).toEqual([1, 2, 3]);
  });

  it('saves and loads files', async () => {
    const path = join(dir, 'model.safetensors');
    await saveSafetensors(path, weights(), { version: '1' });
    const { weights: back, metadata } = await loadSafetensors(path);
    expect(metadata).toEqual({ version: '1' });
    expect(Array.from(back.get('blocks.0.attn.wq')?.data ?? [])).toEqual(Array.from(weights().get('blocks.0.attn.wq')?.data ?? []));
  });

  it('rejects malformed input with DecodeError', async () => {
    const good = encodeSafetensors(weights());
    const data = new Uint8Array(8);
    const cases: Uint8Array[] = [
      new Uint8Array(3), // shorter than the length prefix
      good.subarray(0, good.length - 4), // truncated data
      handMade('not json', new Uint8Array(0)),
      handMade('[1, 2]', new Uint8Array(0)),
      handMade('{"a":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}}', data),
      handMade('{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,8]}}', data), // size mismatch for 2-byte elements
      handMade('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', data), // size mismatch
      handMade('{"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', data), // gap at start
      handMade('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}', data), // overlap
      handMade('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', data),
      handMade('{"__metadata__":{"k":1}}', new Uint8Array(0)),
    ];
    const huge = new Uint8Array(16);
    new DataView(huge.buffer).setBigUint64(0, 1n << 40n, true);
    cases.push(huge);
    for (const bytes of cases) {
      expect(() => decodeSafetensors(bytes)).toThrow(DecodeError);
    }
    const path = join(dir, 'bad.safetensors');
    await writeFile(path, handMade('{"a":', new Uint8Array(0)));
    await expect(loadSafetensors(path)).rejects.toBeInstanceOf(DecodeError);
  });

  it('refuses to encode data that does not match its shape', () => {
    const bad: NamedWeights = new Map([['a', { shape: [3], data: new Float32Array(2) }]]);
    expect(() => encodeSafetensors(bad)).toThrow(ShapeError);
  });
});
