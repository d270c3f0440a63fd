/**
 * Hand-made Parquet files, byte by byte, for specs that need what no writer makes: a page that lies about its
 * uncompressed size, a zstd page of megabytes in a few hundred bytes. One required UTF-8 column, one row group, one
 * PLAIN data page (format: parquet-format's `parquet.thrift`, Thrift's compact protocol).
 */

/** Thrift compact-protocol field types. */
const I32 = 5;
const I64 = 6;
const BINARY = 8;
const LIST = 9;
const STRUCT = 12;

/** A Thrift struct field: its id, its compact type and its value (a nested struct as a list of fields). */
type Field = readonly [
  id: number,
  type: number,
  value: number | string | readonly Field[] | readonly (number | string | readonly Field[])[],
];

function varint(n: bigint, out: number[]): void {
  let v = n;
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
}

function zigzag(n: number, out: number[]): void {
  const v = BigInt(n);
  varint(v >= 0n ? v << 1n : (-v << 1n) - 1n, out);
}

function value(type: number, v: Field[2], out: number[]): void {
  if (type === I32 || type === I64) zigzag(v as number, out);
  else if (type === BINARY) {
    const bytes = Buffer.from(v as string);
    varint(BigInt(bytes.length), out);
    out.push(...bytes);
  } else if (type === STRUCT) struct(v as readonly Field[], out);
}

function struct(fields: readonly Field[], out: number[]): void {
  let last = 0;
  for (const [id, type, v] of fields) {
    out.push(((id - last) << 4) | type);
    last = id;
    if (type === LIST) {
      const items = v as readonly (number | string | readonly Field[])[];
      const element = typeof items[0] === 'string' ? BINARY : typeof items[0] === 'number' ? I32 : STRUCT;
      out.push((items.length << 4) | element);
      for (const item of items) value(element, item, out);
    } else value(type, v, out);
  }
  out.push(0);
}

/** Parquet codec ids (`CompressionCodec` in parquet.thrift). */
const CODECS = { UNCOMPRESSED: 0, SNAPPY: 1, GZIP: 2, ZSTD: 6 } as const;

/** What {@link parquetBytes} writes. */
export interface ParquetPage {
  /** The column's name. */
  readonly column: string;
  /** The page's codec. */
  readonly codec: keyof typeof CODECS;
  /** The page's data as stored (already compressed with `codec`). */
  readonly data: Uint8Array;
  /** The uncompressed size the page header claims. */
  readonly claimed: number;
  /** Rows (values) in the page. Default 1. */
  readonly rows?: number;
}

/**
 * A Parquet file of one row group holding one page of one required `BYTE_ARRAY` (UTF-8) column.
 *
 * @param page - the column, codec, stored data and claimed size.
 * @returns the file's bytes.
 */
export function parquetBytes(page: ParquetPage): Uint8Array {
  const rows = page.rows ?? 1;
  const header: number[] = [];
  struct(
    [
      [1, I32, 0], // DATA_PAGE
      [2, I32, page.claimed],
      [3, I32, page.data.length],
      [
        5,
        STRUCT,
        [
          [1, I32, rows],
          [2, I32, 0],
          [3, I32, 3],
          [4, I32, 3],
        ],
      ], // PLAIN, RLE levels
    ],
    header,
  );
  const chunk = [...header, ...page.data];
  const offset = 4;
  const footer: number[] = [];
  const columnMeta: Field[] = [
    [1, I32, 6], // BYTE_ARRAY
    [2, LIST, [0]],
    [3, LIST, [page.column]],
    [4, I32, CODECS[page.codec]],
    [5, I64, rows],
    [6, I64, header.length + page.claimed],
    [7, I64, chunk.length],
    [9, I64, offset],
  ];
  struct(
    [
      [1, I32, 1],
      [
        2,
        LIST,
        [
          [
            [4, BINARY, 'schema'],
            [5, I32, 1],
          ],
          [
            [1, I32, 6],
            [3, I32, 0],
            [4, BINARY, page.column],
            [6, I32, 0],
          ], // required, UTF8
        ],
      ],
      [3, I64, rows],
      [
        4,
        LIST,
        [
          [
            [
              1,
              LIST,
              [
                [
                  [2, I64, offset],
                  [3, STRUCT, columnMeta],
                ],
              ],
            ],
            [2, I64, header.length + page.claimed],
            [3, I64, rows],
          ],
        ],
      ],
    ],
    footer,
  );
  const length = Buffer.alloc(4);
  length.writeUInt32LE(footer.length);
  return Buffer.concat([Buffer.from('PAR1'), Buffer.from(chunk), Buffer.from(footer), length, Buffer.from('PAR1')]);
}

/** The 4-byte little-endian length that starts a PLAIN `BYTE_ARRAY` value of `length` bytes. */
export function plainLength(length: number): Uint8Array {
  const out = Buffer.alloc(4);
  out.writeUInt32LE(length);
  return out;
}

/**
 * A zstd frame of `prefix` followed by `count` copies of the byte `fill`, as raw and RLE blocks: megabytes in a few
 * hundred bytes (RFC 8878: a frame header with a 128 KiB window and no content size, blocks of at most 128 KiB).
 */
export function zstdRle(prefix: Uint8Array, fill: number, count: number): Uint8Array {
  const out: number[] = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0x38]; // magic; no content size, not single-segment; window 2^17
  const block = (type: number, size: number, last: boolean): void => {
    const word = (size << 3) | (type << 1) | (last ? 1 : 0);
    out.push(word & 0xff, (word >> 8) & 0xff, (word >> 16) & 0xff);
  };
  block(0, prefix.length, count === 0);
  out.push(...prefix);
  const most = 128 * 1024;
  for (let left = count; left > 0; left -= most) {
    block(1, Math.min(most, left), left <= most);
    out.push(fill);
  }
  return Uint8Array.from(out);
}

/**
 * A snappy stream of `bytes` as literals (the format's preamble is the true length, whatever the page claims).
 */
export function snappyLiteral(bytes: Uint8Array): Uint8Array {
  const out: number[] = [];
  varint(BigInt(bytes.length), out);
  for (let i = 0; i < bytes.length; i += 60) {
    const piece = bytes.subarray(i, i + 60);
    out.push((piece.length - 1) << 2, ...piece);
  }
  return Uint8Array.from(out);
}
