import { Observable, type OperatorFunction } from 'rxjs';
import { ConfigError } from '../lib/core/errors.js';
import type { Group } from '../lib/core/types.js';

/**
 * When a batch is ready. `batch_size` (NexRL's `batch_size_reached` is accepted too): as soon as `batchSize`
 * groups are held. `loaded_batch_finished`: when the source completes, i.e. the loader is exhausted and nothing
 * is in flight — one batch with everything held.
 */
export type BatchReadiness = 'batch_size' | 'batch_size_reached' | 'loaded_batch_finished';

/** Options of {@link batchGroups}. */
export interface BatchGroupsOptions {
  /** Groups (prompts) per batch, as verl's `train_batch_size` counts them. */
  readonly batchSize: number;
  /** Readiness rule. Default `batch_size`. */
  readonly readiness?: BatchReadiness;
  /** With `batch_size`: drop a final partial batch instead of flushing it on completion. Default false. */
  readonly dropLast?: boolean;
  /**
   * Admission batch of a group. When given, batch `n` holds exactly the groups admitted in batch `n` and batches
   * are emitted in order `0, 1, 2, …`, whatever order groups complete in — which is what bounds staleness by η in
   * `batch-async` mode. Without it, batches are filled in completion order (`fully-async`).
   */
  readonly batchOf?: (group: Group) => number;
  /** Most groups held at once (a buffer has a capacity); exceeding it is an error. Default 65536. */
  readonly capacity?: number;
}

/**
 * Packs whole groups into batches. A batch holds `batchSize` groups (empty groups count, so a group whose
 * samples all failed never stalls a batch boundary).
 *
 * ```
 * source:  --A--B--C--D--E--|
 * batchGroups({ batchSize: 2 })
 * output:  -----x-----y-----(z|)      x = [A, B], y = [C, D], z = [E] (flushed on completion)
 * ```
 *
 * @example
 * ```ts
 * import { batchGroups, groupTrajectories } from 'rxrl/operators';
 * trajectories$.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 8 }), batchGroups({ batchSize: 16 }));
 * ```
 * @param options - batch size and readiness rule.
 * @returns an operator from groups to arrays of groups.
 * @see grpoPrepare
 */
export function batchGroups(options: BatchGroupsOptions): OperatorFunction<Group, Group[]> {
  const { batchSize } = options;
  const readiness = options.readiness ?? 'batch_size';
  const dropLast = options.dropLast ?? false;
  if (!Number.isInteger(batchSize) || batchSize < 1) {
    throw new ConfigError(`batchGroups batchSize must be an integer >= 1, got ${batchSize}`);
  }
  const bySize = readiness === 'batch_size' || readiness === 'batch_size_reached';
  if (!bySize && readiness !== 'loaded_batch_finished') {
    throw new ConfigError(`unknown batch readiness '${String(readiness)}'; valid: batch_size, batch_size_reached, loaded_batch_finished`);
  }
  const capacity = options.capacity ?? 65536;
  const { batchOf } = options;
  return (source) =>
    new Observable<Group[]>((subscriber) => {
      let held: Group[] = [];
      // Ordered mode: admission batch → its groups, and the next batch to emit.
      const byBatch = new Map<number, Group[]>();
      let next = 0;
      let count = 0;
      const overflow = (): boolean => {
        if (count <= capacity) return false;
        subscriber.error(new ConfigError(`batchGroups holds ${count} groups, over its capacity ${capacity}`, { context: { capacity } }));
        return true;
      };
      const emitReadyInOrder = (): void => {
        for (let ready = byBatch.get(next); ready !== undefined && ready.length >= batchSize; ready = byBatch.get(next)) {
          byBatch.delete(next);
          next++;
          count -= ready.length;
          subscriber.next(ready);
        }
      };
      return source.subscribe({
        next: (group) => {
          count++;
          if (overflow()) return;
          if (batchOf && bySize) {
            const n = batchOf(group);
            const list = byBatch.get(n) ?? [];
            list.push(group);
            byBatch.set(n, list);
            emitReadyInOrder();
            return;
          }
          held.push(group);
          if (bySize && held.length >= batchSize) {
            const batch = held;
            held = [];
            count -= batch.length;
            subscriber.next(batch);
          }
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          if (batchOf && bySize) {
            const rest = [...byBatch.entries()].sort(([a], [b]) => a - b);
            byBatch.clear();
            if (!dropLast) for (const [, groups] of rest) subscriber.next(groups);
          } else {
            const rest = held;
            held = [];
            if (rest.length > 0 && !(bySize && dropLast)) subscriber.next(rest);
          }
          subscriber.complete();
        },
      });
    });
}
