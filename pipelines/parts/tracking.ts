/**
 * How a policy loop reports its work to the run's {@link ActivityTracker}: each pull of the loader, each sample
 * from its task's admission until its output, the groups the store and the batcher hold.
 *
 * @packageDocumentation
 */
import type { Activity, ActivityTracker } from '../../lib/observe/activity.js';
import { isSampleFailure, type Group, type RolloutOutput, type Task } from '../../lib/core/types.js';
import { groupIdOf } from '../../operators/rollout.js';

/**
 * `source` with each `next()` one unit of work of module `loader` (a read that hangs shows as the loader stalled).
 *
 * @param source - the loop's tasks.
 * @param tracker - the run's tracker.
 */
export async function* trackedTasks<T>(source: AsyncIterable<T>, tracker: ActivityTracker): AsyncGenerator<T> {
  const iterator = source[Symbol.asyncIterator]();
  try {
    for (;;) {
      const read = tracker.begin('loader');
      let next: IteratorResult<T>;
      try {
        next = await iterator.next();
      } catch (error) {
        read.fail(error);
        throw error;
      }
      read.done();
      if (next.done === true) return;
      yield next.value;
    }
  } finally {
    await iterator.return?.();
  }
}

/**
 * The samples of a loop's rollout stage as units of work of module `rollout`, whatever transport rolls them out: each
 * admitted task opens `groupSize` samples per slot; each output ends one of its group (a failure fails it); the
 * store's release of a group ends what is left of it (a timed-out group's missing samples, as failed). The store's
 * groups awaiting their samples are held by module `store`.
 */
export class SampleTracking {
  /** Open samples by group id. */
  private readonly open = new Map<string, Activity[]>();

  constructor(
    private readonly tracker: ActivityTracker,
    private readonly suffixes: readonly string[],
    private readonly groupSize: number,
  ) {}

  /** A task entered the rollout stage. */
  readonly admitted = (task: Task): void => {
    for (const suffix of this.suffixes) {
      this.open.set(
        groupIdOf(task) + suffix,
        Array.from({ length: this.groupSize }, () => this.tracker.begin('rollout')),
      );
    }
    this.tracker.hold('store', this.open.size);
  };

  /** A sample ended. */
  readonly ended = (output: RolloutOutput): void => {
    const sample = this.open.get(output.groupId)?.shift();
    if (sample === undefined) return;
    if (isSampleFailure(output) && output.skipped !== true) sample.fail(output.error);
    else sample.done();
  };

  /** The store released a group (complete, timed out or dropped). */
  readonly released = (group: Group): void => {
    const id = group.key[0];
    if (id === undefined) return;
    for (const sample of this.open.get(id) ?? [])
      sample.fail(new Error(`group ${id} was closed (${group.closedBy ?? 'complete'}) before this sample ended`));
    this.open.delete(id);
    this.tracker.begin('store').done();
    this.tracker.hold('store', this.open.size);
  };
}

/**
 * The batcher of one policy as module `name`: the groups it holds until their batch is full, and one unit of work per
 * batch it sends on.
 */
export function batcherTracking(tracker: ActivityTracker, name: string): { received(): void; sent(groups: number): void } {
  let held = 0;
  return {
    received: () => tracker.hold(name, ++held),
    sent: (groups) => {
      held = Math.max(0, held - groups);
      tracker.hold(name, held);
      tracker.begin(name).done();
    },
  };
}
