/**
 * The state behind `groupTrajectories`: open GRPO groups per `modelTag` and key, the ids of groups already
 * released (so that late arrivals are recognized), and the rules that complete a group. A plain class, without a
 * scheduler: the operator owns the timers and asks the store to expire a group when one fires.
 *
 * @internal
 * @packageDocumentation
 */
import { ConfigError } from '../../lib/core/errors.js';
import { isSampleFailure, type Group, type RolloutOutput, type Trajectory } from '../../lib/core/types.js';

/** Fields of a rollout output that a group key may read. */
export type KeyFields = Pick<Trajectory, 'id' | 'taskId' | 'groupId' | 'runId' | 'modelTag'>;

/** One level of a group key: a field name, or a function of the key fields. */
export type GroupKey = 'taskId' | 'groupId' | ((item: KeyFields) => string);

/** How many ids of closed groups are remembered to recognize late arrivals. */
export const CLOSED_MEMORY = 65536;

/** An open group; the handle the operator keeps for its timer. */
export interface OpenGroup {
  readonly id: string;
  readonly key: readonly string[];
  readonly modelTag: string;
  readonly members: Trajectory[];
  readonly seen: Set<string>;
  failed: number;
}

/** What {@link GroupStore.add} did with an output. */
export type Added =
  /** Its group was released already: the output is dropped. */
  | { readonly late: true }
  | {
      readonly late?: false;
      /** The group this output opened (the operator starts its timer). */
      readonly opened?: OpenGroup;
      /** What to emit for the group this output completed (`group`: the open group it was, none for a pass-through). */
      readonly released?: { readonly group?: OpenGroup; readonly out: Group };
    };

/** Open groups keyed by model tag and key, at most `capacity` of them. */
export class GroupStore {
  /** modelTag → joined key → open group. */
  private readonly stores = new Map<string, Map<string, OpenGroup>>();
  /** `modelTag \0 key` of released groups, oldest first. */
  private readonly closed = new Set<string>();
  private open = 0;

  /**
   * @param keys - Key levels (none: every trajectory is its own group).
   * @param groupSize - Expected members of a group; a failed sample lowers the expectation by one.
   * @param capacity - Most groups open at once.
   */
  constructor(
    private readonly keys: readonly GroupKey[],
    private readonly groupSize: number,
    private readonly capacity: number,
  ) {}

  /** Groups open now. */
  get size(): number {
    return this.open;
  }

  /**
   * Adds one rollout output to its group.
   *
   * @throws {@link ConfigError} when it would open a group past the capacity.
   */
  add(item: RolloutOutput): Added {
    if (this.keys.length === 0) {
      return isSampleFailure(item) ? {} : { released: { out: { key: [item.id], modelTag: item.modelTag, trajectories: [item] } } };
    }
    const key = this.keys.map((k) => (typeof k === 'function' ? k(item) : item[k]));
    const id = JSON.stringify(key);
    const store = this.storeOf(item.modelTag);
    let group = store.get(id);
    let opened: OpenGroup | undefined;
    if (group === undefined) {
      if (this.closed.has(`${item.modelTag}\u0000${id}`)) return { late: true };
      if (this.open >= this.capacity) {
        throw new ConfigError(`groupTrajectories holds ${this.open} open groups, its capacity; raise 'capacity'`, {
          context: { capacity: this.capacity },
        });
      }
      group = { id, key, modelTag: item.modelTag, members: [], seen: new Set(), failed: 0 };
      opened = group;
      store.set(id, group);
      this.open++;
    }
    if (group.seen.has(item.id)) return { ...(opened ? { opened } : {}) };
    group.seen.add(item.id);
    if (isSampleFailure(item)) group.failed++;
    else group.members.push(item);
    const complete = group.members.length + group.failed >= this.groupSize;
    return { ...(opened ? { opened } : {}), ...(complete ? { released: { group, out: this.release(group) } } : {}) };
  }

  /**
   * Closes `group` when its timeout fires, if it is still open: released as it is, or emptied (`drop`).
   *
   * @returns What to emit, or `undefined` when the group was released meanwhile.
   */
  expire(group: OpenGroup, drop: boolean): Group | undefined {
    if (this.stores.get(group.modelTag)?.get(group.id) !== group) return undefined;
    return this.release(group, 'timeout', drop);
  }

  /**
   * Closes every open group when the source completes: their outputs when `release`, else none (dropped).
   *
   * @returns The groups closed, each with what to emit (`undefined` when dropped).
   */
  drain(release: boolean): { group: OpenGroup; out: Group | undefined }[] {
    const out: { group: OpenGroup; out: Group | undefined }[] = [];
    for (const store of this.stores.values()) {
      for (const group of [...store.values()]) out.push({ group, out: release ? this.release(group, 'source-complete') : undefined });
    }
    this.clear();
    return out;
  }

  /** Every open group, dropped silently (the subscriber went away). */
  clear(): OpenGroup[] {
    const all = [...this.stores.values()].flatMap((store) => [...store.values()]);
    this.stores.clear();
    this.open = 0;
    return all;
  }

  private release(group: OpenGroup, closedBy?: 'timeout' | 'source-complete', drop = false): Group {
    this.stores.get(group.modelTag)?.delete(group.id);
    this.open--;
    this.closed.add(`${group.modelTag}\u0000${group.id}`);
    if (this.closed.size > CLOSED_MEMORY) this.closed.delete(this.closed.values().next().value as string);
    const trajectories = drop ? [] : [...group.members].sort((a, b) => a.runId - b.runId);
    return {
      key: group.key,
      modelTag: group.modelTag,
      trajectories,
      ...(closedBy ? { closedBy } : {}),
      ...(drop ? { dropped: group.members.length } : {}),
      ...(group.failed > 0 ? { failed: group.failed } : {}),
    };
  }

  private storeOf(modelTag: string): Map<string, OpenGroup> {
    let store = this.stores.get(modelTag);
    if (store === undefined) {
      store = new Map();
      this.stores.set(modelTag, store);
    }
    return store;
  }
}
