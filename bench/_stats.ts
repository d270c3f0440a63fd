/**
 * Summary statistics the benchmarks share.
 *
 * @packageDocumentation
 */

/** The median (the mean of the middle two for an even count); NaN when empty. */
export function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length === 0 ? Number.NaN : s.length % 2 === 1 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}
