/**
 * The state behind `toKafka`: items wait in a queue, are encoded into requests of at most `maxBatchSize`, and are
 * sent one request at a time; the next request is encoded while the previous one is in flight. Plain state over
 * injected encode, send and defer functions, so it runs without a broker and without real time.
 *
 * @internal
 * @packageDocumentation
 */

import { Fifo } from './fifo.js';

/** Options of {@link BatchSender}. */
export interface BatchSenderOptions<T, P> {
  /** Encodes an item; a throw fails the sender. */
  readonly encode: (item: T) => P;
  /** Sends one request; a rejection fails the sender with the rejection's error. */
  readonly send: (batch: readonly P[]) => Promise<void>;
  /** Most items per request. */
  readonly maxBatchSize: number;
  /** Most items waiting (queued or encoded, not yet sent). */
  readonly capacity: number;
  /** Receives each request once it was sent, in order. */
  readonly sent: (batch: readonly P[]) => void;
  /** Receives the first failure; the sender is closed by then. */
  readonly error: (error: unknown) => void;
  /** Called once the input ended and everything was sent. */
  readonly complete: () => void;
  /** Runs a callback soon, after the current I/O callbacks. Default `setImmediate`. */
  readonly defer?: (callback: () => void) => void;
}

/**
 * Sends items in requests, one request at a time, gathering the items that arrive meanwhile into the next.
 *
 * @example
 * ```ts
 * const sender = new BatchSender({ encode, send, maxBatchSize: 500, capacity: 100_000, sent, error, complete });
 * sender.push(a); // sent at once, alone
 * sender.push(b); // waits for a's request, then goes with whatever else arrived
 * sender.end();   // complete() once b's request is done
 * ```
 */
export class BatchSender<T, P> {
  private readonly queue = new Fifo<T>();
  /** The next request, encoded while the previous one is in flight. */
  private prepared: P[] | undefined;
  private sending = false;
  private ended = false;
  private closed = false;
  private readonly defer: (callback: () => void) => void;

  constructor(private readonly options: BatchSenderOptions<T, P>) {
    this.defer = options.defer ?? ((callback) => void setImmediate(callback));
  }

  /** Items waiting: queued, or encoded into the next request. */
  get waiting(): number {
    return this.queue.length + (this.prepared?.length ?? 0);
  }

  /** Queues an item and sends it when no request is in flight; false (nothing queued) at the capacity. */
  push(item: T): boolean {
    if (this.waiting >= this.options.capacity) return false;
    this.queue.push(item);
    this.pump();
    return true;
  }

  /** The input ended: completes once everything queued was sent. */
  end(): void {
    this.ended = true;
    this.pump();
  }

  /** Drops what waits; a request in flight is neither reported as sent nor as failed. */
  close(): void {
    this.closed = true;
    this.queue.clear();
    this.prepared = undefined;
  }

  private pump(): void {
    if (this.sending || this.closed) return;
    const batch = this.prepared ?? this.prepare();
    this.prepared = undefined;
    if (this.closed) return;
    if (batch === undefined) {
      if (this.ended) this.options.complete();
      return;
    }
    this.sending = true;
    this.options.send(batch).then(
      () => {
        this.sending = false;
        if (this.closed) return;
        this.options.sent(batch);
        this.pump();
      },
      (error: unknown) => {
        this.sending = false;
        this.fail(error);
      },
    );
    // Encode the next request once this one is on its way, while the broker works on it.
    this.defer(() => {
      if (!this.closed && this.sending && this.prepared === undefined) this.prepared = this.prepare();
    });
  }

  /** Encodes the next request's items; fails the sender (and returns undefined) if one cannot be encoded. */
  private prepare(): P[] | undefined {
    if (this.queue.length === 0) return undefined;
    try {
      return this.queue.take(this.options.maxBatchSize).map((item) => this.options.encode(item));
    } catch (error) {
      this.fail(error);
      return undefined;
    }
  }

  private fail(error: unknown): void {
    if (this.closed) return;
    this.close();
    this.options.error(error);
  }
}
