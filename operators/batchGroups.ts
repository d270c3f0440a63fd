import { Observable, type OperatorFunction } from 'rxjs';
import { ConfigError } from '../lib/errors.js';
import type { Group } from '../lib/types.js';

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
    throw new ConfigError(
      `unknown batch readiness '${String(readiness)}'; valid: batch_size, batch_size_reached, loaded_batch_finished`,
    );
  }
  return (source) =>
    new Observable<Group[]>((subscriber) => {
      let held: Group[] = [];
      return source.subscribe({
        next: (group) => {
          held.push(group);
          if (bySize && held.length >= batchSize) {
            const batch = held;
            held = [];
            subscriber.next(batch);
          }
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          const rest = held;
          held = [];
          if (rest.length > 0 && !(bySize && dropLast)) subscriber.next(rest);
          subscriber.complete();
        },
      });
    });
}
