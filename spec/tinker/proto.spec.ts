import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

import { describe, expect, it } from 'vitest';

import {
  ProtoError,
  decodeForwardBackwardOutput,
  decodeForwardBackwardRequest,
  decodeSampleResponse,
  encodeForwardBackwardOutput,
  encodeForwardBackwardRequest,
  encodeSampleResponse,
  type ForwardBackwardOutputWire,
  type ForwardBackwardRequest,
  type SampleResponseWire,
  type WireTensor,
} from '../../lib/tinker/proto.js';
import { lacks } from '../helpers/testSetup.js';
import { le, lField, sField, tag, vField, varint } from '../../bench/_protobuf.js';

const run = promisify(execFile);

/** The interpreter with the official SDK (`tinker==0.38.0`). */
const PYTHON = process.env.RXRL_TINKER_PYTHON ?? 'python3';

// ---------------------------------------------------------------------------------------------------------------
// Hand-built protobuf bytes (independent of the codec under test)
// ---------------------------------------------------------------------------------------------------------------

/** A ForwardBackwardRequest with one datum made of `datumFields`. */
const requestWith = (...datumFields: number[][]): Uint8Array =>
  Uint8Array.from([...sField(1, 'm'), ...vField(2, 1), ...lField(3, datumFields.flat()), ...sField(4, 'cross_entropy')]);
const textChunk = (tokens: number[]): number[] => lField(1, lField(1, lField(1, le('i32', tokens))));
const tensorEntry = (key: string, tensor: number[]): number[] => lField(2, [...sField(1, key), ...lField(2, tensor)]);
const hex = (bytes: Uint8Array): string => Buffer.from(bytes).toString('hex');
const unhex = (text: string): Uint8Array => new Uint8Array(Buffer.from(text, 'hex'));

/** `tensor.data` as plain numbers. */
const values = (tensor: WireTensor): number[] => Array.from(tensor.data as ArrayLike<number>);

// ---------------------------------------------------------------------------------------------------------------
// The official SDK
// ---------------------------------------------------------------------------------------------------------------

let sdkCheck: Promise<void> | undefined;
/** Fails (never skips) when the SDK cannot be imported with {@link PYTHON}. */
function requireSdk(): Promise<void> {
  sdkCheck ??= run(PYTHON, ['-c', 'import tinker, numpy']).then(
    () => undefined,
    (error: unknown) => {
      const detail = (error as { stderr?: string }).stderr?.trim().split('\n').at(-1) ?? String(error);
      throw new Error(
        `The Tinker SDK cannot be imported with ${PYTHON} (${detail}). ` +
          'Run `pip install tinker==0.38.0` for that interpreter, or point RXRL_TINKER_PYTHON at one that has it.',
      );
    },
  );
  return sdkCheck;
}

/** Runs `script` with the SDK's interpreter and parses the JSON it prints last. */
async function python<T>(script: string, ...args: string[]): Promise<T> {
  await requireSdk();
  const { stdout } = await run(PYTHON, ['-c', script, ...args], { maxBuffer: 64 * 1024 * 1024 });
  return JSON.parse(stdout.trim().split('\n').at(-1) ?? 'null') as T;
}

/** Builds requests with `tinker.types` and serializes them exactly as `resources/training.py` does. */
const SDK_ENCODES_REQUESTS = String.raw`
import json
import numpy as np
from tinker import types
from tinker.proto.request_conv import forward_backward_request_to_proto

def serialize(data, loss_fn, config, seq_id, forward_only):
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn, loss_fn_config=config),
        model_id="sess-1:train:0",
        seq_id=seq_id,
    )
    msg = forward_backward_request_to_proto(request)
    msg.forward_only = forward_only  # what AsyncTrainingResource.forward_backward does
    return msg.SerializeToString().hex()

cross_entropy = [
    types.Datum(
        model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2, 3]), types.EncodedTextChunk(tokens=[4, 5])]),
        loss_fn_inputs={"target_tokens": [2, 3, 4, 5, 151643], "weights": [0, 0, 1, 1, 0.25]},
    ),
    types.Datum(model_input=types.ModelInput.from_ints([7]), loss_fn_inputs={"target_tokens": [8], "weights": [1.0]}),
    types.Datum(model_input=types.ModelInput.from_ints([]), loss_fn_inputs={"target_tokens": [], "weights": []}),
]
importance_sampling = [
    types.Datum(
        model_input=types.ModelInput.from_ints([10, 11, 12]),
        loss_fn_inputs={"target_tokens": [11, 12, 13], "logprobs": [-0.5, -1.25, -0.1], "advantages": [0.75, 0.75, 0.75]},
    ),
    types.Datum(
        model_input=types.ModelInput.from_ints([20, 21]),
        loss_fn_inputs={"target_tokens": [21, 22], "logprobs": [-2.0, -0.3], "advantages": [-1.5, -1.5]},
    ),
]
sparse = [
    types.Datum(
        model_input=types.ModelInput.from_ints([1, 2, 3]),
        loss_fn_inputs={
            "target_tokens": types.TensorData(
                data=[5, 9, 7], dtype="int64", shape=[2, 4], sparse_crow_indices=[0, 2, 3], sparse_col_indices=[0, 3, 1]
            ),
            "weights": types.TensorData(
                data=np.array([0.5, 1.0], dtype=np.float32), dtype="float32", shape=[2, 4],
                sparse_crow_indices=[0, 0, 2], sparse_col_indices=[1, 2],
            ),
            "advantages": types.TensorData.from_numpy(np.arange(6, dtype=np.float32).reshape(2, 3)),
        },
    )
]
image_chunk = types.ImageChunk(data=b"\x89PNG", format="png", expected_tokens=4)
image = [types.Datum(
    model_input=types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1]), image_chunk]),
    loss_fn_inputs={"target_tokens": [1, 2, 3, 4, 5]},
)]
dmel = [types.Datum(
    model_input=types.ModelInput(chunks=[types.DmelChunk(dmel=b"\x00\x01")]),
    loss_fn_inputs={"target_tokens": [1]},
)]

print(json.dumps({
    "cross_entropy": serialize(cross_entropy, "cross_entropy", None, 7, True),
    "importance_sampling": serialize(
        importance_sampling, "importance_sampling",
        {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "mode": "token"}, 2, False,
    ),
    "sparse": serialize(sparse, "cross_entropy", None, 3, False),
    "image": serialize(image, "cross_entropy", None, 4, False),
    "dmel": serialize(dmel, "cross_entropy", None, 5, False),
}))
`;

/** Decodes the payloads in argv[1] (`{ name: [kind, hex] }`) with the SDK's `response_conv` and prints what it read. */
const SDK_DECODES_RESPONSES = String.raw`
import json, sys
from tinker.proto.response_conv import deserialize_forward_backward_output, deserialize_sample_response

def fbo(raw):
    out = deserialize_forward_backward_output(raw)
    return {
        "loss_fn_output_type": out.loss_fn_output_type,
        "metrics": out.metrics,
        "outputs": [
            {k: {"dtype": td.dtype, "shape": td.shape, "data": td.data} for k, td in d.items()}
            for d in out.loss_fn_outputs
        ],
    }

def sample(raw):
    res = deserialize_sample_response(raw)
    return {
        "sequences": [{"tokens": s.tokens, "logprobs": s.logprobs, "stop_reason": s.stop_reason} for s in res.sequences],
        "prompt_logprobs": res.prompt_logprobs,
    }

def request(raw):
    # No SDK function reads requests (that is the server's side): parse with the SDK's generated message class
    # and its tensor reader.
    from tinker.proto import tinker_public_pb2 as public_pb
    from tinker.proto.response_conv import _tensor_data_from_proto
    import numpy as np
    msg = public_pb.ForwardBackwardRequest()
    msg.ParseFromString(raw)
    return {
        "model_id": msg.model_id, "seq_id": msg.seq_id, "loss_fn": msg.loss_fn, "forward_only": msg.forward_only,
        "loss_fn_config": dict(msg.loss_fn_config),
        "loss_fn_config_v2": {k: getattr(v, v.WhichOneof("value")) for k, v in msg.loss_fn_config_v2.items()},
        "data": [{
            "tokens": [t for c in d.model_input for t in np.frombuffer(c.encoded_text.tokens, dtype=np.int32).tolist()],
            "loss_fn_inputs": {
                k: {"dtype": td.dtype, "shape": td.shape, "data": td.data}
                for k, td in ((k, _tensor_data_from_proto(v)) for k, v in d.loss_fn_inputs.items())
            },
        } for d in msg.data],
    }

readers = {"fbo": fbo, "sample": sample, "request": request}
payloads = json.loads(sys.argv[1])
print(json.dumps({name: readers[kind](bytes.fromhex(data)) for name, (kind, data) in payloads.items()}))
`;

// ---------------------------------------------------------------------------------------------------------------
// Round trips in TypeScript
// ---------------------------------------------------------------------------------------------------------------

describe('ForwardBackwardRequest', () => {
  const request: ForwardBackwardRequest = {
    modelId: 'sess-1:train:0',
    seqId: 12,
    lossFn: 'ppo',
    lossFnConfig: { clip_low_threshold: 0.8, clip_high_threshold: 1.2, variant: 'token-level', zero: 0 },
    forwardOnly: true,
    data: [
      {
        tokens: [1, 2, 3, 151_643, -1],
        lossFnInputs: {
          target_tokens: { dtype: 'int64', data: [2, 3, 151_643, 4, 2 ** 40], shape: [5] },
          logprobs: { dtype: 'float32', data: Float32Array.of(-0.5, -1.25, -0.1, 0, -3), shape: [5] },
          advantages: { dtype: 'float32', data: [0.5, 0.5, 0.5, -0.5, Number.NaN], shape: [5] },
        },
      },
      { tokens: [], lossFnInputs: {} },
      {
        tokens: [9],
        lossFnInputs: {
          target_tokens: { dtype: 'int64', data: BigInt64Array.of(-7n, 8n), shape: [1, 2] },
          weights: { dtype: 'float32', data: new Float32Array(0), shape: [0] },
        },
      },
    ],
  };

  it('round-trips through encode and decode', () => {
    const decoded = decodeForwardBackwardRequest(encodeForwardBackwardRequest(request));
    expect(decoded.modelId).toBe('sess-1:train:0');
    expect(decoded.seqId).toBe(12);
    expect(decoded.lossFn).toBe('ppo');
    expect(decoded.forwardOnly).toBe(true);
    expect(decoded.lossFnConfig).toEqual({ clip_low_threshold: 0.8, clip_high_threshold: 1.2, variant: 'token-level', zero: 0 });
    expect(decoded.data).toHaveLength(3);

    const [first, empty, last] = decoded.data;
    expect(first.tokens).toEqual([1, 2, 3, 151_643, -1]);
    expect(first.lossFnInputs.target_tokens).toEqual({ dtype: 'int64', data: [2, 3, 151_643, 4, 2 ** 40], shape: [5] });
    expect(first.lossFnInputs.logprobs.dtype).toBe('float32');
    expect(first.lossFnInputs.logprobs.data).toBeInstanceOf(Float32Array);
    expect(values(first.lossFnInputs.logprobs)).toEqual([-0.5, -1.25, Math.fround(-0.1), 0, -3]);
    expect(values(first.lossFnInputs.advantages)).toEqual([0.5, 0.5, 0.5, -0.5, Number.NaN]);
    expect(empty).toEqual({ tokens: [], lossFnInputs: {} });
    expect(last.tokens).toEqual([9]);
    expect(last.lossFnInputs.target_tokens).toEqual({ dtype: 'int64', data: [-7, 8], shape: [1, 2] });
    expect(last.lossFnInputs.weights).toEqual({ dtype: 'float32', data: new Float32Array(0), shape: [0] });
  });

  it('decodes defaults from an empty message', () => {
    expect(decodeForwardBackwardRequest(new Uint8Array(0))).toEqual({
      modelId: '',
      seqId: 0,
      data: [],
      lossFn: '',
      lossFnConfig: {},
      forwardOnly: false,
    });
  });

  it('keeps a __proto__ key as a plain key', () => {
    const decoded = decodeForwardBackwardRequest(encodeForwardBackwardRequest({ ...request, lossFnConfig: { ['__proto__']: 3 } }));
    expect(Object.keys(decoded.lossFnConfig)).toEqual(['__proto__']);
    expect(Object.getPrototypeOf(decoded.lossFnConfig)).toBe(Object.prototype);
  });

  it('merges loss_fn_config and loss_fn_config_v2, v2 winning', () => {
    const v1 = (key: string, value: number): number[] => {
      const bytes = new Uint8Array(8);
      new DataView(bytes.buffer).setFloat64(0, value, true);
      return lField(5, [...sField(1, key), ...tag(2, 1), ...bytes]);
    };
    const v2 = (key: string, value: number[]): number[] => lField(7, [...sField(1, key), ...lField(2, value)]);
    const bytes = Uint8Array.from([...v1('a', 1), ...v1('b', 2), ...v2('b', sField(2, 'text')), ...v2('c', sField(2, 'x'))]);
    expect(decodeForwardBackwardRequest(bytes).lossFnConfig).toEqual({ a: 1, b: 'text', c: 'x' });
  });

  it('expands a sparse CSR tensor to dense row-major', () => {
    const csr = [...lField(1, le('f32', [0.5, 2, 3])), ...lField(2, le('i64', [0, 1, 1, 3])), ...lField(3, le('i64', [2, 0, 3]))];
    const tensor = [...lField(2, csr), ...vField(3, 1), ...lField(4, [...varint(3), ...varint(4)])];
    const intCsr = [...lField(1, le('i64', [42])), ...lField(2, le('i64', [0, 0, 1])), ...lField(3, le('i64', [1]))];
    const intTensor = [...lField(2, intCsr), ...vField(3, 2), ...lField(4, [2, 2])];
    const [datum] = decodeForwardBackwardRequest(requestWith(tensorEntry('weights', tensor), tensorEntry('target_tokens', intTensor))).data;
    expect(datum.lossFnInputs.weights.shape).toEqual([3, 4]);
    expect(values(datum.lossFnInputs.weights)).toEqual([0, 0, 0.5, 0, 0, 0, 0, 0, 2, 0, 0, 3]);
    expect(datum.lossFnInputs.target_tokens).toEqual({ dtype: 'int64', data: [0, 0, 0, 42], shape: [2, 2] });
  });

  it('widens INT32 to int64 and BFLOAT16 to float32, reads unpacked shapes and shapeless tensors as 1-D', () => {
    const int32 = [...lField(1, le('i32', [-3, 70_000])), ...vField(3, 3), ...vField(4, 1), ...vField(4, 2)];
    const bf16 = [...lField(1, le('u16', [0x3f80, 0xbfc0, 0x7fc0])), ...vField(3, 4)]; // 1, -1.5, NaN; no shape
    const [datum] = decodeForwardBackwardRequest(requestWith(tensorEntry('target_tokens', int32), tensorEntry('weights', bf16))).data;
    expect(datum.lossFnInputs.target_tokens).toEqual({ dtype: 'int64', data: [-3, 70_000], shape: [1, 2] });
    expect(datum.lossFnInputs.weights.dtype).toBe('float32');
    expect(datum.lossFnInputs.weights.shape).toEqual([3]);
    expect(values(datum.lossFnInputs.weights)).toEqual([1, -1.5, Number.NaN]);
  });

  it('concatenates encoded_text chunks and skips unknown fields of every wire type', () => {
    const fixed64 = [...tag(15, 1), 1, 2, 3, 4, 5, 6, 7, 8];
    const fixed32 = [...tag(16, 5), 1, 2, 3, 4];
    const group = [...tag(17, 3), ...vField(1, 5), ...tag(2, 3), ...tag(2, 4), ...tag(17, 4)];
    const span = lField(3, lField(1, [...sField(1, 'seq'), ...vField(2, 0), ...vField(3, 2)])); // a provenance span
    const bytes = Uint8Array.from([
      ...vField(99, 2n ** 63n),
      ...fixed64,
      ...requestWith(textChunk([1, 2]), fixed32, group, span, textChunk([3]), lField(20, [1, 2, 3])),
      ...group,
    ]);
    const decoded = decodeForwardBackwardRequest(bytes);
    expect(decoded.data[0].tokens).toEqual([1, 2, 3]);
    expect(decoded.lossFn).toBe('cross_entropy');
  });

  it('reads a negative seq_id written as a sign-extended varint', () => {
    expect(decodeForwardBackwardRequest(Uint8Array.from(vField(2, -5))).seqId).toBe(-5);
    expect(decodeForwardBackwardRequest(encodeForwardBackwardRequest({ ...request, seqId: -5 })).seqId).toBe(-5);
  });

  it.each([
    ['an image chunk', requestWith(lField(1, lField(2, sField(2, 'png')))), /model_input\[0\].*image chunks are not supported/],
    ['a dmel chunk', requestWith(textChunk([1]), lField(1, lField(3, lField(1, [0])))), /model_input\[1\].*dmel chunks are not supported/],
    ['an empty chunk', requestWith(lField(1, [])), /chunk has no encoded_text/],
    ['a truncated message', requestWith(textChunk([1, 2])).subarray(0, 12), /runs past the end|truncated/],
    ['a truncated varint', Uint8Array.of(0x10, 0x80), /truncated varint/],
    ['a wrong wire type', Uint8Array.from(vField(1, 3)), /field model_id \(1\) has wire type 0, expected 2/],
    ['field number 0', Uint8Array.of(0x00, 0x00), /invalid field number 0/],
    ['an invalid wire type', Uint8Array.of(0x0e), /invalid wire type 6/],
    ['an unterminated group', Uint8Array.from([...tag(9, 3), ...vField(1, 1)]), /unterminated group 9/],
    ['a stray end-group', Uint8Array.from(tag(9, 4)), /unexpected end-group/],
    ['tokens not a multiple of 4 bytes', requestWith(lField(1, lField(1, lField(1, [1, 0, 0])))), /tokens holds 3 bytes/],
    [
      'an unspecified dtype',
      requestWith(tensorEntry('weights', lField(1, le('f32', [1])))),
      /loss_fn_inputs\["weights"\].*unsupported dtype 0 \(DTYPE_UNSPECIFIED\)/,
    ],
    [
      'a shape that does not match',
      requestWith(tensorEntry('weights', [...lField(1, le('f32', [1, 2])), ...vField(3, 1), ...vField(4, 3)])),
      /holds 2 elements but shape \[3\] needs 3/,
    ],
    [
      'an int64 beyond 2^53',
      requestWith(tensorEntry('target_tokens', [...lField(1, le('i64', [2 ** 53 + 2])), ...vField(3, 2)])),
      /outside the safe-integer range/,
    ],
    [
      'a sparse tensor that is not 2-D',
      requestWith(tensorEntry('w', [...lField(2, []), ...vField(3, 1), ...vField(4, 0)])),
      /sparse CSR needs a 2-D shape/,
    ],
    [
      'sparse column out of range',
      requestWith(
        tensorEntry('w', [
          ...lField(2, [...lField(1, le('f32', [1])), ...lField(2, le('i64', [0, 1])), ...lField(3, le('i64', [5]))]),
          ...vField(3, 1),
          ...lField(4, [1, 2]),
        ]),
      ),
      /col_indices\[0\] = 5 is outside \[0, 2\)/,
    ],
    ['a map entry without a tensor', requestWith(lField(2, sField(1, 'weights'))), /map entry has no tensor value/],
  ])('refuses %s with a ProtoError', (_, bytes, message) => {
    expect(() => decodeForwardBackwardRequest(bytes)).toThrow(ProtoError);
    expect(() => decodeForwardBackwardRequest(bytes)).toThrow(message);
  });

  it('refuses to encode what the wire cannot carry', () => {
    const datum = request.data[0];
    expect(() => encodeForwardBackwardRequest({ ...request, data: [{ ...datum, tokens: [2 ** 31] }] })).toThrow(/not an int32/);
    expect(() => encodeForwardBackwardRequest({ ...request, seqId: 1.5 })).toThrow(ProtoError);
    const bad: Record<string, WireTensor> = { target_tokens: { dtype: 'int64', data: [1, 2], shape: [3] } };
    expect(() => encodeForwardBackwardRequest({ ...request, data: [{ tokens: [1], lossFnInputs: bad }] })).toThrow(/needs 3/);
    const fractional: Record<string, WireTensor> = { target_tokens: { dtype: 'int64', data: [1.5], shape: [1] } };
    expect(() => encodeForwardBackwardRequest({ ...request, data: [{ tokens: [1], lossFnInputs: fractional }] })).toThrow(
      /not a safe integer/,
    );
  });

  it('accepts a Buffer', () => {
    const bytes = encodeForwardBackwardRequest(request);
    const padded = Buffer.concat([Buffer.from([1, 2, 3]), Buffer.from(bytes)]).subarray(3); // a view at an odd offset
    expect(decodeForwardBackwardRequest(padded)).toEqual(decodeForwardBackwardRequest(bytes));
  });
});

describe('ForwardBackwardOutput', () => {
  const output: ForwardBackwardOutputWire = {
    outputs: [
      { logprobs: Float32Array.of(-0.5, -1.5, -0.25), elementwise_loss: Float32Array.of(0.5, 1.5, 0.25) },
      { logprobs: new Float32Array(0), elementwise_loss: new Float32Array(0) },
      { logprobs: Float32Array.of(-2), elementwise_loss: Float32Array.of(Number.NaN) },
    ],
    metrics: { 'loss:sum': 2.25, 'tokens:sum': 4, 'zero:mean': 0 },
  };

  it('round-trips through encode and decode, empty datums included', () => {
    expect(decodeForwardBackwardOutput(encodeForwardBackwardOutput(output))).toEqual(output);
  });

  it('round-trips no datums', () => {
    expect(decodeForwardBackwardOutput(encodeForwardBackwardOutput({ outputs: [], metrics: { 'loss:sum': 0 } }))).toEqual({
      outputs: [],
      metrics: { 'loss:sum': 0 },
    });
    expect(decodeForwardBackwardOutput(encodeForwardBackwardOutput({ outputs: [{}, {}], metrics: {} })).outputs).toEqual([{}, {}]);
  });

  it('writes one ArrayRecord with byte offsets', () => {
    const bytes = encodeForwardBackwardOutput({
      outputs: [{ logprobs: Float32Array.of(1, 2) }, { logprobs: Float32Array.of(3) }],
      metrics: {},
    });
    const batched = [...lField(1, le('f32', [1, 2, 3])), ...lField(2, le('i64', [0, 8, 12])), ...vField(3, 1)];
    const record = [...sField(1, 'ArrayRecord'), ...lField(2, [...sField(1, 'logprobs'), ...lField(2, batched)]), ...vField(3, 2)];
    expect(hex(bytes)).toBe(hex(Uint8Array.from([...sField(1, 'ArrayRecord'), ...lField(2, record)])));
  });

  it('reads several records, BFLOAT16 and INT32 fields, as the SDK does', () => {
    const record = (data: number[], offsets: number[], dtype: number, kind: 'f32' | 'u16' | 'i32', n: number): number[] => {
      const batched = [...lField(1, le(kind, data)), ...lField(2, le('i64', offsets)), ...vField(3, dtype)];
      return lField(2, [...lField(2, [...sField(1, 'x'), ...lField(2, batched)]), ...vField(3, n)]);
    };
    const bytes = Uint8Array.from([
      ...record([1, 2], [0, 4, 8], 1, 'f32', 2),
      ...record([0x4000], [0, 2], 4, 'u16', 1),
      ...record([-7, 9], [0, 8], 3, 'i32', 1),
    ]);
    const decoded = decodeForwardBackwardOutput(bytes);
    expect(decoded.outputs.map((o) => Array.from(o.x))).toEqual([[1], [2], [2], [-7, 9]]);
  });

  it('refuses datums with different fields, and bad offsets', () => {
    expect(() => encodeForwardBackwardOutput({ outputs: [{ a: new Float32Array(1) }, { b: new Float32Array(1) }], metrics: {} })).toThrow(
      /datum 1 has fields \[b\] but datum 0 has \[a\]/,
    );
    const overrun = [...lField(1, le('f32', [1])), ...lField(2, le('i64', [0, 8])), ...vField(3, 1)]; // 8 bytes past 4
    const bad = lField(2, lField(2, [...sField(1, 'x'), ...lField(2, overrun)]));
    expect(() => decodeForwardBackwardOutput(Uint8Array.from(bad))).toThrow(/not a valid byte range/);
    const short = lField(2, [
      ...lField(2, [...sField(1, 'x'), ...lField(2, [...lField(2, le('i64', [0])), ...vField(3, 1)])]),
      ...vField(3, 2),
    ]);
    expect(() => decodeForwardBackwardOutput(Uint8Array.from(short))).toThrow(/has 0 datums, expected 2/);
  });
});

describe('SampleResponse', () => {
  const response: SampleResponseWire = {
    sequences: [
      { tokens: [5, 6, 7], logprobs: [-0.1, -0.2, -0.3].map(Math.fround), stopReason: 'length' },
      { tokens: [8], logprobs: [-1.5], stopReason: 'stop' },
      { tokens: [], logprobs: [], stopReason: 'stop' },
    ],
    promptLogprobs: [Number.NaN, -1, Math.fround(-2.7)],
  };

  it('round-trips through encode and decode, NaN prompt logprobs included', () => {
    expect(decodeSampleResponse(encodeSampleResponse(response))).toEqual(response);
    expect(decodeSampleResponse(encodeSampleResponse({ sequences: response.sequences }))).toEqual({ sequences: response.sequences });
    expect(decodeSampleResponse(encodeSampleResponse({ sequences: [] }))).toEqual({ sequences: [] });
  });

  it('decodes the example bytes from the protocol notes', () => {
    const example = '0a1e0801120c0500000006000000070000001a0ccdccccbdcdcc4cbe9a9999be0a06120408000000120c0000c07f000080bf000000c0';
    expect(decodeSampleResponse(unhex(example))).toEqual({
      sequences: [
        { tokens: [5, 6, 7], logprobs: [-0.1, -0.2, -0.3].map(Math.fround), stopReason: 'length' },
        { tokens: [8], logprobs: [], stopReason: 'stop' },
      ],
      promptLogprobs: [Number.NaN, -1, -2],
    });
  });

  it('refuses unknown stop reasons and mismatched logprobs', () => {
    expect(() => decodeSampleResponse(Uint8Array.from(lField(1, vField(1, 2))))).toThrow(/sequences\[0\].*unknown stop_reason 2/);
    expect(() => encodeSampleResponse({ sequences: [{ tokens: [1, 2], logprobs: [-1], stopReason: 'stop' }] })).toThrow(
      /2 tokens but 1 logprobs/,
    );
  });
});

// ---------------------------------------------------------------------------------------------------------------
// Against the official SDK
// ---------------------------------------------------------------------------------------------------------------

describe.skipIf(lacks('python'))('against the tinker SDK', () => {
  it('decodes the requests the SDK serializes', async () => {
    const encoded = await python<Record<string, string>>(SDK_ENCODES_REQUESTS);

    const ce = decodeForwardBackwardRequest(unhex(encoded.cross_entropy));
    expect(ce).toMatchObject({ modelId: 'sess-1:train:0', seqId: 7, lossFn: 'cross_entropy', forwardOnly: true, lossFnConfig: {} });
    expect(ce.data.map((d) => d.tokens)).toEqual([[1, 2, 3, 4, 5], [7], []]);
    expect(ce.data.map((d) => d.lossFnInputs.target_tokens)).toEqual([
      { dtype: 'int64', data: [2, 3, 4, 5, 151_643], shape: [5] },
      { dtype: 'int64', data: [8], shape: [1] },
      { dtype: 'int64', data: [], shape: [0] },
    ]);
    expect(ce.data.map((d) => [d.lossFnInputs.weights.dtype, values(d.lossFnInputs.weights), d.lossFnInputs.weights.shape])).toEqual([
      ['float32', [0, 0, 1, 1, 0.25], [5]],
      ['float32', [1], [1]],
      ['float32', [], [0]],
    ]);

    const is = decodeForwardBackwardRequest(unhex(encoded.importance_sampling));
    expect(is).toMatchObject({ seqId: 2, lossFn: 'importance_sampling', forwardOnly: false });
    expect(is.lossFnConfig).toEqual({ clip_low_threshold: 0.8, clip_high_threshold: 1.2, mode: 'token' });
    expect(is.data.map((d) => d.tokens)).toEqual([
      [10, 11, 12],
      [20, 21],
    ]);
    expect(is.data.map((d) => d.lossFnInputs.target_tokens.data)).toEqual([
      [11, 12, 13],
      [21, 22],
    ]);
    expect(is.data.map((d) => values(d.lossFnInputs.logprobs))).toEqual([
      [-0.5, -1.25, -0.1].map(Math.fround),
      [-2, -0.3].map(Math.fround),
    ]);
    expect(is.data.map((d) => values(d.lossFnInputs.advantages))).toEqual([
      [0.75, 0.75, 0.75],
      [-1.5, -1.5],
    ]);
    expect(is.data.every((d) => d.lossFnInputs.logprobs.data instanceof Float32Array)).toBe(true);

    const [sparse] = decodeForwardBackwardRequest(unhex(encoded.sparse)).data;
    expect(sparse.lossFnInputs.target_tokens).toEqual({ dtype: 'int64', data: [5, 0, 0, 9, 0, 7, 0, 0], shape: [2, 4] });
    expect(sparse.lossFnInputs.weights.shape).toEqual([2, 4]);
    expect(values(sparse.lossFnInputs.weights)).toEqual([0, 0, 0, 0, 0, 0.5, 1, 0]);
    expect(sparse.lossFnInputs.advantages.shape).toEqual([2, 3]);
    expect(values(sparse.lossFnInputs.advantages)).toEqual([0, 1, 2, 3, 4, 5]);

    expect(() => decodeForwardBackwardRequest(unhex(encoded.image))).toThrow(/data\[0\]\.model_input\[1\].*image chunks are not supported/);
    expect(() => decodeForwardBackwardRequest(unhex(encoded.dmel))).toThrow(/dmel chunks are not supported/);
  });

  it('writes results the SDK reads back, and requests it parses', async () => {
    const request: ForwardBackwardRequest = {
      modelId: 'sess-1:train:0',
      seqId: 3,
      lossFn: 'importance_sampling',
      lossFnConfig: { clip_low_threshold: 0.8, mode: 'token' },
      forwardOnly: false,
      data: [
        {
          tokens: [10, 11, 12],
          lossFnInputs: {
            target_tokens: { dtype: 'int64', data: [11, 12, 13], shape: [3] },
            logprobs: { dtype: 'float32', data: [-0.5, -1.25, -0.1], shape: [3] },
            advantages: { dtype: 'float32', data: Float32Array.of(0.75, -0.75, 0), shape: [1, 3] },
          },
        },
        { tokens: [], lossFnInputs: {} },
      ],
    };
    const output: ForwardBackwardOutputWire = {
      outputs: [
        { logprobs: Float32Array.of(-0.5, -1.25, -0.1), elementwise_loss: Float32Array.of(0.5, 1.25, 0.1) },
        { logprobs: new Float32Array(0), elementwise_loss: new Float32Array(0) },
        { logprobs: Float32Array.of(-3), elementwise_loss: Float32Array.of(3) },
      ],
      metrics: { 'loss:sum': 4.85, 'ntokens:sum': 4 },
    };
    const sample: SampleResponseWire = {
      sequences: [
        { tokens: [5, 6, 7], logprobs: [-0.1, -0.2, -0.3], stopReason: 'length' },
        { tokens: [151_643], logprobs: [-0.01], stopReason: 'stop' },
      ],
      promptLogprobs: [Number.NaN, -1, -2.5, Number.NaN],
    };
    const payloads = {
      fbo: ['fbo', hex(encodeForwardBackwardOutput(output))],
      empty: ['fbo', hex(encodeForwardBackwardOutput({ outputs: [], metrics: { 'loss:sum': 0 } }))],
      sample: ['sample', hex(encodeSampleResponse(sample))],
      plain: ['sample', hex(encodeSampleResponse({ sequences: [{ tokens: [1], logprobs: [-1], stopReason: 'stop' }] }))],
      request: ['request', hex(encodeForwardBackwardRequest(request))],
    };
    interface SdkTensor {
      dtype: string;
      shape: number[];
      data: number[];
    }
    interface SdkOutput {
      loss_fn_output_type: string;
      metrics: Record<string, number>;
      outputs: Record<string, SdkTensor>[];
    }
    interface SdkSample {
      sequences: { tokens: number[]; logprobs: number[] | null; stop_reason: string }[];
      prompt_logprobs: (number | null)[] | null;
    }
    const read = await python<{ fbo: SdkOutput; empty: SdkOutput; sample: SdkSample; plain: SdkSample; request: unknown }>(
      SDK_DECODES_RESPONSES,
      JSON.stringify(payloads),
    );

    expect(read.fbo.loss_fn_output_type).toBe('ArrayRecord');
    expect(read.fbo.metrics).toEqual({ 'loss:sum': 4.85, 'ntokens:sum': 4 });
    expect(read.fbo.outputs).toEqual(
      output.outputs.map((record) =>
        Object.fromEntries(
          Object.entries(record).map(([name, data]) => [name, { dtype: 'float32', shape: [data.length], data: Array.from(data) }]),
        ),
      ),
    );
    expect(read.empty).toEqual({ loss_fn_output_type: 'ArrayRecord', metrics: { 'loss:sum': 0 }, outputs: [] });

    expect(read.sample.sequences).toEqual([
      { tokens: [5, 6, 7], logprobs: [-0.1, -0.2, -0.3].map(Math.fround), stop_reason: 'length' },
      { tokens: [151_643], logprobs: [Math.fround(-0.01)], stop_reason: 'stop' },
    ]);
    expect(read.sample.prompt_logprobs).toEqual([null, -1, -2.5, null]);
    expect(read.plain).toEqual({ sequences: [{ tokens: [1], logprobs: [-1], stop_reason: 'stop' }], prompt_logprobs: null });

    expect(read.request).toEqual({
      model_id: 'sess-1:train:0',
      seq_id: 3,
      loss_fn: 'importance_sampling',
      forward_only: false,
      loss_fn_config: { clip_low_threshold: 0.8 },
      loss_fn_config_v2: { clip_low_threshold: 0.8, mode: 'token' },
      data: [
        {
          tokens: [10, 11, 12],
          loss_fn_inputs: {
            target_tokens: { dtype: 'int64', shape: [3], data: [11, 12, 13] },
            logprobs: { dtype: 'float32', shape: [3], data: [-0.5, -1.25, -0.1].map(Math.fround) },
            advantages: { dtype: 'float32', shape: [1, 3], data: [0.75, -0.75, 0] },
          },
        },
        { tokens: [], loss_fn_inputs: {} },
      ],
    });
  });
});
