/**
 * Giving the event loop its turns: long synchronous work (a batch's bookkeeping, thousands of choices of one
 * response) is cut into slices with a macrotask between them, so sockets and timers (a server's `/health`) are
 * served meanwhile.
 *
 * @packageDocumentation
 */

/** Items handled in one turn by {@link mapInTurns}. */
export const ITEMS_PER_TURN = 256;

/**
 * Resolves on a later turn of the event loop (`setImmediate`: after pending I/O is polled), unlike a resolved
 * promise, which runs before any I/O.
 */
export function yieldToEventLoop(): Promise<void> {
  return new Promise((resolve) => setImmediate(resolve));
}

/**
 * `items.map(fn)`, yielding to the event loop after every `perTurn` items.
 *
 * @example
 * ```ts
 * const lines = await mapInTurns(responses, (r, i) => render(r, i)); // 256 per turn
 * ```
 * @param items - What to map.
 * @param fn - Called once per item, in order.
 * @param perTurn - Items between yields. Default {@link ITEMS_PER_TURN}.
 * @returns The mapped items, in order.
 */
export async function mapInTurns<T, R>(items: readonly T[], fn: (item: T, index: number) => R, perTurn = ITEMS_PER_TURN): Promise<R[]> {
  const out: R[] = [];
  for (let i = 0; i < items.length; i++) {
    if (i > 0 && i % perTurn === 0) await yieldToEventLoop();
    out.push(fn(items[i], i));
  }
  return out;
}
