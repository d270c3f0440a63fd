/**
 * A first-in first-out queue taken from the front in runs, for the operators that hold items until they can send
 * them (`toKafka`). Taking from a long array by slicing it each time would be quadratic; the queue keeps a head
 * index instead and compacts when the taken prefix outweighs the rest.
 *
 * @internal
 * @packageDocumentation
 */

/** Taken items kept before the array is compacted, at least. */
const COMPACT_AFTER = 4096;

/** See the module comment. */
export class Fifo<T> {
  private items: T[] = [];
  private head = 0;

  /** Items queued. */
  get length(): number {
    return this.items.length - this.head;
  }

  push(item: T): void {
    this.items.push(item);
  }

  /** Removes and returns up to `n` items from the front, oldest first. */
  take(n: number): T[] {
    const end = Math.min(this.items.length, this.head + n);
    const out = this.items.slice(this.head, end);
    this.head = end;
    if (this.head === this.items.length) this.clear();
    else if (this.head > COMPACT_AFTER && this.head * 2 > this.items.length) {
      this.items = this.items.slice(this.head);
      this.head = 0;
    }
    return out;
  }

  clear(): void {
    this.items = [];
    this.head = 0;
  }
}
