/**
 * The wire layer under lib/tinker/proto.ts (protobuf-es's BinaryReader / BinaryWriter): what rxrl asks of it beyond
 * the round trips of proto.spec.ts. Malformed bytes anywhere, nested or not, come out as a ProtoError naming the
 * field path and byte offset, never as the codec's own error; rxrl's strictness (varints of at most ten bytes, keys
 * and lengths within 32 bits, groups at most 64 deep) holds where the codec alone would be lax; unknown groups are
 * skipped inside nested messages; and the encoders write canonical protobuf byte for byte. Bytes are built by hand
 * (bench/_protobuf.ts), independent of the codec under test.
 */
import { describe, expect, it } from 'vitest';

import { le, lField, sField, tag, vField, varint } from '../../bench/_protobuf.js';
import { createRng } from '../../lib/core/random.js';
import {
  ProtoError,
  decodeForwardBackwardOutput,
  decodeForwardBackwardRequest,
  decodeSampleResponse,
  encodeForwardBackwardOutput,
  encodeForwardBackwardRequest,
  encodeSampleResponse,
  readForwardBackwardModelId,
  type ForwardBackwardRequest,
} from '../../lib/tinker/proto.js';

const REQUEST = 'ForwardBackwardRequest';
const WEIGHTS = `${REQUEST}.data[0].loss_fn_inputs["weights"]`;

/** A ForwardBackwardRequest with one datum made of `datumFields`. */
const requestWith = (...datumFields: number[][]): Uint8Array =>
  Uint8Array.from([...sField(1, 'm'), ...vField(2, 1), ...lField(3, datumFields.flat()), ...sField(4, 'cross_entropy')]);
const textChunk = (tokens: number[]): number[] => lField(1, lField(1, lField(1, le('i32', tokens))));
const tensorEntry = (key: string, tensor: number[]): number[] => lField(2, [...sField(1, key), ...lField(2, tensor)]);
const f64 = (value: number): number[] => {
  const bytes = new Uint8Array(8);
  new DataView(bytes.buffer).setFloat64(0, value, true);
  return Array.from(bytes);
};
const hex = (bytes: ArrayLike<number>): string => Buffer.from(Uint8Array.from(bytes)).toString('hex');

/** The ProtoError `run` throws (fails the test on anything else, or on no error). */
function protoError(run: () => unknown): ProtoError {
  try {
    run();
  } catch (error) {
    expect(error).toBeInstanceOf(ProtoError);
    return error as ProtoError;
  }
  return expect.fail('expected a ProtoError, got a result');
}

/** A group of field `field` holding one field of every wire type and a nested group. */
const unknownGroup = (field: number): number[] => [
  ...tag(field, 3),
  ...vField(1, 2n ** 63n),
  ...tag(2, 1),
  ...f64(1),
  ...tag(3, 5),
  1,
  2,
  3,
  4,
  ...lField(4, [9, 9, 9]),
  ...tag(5, 3),
  ...vField(1, 1),
  ...tag(5, 4),
  ...tag(field, 4),
];

describe('the Tinker wire layer: malformed input', () => {
  it('turns a truncated varint inside a nested tensor into a ProtoError naming the tensor and the byte', () => {
    const tensor = [...lField(1, le('f32', [1])), ...tag(3, 0), 0x81]; // dtype's varint cut at the tensor's end
    const error = protoError(() => decodeForwardBackwardRequest(requestWith(textChunk([1]), tensorEntry('weights', tensor))));
    expect(error.path).toBe(WEIGHTS);
    expect(error.message).toContain(WEIGHTS);
    expect(error.message).toMatch(/truncated varint \(at byte 7 of 8\)/);
    expect(error.cause).toBeInstanceOf(Error); // the codec's own error, kept as the cause
    expect(error.cause).not.toBeInstanceOf(ProtoError);
  });

  it('names the path of a malformed value in a sampled sequence and in a forward/backward record', () => {
    expect(protoError(() => decodeSampleResponse(Uint8Array.from(lField(1, [...tag(1, 0), 0x80])))).path).toBe(
      'SampleResponse.sequences[0]',
    );
    expect(protoError(() => decodeSampleResponse(Uint8Array.from([...lField(1, []), ...lField(1, [...tag(2, 2), 9])]))).path).toBe(
      'SampleResponse.sequences[1]',
    );
    const record = lField(2, [...tag(3, 0), 0xff, 0xff]);
    expect(protoError(() => decodeForwardBackwardOutput(Uint8Array.from(record))).path).toBe('ForwardBackwardOutput.loss_fn_outputs[0]');
  });

  it('refuses a varint of more than ten bytes, in a packed shape and in a field it skips', () => {
    const shape = [...lField(1, le('f32', [1])), ...vField(3, 1), ...lField(4, [...new Array<number>(10).fill(0x80), 0x00])];
    expect(protoError(() => decodeForwardBackwardRequest(requestWith(tensorEntry('weights', shape)))).path).toBe(`${WEIGHTS}.shape`);
    const skipped = Uint8Array.from([...tag(20, 0), ...new Array<number>(10).fill(0xff), 0x01, ...sField(1, 'm')]);
    expect(protoError(() => decodeForwardBackwardRequest(skipped)).path).toBe(REQUEST);
  });

  it('refuses a length or a key past 32 bits rather than reading its low 32 bits', () => {
    // Read as their low 32 bits, these would be a valid model_id "abc" and a key of field 1 (model_id) holding "a".
    const length = Uint8Array.from([...tag(1, 2), ...varint(2 ** 32 + 3), 0x61, 0x62, 0x63]);
    expect(protoError(() => decodeForwardBackwardRequest(length)).path).toBe(REQUEST);
    const key = Uint8Array.from([...varint((2 ** 29 + 1) * 8 + 2), ...varint(1), 0x61]);
    expect(protoError(() => decodeForwardBackwardRequest(key)).path).toBe(REQUEST);
    const largest = Uint8Array.from([...tag(2 ** 29 - 1, 0), 1, ...sField(1, 'm')]); // the largest field number: skipped
    expect(decodeForwardBackwardRequest(largest).modelId).toBe('m');
  });

  it('refuses invalid UTF-8 in a map key and a truncated double in a config entry, naming the map', () => {
    const key = lField(2, [...lField(1, [0xc3, 0x28]), ...lField(2, [...lField(1, le('f32', [1])), ...vField(3, 1)])]);
    expect(protoError(() => decodeForwardBackwardRequest(requestWith(key))).path).toBe(`${REQUEST}.data[0].loss_fn_inputs`);
    const double = Uint8Array.from(lField(5, [...sField(1, 'a'), ...tag(2, 1), 1, 2, 3]));
    expect(protoError(() => decodeForwardBackwardRequest(double)).path).toBe(`${REQUEST}.loss_fn_config`);
  });

  it('lets nothing but a ProtoError out of a decoder, for every prefix of a message and seeded byte corruptions', () => {
    const request = encodeForwardBackwardRequest({
      modelId: 'sess-1:train:0',
      seqId: -2,
      lossFn: 'ppo',
      lossFnConfig: { clip: 0.2, variant: 'token' },
      forwardOnly: false,
      data: [
        { tokens: [1, 200, 3], lossFnInputs: { target_tokens: { dtype: 'int64', data: [200, 3, 2 ** 40], shape: [3] } } },
        { tokens: [7], lossFnInputs: { weights: { dtype: 'float32', data: [0.5], shape: [1, 1] } } },
      ],
    });
    const withUnknown = Uint8Array.from([...request, ...unknownGroup(30)]);
    const output = encodeForwardBackwardOutput({ outputs: [{ logprobs: Float32Array.of(-1, -2) }], metrics: { 'loss:sum': 3 } });
    const sample = encodeSampleResponse({
      sequences: [{ tokens: [5, 6], logprobs: [-1, -2], stopReason: 'length' }],
      promptLogprobs: [Number.NaN],
    });
    const limits = { maxDatumTokens: 64, maxElements: 256 };
    const decoders: [Uint8Array, (bytes: Uint8Array) => unknown][] = [
      [withUnknown, (bytes) => decodeForwardBackwardRequest(bytes, limits)],
      [withUnknown, readForwardBackwardModelId],
      [output, decodeForwardBackwardOutput],
      [sample, decodeSampleResponse],
    ];
    const rng = createRng(33, 'corrupt');
    let refused = 0;
    const attempt = (decode: (bytes: Uint8Array) => unknown, bytes: Uint8Array): void => {
      try {
        decode(bytes);
      } catch (error) {
        expect(error).toBeInstanceOf(ProtoError);
        refused++;
      }
    };
    for (const [bytes, decode] of decoders) {
      for (let cut = 0; cut < bytes.length; cut++) attempt(decode, bytes.subarray(0, cut));
      for (let round = 0; round < 300; round++) {
        const corrupt = bytes.slice();
        const changes = 1 + Math.floor(rng.next() * 3);
        for (let c = 0; c < changes; c++) corrupt[Math.floor(rng.next() * corrupt.length)] = Math.floor(rng.next() * 256);
        attempt(decode, corrupt);
      }
    }
    expect(refused).toBeGreaterThan(500); // most cuts and corruptions are malformed: the check saw real errors
  });

  it('reads the last model_id without the datums; malformed framing before one is a ProtoError, after one ends the scan', () => {
    const garbage = lField(3, [0xff, 0xff, 0xff]); // framed, but no valid datum inside
    expect(readForwardBackwardModelId(Uint8Array.from([...sField(1, 'a'), ...garbage, ...sField(1, 'b')]))).toBe('b');
    expect(readForwardBackwardModelId(Uint8Array.from([...sField(1, 'a'), ...tag(3, 2), 5, 1]))).toBe('a');
    expect(protoError(() => readForwardBackwardModelId(Uint8Array.from([...tag(3, 2), 5, 1]))).path).toBe(REQUEST);
  });
});

describe('the Tinker wire layer: unknown fields and groups', () => {
  it('skips groups rxrl does not know inside a tensor, a map entry, a chunk, a sampled sequence and a record', () => {
    const tensor = [...unknownGroup(9), ...lField(1, le('f32', [0.5, 2])), ...unknownGroup(9), ...vField(3, 1), ...lField(4, [2])];
    const entry = lField(2, [...unknownGroup(3), ...sField(1, 'weights'), ...lField(2, tensor), ...unknownGroup(4)]);
    const chunk = lField(1, [...unknownGroup(7), ...lField(1, [...unknownGroup(5), ...lField(1, le('i32', [4, 5]))])]);
    const [datum] = decodeForwardBackwardRequest(requestWith(chunk, entry)).data;
    expect(datum.tokens).toEqual([4, 5]);
    expect(datum.lossFnInputs.weights).toEqual({ dtype: 'float32', data: Float32Array.of(0.5, 2), shape: [2] });

    const sequence = lField(1, [...unknownGroup(6), ...vField(1, 1), ...lField(2, le('i32', [8])), ...lField(3, le('f32', [-1]))]);
    expect(decodeSampleResponse(Uint8Array.from([...unknownGroup(3), ...sequence])).sequences).toEqual([
      { tokens: [8], logprobs: [-1], stopReason: 'length' },
    ]);

    const batched = [...unknownGroup(8), ...lField(1, le('f32', [3])), ...lField(2, le('i64', [0, 4])), ...vField(3, 1)];
    const record = lField(2, [...unknownGroup(5), ...lField(2, [...sField(1, 'x'), ...lField(2, batched)]), ...vField(3, 1)]);
    expect(decodeForwardBackwardOutput(Uint8Array.from(record)).outputs).toEqual([{ x: Float32Array.of(3) }]);
  });

  it('skips groups nested 64 deep and refuses 65, and a group closed by another field', () => {
    const nested = (depth: number): number[] => [
      ...new Array<number[]>(depth).fill(tag(9, 3)).flat(),
      ...new Array<number[]>(depth).fill(tag(9, 4)).flat(),
    ];
    expect(decodeForwardBackwardRequest(Uint8Array.from([...nested(64), ...sField(1, 'm')])).modelId).toBe('m');
    expect(protoError(() => decodeForwardBackwardRequest(Uint8Array.from([...nested(65), ...sField(1, 'm')]))).path).toBe(REQUEST);
    const deepInTensor = [...nested(65), ...lField(1, le('f32', [1])), ...vField(3, 1)]; // a valid tensor but for the groups
    expect(protoError(() => decodeForwardBackwardRequest(requestWith(tensorEntry('weights', deepInTensor)))).path).toBe(WEIGHTS);
    expect(protoError(() => decodeForwardBackwardRequest(Uint8Array.from([...tag(9, 3), ...tag(10, 4)]))).path).toBe(REQUEST);
    expect(protoError(() => decodeForwardBackwardRequest(Uint8Array.from([...tag(9, 3), ...tag(1, 7)]))).path).toBe(REQUEST);
  });

  it('keeps a leading U+FEFF of a string: it is text in protobuf, not a byte-order mark', () => {
    expect(decodeForwardBackwardRequest(Uint8Array.from(sField(1, '\ufeffsess-1'))).modelId).toBe('\ufeffsess-1');
  });
});

describe('the Tinker wire layer: encoding', () => {
  it('writes canonical protobuf byte for byte: lengths past 127 at every nesting level, sign-extended negatives, packed shapes', () => {
    const tokens = Array.from({ length: 40 }, (_, i) => 1000 + i); // 160 bytes: a two-byte length at each level
    const targets = tokens.map((t) => t + 1);
    const req: ForwardBackwardRequest = {
      modelId: 'sess-1:train:0',
      seqId: -3,
      lossFn: 'ppo',
      lossFnConfig: { a: 1.5, t: 'x' },
      forwardOnly: true,
      data: [{ tokens, lossFnInputs: { target_tokens: { dtype: 'int64', data: targets, shape: [40] } } }],
    };
    const tensor = [...lField(1, le('i64', targets)), ...vField(3, 2), ...lField(4, varint(40))];
    const datum = [...textChunk(tokens), ...lField(2, [...sField(1, 'target_tokens'), ...lField(2, tensor)])];
    const expected = [
      ...sField(1, 'sess-1:train:0'),
      ...vField(2, -3), // ten bytes
      ...lField(3, datum),
      ...sField(4, 'ppo'),
      ...lField(5, [...sField(1, 'a'), ...tag(2, 1), ...f64(1.5)]),
      ...vField(6, 1),
      ...lField(7, [...sField(1, 'a'), ...lField(2, [...tag(1, 1), ...f64(1.5)])]),
      ...lField(7, [...sField(1, 't'), ...lField(2, sField(2, 'x'))]),
    ];
    expect(hex(encodeForwardBackwardRequest(req))).toBe(hex(expected));

    const logprobs = tokens.map((_, i) => -i / 8);
    const sample = encodeSampleResponse({ sequences: [{ tokens, logprobs, stopReason: 'length' }], promptLogprobs: [Number.NaN, -1] });
    const sequence = [...vField(1, 1), ...lField(2, le('i32', tokens)), ...lField(3, le('f32', logprobs))];
    expect(hex(sample)).toBe(hex([...lField(1, sequence), ...lField(2, le('f32', [Number.NaN, -1]))]));
  });
});
