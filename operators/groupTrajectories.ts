import { Observable, asyncScheduler, type OperatorFunction, type SchedulerLike, type Subscription } from 'rxjs';
import { ConfigError } from '../lib/errors.js';
import { isSampleFailure, type Group, type RolloutOutput, type Trajectory } from '../lib/types.js';

/** Fields of a rollout output that a group key may read. */
export type KeyFields = Pick<Trajectory, 'id' | 'taskId' | 'groupId' | 'runId' | 'modelTag'>;

/** One level of a group key: a field name, or a function of the key fields. */
export type GroupKey = 'taskId' | 'groupId' | ((item: KeyFields) => string);

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
  readonly onTimeout?: IncompletePolicy;
  /** Called for each output that arrives after its group was closed; it is dropped. */
  readonly onLate?: (item: RolloutOutput) => void;
  /** Scheduler of the timeouts (tests pass the `TestScheduler`). Default `asyncScheduler`. */
  readonly scheduler?: SchedulerLike;
}

/** How many ids of closed groups are remembered to recognize late arrivals. */
const CLOSED_MEMORY = 65536;

interface OpenGroup {
  readonly key: readonly string[];
  readonly modelTag: string;
  readonly members: Trajectory[];
  readonly seen: Set<string>;
  failed: number;
  timer?: Subscription;
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
  const keys = options.keys ?? [];
  const { groupSize } = options;
  const capacity = options.capacity ?? 4096;
  const onIncomplete = options.onIncomplete ?? 'release';
  const onTimeout = options.onTimeout ?? 'release';
  const scheduler = options.scheduler ?? asyncScheduler;
  const { timeoutMs } = options;
  if (timeoutMs !== undefined && !(timeoutMs >= 0)) {
    throw new ConfigError(`groupTrajectories timeoutMs must be >= 0, got ${timeoutMs}`);
  }
  if (!Number.isInteger(groupSize) || groupSize < 1) {
    throw new ConfigError(`groupTrajectories groupSize must be an integer >= 1, got ${groupSize}`);
  }
  if (!(capacity >= 1)) {
    throw new ConfigError(`groupTrajectories capacity must be >= 1, got ${capacity}`);
  }
  return (source) =>
    new Observable<Group>((subscriber) => {
      // modelTag → joined key → open group
      const stores = new Map<string, Map<string, OpenGroup>>();
      let open = 0;
      // Ids of groups already released, oldest first, so that late arrivals are recognized and dropped.
      const closed = new Set<string>();

      const release = (
        store: Map<string, OpenGroup>,
        id: string,
        group: OpenGroup,
        closedBy?: 'timeout' | 'source-complete',
        drop = false,
      ): void => {
        store.delete(id);
        open--;
        group.timer?.unsubscribe();
        closed.add(`${group.modelTag}\u0000${id}`);
        if (closed.size > CLOSED_MEMORY) closed.delete(closed.values().next().value as string);
        const trajectories = drop ? [] : [...group.members].sort((a, b) => a.runId - b.runId);
        subscriber.next({
          key: group.key,
          modelTag: group.modelTag,
          trajectories,
          ...(closedBy ? { closedBy } : {}),
          ...(drop ? { dropped: group.members.length } : {}),
          ...(group.failed > 0 ? { failed: group.failed } : {}),
        });
      };

      const upstream = source.subscribe({
        next: (item) => {
          if (keys.length === 0) {
            if (!isSampleFailure(item)) subscriber.next({ key: [item.id], modelTag: item.modelTag, trajectories: [item] });
            return;
          }
          const key = keys.map((k) => (typeof k === 'function' ? k(item) : item[k]));
          const id = JSON.stringify(key);
          let store = stores.get(item.modelTag);
          if (store === undefined) {
            store = new Map();
            stores.set(item.modelTag, store);
          }
          let group = store.get(id);
          if (group === undefined && closed.has(`${item.modelTag}\u0000${id}`)) {
            options.onLate?.(item);
            return;
          }
          if (group === undefined) {
            if (open >= capacity) {
              subscriber.error(
                new ConfigError(`groupTrajectories holds ${open} open groups, its capacity; raise 'capacity'`, {
                  context: { capacity },
                }),
              );
              return;
            }
            const opened: OpenGroup = { key, modelTag: item.modelTag, members: [], seen: new Set(), failed: 0 };
            group = opened;
            store.set(id, opened);
            open++;
            if (timeoutMs !== undefined) {
              const owner = store;
              opened.timer = scheduler.schedule(() => {
                if (owner.get(id) === opened) release(owner, id, opened, 'timeout', onTimeout === 'drop');
              }, timeoutMs);
            }
          }
          if (group.seen.has(item.id)) return;
          group.seen.add(item.id);
          if (isSampleFailure(item)) group.failed++;
          else group.members.push(item);
          if (group.members.length + group.failed >= groupSize) release(store, id, group);
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          for (const store of stores.values()) {
            for (const [id, group] of [...store]) {
              group.timer?.unsubscribe();
              if (onIncomplete === 'release') release(store, id, group, 'source-complete');
            }
          }
          stores.clear();
          subscriber.complete();
        },
      });
      return () => {
        upstream.unsubscribe();
        for (const store of stores.values()) for (const group of store.values()) group.timer?.unsubscribe();
        stores.clear();
      };
    });
}
