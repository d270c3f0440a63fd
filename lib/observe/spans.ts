/**
 * Wall time covered by overlapping spans: how long a stage of many concurrent samples kept the process busy.
 *
 * @packageDocumentation
 */
import type { TimeSpan } from '../core/types.js';

/**
 * Seconds covered by at least one of `spans` (millisecond `[start, end]` pairs of one clock): the length of their
 * union, so concurrent samples count once. Empty or reversed spans count for nothing. 0 for no spans.
 *
 * @param spans - `[start, end]` in milliseconds.
 * @returns the union's length in seconds.
 */
export function spanSeconds(spans: readonly TimeSpan[]): number {
  const sorted = spans.filter(([start, end]) => end > start).sort((a, b) => a[0] - b[0]);
  let total = 0;
  let open: number | undefined;
  let close = 0;
  for (const [start, end] of sorted) {
    if (open === undefined || start > close) {
      if (open !== undefined) total += close - open;
      open = start;
      close = end;
    } else {
      close = Math.max(close, end);
    }
  }
  if (open !== undefined) total += close - open;
  return total / 1000;
}
