import { Observable, asyncScheduler, type OperatorFunction, type SchedulerLike, type Subscription } from 'rxjs';
import { ConfigError } from '../lib/core/errors.js';
import type { Group, RolloutOutput } from '../lib/core/types.js';
import { GroupStore, type GroupKey, type OpenGroup } from './internal/groupStore.js';

export type { GroupKey, KeyFields } from './internal/groupStore.js';

/** What happens to groups still incomplete when the source completes. */
export type IncompletePolicy = 'release' | 'drop';

/** Options of {@link groupTrajectories}. */
export interface GroupTrajectoriesOptions {
  /**
   * Key levels. None: pass-through (every trajectory is its own group). One: grouped by it. Several:
   * hierarchical, and the leaf groups (one per full key) are released.
   */
  readonly keys?: readonly GroupKey[];
  /** Expected members of a leaf group; a failed sample lowers its group's expectation by one. */
  readonly groupSize: number;
  /** Most groups held open at once (a buffer has a capacity); exceeding it is an error. Default 4096. */
  readonly capacity?: number;
  /** Incomplete groups when the source completes: `release` them as they are (default) or `drop` them. */
  readonly onIncomplete?: IncompletePolicy;
  /** Close a group this long (ms) after its first member arrived, even if incomplete. Default: no timeout. */
  readonly timeoutMs?: number;
  /**
   * What a timeout does: `release` the partial group (default), or `drop` it — emitted empty with `dropped`
   * set, so batch boundaries downstream never wait for it and nothing vanishes silently.
   */
  readonly onTimeout?: IncompletePolicy | undefined;
  /** Called for each output that arrives after its group was closed; it is dropped. */
  readonly onLate?: (item: RolloutOutput) => void;
  /** Scheduler of the timeouts (tests pass the `TestScheduler`). Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
}

/**
 * The grouped trajectory store: collects rollout outputs into GRPO groups and releases each group when it is
 * complete (`groupSize` members, minus failed samples). Stores are kept per `modelTag`; a trajectory id seen
 * twice in a group (a redelivery) is dropped. A group whose every sample failed is released empty, so batch
 * boundaries downstream never wait for it.
 *
 * ```
 * source:  --a0--b0--a1--b1--|
 * groupTrajectories({ keys: ['groupId'], groupSize: 2 })
 * output:  ----------A-----B-|         (A = group a: [a0, a1])
 *
 * source:  --a0-------------------a1--|
 * groupTrajectories({ keys: ['groupId'], groupSize: 2, timeoutMs: 10 })
 * output:  ------------A'--------------|   (A' = [a0], closedBy 'timeout'; a1 arrives late and is dropped)
 * ```
 *
 * @example
 * ```ts
 * import { groupTrajectories, rollout } from 'rxrl/operators';
 * tasks$.pipe(rollout(engine, opts), groupTrajectories({ keys: ['groupId'], groupSize: 8 }));
 * ```
 * @param options - key levels, group size, capacity and the policy for incomplete groups.
 * @returns an operator from rollout outputs to groups, each group's trajectories ordered by `runId`.
 * @see batchGroups
 */
export function groupTrajectories(options: GroupTrajectoriesOptions): OperatorFunction<RolloutOutput, Group> {
  const { keys, groupSize, capacity, onIncomplete, onTimeout, scheduler, timeoutMs } = resolveOptions(options);
  return (source) =>
    new Observable<Group>((subscriber) => {
      const store = new GroupStore(keys, groupSize, capacity);
      const timers = new Map<OpenGroup, Subscription>();
      const closed = (group: OpenGroup | undefined): void => {
        if (group === undefined) return;
        timers.get(group)?.unsubscribe();
        timers.delete(group);
      };
      const upstream = source.subscribe({
        next: (item) => {
          let added;
          try {
            added = store.add(item);
          } catch (error) {
            subscriber.error(error);
            return;
          }
          if (added.late === true) return void options.onLate?.(item);
          if (added.opened !== undefined && added.released === undefined && timeoutMs !== undefined) {
            const group = added.opened;
            timers.set(
              group,
              scheduler.schedule(() => {
                timers.delete(group);
                const out = store.expire(group, onTimeout === 'drop');
                if (out !== undefined) subscriber.next(out);
              }, timeoutMs),
            );
          }
          if (added.released !== undefined) {
            closed(added.released.group);
            subscriber.next(added.released.out);
          }
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          for (const { group, out } of store.drain(onIncomplete === 'release')) {
            closed(group);
            if (out !== undefined) subscriber.next(out);
          }
          subscriber.complete();
        },
      });
      return () => {
        upstream.unsubscribe();
        for (const timer of timers.values()) timer.unsubscribe();
        timers.clear();
        store.clear();
      };
    });
}

/** The options with their defaults, checked. */
function resolveOptions(options: GroupTrajectoriesOptions) {
  const resolved = {
    keys: options.keys ?? [],
    groupSize: options.groupSize,
    capacity: options.capacity ?? 4096,
    onIncomplete: options.onIncomplete ?? 'release',
    onTimeout: options.onTimeout ?? 'release',
    scheduler: options.scheduler ?? asyncScheduler,
    timeoutMs: options.timeoutMs,
  } as const;
  const { timeoutMs, groupSize, capacity } = resolved;
  if (timeoutMs !== undefined && !(timeoutMs >= 0)) {
    throw new ConfigError(`groupTrajectories timeoutMs must be >= 0, got ${timeoutMs}`);
  }
  if (!Number.isInteger(groupSize) || groupSize < 1) {
    throw new ConfigError(`groupTrajectories groupSize must be an integer >= 1, got ${groupSize}`);
  }
  if (!(capacity >= 1)) {
    throw new ConfigError(`groupTrajectories capacity must be >= 1, got ${capacity}`);
  }
  return resolved;
}
