/**
 * Reads and writes {@link NamedWeights} in the safetensors format, so checkpoints interoperate with Python's
 * `safetensors` package.
 *
 * Layout: an unsigned 64-bit little-endian header length `N`; `N` bytes of UTF-8 JSON mapping each tensor
 * name to `{ dtype, shape, data_offsets: [begin, end] }` (byte offsets into the data section) plus an optional
 * `__metadata__` object of string values; then the data section, row-major little-endian. This module writes
 * `F32` tensors and reads `F32`, `F16` and `BF16` ones (widened to `Float32Array`, exactly: every half and
 * bfloat16 value is a float32 value); the header is padded with spaces to a multiple of 8 bytes, as the
 * Python writer does.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';
import { open, rename, rm } from 'node:fs/promises';

import type { NamedWeights, WeightArray } from './types.js';
import { DecodeError, ShapeError, assertNever } from '../core/errors.js';
import { readRegularFile, type FileLimits } from './files.js';

/** Key of the free-form string metadata in a safetensors header. */
export const SAFETENSORS_METADATA_KEY = '__metadata__';
/** Bytes of the header-length prefix. */
const LENGTH_PREFIX_BYTES = 8;
/** Alignment of the data section, in bytes (the header is padded with spaces to reach it). */
const HEADER_ALIGNMENT = 8;
/** Bytes per `F32` element. */
const F32_BYTES = 4;
/** Floating-point dtypes this reader widens to float32, with their element sizes. */
const READ_DTYPES: Readonly<Record<string, number>> = { F32: 4, F16: 2, BF16: 2 };

/** A floating-point safetensors dtype this module reads. */
export type SafetensorsDtype = 'F32' | 'F16' | 'BF16';
/** Largest header this reader accepts (the Python reader's limit is 100 MB). */
export const SAFETENSORS_MAX_HEADER_BYTES = 100_000_000;

/** String metadata stored in the `__metadata__` entry. */
export type SafetensorsMetadata = Readonly<Record<string, string>>;

/** Decoded contents of a safetensors file. */
export interface SafetensorsContents {
  /** Tensors by name, in file (header) order, as fresh `Float32Array`s. */
  readonly weights: NamedWeights;
  /** The `__metadata__` entry, or `{}`. */
  readonly metadata: SafetensorsMetadata;
}

const hostIsLittleEndian = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

/**
 * Encodes weights and optional string metadata as safetensors bytes, every tensor in `dtype` (`F32` by default;
 * `BF16` and `F16` round each float32 to nearest, ties to even, as PyTorch's casts do).
 *
 * @param weights - Tensors by name; each `data.length` must equal the product of its `shape`.
 * @param metadata - Stored under `__metadata__`.
 * @param dtype - The stored element type.
 * @throws {@link ShapeError} when a tensor's data does not match its shape, or a name is reserved.
 */
export function encodeSafetensors(weights: NamedWeights, metadata?: SafetensorsMetadata, dtype: SafetensorsDtype = 'F32'): Uint8Array {
  const width = READ_DTYPES[dtype] as number;
  const header: Record<string, unknown> = {};
  if (metadata !== undefined && Object.keys(metadata).length > 0) {
    header[SAFETENSORS_METADATA_KEY] = { ...metadata };
  }
  let offset = 0;
  for (const [name, { shape, data }] of weights) {
    if (name === SAFETENSORS_METADATA_KEY) {
      throw new ShapeError(`tensor name '${name}' is reserved`, { context: { name } });
    }
    const size = shape.reduce((p, d) => p * d, 1);
    if (size !== data.length) {
      throw new ShapeError(`tensor '${name}' has ${data.length} values but shape [${shape.join(', ')}]`, {
        context: { name, shape, length: data.length },
      });
    }
    header[name] = { dtype, shape: [...shape], data_offsets: [offset, offset + size * width] };
    offset += size * width;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const padding = (HEADER_ALIGNMENT - (json.length % HEADER_ALIGNMENT)) % HEADER_ALIGNMENT;
  if (padding > 0) {
    const padded = new Uint8Array(json.length + padding).fill(0x20);
    padded.set(json);
    json = padded;
  }
  const out = new Uint8Array(LENGTH_PREFIX_BYTES + json.length + offset);
  new DataView(out.buffer).setBigUint64(0, BigInt(json.length), true);
  out.set(json, LENGTH_PREFIX_BYTES);
  let at = LENGTH_PREFIX_BYTES + json.length;
  for (const { data } of weights.values()) {
    if (dtype === 'F32') writeF32(out, at, data);
    else writeHalves(out, at, data, dtype === 'BF16' ? floatToBfloat16 : floatToHalf);
    at += data.length * width;
  }
  return out;
}

function writeHalves(out: Uint8Array, at: number, data: ArrayLike<number>, narrow: (value: number) => number): void {
  for (let i = 0; i < data.length; i++) {
    const bits = narrow(data[i]);
    out[at + 2 * i] = bits & 0xff;
    out[at + 2 * i + 1] = bits >>> 8;
  }
}

const narrowScratch = new DataView(new ArrayBuffer(4));

/**
 * The bfloat16 nearest to a float32 (ties to even); NaN stays a quiet NaN of its sign.
 *
 * @param value - A float32 value.
 * @returns Its 16 bits.
 */
export function floatToBfloat16(value: number): number {
  narrowScratch.setFloat32(0, value);
  const bits = narrowScratch.getUint32(0);
  if ((bits & 0x7fffffff) > 0x7f800000) return ((bits >>> 16) & 0x8000) | 0x7fc0;
  return ((bits + 0x7fff + ((bits >>> 16) & 1)) >>> 16) & 0xffff;
}

/**
 * The IEEE half nearest to a float32 (ties to even): overflow to ±Infinity, subnormals kept, NaN quiet.
 *
 * @param value - A float32 value.
 * @returns Its 16 bits.
 */
export function floatToHalf(value: number): number {
  narrowScratch.setFloat32(0, value);
  const bits = narrowScratch.getUint32(0);
  const sign = (bits >>> 16) & 0x8000;
  const exponent = (bits >>> 23) & 0xff;
  const mantissa = bits & 0x7fffff;
  if (exponent === 0xff) return sign | 0x7c00 | (mantissa !== 0 ? 0x200 : 0);
  const e = exponent - 127 + 15;
  if (e >= 0x1f) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    // Subnormal: the implicit bit joins the mantissa, shifted right with rounding to nearest even.
    const full = mantissa | 0x800000;
    const shift = 14 - e;
    const half = full >>> shift;
    const rest = full & ((1 << shift) - 1);
    const midpoint = 1 << (shift - 1);
    return sign | (half + (rest > midpoint || (rest === midpoint && (half & 1) === 1) ? 1 : 0));
  }
  const half = (e << 10) | (mantissa >>> 13);
  const rest = mantissa & 0x1fff;
  // A carry out of the mantissa raises the exponent, up to Infinity, which is the right rounding.
  return sign | (half + (rest > 0x1000 || (rest === 0x1000 && (half & 1) === 1) ? 1 : 0));
}

/**
 * Decodes safetensors bytes holding `F32`, `F16` or `BF16` tensors (returned as float32).
 *
 * @throws {@link DecodeError} when the length prefix, the JSON header, a dtype, a shape or the data offsets
 *   are malformed (offsets must tile the data section exactly, as the Python reader requires).
 */
export function decodeSafetensors(bytes: Uint8Array): SafetensorsContents {
  if (bytes.length < LENGTH_PREFIX_BYTES) {
    throw malformed(`file has ${bytes.length} bytes, fewer than the ${LENGTH_PREFIX_BYTES}-byte length prefix`);
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const headerLength = view.getBigUint64(0, true);
  if (headerLength > BigInt(Math.min(SAFETENSORS_MAX_HEADER_BYTES, bytes.length - LENGTH_PREFIX_BYTES))) {
    // The length itself is not quoted: it is the file's first eight bytes, whatever the file is.
    throw malformed(`the header length prefix exceeds the file (${bytes.length} bytes) or the ${SAFETENSORS_MAX_HEADER_BYTES}-byte limit`);
  }
  const dataStart = LENGTH_PREFIX_BYTES + Number(headerLength);
  let parsed: unknown;
  try {
    const text = new TextDecoder('utf-8', { fatal: true }).decode(bytes.subarray(LENGTH_PREFIX_BYTES, dataStart));
    if (!text.startsWith('{')) {
      throw new Error('header does not start with "{"');
    }
    parsed = JSON.parse(text);
  } catch (cause) {
    throw malformed('header is not a UTF-8 JSON object', cause);
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) {
    throw malformed('header is not a JSON object');
  }
  const dataLength = bytes.length - dataStart;
  const entries: { name: string; shape: number[]; dtype: SafetensorsDtype; begin: number; end: number }[] = [];
  let metadata: Record<string, string> = {};
  for (const [name, value] of Object.entries(parsed as Record<string, unknown>)) {
    if (name === SAFETENSORS_METADATA_KEY) {
      metadata = parseMetadata(value);
      continue;
    }
    entries.push({ name, ...parseEntry(name, value, dataLength) });
  }
  const sorted = [...entries].sort((x, y) => x.begin - y.begin || x.end - y.end);
  let expected = 0;
  for (const e of sorted) {
    if (e.begin !== expected) {
      throw malformed(`tensor '${e.name}' starts at byte ${e.begin}, expected ${expected} (gap or overlap)`);
    }
    expected = e.end;
  }
  if (expected !== dataLength) {
    throw malformed(`tensors cover ${expected} bytes of a ${dataLength}-byte data section`);
  }
  const weights = new Map<string, WeightArray>();
  for (const e of entries) {
    const count = (e.end - e.begin) / (READ_DTYPES[e.dtype] as number);
    weights.set(e.name, { shape: e.shape, data: readFloats(bytes, dataStart + e.begin, count, e.dtype) });
  }
  return { weights, metadata };
}

/**
 * Writes weights as a safetensors file (through a temporary file and a rename, so readers never see half a
 * file).
 *
 * @param path - Destination file.
 * @param weights - Tensors by name (`F32`).
 * @param metadata - Stored under `__metadata__`.
 */
export async function saveSafetensors(path: string, weights: NamedWeights, metadata?: SafetensorsMetadata): Promise<void> {
  await writeFileAtomic(path, encodeSafetensors(weights, metadata));
}

/**
 * Writes a file through a temporary sibling, flushed to the disk (`fsync`) before it is renamed into place, so
 * readers never see half of it and a machine crash never leaves it empty. Making the rename itself durable is the
 * caller's: {@link syncDirectory} on the parent.
 */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const tmp = `${path}.${randomBytes(6).toString('hex')}.tmp`;
  try {
    const file = await open(tmp, 'w');
    try {
      await file.writeFile(data);
      await file.sync();
    } finally {
      await file.close();
    }
    await rename(tmp, path);
  } catch (error) {
    await rm(tmp, { force: true });
    throw error;
  }
}

/** Flushes a directory's entries (files created, renamed or removed in it) to the disk. */
export async function syncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, 'r');
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Reads a safetensors file written by {@link saveSafetensors} or by Python's `safetensors` (F32, F16 or BF16
 * tensors, returned as float32), through rxrl's one file reader: a regular file only, no larger than
 * `limits.maxBytes`, inside `limits.root` when given.
 *
 * @returns the tensors, the metadata, and the file's size in bytes.
 * @throws {@link DecodeError} when the file is not a readable regular file within the limits, or is malformed;
 *   {@link ForbiddenPathError} outside `limits.root`.
 */
export async function loadSafetensors(
  path: string,
  limits: Partial<FileLimits> = {},
): Promise<SafetensorsContents & { readonly bytes: number }> {
  const bytes = await readRegularFile(path, { maxBytes: Number.MAX_SAFE_INTEGER, ...limits });
  try {
    return { ...decodeSafetensors(new Uint8Array(bytes.buffer, bytes.byteOffset, bytes.byteLength)), bytes: bytes.length };
  } catch (error) {
    if (error instanceof DecodeError) {
      throw new DecodeError(`${path}: ${error.message}`, { cause: error.cause, context: { ...error.context, path } });
    }
    throw error;
  }
}

function parseMetadata(value: unknown): Record<string, string> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw malformed(`'${SAFETENSORS_METADATA_KEY}' is not an object`);
  }
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
    if (typeof v !== 'string') {
      throw malformed(`metadata value '${k}' is not a string`);
    }
    out[k] = v;
  }
  return out;
}

function parseEntry(
  name: string,
  value: unknown,
  dataLength: number,
): { shape: number[]; dtype: SafetensorsDtype; begin: number; end: number } {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw malformed(`entry '${name}' is not an object`);
  }
  const { dtype, shape, data_offsets: offsets } = value as Record<string, unknown>;
  const width = typeof dtype === 'string' ? READ_DTYPES[dtype] : undefined;
  if (width === undefined) {
    throw malformed(`tensor '${name}' has an unsupported dtype; supported: ${Object.keys(READ_DTYPES).join(', ')}`);
  }
  if (!Array.isArray(shape) || !shape.every((d) => Number.isSafeInteger(d) && (d as number) >= 0)) {
    throw malformed(`tensor '${name}' has an invalid shape`);
  }
  if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every((o) => Number.isSafeInteger(o) && (o as number) >= 0)) {
    throw malformed(`tensor '${name}' has invalid data_offsets`);
  }
  const [begin, end] = offsets as [number, number];
  const size = (shape as number[]).reduce((p, d) => p * d, 1);
  if (end < begin || end > dataLength || end - begin !== size * width) {
    throw malformed(`tensor '${name}' data_offsets [${begin}, ${end}] do not fit shape [${shape.join(', ')}] of ${dtype}`);
  }
  return { shape: [...(shape as number[])], dtype: dtype as SafetensorsDtype, begin, end };
}

function malformed(message: string, cause?: unknown): DecodeError {
  return new DecodeError(`malformed safetensors: ${message}`, { cause, context: { format: 'safetensors' } });
}

function writeF32(out: Uint8Array, at: number, data: Float32Array): void {
  if (hostIsLittleEndian) {
    out.set(new Uint8Array(data.buffer, data.byteOffset, data.byteLength), at);
    return;
  }
  const view = new DataView(out.buffer, out.byteOffset, out.byteLength);
  for (let i = 0; i < data.length; i++) {
    view.setFloat32(at + i * F32_BYTES, data[i], true);
  }
}

function readFloats(bytes: Uint8Array, at: number, count: number, dtype: SafetensorsDtype): Float32Array {
  switch (dtype) {
    case 'F32':
      return readF32(bytes, at, count);
    case 'F16':
      return readHalves(bytes, at, count, halfToFloat);
    case 'BF16':
      return readHalves(bytes, at, count, bfloat16ToFloat);
    default:
      return assertNever(dtype, 'safetensors dtype');
  }
}

function readHalves(bytes: Uint8Array, at: number, count: number, widen: (bits: number) => number): Float32Array {
  const out = new Float32Array(count);
  for (let i = 0; i < count; i++) {
    out[i] = widen(bytes[at + 2 * i] | (bytes[at + 2 * i + 1] << 8));
  }
  return out;
}

const widenScratch = new DataView(new ArrayBuffer(4));

/** bfloat16 is the upper half of a float32: shift the 16 bits back into place. */
function bfloat16ToFloat(bits: number): number {
  widenScratch.setUint32(0, bits << 16);
  return widenScratch.getFloat32(0);
}

/** IEEE 754 binary16 → number: sign, 5-bit exponent (bias 15), 10-bit mantissa; subnormals, ±∞ and NaN kept. */
function halfToFloat(bits: number): number {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;
  if (exponent === 0x1f) return mantissa === 0 ? sign * Infinity : NaN;
  return sign * (1 + mantissa / 1024) * 2 ** (exponent - 15);
}

function readF32(bytes: Uint8Array, at: number, count: number): Float32Array {
  const out = new Float32Array(count);
  if (hostIsLittleEndian) {
    new Uint8Array(out.buffer).set(bytes.subarray(at, at + count * F32_BYTES));
    return out;
  }
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < count; i++) {
    out[i] = view.getFloat32(at + i * F32_BYTES, true);
  }
  return out;
}
