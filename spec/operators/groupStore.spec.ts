/** The state behind groupTrajectories, without Rx or a scheduler. */
import { describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import type { Group } from '../../lib/core/types.js';
import { CLOSED_MEMORY, GroupStore, type Added } from '../../operators/internal/groupStore.js';
import { failure, traj } from '../helpers/fixtures.js';

const out = (added: Added): Group | undefined => (added.late === true ? undefined : added.released?.out);

describe('GroupStore', () => {
  it('releases a group once it has groupSize members, ordered by runId; opens it with its first member', () => {
    const store = new GroupStore(['groupId'], 3, 8);
    const first = store.add(traj('a@0', 2));
    expect(first.late !== true && first.opened?.key).toEqual(['a@0']);
    expect(out(first)).toBeUndefined();
    expect(out(store.add(traj('a@0', 0)))).toBeUndefined();
    expect(store.size).toBe(1);
    const last = store.add(traj('a@0', 1));
    expect(last.late !== true && last.opened).toBeUndefined();
    expect(out(last)?.trajectories.map((t) => t.runId)).toEqual([0, 1, 2]);
    expect(store.size).toBe(0);
  });

  it('drops a trajectory id seen twice in a group, and recognizes outputs of a released group as late', () => {
    const store = new GroupStore(['groupId'], 2, 8);
    store.add(traj('a@0', 0));
    expect(out(store.add(traj('a@0', 0)))).toBeUndefined();
    expect(out(store.add(traj('a@0', 1)))?.trajectories).toHaveLength(2);
    expect(store.add(traj('a@0', 0))).toEqual({ late: true });
    expect(store.size).toBe(0);
  });

  it('counts a failed sample against the group size; a group of failures only is released empty', () => {
    const store = new GroupStore(['groupId'], 2, 8);
    store.add(failure('a@0', 0));
    expect(out(store.add(traj('a@0', 1)))).toEqual({ key: ['a@0'], modelTag: 'policy', trajectories: [traj('a@0', 1)], failed: 1 });
    store.add(failure('b@0', 0));
    expect(out(store.add(failure('b@0', 1)))).toEqual({ key: ['b@0'], modelTag: 'policy', trajectories: [], failed: 2 });
  });

  it('keeps groups of different model tags apart', () => {
    const store = new GroupStore(['groupId'], 2, 8);
    store.add(traj('a@0', 0, { modelTag: 'writer' }));
    store.add(traj('a@0', 1, { modelTag: 'editor' }));
    expect(store.size).toBe(2);
    expect(out(store.add(traj('a@0', 1, { modelTag: 'writer' })))?.modelTag).toBe('writer');
  });

  it('refuses to open a group past its capacity with a ConfigError, and opens none', () => {
    const store = new GroupStore(['groupId'], 2, 1);
    store.add(traj('a@0', 0));
    expect(() => store.add(traj('b@0', 0))).toThrow(ConfigError);
    expect(store.size).toBe(1);
  });

  it('expires an open group as it is or emptied, once; a group released meanwhile is left alone', () => {
    const store = new GroupStore(['groupId'], 3, 8);
    const a = store.add(traj('a@0', 0));
    const b = store.add(traj('b@0', 1));
    if (a.late === true || b.late === true || a.opened === undefined || b.opened === undefined) throw new Error('not opened');
    expect(store.expire(a.opened, false)).toEqual({
      key: ['a@0'],
      modelTag: 'policy',
      trajectories: [traj('a@0', 0)],
      closedBy: 'timeout',
    });
    expect(store.expire(a.opened, false)).toBeUndefined();
    expect(store.expire(b.opened, true)).toEqual({ key: ['b@0'], modelTag: 'policy', trajectories: [], closedBy: 'timeout', dropped: 1 });
    expect(store.add(traj('b@0', 2))).toEqual({ late: true });
    const c = store.add(traj('c@0', 0));
    store.add(traj('c@0', 1));
    store.add(traj('c@0', 2));
    if (c.late === true || c.opened === undefined) throw new Error('not opened');
    expect(store.expire(c.opened, false)).toBeUndefined();
  });

  it('drains the open groups when the source completes: released as they are, or dropped', () => {
    const released = new GroupStore(['groupId'], 2, 8);
    released.add(traj('a@0', 0));
    released.add(traj('b@0', 1));
    expect(released.drain(true).map((d) => d.out)).toEqual([
      { key: ['a@0'], modelTag: 'policy', trajectories: [traj('a@0', 0)], closedBy: 'source-complete' },
      { key: ['b@0'], modelTag: 'policy', trajectories: [traj('b@0', 1)], closedBy: 'source-complete' },
    ]);
    expect(released.size).toBe(0);
    const dropped = new GroupStore(['groupId'], 2, 8);
    dropped.add(traj('a@0', 0));
    expect(dropped.drain(false).map((d) => d.out)).toEqual([undefined]);
  });

  it('passes each trajectory through as its own group without keys, and nothing for a failure', () => {
    const store = new GroupStore([], 4, 1);
    expect(out(store.add(traj('a@0', 0)))).toEqual({ key: ['a@0/0'], modelTag: 'policy', trajectories: [traj('a@0', 0)] });
    expect(out(store.add(traj('a@0', 1)))?.key).toEqual(['a@0/1']);
    expect(store.add(failure('a@0', 2))).toEqual({});
    expect(store.size).toBe(0);
  });

  it('remembers the newest CLOSED_MEMORY released groups only', () => {
    const store = new GroupStore(['groupId'], 1, 8);
    for (let i = 0; i <= CLOSED_MEMORY; i++) store.add(traj(`g${i}@0`, 0));
    expect(store.add(traj(`g${CLOSED_MEMORY}@0`, 1))).toEqual({ late: true });
    expect(store.add(traj('g0@0', 1)).late).not.toBe(true); // forgotten: it opens a new group
  });
});
