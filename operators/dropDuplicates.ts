import { Observable, type OperatorFunction } from 'rxjs';
import { ConfigError } from '../lib/core/errors.js';

/** Options of {@link dropDuplicates}. */
export interface DropDuplicatesOptions<T> {
  /** How many distinct keys are remembered (the oldest are forgotten first). Default 1 048 576. */
  readonly capacity?: number;
  /** Called with every dropped item (for example to acknowledge a redelivered Kafka record). */
  readonly onDuplicate?: (item: T, key: string) => void;
}

/**
 * Drops every item whose key was already seen, keeping the first. At-least-once delivery (a Kafka redelivery
 * after a crash or a rebalance) becomes exactly-once processing by id. Memory is bounded: the last `capacity`
 * distinct keys are remembered, so a duplicate arriving after `capacity` newer keys passes through.
 *
 * ```
 * source:  -a-b-a-c-b-|
 * dropDuplicates((x) => x)
 * output:  -a-b---c---|
 * ```
 *
 * @example
 * ```ts
 * import { dropDuplicates, fromKafka } from 'rxrl/operators';
 * fromKafka(kafka, { groupId, topics, decode: decodeTrajectoryMessage }).pipe(
 *   dropDuplicates((record) => record.value.output.id, { onDuplicate: (record) => record.ack() }),
 * );
 * ```
 * @param keyOf - the identity of an item (a trajectory id).
 * @param options - memory bound and a hook for dropped items.
 * @returns an operator that passes on the first item of each key.
 */
export function dropDuplicates<T>(keyOf: (item: T) => string, options: DropDuplicatesOptions<T> = {}): OperatorFunction<T, T> {
  const capacity = options.capacity ?? 1 << 20;
  if (!Number.isInteger(capacity) || capacity < 1) {
    throw new ConfigError(`dropDuplicates capacity must be an integer >= 1, got ${capacity}`);
  }
  return (source) =>
    new Observable<T>((subscriber) => {
      // Insertion-ordered: the first entry is the oldest key.
      const seen = new Set<string>();
      return source.subscribe({
        next: (item) => {
          let key: string;
          try {
            key = keyOf(item);
          } catch (error) {
            subscriber.error(error);
            return;
          }
          if (seen.has(key)) {
            options.onDuplicate?.(item, key);
            return;
          }
          seen.add(key);
          if (seen.size > capacity) seen.delete(seen.values().next().value as string);
          subscriber.next(item);
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => subscriber.complete(),
      });
    });
}
