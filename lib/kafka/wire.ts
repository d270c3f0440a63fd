/**
 * The Protocol Buffers wire layer under the generated record codec (lib/kafka/schema/records.ts): a writer that
 * reuses one growing buffer and a bounds-checked reader. Kept to what the record schema uses — varints (32-bit, and
 * 64-bit as JavaScript safe integers), little-endian `double` and `float`, length-delimited strings and messages,
 * packed repeated scalars — and fast on the hot path (token ids and log-probs of every trajectory).
 *
 * Reading follows protobuf rules: unknown fields are skipped by wire type, a repeated scalar is accepted packed or
 * not, the last occurrence of a singular field wins. Malformed bytes throw a {@link DecodeError} naming the field
 * and the byte offset.
 *
 * @packageDocumentation
 */
import { DecodeError } from '../core/errors.js';

/** Protocol Buffers wire types. */
export const WIRE = { varint: 0, fixed64: 1, bytes: 2, startGroup: 3, endGroup: 4, fixed32: 5 } as const;

const TWO_32 = 2 ** 32;
const utf8 = new TextEncoder();
// ignoreBOM: a string that starts with U+FEFF keeps it (by default TextDecoder drops a leading BOM).
const strictUtf8 = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/**
 * One scratch buffer shared by encodes (a fresh array per record costs more than encoding it); `finish` copies the
 * bytes out. A nested encode (user code run inside one) gets a private buffer.
 */
let scratch = new Uint8Array(1 << 16);
let scratchBusy = false;

/** Writes one record. Get one with {@link encodeWith}. */
export class WireWriter {
  private buf: Uint8Array;
  private view: DataView;
  private at = 0;

  constructor(private readonly owned: boolean) {
    this.buf = owned ? scratch : new Uint8Array(1024);
    this.view = new DataView(this.buf.buffer, this.buf.byteOffset, this.buf.byteLength);
  }

  private ensure(n: number): void {
    if (this.at + n <= this.buf.length) return;
    let size = this.buf.length * 2;
    while (size < this.at + n) size *= 2;
    const next = new Uint8Array(size);
    next.set(this.buf.subarray(0, this.at));
    this.buf = next;
    this.view = new DataView(next.buffer);
    if (this.owned) scratch = next;
  }

  /** A field's tag: its number and wire type. */
  tag(field: number, wireType: number): void {
    this.uint32((field << 3) | wireType);
  }

  /** An unsigned 32-bit varint. */
  uint32(value: number): void {
    this.ensure(5);
    const buf = this.buf;
    let v = value >>> 0;
    while (v > 0x7f) {
      buf[this.at++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    buf[this.at++] = v;
  }

  /** A signed 32-bit varint (a negative value takes ten bytes, as protobuf sign-extends it to 64 bits). */
  int32(value: number): void {
    if (value >= 0) {
      this.uint32(value);
      return;
    }
    this.ensure(10);
    const buf = this.buf;
    let v = value >>> 0;
    for (let i = 0; i < 4; i++) {
      buf[this.at++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    // Bits 28..31 of the value, then the sign extension: five more bytes.
    buf[this.at++] = (v & 0x0f) | 0xf0;
    for (let i = 0; i < 4; i++) buf[this.at++] = 0xff;
    buf[this.at++] = 0x01;
  }

  /** A non-negative safe integer as an unsigned 64-bit varint. */
  uint64(value: number): void {
    if (value < TWO_32) {
      this.uint32(value);
      return;
    }
    this.ensure(10);
    let v = value;
    while (v > 0x7f) {
      this.buf[this.at++] = (v % 128) | 0x80;
      v = Math.floor(v / 128);
    }
    this.buf[this.at++] = v;
  }

  bool(value: boolean): void {
    this.ensure(1);
    this.buf[this.at++] = value ? 1 : 0;
  }

  double(value: number): void {
    this.ensure(8);
    this.view.setFloat64(this.at, value, true);
    this.at += 8;
  }

  float(value: number): void {
    this.ensure(4);
    this.view.setFloat32(this.at, value, true);
    this.at += 4;
  }

  /** A packed run of signed 32-bit varints: its length, then each value. */
  packedInt32(values: readonly number[]): void {
    const n = values.length;
    // At most ten bytes a value (a negative one), plus a length of at most five.
    this.ensure(5 + 10 * n);
    const start = this.fork();
    const buf = this.buf;
    let at = this.at;
    for (let i = 0; i < n; i++) {
      const value = values[i];
      if (value < 0) {
        this.at = at;
        this.int32(value);
        at = this.at;
        continue;
      }
      let v = value >>> 0;
      while (v > 0x7f) {
        buf[at++] = (v & 0x7f) | 0x80;
        v >>>= 7;
      }
      buf[at++] = v;
    }
    this.at = at;
    this.join(start);
  }

  /** A packed run of little-endian floats: its length, then four bytes a value. */
  packedFloat(values: readonly number[]): void {
    const n = values.length;
    this.uint32(4 * n);
    this.ensure(4 * n);
    const view = this.view;
    let at = this.at;
    for (let i = 0; i < n; i++, at += 4) view.setFloat32(at, values[i], true);
    this.at = at;
  }

  /** A packed run of booleans (a 0 or 1 given as a number reads as false or true): its length, then a byte a value. */
  packedBool(values: readonly (boolean | number)[]): void {
    const n = values.length;
    this.uint32(n);
    this.ensure(n);
    const buf = this.buf;
    const at = this.at;
    for (let i = 0; i < n; i++) buf[at + i] = values[i] ? 1 : 0;
    this.at = at + n;
  }

  /** A length-delimited UTF-8 string. */
  string(value: string): void {
    const n = value.length;
    // ASCII fast path (ids, prompts): one byte per UTF-16 unit, written in place after the length.
    this.ensure(5 + n);
    let ascii = true;
    for (let i = 0; i < n; i++) {
      if (value.charCodeAt(i) > 0x7f) {
        ascii = false;
        break;
      }
    }
    if (!ascii) {
      const bytes = utf8.encode(value);
      this.uint32(bytes.length);
      this.ensure(bytes.length);
      this.buf.set(bytes, this.at);
      this.at += bytes.length;
      return;
    }
    this.uint32(n);
    const buf = this.buf;
    const at = this.at;
    for (let i = 0; i < n; i++) buf[at + i] = value.charCodeAt(i);
    this.at = at + n;
  }

  /** Starts a length-delimited part (a message, a packed array) of unknown length; {@link join} ends it. */
  fork(): number {
    this.ensure(1);
    this.at += 1;
    return this.at;
  }

  /** Ends the part started at `start`: writes its length before it, moving it when the length takes over a byte. */
  join(start: number): void {
    const length = this.at - start;
    if (length < 0x80) {
      this.buf[start - 1] = length;
      return;
    }
    let size = 1;
    while (length >= 2 ** (7 * size)) size++;
    this.ensure(size - 1);
    this.buf.copyWithin(start + size - 1, start, this.at);
    this.at += size - 1;
    let v = length;
    let p = start - 1;
    while (v > 0x7f) {
      this.buf[p++] = (v & 0x7f) | 0x80;
      v >>>= 7;
    }
    this.buf[p] = v;
  }

  /** The bytes written, copied into a pooled `Buffer` (a view: copy it before mutating it in place). */
  finish(): Uint8Array {
    const out = Buffer.allocUnsafe(this.at);
    out.set(this.buf.subarray(0, this.at));
    return out;
  }
}

/** Runs `body` with a writer and returns the bytes it wrote. */
export function encodeWith(body: (w: WireWriter) => void): Uint8Array {
  const owned = !scratchBusy;
  scratchBusy = true;
  try {
    const w = new WireWriter(owned);
    body(w);
    return w.finish();
  } finally {
    if (owned) scratchBusy = false;
  }
}

/** Reads one record, every read bounded by the bytes given. */
export class WireReader {
  pos = 0;
  private readonly view: DataView;

  constructor(readonly bytes: Uint8Array) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  get length(): number {
    return this.bytes.length;
  }

  /** A {@link DecodeError} for `field`, at the current offset. */
  fail(field: string, reason: string, cause?: unknown): DecodeError {
    return new DecodeError(`cannot decode ${field}: ${reason}`, { cause, context: { field, offset: this.pos } });
  }

  private need(n: number, field: string): void {
    if (this.pos + n > this.bytes.length) throw this.fail(field, `needs ${n} bytes at offset ${this.pos}, record has ${this.bytes.length}`);
  }

  /** A varint's low 32 bits, unsigned (a varint of up to ten bytes). */
  uint32(field: string): number {
    const bytes = this.bytes;
    let value = 0;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= bytes.length) throw this.fail(field, 'a varint runs past the record');
      const b = bytes[this.pos++];
      if (i < 5) value |= (b & 0x7f) << (7 * i);
      if ((b & 0x80) === 0) return value >>> 0;
    }
    throw this.fail(field, 'a varint longer than ten bytes');
  }

  /** A varint's low 32 bits, signed. */
  int32(field: string): number {
    return this.uint32(field) | 0;
  }

  /** An unsigned 64-bit varint that must be a JavaScript safe integer. */
  uint64(field: string): number {
    const bytes = this.bytes;
    let value = 0;
    let scale = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= bytes.length) throw this.fail(field, 'a varint runs past the record');
      const b = bytes[this.pos++];
      value += (b & 0x7f) * scale;
      scale *= 128;
      if ((b & 0x80) === 0) {
        if (!Number.isSafeInteger(value)) throw this.fail(field, `${value} is over 2^53 - 1`);
        return value;
      }
    }
    throw this.fail(field, 'a varint longer than ten bytes');
  }

  bool(field: string): boolean {
    return this.uint32(field) !== 0;
  }

  double(field: string): number {
    this.need(8, field);
    const v = this.view.getFloat64(this.pos, true);
    this.pos += 8;
    return v;
  }

  float(field: string): number {
    this.need(4, field);
    const v = this.view.getFloat32(this.pos, true);
    this.pos += 4;
    return v;
  }

  /** The end offset of a length-delimited part that starts here, checked against the record. */
  delimited(field: string): number {
    const n = this.uint32(field);
    if (n > this.bytes.length - this.pos) throw this.fail(field, `a part of ${n} bytes runs past the record`);
    return this.pos + n;
  }

  /** A length-delimited string of valid UTF-8. */
  string(field: string): string {
    const end = this.delimited(field);
    const bytes = this.bytes;
    const start = this.pos;
    this.pos = end;
    // ASCII fast path: short strings decode faster by hand than through TextDecoder.
    if (end - start <= 64) {
      let value = '';
      let i = start;
      for (; i < end; i++) {
        const c = bytes[i];
        if (c > 0x7f) break;
        value += String.fromCharCode(c);
      }
      if (i === end) return value;
    }
    try {
      return strictUtf8.decode(bytes.subarray(start, end));
    } catch (cause) {
      throw this.fail(field, 'invalid UTF-8', cause);
    }
  }

  /** Appends a packed run of signed 32-bit varints to `out`. */
  packedInt32(out: number[], field: string): void {
    const end = this.delimited(field);
    const bytes = this.bytes;
    // Small values (token ids under 128) take one byte: read them inline, and the rest as varints.
    while (this.pos < end) {
      const b = bytes[this.pos];
      if (b < 0x80) {
        out.push(b);
        this.pos++;
      } else {
        out.push(this.uint32(field) | 0);
      }
    }
    if (this.pos !== end) throw this.fail(field, 'a packed varint runs past its length');
  }

  /** Appends a packed run of booleans to `out`. */
  packedBool(out: boolean[], field: string): void {
    const end = this.delimited(field);
    while (this.pos < end) out.push(this.uint32(field) !== 0);
    if (this.pos !== end) throw this.fail(field, 'a packed varint runs past its length');
  }

  /** Appends a packed run of little-endian floats to `out`. */
  packedFloat(out: number[], field: string): void {
    const end = this.delimited(field);
    if ((end - this.pos) % 4 !== 0) throw this.fail(field, `a packed float run of ${end - this.pos} bytes`);
    const view = this.view;
    let at = this.pos;
    for (; at < end; at += 4) out.push(view.getFloat32(at, true));
    this.pos = at;
  }

  /**
   * Skips a field of a number the message does not know (groups included, at most 64 deep); a field it knows (in
   * `known`) with another wire type than its own is malformed.
   */
  skip(tag: number, message: string, known: readonly number[] = [], depth = 0): void {
    const field = `${message} field ${tag >>> 3}`;
    if (tag >>> 3 === 0) throw this.fail(message, `field number 0 at offset ${this.pos}`);
    if (known.includes(tag >>> 3)) throw this.fail(field, `wire type ${tag & 7} is not the one its type takes`);
    switch (tag & 7) {
      case WIRE.varint:
        this.uint32(field);
        return;
      case WIRE.fixed64:
        this.need(8, field);
        this.pos += 8;
        return;
      case WIRE.bytes:
        this.pos = this.delimited(field);
        return;
      case WIRE.fixed32:
        this.need(4, field);
        this.pos += 4;
        return;
      case WIRE.startGroup: {
        if (depth >= 64) throw this.fail(field, 'groups nested over 64 deep');
        for (;;) {
          if (this.pos >= this.bytes.length) throw this.fail(field, 'a group runs past the record');
          const inner = this.uint32(field);
          if ((inner & 7) === WIRE.endGroup) {
            if (inner >>> 3 !== tag >>> 3) throw this.fail(field, 'a group ends with another field number');
            return;
          }
          this.skip(inner, message, [], depth + 1);
        }
      }
      default:
        throw this.fail(field, `wire type ${tag & 7} is not one protobuf knows here`);
    }
  }
}
