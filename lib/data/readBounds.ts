/**
 * Bounds on what reading a task file may cost, checked before the cost is paid: a Parquet page's claimed
 * uncompressed size before it is decompressed (a 556-byte file may claim a 2 GiB page), the pages of one row group
 * together, and one row's size before it becomes a task. Past a bound, a `DecodeError` naming the file and row.
 *
 * @packageDocumentation
 */
import type { Compressors } from 'hyparquet';
import type { decompressZstd } from 'hyparquet-compressors';

import { DecodeError } from '../core/errors.js';

/** Bounds on reading a task file, in bytes. */
export interface ReadBounds {
  /** Largest row: a JSONL line, or a Parquet row's values (text as UTF-8). */
  readonly rowBytes: number;
  /** Largest uncompressed size a Parquet page may claim. */
  readonly pageBytes: number;
  /** Largest uncompressed size the pages of one Parquet row group may claim together. */
  readonly rowGroupBytes: number;
}

/**
 * The default bounds: 64 MiB a row (a prompt that long fits no model's context) and a page (writers cut pages at
 * 1 MiB; a larger one holds a single huge value), 1 GiB a row group (writers cut them at 128 MiB or less).
 */
export const DEFAULT_READ_BOUNDS: ReadBounds = { rowBytes: 64 * 2 ** 20, pageBytes: 64 * 2 ** 20, rowGroupBytes: 2 ** 30 };

/** Where in a file a bound was passed: the file, the first row of what was being read, and its last. */
interface Rows {
  readonly file: string;
  readonly first: number;
  readonly last: number;
}

/**
 * Parquet decompressors that refuse a page whose claimed uncompressed size passes `bounds.pageBytes`, or brings the
 * row group's pages past `bounds.rowGroupBytes`, before anything is decompressed or allocated; and that write no more
 * than the claim (zstd's own frame sizes are not trusted). Every codec is wrapped, so none falls back to an
 * unbounded built-in decoder.
 *
 * @param codecs - `hyparquet-compressors`: its decompressors, and its zstd decoder that writes into a given buffer.
 * @param bounds - the bounds.
 * @returns the wrapped decompressors, and `startRowGroup`, to call before each row group is read (resets its total).
 */
export function boundedCompressors(
  codecs: { readonly compressors: Compressors; readonly decompressZstd: typeof decompressZstd },
  bounds: ReadBounds,
): { readonly compressors: Compressors; startRowGroup(rows: Rows): void } {
  let rows: Rows = { file: '', first: 0, last: 0 };
  let claimed = 0;
  const check = (length: number): void => {
    claimed += length;
    const [what, bound, key] =
      length > bounds.pageBytes
        ? (['a page', bounds.pageBytes, 'pageBytes'] as const)
        : (['the pages of the row group', bounds.rowGroupBytes, 'rowGroupBytes'] as const);
    if (length > bounds.pageBytes || claimed > bounds.rowGroupBytes) {
      const size = length > bounds.pageBytes ? length : claimed;
      throw new DecodeError(
        `${rows.file}:${rows.first}: ${what} of rows ${rows.first}–${rows.last} claims ${size} bytes uncompressed, more than the bound of ${bound}`,
        { context: { file: rows.file, line: rows.first, lastLine: rows.last, bytes: size, limit: bound, bound: key } },
      );
    }
  };
  // The package's zstd entry ignores the claimed length and grows to whatever the frames say: give it a buffer.
  const zstd = (input: Uint8Array, length: number): Uint8Array => codecs.decompressZstd(input, new Uint8Array(length));
  const wrapped: Compressors = Object.fromEntries(
    Object.entries({ ...codecs.compressors, ZSTD: zstd }).map(([codec, decompress]) => [
      codec,
      (input: Uint8Array, length: number): Uint8Array => {
        check(length);
        return decompress(input, length);
      },
    ]),
  );
  return {
    compressors: wrapped,
    startRowGroup(next) {
      rows = next;
      claimed = 0;
    },
  };
}

/**
 * A {@link DecodeError} when a row is larger than `bounds.rowBytes`.
 *
 * @param size - the row's size in bytes (see {@link rowBytes}).
 * @param where - its file and 1-based line or row.
 * @param bounds - the bounds.
 */
export function checkRowSize(size: number, where: { readonly file: string; readonly line: number }, bounds: ReadBounds): void {
  if (size > bounds.rowBytes) {
    throw new DecodeError(`${where.file}:${where.line}: the row is ${size} bytes, more than the bound of ${bounds.rowBytes}`, {
      context: { ...where, bytes: size, limit: bounds.rowBytes, bound: 'rowBytes' },
    });
  }
}

/** Size in bytes of a decoded Parquet row: its text as UTF-8, its binary values, 8 bytes per other scalar. */
export function rowBytes(value: unknown): number {
  if (typeof value === 'string') return Buffer.byteLength(value);
  if (ArrayBuffer.isView(value)) return value.byteLength;
  if (Array.isArray(value)) return value.reduce((sum: number, v: unknown) => sum + rowBytes(v), 0);
  if (value !== null && typeof value === 'object' && !(value instanceof Date)) {
    return Object.entries(value).reduce((sum, [key, v]) => sum + key.length + rowBytes(v), 0);
  }
  return 8;
}
