/**
 * Offset bookkeeping for at-least-once consumption: which delivered offsets are done, and how far each
 * partition may be committed.
 *
 * Work finishes out of order (a task's trajectories may be acknowledged before an earlier task's), but a Kafka
 * commit says "everything before this offset is done". So each partition keeps its outstanding offsets in order
 * and commits up to the first one still outstanding. A message delivered again while its first copy is still
 * outstanding (the consumer re-read it after a rebalance) shares that offset's slot: the offset is done only when
 * every copy is acknowledged. A copy of an offset that is already done is acknowledged for free.
 *
 * @packageDocumentation
 */

/** One offset to commit: the next offset to read, as Kafka expects (last done + 1). */
export interface CommitOffset {
  readonly topic: string;
  readonly partition: number;
  /** Decimal string. */
  readonly offset: string;
}

interface Slot {
  readonly offset: bigint;
  refs: number;
}

class PartitionState {
  /** Outstanding (or done but not yet popped) offsets, ascending, from `head`. */
  private slots: Slot[] = [];
  private head = 0;
  private maxSeen: bigint | undefined;
  /** First offset delivered: committing it would say nothing. */
  private first: bigint | undefined;
  committed: bigint | undefined;

  constructor(
    readonly topic: string,
    readonly partition: number,
  ) {}

  deliver(offset: bigint): Slot | undefined {
    if (this.maxSeen === undefined || offset > this.maxSeen) {
      const slot = { offset, refs: 1 };
      this.slots.push(slot);
      this.maxSeen = offset;
      this.first ??= offset;
      return slot;
    }
    const slot = this.find(offset);
    if (slot === undefined || slot.refs === 0) return undefined; // already done
    slot.refs++;
    return slot;
  }

  /** Number of offsets delivered and not yet done. */
  outstanding(): number {
    let n = 0;
    for (let i = this.head; i < this.slots.length; i++) if (this.slots[i].refs > 0) n++;
    return n;
  }

  /** The offset to commit now, if it is past the last commit. */
  committable(): bigint | undefined {
    while (this.head < this.slots.length && this.slots[this.head].refs === 0) this.head++;
    if (this.head > 1024 && this.head * 2 > this.slots.length) {
      this.slots = this.slots.slice(this.head);
      this.head = 0;
    }
    if (this.maxSeen === undefined || this.first === undefined) return undefined;
    const next = this.head < this.slots.length ? this.slots[this.head].offset : this.maxSeen + 1n;
    return next > (this.committed ?? this.first) ? next : undefined;
  }

  private find(offset: bigint): Slot | undefined {
    let lo = this.head;
    let hi = this.slots.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const at = this.slots[mid].offset;
      if (at === offset) return this.slots[mid];
      if (at < offset) lo = mid + 1;
      else hi = mid - 1;
    }
    return undefined;
  }
}

/**
 * Tracks delivered offsets per topic-partition and computes what may be committed.
 *
 * @example
 * ```ts
 * const tracker = new OffsetTracker();
 * const ack5 = tracker.deliver('t', 0, '5');
 * const ack6 = tracker.deliver('t', 0, '6');
 * ack6();
 * tracker.committable(); // [] — offset 5 is still outstanding
 * ack5();
 * tracker.committable(); // [{ topic: 't', partition: 0, offset: '7' }]
 * ```
 */
export class OffsetTracker {
  private readonly partitions = new Map<string, PartitionState>();

  /**
   * Records the delivery of `offset` and returns its acknowledgement (idempotent). Acknowledging after the
   * partition was dropped by {@link retain} does nothing.
   */
  deliver(topic: string, partition: number, offset: string): () => void {
    const key = partitionKey(topic, partition);
    let state = this.partitions.get(key);
    if (state === undefined) {
      state = new PartitionState(topic, partition);
      this.partitions.set(key, state);
    }
    const slot = state.deliver(BigInt(offset));
    let acked = false;
    return () => {
      if (acked || slot === undefined) return;
      acked = true;
      slot.refs--;
    };
  }

  /**
   * Forgets every partition that is not in `assignment` (topic → partitions), after a rebalance took them away:
   * their late acknowledgements must not commit over the new owner's progress.
   */
  retain(assignment: Readonly<Record<string, readonly number[]>>): void {
    for (const [key, state] of this.partitions) {
      if (!(assignment[state.topic] ?? []).includes(state.partition)) this.partitions.delete(key);
    }
  }

  /** Offsets that may be committed now (one per partition that moved since its last commit). */
  committable(): CommitOffset[] {
    const out: CommitOffset[] = [];
    for (const state of this.partitions.values()) {
      const next = state.committable();
      if (next !== undefined) out.push({ topic: state.topic, partition: state.partition, offset: next.toString() });
    }
    return out;
  }

  /** Records that `offsets` were committed. */
  markCommitted(offsets: readonly CommitOffset[]): void {
    for (const { topic, partition, offset } of offsets) {
      const state = this.partitions.get(partitionKey(topic, partition));
      if (state === undefined) continue;
      const value = BigInt(offset);
      if (state.committed === undefined || value > state.committed) state.committed = value;
    }
  }

  /** Offsets delivered and not yet done, over all partitions. */
  outstanding(): number {
    let n = 0;
    for (const state of this.partitions.values()) n += state.outstanding();
    return n;
  }
}

function partitionKey(topic: string, partition: number): string {
  return `${topic}\u0000${partition}`;
}
