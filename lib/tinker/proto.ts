/**
 * rxrl's mapping of the part of the Tinker API wire format (package `tinker_public`, as spoken by the
 * `tinker==0.38.0` Python SDK) that a Tinker-compatible server needs, onto protobuf-es's binary wire layer
 * (`@bufbuild/protobuf/wire`: `BinaryReader`, `BinaryWriter`, which pass the protobuf conformance suite):
 *
 * - `ForwardBackwardRequest`: the body of `POST /api/v1/forward_backward` (decoded by the server);
 * - `ForwardBackwardOutput`: the result of a forward/backward future (encoded by the server);
 * - `SampleResponse`: the result of a sample future (encoded by the server);
 *
 * and, for tests and a future client, the opposite direction of each.
 *
 * Field numbers follow the SDK's descriptor (`tinker/proto/tinker_public_pb2.py`); the encoders write what the
 * SDK's `proto/response_conv.py` reads, the decoders read what its `proto/request_conv.py` writes. Raw arrays
 * inside `bytes` fields are little-endian on every platform (read and written through `DataView`).
 *
 * Decoding follows protobuf rules: unknown fields are skipped by wire type (groups included, at most 64 deep), a
 * repeated scalar is accepted packed or unpacked, the last occurrence of a singular field wins, and a map is a
 * repeated entry message `{ key = 1; value = 2 }` whose missing key or value takes the default. Malformed input
 * throws a {@link ProtoError} whose message names the field path and byte offset (the codec's own error, if any, is
 * its `cause`); nothing else escapes a decoder.
 *
 * @packageDocumentation
 */

import { BinaryReader, BinaryWriter, WireType, getTextEncoding } from '@bufbuild/protobuf/wire';

import { RxrlError } from '../core/errors.js';

// ---------------------------------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------------------------------

/** Element type of a {@link WireTensor}: the public Tinker `TensorDtype`. */
export type TensorDtype = 'float32' | 'int64';

/**
 * A tensor as it travels in a `Tensor` message (a `loss_fn_inputs` value).
 *
 * Decoded tensors are always dense and row-major: `float32` data is a `Float32Array`, `int64` data a `number[]`
 * of safe integers. Encoders also accept a `BigInt64Array` (or any of the three forms for either dtype).
 */
export interface WireTensor {
  /** Element type. `INT32` on the wire decodes as `int64`, `BFLOAT16` as `float32`. */
  readonly dtype: TensorDtype;
  /** Elements in row-major order; `data.length` equals the product of `shape`. */
  readonly data: Float32Array | BigInt64Array | number[];
  /** Dense shape, e.g. `[T]` or `[B, T]`. A tensor sent without a shape decodes as 1-D `[data.length]`. */
  readonly shape: readonly number[];
}

/** One training example of a forward/backward request. */
export interface WireDatum {
  /** Model input tokens: every `encoded_text` chunk's tokens, concatenated in order. */
  readonly tokens: number[];
  /** Loss inputs by name (`target_tokens` int64, `weights`, `logprobs`, `advantages` float32, ...). */
  readonly lossFnInputs: Readonly<Record<string, WireTensor>>;
}

/** A decoded `ForwardBackwardRequest` (`POST /api/v1/forward_backward`, also used by `forward()`). */
export interface ForwardBackwardRequest {
  /** The training model, e.g. `sess-1:train:0`. */
  readonly modelId: string;
  /** Per-model request sequence number (`1, 2, 3, ...`); requests run in this order. */
  readonly seqId: number;
  /** The batch, in order. */
  readonly data: WireDatum[];
  /** Loss name, e.g. `cross_entropy`, `importance_sampling`, `ppo`. */
  readonly lossFn: string;
  /** Loss configuration: `loss_fn_config` (numbers) overlaid with `loss_fn_config_v2` (numbers or text). */
  readonly lossFnConfig: Readonly<Record<string, number | string>>;
  /** True for `forward()`: compute outputs, accumulate no gradients. */
  readonly forwardOnly: boolean;
}

/**
 * Bounds {@link decodeForwardBackwardRequest} checks before it allocates, so a few bytes (a sparse tensor of a huge
 * shape, a shape that disagrees with its data) cannot make it expand more than a legitimate request would.
 */
export interface DecodeLimits {
  /** Most tokens of one datum, and most elements of one of its tensors (a server passes the model's context). */
  readonly maxDatumTokens: number;
  /** Most tokens and tensor elements of the whole request, summed. */
  readonly maxElements: number;
}

/** A forward/backward result, as the server produces it. */
export interface ForwardBackwardOutputWire {
  /** One record per datum, in request order, e.g. `{ logprobs, elementwise_loss }`, each float32 `[T]`. */
  readonly outputs: readonly Readonly<Record<string, Float32Array>>[];
  /** Metrics keyed `name:reduction` (the SDK splits every key on its one `:`), e.g. `loss:sum`. */
  readonly metrics: Readonly<Record<string, number>>;
}

/** One sampled sequence. */
export interface SampledSequenceWire {
  /** Generated token ids (int32). */
  readonly tokens: readonly number[];
  /** Log-probability of each generated token (float32 on the wire); as long as `tokens`. */
  readonly logprobs: readonly number[];
  /** Why generation ended: a stop sequence or EOS (`stop`), or `max_tokens` (`length`). */
  readonly stopReason: 'stop' | 'length';
}

/** A sample result, as the server produces it. */
export interface SampleResponseWire {
  /** The samples, in the order of the future's `sample_sequence_ids`. */
  readonly sequences: readonly SampledSequenceWire[];
  /** One log-probability per prompt token (float32 on the wire), `NaN` where not computed (position 0). */
  readonly promptLogprobs?: readonly number[];
}

/**
 * Malformed or unsupported protobuf input (or output that cannot be encoded). Never retriable: the same bytes
 * fail the same way.
 */
export class ProtoError extends RxrlError {
  override readonly name = 'ProtoError';
  /** Where the problem is, e.g. `ForwardBackwardRequest.data[0].loss_fn_inputs["weights"]`. */
  readonly path: string;

  /**
   * @param message - what is wrong.
   * @param path - the field path; it prefixes the message.
   */
  constructor(message: string, path = '') {
    super(path === '' ? message : `${path}: ${message}`, { context: { path } });
    this.path = path;
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Wire constants (tinker_public)
// ---------------------------------------------------------------------------------------------------------------

const DTYPE_FLOAT32 = 1;
const DTYPE_INT64 = 2;
const DTYPE_INT32 = 3;
const DTYPE_BFLOAT16 = 4;
const DTYPE_NAMES: Readonly<Record<number, string>> = {
  0: 'DTYPE_UNSPECIFIED',
  [DTYPE_FLOAT32]: 'DTYPE_FLOAT32',
  [DTYPE_INT64]: 'DTYPE_INT64',
  [DTYPE_INT32]: 'DTYPE_INT32',
  [DTYPE_BFLOAT16]: 'DTYPE_BFLOAT16',
};

const STOP_REASON_STOP = 0;
const STOP_REASON_LENGTH = 1;

/** `loss_fn_output_type` the SDK reports (it keeps the part after the last `:`), and the ArrayRecord `type_tag`. */
const ARRAY_RECORD = 'ArrayRecord';

/** Largest field number protobuf allows (2^29 - 1). */
const MAX_FIELD_NUMBER = 0x1fffffff;
/** Deepest group nesting skipped before the input is called malformed. */
const MAX_GROUP_DEPTH = 64;
/** Most elements a sparse CSR tensor may expand to (2^28): a guard against absurd shapes in tiny messages. */
const MAX_SPARSE_DENSE_ELEMENTS = 2 ** 28;

/** No bounds but the sparse guard: what a client decoding its own requests uses. */
const NO_LIMITS: DecodeLimits = { maxDatumTokens: Number.POSITIVE_INFINITY, maxElements: Number.POSITIVE_INFINITY };

/** A request's decode budget: its limits and the elements decoded so far. */
class Budget {
  private used = 0;

  constructor(readonly limits: DecodeLimits) {}

  /** Counts `n` more elements of the request at `path`, before they are allocated. */
  take(n: number, path: string): void {
    this.used += n;
    if (this.used > this.limits.maxElements) {
      throw new ProtoError(`the request expands to more than ${this.limits.maxElements} tokens and tensor elements`, path);
    }
  }
}

const TWO_POW_32 = 2 ** 32;
const INT32_MIN = -(2 ** 31);
const INT32_MAX = 2 ** 31 - 1;

/** protobuf-es's UTF-8 (`TextDecoder` with `fatal` for strict reads; a leading U+FEFF is text, as in protobuf). */
const utf8 = getTextEncoding();

// ---------------------------------------------------------------------------------------------------------------
// Reader: protobuf-es's BinaryReader, with field paths, byte offsets and rxrl's strictness
// ---------------------------------------------------------------------------------------------------------------

/** A field tag: its number and wire type. */
interface Tag {
  readonly field: number;
  readonly wire: WireType;
}

/**
 * Reads one message's fields through a `BinaryReader`. Whatever the codec throws (past the end, a varint over ten
 * bytes, invalid UTF-8) becomes a {@link ProtoError} naming this message's field path and the value's byte offset.
 */
class Reader {
  private readonly r: BinaryReader;

  constructor(
    private readonly buf: Uint8Array,
    readonly path: string,
  ) {
    this.r = new BinaryReader(buf);
  }

  get done(): boolean {
    return this.r.pos >= this.r.len;
  }

  fail(message: string, at = this.r.pos, cause?: unknown): never {
    const error = new ProtoError(`${message} (at byte ${at} of ${this.buf.length})`, this.path);
    if (cause !== undefined) Object.defineProperty(error, 'cause', { value: cause, configurable: true, writable: true });
    throw error;
  }

  /** Runs one read of the codec; on failure rewinds and throws what `explain` says (given whether it ran past the end). */
  private read<T>(op: (r: BinaryReader) => T, explain: (pastEnd: boolean) => string): T {
    const start = this.r.pos;
    try {
      return op(this.r);
    } catch (error) {
      const message = explain(this.r.pos > this.r.len);
      this.r.pos = start;
      return this.fail(message, start, error);
    }
  }

  /** One varint read (`uint32`, `int32`, `int64`, `bool`: each refuses more than ten bytes). */
  private varint<T>(op: (r: BinaryReader) => T): T {
    return this.read(op, (pastEnd) => (pastEnd ? 'truncated varint' : 'varint longer than 10 bytes'));
  }

  /** The next tag. The codec's `uint32` keeps a key's low 32 bits, so a longer key (a field past 2^29 - 1) is refused here. */
  tag(): Tag {
    const start = this.r.pos;
    const key = this.varint((r) => r.uint32());
    const size = this.r.pos - start;
    if (size > 5 || (size === 5 && this.buf[start + 4] > 0x0f)) this.fail(`invalid field number (over ${MAX_FIELD_NUMBER})`, start);
    const field = key >>> 3;
    const wire = key & 7;
    if (field === 0) this.fail('invalid field number 0', start);
    if (wire > WireType.Bit32) this.fail(`invalid wire type ${wire} for field ${field}`, start);
    return { field, wire };
  }

  private expect(tag: Tag, wire: WireType, name: string): void {
    if (tag.wire !== wire) this.fail(`field ${name} (${tag.field}) has wire type ${tag.wire}, expected ${wire}`);
  }

  /** A length-delimited payload (a view, not a copy). */
  bytes(tag: Tag, name: string): Uint8Array {
    this.expect(tag, WireType.LengthDelimited, name);
    return this.lengthDelimited();
  }

  private lengthDelimited(): Uint8Array {
    const start = this.r.pos;
    const out = this.read(
      (r) => r.bytes(),
      (pastEnd) => (pastEnd ? 'length-delimited value runs past the end' : 'varint longer than 10 bytes'),
    );
    const prefix = this.r.pos - out.length - start; // the codec keeps a length's low 32 bits: refuse a longer one
    if (prefix > 5 || (prefix === 5 && this.buf[start + 4] > 0x0f)) this.fail('length over 2^32 - 1 runs past the end', start);
    return out;
  }

  string(tag: Tag, name: string): string {
    const start = this.r.pos;
    const bytes = this.bytes(tag, name);
    try {
      return utf8.decodeUtf8(bytes, true);
    } catch (error) {
      return this.fail(`field ${name} (${tag.field}) is not valid UTF-8`, start, error);
    }
  }

  /** `int32` (and enums): the low 32 bits of the varint, signed. */
  int32(tag: Tag, name: string): number {
    this.expect(tag, WireType.Varint, name);
    return this.varint((r) => r.int32());
  }

  /** `int64` as a number; fails outside the safe-integer range. */
  int64(tag: Tag, name: string): number {
    this.expect(tag, WireType.Varint, name);
    return this.safeInt64(name);
  }

  private safeInt64(name: string): number {
    const start = this.r.pos;
    const value = BigInt(this.varint((r) => r.int64())); // a bigint, or a string where BigInt is off
    if (value > BigInt(Number.MAX_SAFE_INTEGER) || value < BigInt(Number.MIN_SAFE_INTEGER)) {
      this.fail(`field ${name}: ${value} is outside the safe-integer range`, start);
    }
    return Number(value);
  }

  bool(tag: Tag, name: string): boolean {
    this.expect(tag, WireType.Varint, name);
    return this.varint((r) => r.bool());
  }

  double(tag: Tag, name: string): number {
    this.expect(tag, WireType.Bit64, name);
    return this.read(
      (r) => r.double(),
      () => 'truncated fixed64',
    );
  }

  /** One or more `repeated int64` values, packed (wire type 2) or not (wire type 0), appended to `out`. */
  repeatedInt64(tag: Tag, name: string, out: number[]): void {
    if (tag.wire === WireType.Varint) {
      out.push(this.safeInt64(name));
      return;
    }
    const packed = new Reader(this.bytes(tag, name), `${this.path}.${name}`);
    while (!packed.done) out.push(packed.safeInt64(name));
  }

  /** Skips the value of an unhandled field. */
  skip(tag: Tag, depth = 0): void {
    switch (tag.wire) {
      case WireType.Varint:
        this.varint((r) => r.uint32()); // not r.skip(), which takes a varint of any length
        return;
      case WireType.Bit64:
        this.read(
          (r) => r.skip(WireType.Bit64),
          () => 'truncated fixed64',
        );
        return;
      case WireType.LengthDelimited:
        this.lengthDelimited();
        return;
      case WireType.Bit32:
        this.read(
          (r) => r.skip(WireType.Bit32),
          () => 'truncated fixed32',
        );
        return;
      case WireType.StartGroup:
        this.skipGroup(tag.field, depth);
        return;
      case WireType.EndGroup:
        return this.fail(`unexpected end-group for field ${tag.field}`);
      default:
        return this.fail(`invalid wire type ${String(tag.wire)} for field ${tag.field}`);
    }
  }

  /** Skips a group's fields, each by the rules above, up to its end-group (rxrl's depth limit, not the codec's 100). */
  private skipGroup(field: number, depth: number): void {
    if (depth >= MAX_GROUP_DEPTH) this.fail('groups nested too deeply');
    for (;;) {
      if (this.done) this.fail(`unterminated group ${field}`);
      const inner = this.tag();
      if (inner.wire === WireType.EndGroup) {
        if (inner.field !== field) this.fail(`group ${field} closed by end-group ${inner.field}`);
        return;
      }
      this.skip(inner, depth + 1);
    }
  }
}

function viewOf(bytes: Uint8Array): DataView {
  return new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
}

/** Sets `record[key]` as an own data property, so keys such as `__proto__` stay plain keys. */
function setEntry<V>(record: Record<string, V>, key: string, value: V): void {
  Object.defineProperty(record, key, { value, enumerable: true, writable: true, configurable: true });
}

function checkBytes(bytes: unknown, what: string): Uint8Array {
  if (!(bytes instanceof Uint8Array)) throw new ProtoError(`expected a Uint8Array, got ${typeof bytes}`, what);
  return bytes;
}

// ---------------------------------------------------------------------------------------------------------------
// Little-endian raw arrays
// ---------------------------------------------------------------------------------------------------------------

function checkMultiple(bytes: Uint8Array, itemSize: number, what: string, path: string): number {
  if (bytes.length % itemSize !== 0) {
    throw new ProtoError(`${what} holds ${bytes.length} bytes, not a multiple of ${itemSize}`, path);
  }
  return bytes.length / itemSize;
}

function int32sFromLE(bytes: Uint8Array, what: string, path: string): number[] {
  const n = checkMultiple(bytes, 4, what, path);
  const view = viewOf(bytes);
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) out[i] = view.getInt32(i * 4, true);
  return out;
}

function float32sFromLE(bytes: Uint8Array, what: string, path: string): Float32Array {
  const n = checkMultiple(bytes, 4, what, path);
  const view = viewOf(bytes);
  const out = new Float32Array(n);
  for (let i = 0; i < n; i++) out[i] = view.getFloat32(i * 4, true);
  return out;
}

/** bfloat16 is the upper half of a float32: shift each value into place and reinterpret the bits. */
function bfloat16sFromLE(bytes: Uint8Array, what: string, path: string): Float32Array {
  const n = checkMultiple(bytes, 2, what, path);
  const view = viewOf(bytes);
  const bits = new Uint32Array(n);
  for (let i = 0; i < n; i++) bits[i] = view.getUint16(i * 2, true) << 16;
  return new Float32Array(bits.buffer); // same platform byte order on both views: a bit-exact reinterpretation
}

function int64sFromLE(bytes: Uint8Array, what: string, path: string): number[] {
  const n = checkMultiple(bytes, 8, what, path);
  const view = viewOf(bytes);
  const out = new Array<number>(n);
  for (let i = 0; i < n; i++) {
    const lo = view.getUint32(i * 8, true);
    const hi = view.getInt32(i * 8 + 4, true);
    if (hi >= 0x200000 || hi < -0x200000) {
      throw new ProtoError(`${what}[${i}] = ${view.getBigInt64(i * 8, true)} is outside the safe-integer range`, path);
    }
    out[i] = hi * TWO_POW_32 + lo;
  }
  return out;
}

function int32sToLE(values: readonly number[], what: string, path: string): Uint8Array {
  const out = new Uint8Array(values.length * 4);
  const view = viewOf(out);
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (!Number.isInteger(v) || v < INT32_MIN || v > INT32_MAX) {
      throw new ProtoError(`${what}[${i}] = ${v} is not an int32`, path);
    }
    view.setInt32(i * 4, v, true);
  }
  return out;
}

function float32sToLE(values: ArrayLike<number>): Uint8Array {
  const out = new Uint8Array(values.length * 4);
  const view = viewOf(out);
  for (let i = 0; i < values.length; i++) view.setFloat32(i * 4, values[i], true);
  return out;
}

function int64sToLE(values: ArrayLike<number> | BigInt64Array, what: string, path: string): Uint8Array {
  const out = new Uint8Array(values.length * 8);
  const view = viewOf(out);
  if (values instanceof BigInt64Array) {
    for (let i = 0; i < values.length; i++) view.setBigInt64(i * 8, values[i], true);
    return out;
  }
  for (let i = 0; i < values.length; i++) {
    const v = values[i];
    if (!Number.isSafeInteger(v)) throw new ProtoError(`${what}[${i}] = ${v} is not a safe integer`, path);
    const hi = Math.floor(v / TWO_POW_32);
    view.setUint32(i * 8, v - hi * TWO_POW_32, true);
    view.setInt32(i * 8 + 4, hi, true);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Writer: protobuf-es's BinaryWriter (default values are the caller's to omit, proto3 style)
// ---------------------------------------------------------------------------------------------------------------

/** Writes field `field` as a nested message (or a packed field) that `build` writes into the same writer. */
function message(w: BinaryWriter, field: number, build: (w: BinaryWriter) => void): void {
  w.tag(field, WireType.LengthDelimited).fork();
  build(w);
  w.join();
}

// ---------------------------------------------------------------------------------------------------------------
// Tensor
// ---------------------------------------------------------------------------------------------------------------

interface DtypeInfo {
  readonly dtype: TensorDtype;
  readonly itemSize: number;
}

function dtypeInfo(code: number, path: string): DtypeInfo {
  switch (code) {
    case DTYPE_FLOAT32:
      return { dtype: 'float32', itemSize: 4 };
    case DTYPE_INT64:
      return { dtype: 'int64', itemSize: 8 };
    case DTYPE_INT32:
      return { dtype: 'int64', itemSize: 4 };
    case DTYPE_BFLOAT16:
      return { dtype: 'float32', itemSize: 2 };
    default:
      return unsupportedDtype(code, path);
  }
}

function unsupportedDtype(code: number, path: string): never {
  throw new ProtoError(`unsupported dtype ${code} (${DTYPE_NAMES[code] ?? 'unknown'})`, path);
}

/** Decodes raw little-endian `bytes` of wire dtype `code` into the public representation. */
function elementsFromLE(bytes: Uint8Array, code: number, what: string, path: string): Float32Array | number[] {
  switch (code) {
    case DTYPE_FLOAT32:
      return float32sFromLE(bytes, what, path);
    case DTYPE_BFLOAT16:
      return bfloat16sFromLE(bytes, what, path);
    case DTYPE_INT64:
      return int64sFromLE(bytes, what, path);
    case DTYPE_INT32:
      return int32sFromLE(bytes, what, path);
    default:
      return unsupportedDtype(code, path);
  }
}

interface SparseCsrBytes {
  values: Uint8Array;
  crow: Uint8Array;
  col: Uint8Array;
}

function decodeSparseCsr(bytes: Uint8Array, path: string): SparseCsrBytes {
  const r = new Reader(bytes, path);
  const out: SparseCsrBytes = { values: new Uint8Array(0), crow: new Uint8Array(0), col: new Uint8Array(0) };
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        out.values = r.bytes(tag, 'values');
        break;
      case 2:
        out.crow = r.bytes(tag, 'crow_indices');
        break;
      case 3:
        out.col = r.bytes(tag, 'col_indices');
        break;
      default:
        r.skip(tag);
    }
  }
  return out;
}

/**
 * Expands a 2-D CSR tensor to dense row-major, with 0 in every unlisted entry (the SDK's default pad value). Its
 * dense size was bounded by the caller.
 */
function expandSparseCsr(csr: SparseCsrBytes, code: number, shape: readonly number[], path: string): Float32Array | number[] {
  if (shape.length !== 2) throw new ProtoError(`sparse CSR needs a 2-D shape, got [${shape.join(', ')}]`, path);
  const [rows, cols] = shape;
  const size = rows * cols;
  const values = elementsFromLE(csr.values, code, 'sparse_csr.values', path);
  const crow = int64sFromLE(csr.crow, 'sparse_csr.crow_indices', path);
  const col = int64sFromLE(csr.col, 'sparse_csr.col_indices', path);
  const nnz = values.length;
  if (crow.length !== rows + 1)
    throw new ProtoError(`sparse_csr.crow_indices has ${crow.length} entries, expected rows + 1 = ${rows + 1}`, path);
  if (col.length !== nnz) throw new ProtoError(`sparse_csr.col_indices has ${col.length} entries but there are ${nnz} values`, path);
  if (crow[0] !== 0 || crow[rows] !== nnz) {
    throw new ProtoError(`sparse_csr.crow_indices must run from 0 to ${nnz}, got ${crow[0]} .. ${crow[rows]}`, path);
  }
  const dense = values instanceof Float32Array ? new Float32Array(size) : new Array<number>(size).fill(0);
  for (let row = 0; row < rows; row++) {
    const start = crow[row];
    const end = crow[row + 1];
    if (end < start) throw new ProtoError(`sparse_csr.crow_indices decreases at row ${row}`, path);
    for (let k = start; k < end; k++) {
      const c = col[k];
      if (c < 0 || c >= cols) throw new ProtoError(`sparse_csr.col_indices[${k}] = ${c} is outside [0, ${cols})`, path);
      dense[row * cols + c] = values[k];
    }
  }
  return dense;
}

/** The product of `shape`, refused as soon as it passes `max` (so no absurd shape overflows or allocates). */
function denseSize(shape: readonly number[], max: number, path: string): number {
  let size = 1;
  for (const dim of shape) {
    if (dim < 0) throw new ProtoError(`negative dimension in shape [${shape.join(', ')}]`, path);
    size *= dim;
    if (size > max)
      throw new ProtoError(`shape [${shape.join(', ')}] has more than ${max} elements, the most one tensor of a datum may have`, path);
  }
  return size;
}

function decodeTensor(bytes: Uint8Array, path: string, budget: Budget): WireTensor {
  const r = new Reader(bytes, path);
  let dense: Uint8Array | undefined;
  let sparse: SparseCsrBytes | undefined;
  let code = 0;
  const shape: number[] = [];
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        dense = r.bytes(tag, 'dense');
        sparse = undefined;
        break;
      case 2:
        sparse = decodeSparseCsr(r.bytes(tag, 'sparse_csr'), `${path}.sparse_csr`);
        dense = undefined;
        break;
      case 3:
        code = r.int32(tag, 'dtype');
        break;
      case 4:
        r.repeatedInt64(tag, 'shape', shape);
        break;
      default:
        r.skip(tag);
    }
  }
  const { dtype, itemSize } = dtypeInfo(code, path);
  const max = budget.limits.maxDatumTokens;
  // Sizes are checked against the limits before anything of the tensor's size is allocated.
  if (sparse !== undefined) {
    budget.take(denseSize(shape, Math.min(max, MAX_SPARSE_DENSE_ELEMENTS), path), path);
    return { dtype, data: expandSparseCsr(sparse, code, shape, path), shape };
  }
  const stored = checkMultiple(dense ?? new Uint8Array(0), itemSize, 'dense', path);
  if (stored > max) throw new ProtoError(`dense data holds ${stored} elements, more than the ${max} one tensor of a datum may have`, path);
  if (shape.length > 0) {
    const size = denseSize(shape, max, path);
    if (size !== stored) throw new ProtoError(`dense data holds ${stored} elements but shape [${shape.join(', ')}] needs ${size}`, path);
  }
  budget.take(stored, path);
  const data = elementsFromLE(dense ?? new Uint8Array(0), code, 'dense', path);
  return { dtype, data, shape: shape.length === 0 ? [data.length] : shape };
}

function encodeTensor(w: BinaryWriter, tensor: WireTensor, path: string): void {
  const { dtype, data, shape } = tensor;
  const size = shape.reduce((a, b) => a * b, 1);
  for (const dim of shape) {
    if (!Number.isSafeInteger(dim) || dim < 0) throw new ProtoError(`invalid dimension ${dim} in shape [${shape.join(', ')}]`, path);
  }
  if (size !== data.length) {
    throw new ProtoError(`data holds ${data.length} elements but shape [${shape.join(', ')}] needs ${size}`, path);
  }
  switch (dtype) {
    case 'float32':
      w.tag(1, WireType.LengthDelimited).bytes(float32sToLE(data instanceof BigInt64Array ? Array.from(data, Number) : data));
      w.tag(3, WireType.Varint).int32(DTYPE_FLOAT32);
      break;
    case 'int64':
      w.tag(1, WireType.LengthDelimited).bytes(int64sToLE(data, 'data', path));
      w.tag(3, WireType.Varint).int32(DTYPE_INT64);
      break;
    default:
      throw new ProtoError(`unsupported dtype ${String(dtype satisfies never)}`, path);
  }
  if (shape.length > 0) message(w, 4, (packed) => shape.forEach((dim) => packed.int64(dim))); // packed, as proto3 writes it
}

// ---------------------------------------------------------------------------------------------------------------
// Map entries
// ---------------------------------------------------------------------------------------------------------------

/** Reads a map entry `{ key = 1 (string); value = 2 (a message) }`: the key and the value's bytes, if any. */
function decodeMessageMapEntry(bytes: Uint8Array, path: string): [string, Uint8Array | undefined] {
  const r = new Reader(bytes, path);
  let key = '';
  let value: Uint8Array | undefined;
  while (!r.done) {
    const tag = r.tag();
    if (tag.field === 1) key = r.string(tag, 'key');
    else if (tag.field === 2) value = r.bytes(tag, 'value');
    else r.skip(tag);
  }
  return [key, value];
}

/** Reads a map entry `{ key = 1 (string); value = 2 (double) }`. */
function decodeDoubleMapEntry(bytes: Uint8Array, path: string): [string, number] {
  const r = new Reader(bytes, path);
  let key = '';
  let value = 0;
  while (!r.done) {
    const tag = r.tag();
    if (tag.field === 1) key = r.string(tag, 'key');
    else if (tag.field === 2) value = r.double(tag, 'value');
    else r.skip(tag);
  }
  return [key, value];
}

function encodeDoubleMap(w: BinaryWriter, field: number, map: Readonly<Record<string, number>>): void {
  for (const [key, value] of Object.entries(map)) {
    message(w, field, (e) => {
      if (key !== '') e.tag(1, WireType.LengthDelimited).string(key);
      if (value !== 0 || Object.is(value, -0)) e.tag(2, WireType.Bit64).double(value);
    });
  }
}

// ---------------------------------------------------------------------------------------------------------------
// ForwardBackwardRequest
// ---------------------------------------------------------------------------------------------------------------

const REQUEST = 'ForwardBackwardRequest';

/** A `Chunk` oneof: the tokens of an `encoded_text` chunk; any other kind is refused. */
function decodeChunk(bytes: Uint8Array, path: string): number[] {
  const r = new Reader(bytes, path);
  let tokens: number[] | undefined;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1: {
        const text = new Reader(r.bytes(tag, 'encoded_text'), `${path}.encoded_text`);
        tokens = [];
        while (!text.done) {
          const inner = text.tag();
          if (inner.field === 1) tokens = int32sFromLE(text.bytes(inner, 'tokens'), 'tokens', text.path);
          else text.skip(inner);
        }
        break;
      }
      case 2:
        throw new ProtoError('image chunks are not supported (only encoded_text chunks are)', path);
      case 3:
        throw new ProtoError('dmel chunks are not supported (only encoded_text chunks are)', path);
      default:
        r.skip(tag);
    }
  }
  if (tokens === undefined) throw new ProtoError('chunk has no encoded_text (an empty or unknown chunk type)', path);
  return tokens;
}

function decodeDatum(bytes: Uint8Array, path: string, budget: Budget): WireDatum {
  const r = new Reader(bytes, path);
  const tokens: number[] = [];
  const lossFnInputs: Record<string, WireTensor> = {};
  let chunks = 0;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1: {
        const chunk = decodeChunk(r.bytes(tag, 'model_input'), `${path}.model_input[${chunks++}]`);
        const max = budget.limits.maxDatumTokens;
        if (tokens.length + chunk.length > max) {
          throw new ProtoError(`model_input has ${tokens.length + chunk.length} tokens or more, past the ${max} a datum may have`, path);
        }
        budget.take(chunk.length, path);
        for (const token of chunk) tokens.push(token);
        break;
      }
      case 2: {
        const [key, value] = decodeMessageMapEntry(r.bytes(tag, 'loss_fn_inputs'), `${path}.loss_fn_inputs`);
        const tensorPath = `${path}.loss_fn_inputs[${JSON.stringify(key)}]`;
        if (value === undefined) throw new ProtoError('map entry has no tensor value', tensorPath);
        setEntry(lossFnInputs, key, decodeTensor(value, tensorPath, budget));
        break;
      }
      default:
        r.skip(tag); // model_input_spans (3), loss_fn_input_spans (4): provenance, unused here
    }
  }
  return { tokens, lossFnInputs };
}

function decodeLossConfigValue(bytes: Uint8Array, path: string): number | string | undefined {
  const r = new Reader(bytes, path);
  let value: number | string | undefined;
  while (!r.done) {
    const tag = r.tag();
    if (tag.field === 1) value = r.double(tag, 'number');
    else if (tag.field === 2) value = r.string(tag, 'text');
    else r.skip(tag);
  }
  return value;
}

/**
 * Decodes the protobuf body of `POST /api/v1/forward_backward` (as the SDK's
 * `request_conv.forward_backward_request_to_proto` writes it).
 *
 * Tensors come back dense (sparse CSR is expanded with zeros); `INT32` widens to `int64`, `BFLOAT16` to
 * `float32`. `loss_fn_config` and `loss_fn_config_v2` are merged, v2 winning. Provenance spans are ignored.
 *
 * @example
 * ```ts
 * import { decodeForwardBackwardRequest } from './lib/tinker/proto.js';
 * const req = decodeForwardBackwardRequest(new Uint8Array(await request.arrayBuffer()));
 * console.log(req.lossFn, req.data[0].tokens, req.data[0].lossFnInputs.target_tokens.data);
 * ```
 *
 * @param bytes - The (decompressed) request body.
 * @param limits - Bounds checked before anything is allocated (a server passes its model's context). Default: none
 *   but a guard of 2^28 elements on a sparse tensor's expansion.
 * @returns The request in plain JS values.
 * @throws {@link ProtoError} on malformed input, an unsupported dtype, an image/dmel chunk, or a datum or request
 *   past `limits`.
 */
export function decodeForwardBackwardRequest(bytes: Uint8Array, limits: DecodeLimits = NO_LIMITS): ForwardBackwardRequest {
  const budget = new Budget(limits);
  const r = new Reader(checkBytes(bytes, REQUEST), REQUEST);
  let modelId = '';
  let seqId = 0;
  let lossFn = '';
  let forwardOnly = false;
  const data: WireDatum[] = [];
  const legacyConfig = new Map<string, number>();
  const config = new Map<string, number | string>();
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        modelId = r.string(tag, 'model_id');
        break;
      case 2:
        seqId = r.int32(tag, 'seq_id');
        break;
      case 3:
        data.push(decodeDatum(r.bytes(tag, 'data'), `${REQUEST}.data[${data.length}]`, budget));
        break;
      case 4:
        lossFn = r.string(tag, 'loss_fn');
        break;
      case 5: {
        const [key, value] = decodeDoubleMapEntry(r.bytes(tag, 'loss_fn_config'), `${REQUEST}.loss_fn_config`);
        legacyConfig.set(key, value);
        break;
      }
      case 6:
        forwardOnly = r.bool(tag, 'forward_only');
        break;
      case 7: {
        const [key, bytes] = decodeMessageMapEntry(r.bytes(tag, 'loss_fn_config_v2'), `${REQUEST}.loss_fn_config_v2`);
        const value =
          bytes === undefined ? undefined : decodeLossConfigValue(bytes, `${REQUEST}.loss_fn_config_v2[${JSON.stringify(key)}]`);
        if (value === undefined) config.delete(key);
        else config.set(key, value);
        break;
      }
      default:
        r.skip(tag);
    }
  }
  const lossFnConfig: Record<string, number | string> = {};
  for (const [key, value] of legacyConfig) setEntry(lossFnConfig, key, value);
  for (const [key, value] of config) setEntry(lossFnConfig, key, value);
  return { modelId, seqId, data, lossFn, lossFnConfig, forwardOnly };
}

/**
 * The `model_id` of a `ForwardBackwardRequest`, read without decoding anything else (the datums are skipped by
 * length), so that a server refuses a request for a model it does not have before it spends anything on the
 * payload. Malformed framing after a `model_id` ends the scan (the full decode reports it); before one, it throws.
 *
 * @param bytes - The request body.
 * @returns The last `model_id` (protobuf's rule for a repeated singular field), or `''` when there is none.
 * @throws {@link ProtoError} when the body is malformed before any `model_id`.
 */
export function readForwardBackwardModelId(bytes: Uint8Array): string {
  const r = new Reader(checkBytes(bytes, REQUEST), REQUEST);
  let modelId: string | undefined;
  try {
    while (!r.done) {
      const tag = r.tag();
      if (tag.field === 1) modelId = r.string(tag, 'model_id');
      else r.skip(tag);
    }
  } catch (error) {
    if (modelId === undefined || !(error instanceof ProtoError)) throw error;
  }
  return modelId ?? '';
}

/**
 * Encodes a `ForwardBackwardRequest` the way the SDK does: tokens as one `encoded_text` chunk, tensors dense
 * (`int64` as `DTYPE_INT64`, `float32` as `DTYPE_FLOAT32`), numeric config in both config maps, text config in
 * `loss_fn_config_v2` only.
 *
 * @example
 * ```ts
 * import { encodeForwardBackwardRequest } from './lib/tinker/proto.js';
 * const body = encodeForwardBackwardRequest({
 *   modelId: 'sess-1:train:0', seqId: 1, lossFn: 'cross_entropy', lossFnConfig: {}, forwardOnly: false,
 *   data: [{ tokens: [1, 2], lossFnInputs: { target_tokens: { dtype: 'int64', data: [2, 3], shape: [2] } } }],
 * });
 * ```
 *
 * @param req - The request.
 * @returns The protobuf body.
 * @throws {@link ProtoError} when a token is not an int32, `seqId` not an int32, or a tensor's size mismatches its shape.
 */
export function encodeForwardBackwardRequest(req: ForwardBackwardRequest): Uint8Array {
  if (!Number.isInteger(req.seqId) || req.seqId < INT32_MIN || req.seqId > INT32_MAX) {
    throw new ProtoError(`seq_id ${req.seqId} is not an int32`, REQUEST);
  }
  const w = new BinaryWriter();
  if (req.modelId !== '') w.tag(1, WireType.LengthDelimited).string(req.modelId);
  if (req.seqId !== 0) w.tag(2, WireType.Varint).int32(req.seqId);
  req.data.forEach((datum, i) => {
    const path = `${REQUEST}.data[${i}]`;
    message(w, 3, (d) => {
      if (datum.tokens.length > 0) {
        const tokens = int32sToLE(datum.tokens, 'tokens', path);
        message(d, 1, (chunk) => message(chunk, 1, (text) => text.tag(1, WireType.LengthDelimited).bytes(tokens)));
      }
      for (const [key, tensor] of Object.entries(datum.lossFnInputs)) {
        message(d, 2, (e) => {
          if (key !== '') e.tag(1, WireType.LengthDelimited).string(key);
          message(e, 2, (t) => encodeTensor(t, tensor, `${path}.loss_fn_inputs[${JSON.stringify(key)}]`));
        });
      }
    });
  });
  if (req.lossFn !== '') w.tag(4, WireType.LengthDelimited).string(req.lossFn);
  const numeric: Record<string, number> = {};
  for (const [key, value] of Object.entries(req.lossFnConfig)) if (typeof value === 'number') setEntry(numeric, key, value);
  encodeDoubleMap(w, 5, numeric);
  if (req.forwardOnly) w.tag(6, WireType.Varint).bool(true);
  for (const [key, value] of Object.entries(req.lossFnConfig)) {
    message(w, 7, (e) => {
      if (key !== '') e.tag(1, WireType.LengthDelimited).string(key);
      message(e, 2, (v) =>
        typeof value === 'number' ? v.tag(1, WireType.Bit64).double(value) : v.tag(2, WireType.LengthDelimited).string(value),
      );
    });
  }
  return w.finish();
}

// ---------------------------------------------------------------------------------------------------------------
// ForwardBackwardOutput
// ---------------------------------------------------------------------------------------------------------------

const OUTPUT = 'ForwardBackwardOutput';

/**
 * Encodes a forward/backward result as the SDK's `deserialize_forward_backward_output` reads it: one
 * `ArrayRecord` batching every datum, each field a `BatchedTensor` (data concatenated, `offsets` = byte offsets
 * as int64 LE with `num_datums + 1` entries, empty `trailing_shape`, `DTYPE_FLOAT32`), and
 * `loss_fn_output_type = "ArrayRecord"`. With no datums no record is written.
 *
 * @example
 * ```ts
 * import { encodeForwardBackwardOutput } from './lib/tinker/proto.js';
 * const body = encodeForwardBackwardOutput({
 *   outputs: [{ logprobs: Float32Array.of(-0.5, -1.5) }],
 *   metrics: { 'loss:sum': 2 },
 * });
 * // respond with content-type application/x-protobuf
 * ```
 *
 * @param out - Per-datum float32 `[T]` outputs (every datum with the same field names) and `name:reduction` metrics.
 * @returns The protobuf body.
 * @throws {@link ProtoError} when datums have different field names.
 */
export function encodeForwardBackwardOutput(out: ForwardBackwardOutputWire): Uint8Array {
  const w = new BinaryWriter();
  w.tag(1, WireType.LengthDelimited).string(ARRAY_RECORD);
  const n = out.outputs.length;
  if (n > 0) {
    const names = Object.keys(out.outputs[0]);
    out.outputs.forEach((record, i) => {
      const own = Object.keys(record);
      if (own.length !== names.length || own.some((name) => !names.includes(name))) {
        throw new ProtoError(
          `datum ${i} has fields [${own.join(', ')}] but datum 0 has [${names.join(', ')}]; one ArrayRecord needs the same fields for every datum`,
          OUTPUT,
        );
      }
    });
    message(w, 2, (rec) => {
      rec.tag(1, WireType.LengthDelimited).string(ARRAY_RECORD);
      for (const name of names) {
        const total = out.outputs.reduce((sum, record) => sum + record[name].length, 0);
        const data = new Float32Array(total);
        const offsets: number[] = [0];
        let at = 0;
        for (const record of out.outputs) {
          data.set(record[name], at);
          at += record[name].length;
          offsets.push(at * 4);
        }
        message(rec, 2, (e) => {
          if (name !== '') e.tag(1, WireType.LengthDelimited).string(name);
          message(e, 2, (bt) => {
            bt.tag(1, WireType.LengthDelimited).bytes(float32sToLE(data));
            bt.tag(2, WireType.LengthDelimited).bytes(int64sToLE(offsets, 'offsets', OUTPUT));
            bt.tag(3, WireType.Varint).int32(DTYPE_FLOAT32);
          });
        });
      }
      rec.tag(3, WireType.Varint).int64(n);
    });
  }
  encodeDoubleMap(w, 3, out.metrics);
  return w.finish();
}

/** Slices a BatchedTensor into per-datum flat arrays by its byte offsets (as the SDK does). */
function decodeBatchedTensor(bytes: Uint8Array, path: string): Float32Array[] {
  const r = new Reader(bytes, path);
  let data: Uint8Array = new Uint8Array(0);
  let offsetBytes: Uint8Array = new Uint8Array(0);
  let code = 0;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        data = r.bytes(tag, 'data');
        break;
      case 2:
        offsetBytes = r.bytes(tag, 'offsets');
        break;
      case 3:
        code = r.int32(tag, 'dtype');
        break;
      default:
        r.skip(tag); // trailing_shape (4): per-datum outputs are returned flat
    }
  }
  const { itemSize } = dtypeInfo(code, path);
  const elements = elementsFromLE(data, code, 'data', path);
  const offsets = int64sFromLE(offsetBytes, 'offsets', path);
  const perDatum: Float32Array[] = [];
  for (let i = 0; i + 1 < offsets.length; i++) {
    const start = offsets[i];
    const end = offsets[i + 1];
    if (start < 0 || end < start || end > data.length || start % itemSize !== 0 || end % itemSize !== 0) {
      throw new ProtoError(`offsets[${i}..${i + 1}] = ${start}..${end} is not a valid byte range of ${data.length} bytes`, path);
    }
    const slice = elements.slice(start / itemSize, end / itemSize);
    perDatum.push(slice instanceof Float32Array ? slice : Float32Array.from(slice));
  }
  return perDatum;
}

/** Reads one ArrayRecord, appending each field's per-datum arrays to `fields`; returns its `num_datums`. */
function decodeArrayRecord(bytes: Uint8Array, path: string, fields: Map<string, Float32Array[]>): number {
  const r = new Reader(bytes, path);
  let numDatums = 0;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 2: {
        const [name, value] = decodeMessageMapEntry(r.bytes(tag, 'fields'), `${path}.fields`);
        const perDatum = decodeBatchedTensor(value ?? new Uint8Array(0), `${path}.fields[${JSON.stringify(name)}]`);
        const field = fields.get(name) ?? [];
        fields.set(name, field);
        for (const datum of perDatum) field.push(datum);
        break;
      }
      case 3:
        numDatums = r.int64(tag, 'num_datums');
        break;
      default:
        r.skip(tag); // type_tag (1)
    }
  }
  return numDatums;
}

/**
 * Decodes a `ForwardBackwardOutput` as the SDK does: any number of `ArrayRecord`s, their datums concatenated;
 * `num_datums` is authoritative when set. Integer fields are widened into `Float32Array` (exact up to 2^24) and
 * every per-datum array is returned flat.
 *
 * @param bytes - The protobuf body of a forward/backward result.
 * @returns Per-datum outputs and metrics.
 * @throws {@link ProtoError} on malformed input or a field with fewer datums than the records declare.
 */
export function decodeForwardBackwardOutput(bytes: Uint8Array): ForwardBackwardOutputWire {
  const r = new Reader(checkBytes(bytes, OUTPUT), OUTPUT);
  const fields = new Map<string, Float32Array[]>();
  const metrics: Record<string, number> = {};
  let numDatums = 0;
  let records = 0;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 2:
        numDatums += decodeArrayRecord(r.bytes(tag, 'loss_fn_outputs'), `${OUTPUT}.loss_fn_outputs[${records++}]`, fields);
        break;
      case 3: {
        const [key, value] = decodeDoubleMapEntry(r.bytes(tag, 'metrics'), `${OUTPUT}.metrics`);
        setEntry(metrics, key, value);
        break;
      }
      default:
        r.skip(tag); // loss_fn_output_type (1)
    }
  }
  if (numDatums === 0 && fields.size > 0) numDatums = fields.values().next().value?.length ?? 0;
  const outputs: Record<string, Float32Array>[] = [];
  for (let i = 0; i < numDatums; i++) {
    const record: Record<string, Float32Array> = {};
    for (const [name, field] of fields) {
      if (i >= field.length) {
        throw new ProtoError(`field ${JSON.stringify(name)} has ${field.length} datums, expected ${numDatums}`, OUTPUT);
      }
      setEntry(record, name, field[i]);
    }
    outputs.push(record);
  }
  return { outputs, metrics };
}

// ---------------------------------------------------------------------------------------------------------------
// SampleResponse
// ---------------------------------------------------------------------------------------------------------------

const SAMPLE = 'SampleResponse';

/**
 * Encodes a sample result as the SDK's `deserialize_sample_response` reads it: per sequence the stop reason,
 * int32 LE tokens and float32 LE logprobs; `prompt_logprobs` as float32 LE with `NaN` kept, left out when
 * `promptLogprobs` is undefined.
 *
 * Note the SDK reads an empty `logprobs` (a sequence of no tokens) or an empty `prompt_logprobs` as `None`.
 *
 * @example
 * ```ts
 * import { encodeSampleResponse } from './lib/tinker/proto.js';
 * const body = encodeSampleResponse({
 *   sequences: [{ tokens: [5, 6], logprobs: [-0.1, -0.2], stopReason: 'length' }],
 *   promptLogprobs: [Number.NaN, -1.5],
 * });
 * ```
 *
 * @param res - The samples and optional prompt logprobs.
 * @returns The protobuf body.
 * @throws {@link ProtoError} when a token is not an int32 or a sequence's logprobs and tokens differ in length.
 */
export function encodeSampleResponse(res: SampleResponseWire): Uint8Array {
  const w = new BinaryWriter();
  res.sequences.forEach((seq, i) => {
    const path = `${SAMPLE}.sequences[${i}]`;
    if (seq.logprobs.length !== seq.tokens.length) {
      throw new ProtoError(`${seq.tokens.length} tokens but ${seq.logprobs.length} logprobs`, path);
    }
    const tokens = int32sToLE(seq.tokens, 'tokens', path);
    message(w, 1, (s) => {
      switch (seq.stopReason) {
        case 'stop':
          break; // STOP_REASON_STOP = 0, the default: not written
        case 'length':
          s.tag(1, WireType.Varint).int32(STOP_REASON_LENGTH);
          break;
        default:
          throw new ProtoError(`unknown stop reason ${JSON.stringify(seq.stopReason satisfies never)}`, path);
      }
      if (tokens.length > 0) s.tag(2, WireType.LengthDelimited).bytes(tokens);
      s.tag(3, WireType.LengthDelimited).bytes(float32sToLE(seq.logprobs));
    });
  });
  if (res.promptLogprobs !== undefined) w.tag(2, WireType.LengthDelimited).bytes(float32sToLE(res.promptLogprobs));
  return w.finish();
}

function decodeSampledSequence(bytes: Uint8Array, path: string): SampledSequenceWire {
  const r = new Reader(bytes, path);
  let reason = STOP_REASON_STOP;
  let tokens: number[] = [];
  let logprobs: number[] = [];
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        reason = r.int32(tag, 'stop_reason');
        break;
      case 2:
        tokens = int32sFromLE(r.bytes(tag, 'tokens'), 'tokens', path);
        break;
      case 3:
        logprobs = Array.from(float32sFromLE(r.bytes(tag, 'logprobs'), 'logprobs', path));
        break;
      default:
        r.skip(tag); // topk_sampled_logprobs (4)
    }
  }
  let stopReason: SampledSequenceWire['stopReason'];
  if (reason === STOP_REASON_STOP) stopReason = 'stop';
  else if (reason === STOP_REASON_LENGTH) stopReason = 'length';
  else throw new ProtoError(`unknown stop_reason ${reason}`, path);
  return { tokens, logprobs, stopReason };
}

/**
 * Decodes a `SampleResponse`: tokens, float32 logprobs (`[]` when absent) and stop reason per sequence, and
 * `promptLogprobs` (with `NaN` kept) when the field is present. Top-k and alternative-token fields are skipped.
 *
 * @param bytes - The protobuf body of a sample result.
 * @returns The samples.
 * @throws {@link ProtoError} on malformed input or an unknown stop reason.
 */
export function decodeSampleResponse(bytes: Uint8Array): SampleResponseWire {
  const r = new Reader(checkBytes(bytes, SAMPLE), SAMPLE);
  const sequences: SampledSequenceWire[] = [];
  let promptLogprobs: number[] | undefined;
  while (!r.done) {
    const tag = r.tag();
    switch (tag.field) {
      case 1:
        sequences.push(decodeSampledSequence(r.bytes(tag, 'sequences'), `${SAMPLE}.sequences[${sequences.length}]`));
        break;
      case 2:
        promptLogprobs = Array.from(float32sFromLE(r.bytes(tag, 'prompt_logprobs'), 'prompt_logprobs', SAMPLE));
        break;
      default:
        r.skip(tag);
    }
  }
  return promptLogprobs === undefined ? { sequences } : { sequences, promptLogprobs };
}
