/**
 * Protobuf bytes built by hand — what no SDK sends — for the Tinker codec's specs and the hostile-client bench:
 * varints, the three wire types the Tinker messages use, little-endian arrays, and the audit's "sparse bomb".
 *
 * @packageDocumentation
 */

/** `value` as a base-128 varint (negative numbers as their 64-bit two's complement). */
export function varint(value: number | bigint): number[] {
  let v = BigInt.asUintN(64, BigInt(value));
  const out: number[] = [];
  while (v >= 0x80n) {
    out.push(Number(v & 0x7fn) | 0x80);
    v >>= 7n;
  }
  out.push(Number(v));
  return out;
}

/** A field's key: its number and wire type. */
export const tag = (field: number, wire: number): number[] => varint(field * 8 + wire);
/** A varint field. */
export const vField = (field: number, value: number | bigint): number[] => [...tag(field, 0), ...varint(value)];
/** A length-delimited field. */
export const lField = (field: number, payload: ArrayLike<number>): number[] => [
  ...tag(field, 2),
  ...varint(payload.length),
  ...Array.from(payload),
];
/** A string field (UTF-8). */
export const sField = (field: number, text: string): number[] => lField(field, new TextEncoder().encode(text));

/** `values` as little-endian bytes of one kind. */
export function le(kind: 'i32' | 'i64' | 'f32' | 'u16', values: readonly (number | bigint)[]): number[] {
  const size = { i32: 4, i64: 8, f32: 4, u16: 2 }[kind];
  const view = new DataView(new ArrayBuffer(values.length * size));
  values.forEach((v, i) => {
    if (kind === 'i64') view.setBigInt64(i * 8, BigInt(v), true);
    else if (kind === 'i32') view.setInt32(i * 4, Number(v), true);
    else if (kind === 'f32') view.setFloat32(i * 4, Number(v), true);
    else view.setUint16(i * 2, Number(v), true);
  });
  return Array.from(new Uint8Array(view.buffer));
}

/**
 * A `forward_backward` body for `modelId` whose one datum has 2 tokens and a `target_tokens` tensor in sparse CSR of
 * shape `[rows, cols]` with no stored value: a few dozen bytes that would expand to `rows · cols` int64s (the
 * audit's was `1 × 2^26`, 91 bytes).
 */
export function sparseBomb(modelId: string, rows: number, cols: number | bigint): Uint8Array {
  const csr = [...lField(2, le('i64', new Array<number>(rows + 1).fill(0)))];
  const tensor = [...lField(2, csr), ...vField(3, 2), ...lField(4, [...varint(rows), ...varint(cols)])];
  const chunk = lField(1, lField(1, lField(1, [1, 0, 0, 0, 2, 0, 0, 0])));
  const datumBytes = [...chunk, ...lField(2, [...sField(1, 'target_tokens'), ...lField(2, tensor)])];
  return Uint8Array.from([...sField(1, modelId), ...vField(2, 1), ...lField(3, datumBytes), ...sField(4, 'cross_entropy')]);
}
