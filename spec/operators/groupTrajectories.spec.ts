import { Observable, Subject, from, take, throwError, concat } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { beforeEach, describe, expect, it } from 'vitest';
import { groupTrajectories } from '../../operators/groupTrajectories.js';
import { ConfigError } from '../../lib/core/errors.js';
import type { Group, RolloutOutput } from '../../lib/core/types.js';
import { failure, traj } from '../helpers/fixtures.js';

const src = (...items: RolloutOutput[]): Observable<RolloutOutput> => from(items);
const ids = (g: Group): string[] => g.trajectories.map((t) => t.id);

describe('groupTrajectories', () => {
  let scheduler: TestScheduler;
  beforeEach(() => {
    scheduler = new TestScheduler((actual, expected) => expect(actual).toEqual(expected));
  });

  const a0 = traj('a@0', 0);
  const a1 = traj('a@0', 1);
  const b0 = traj('b@0', 0);
  const b1 = traj('b@0', 1);
  const A: Group = { key: ['a@0'], modelTag: 'policy', trajectories: [a0, a1] };
  const B: Group = { key: ['b@0'], modelTag: 'policy', trajectories: [b0, b1] };

  it('releases each group when complete, ordered by runId', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold<RolloutOutput>('-x-y-z-w-|', { x: a1, y: b0, z: a0, w: b1 });
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 }))).toBe('-----A-B-|', { A, B });
    });
  });

  it('flushes incomplete groups on completion, or drops them', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold<RolloutOutput>('-x-y-|', { x: a0, y: b0 });
      const partA: Group = { key: ['a@0'], modelTag: 'policy', trajectories: [a0], closedBy: 'source-complete' };
      const partB: Group = { key: ['b@0'], modelTag: 'policy', trajectories: [b0], closedBy: 'source-complete' };
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 }))).toBe('-----(pq|)', {
        p: partA,
        q: partB,
      });
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, onIncomplete: 'drop' }))).toBe('-----|');
    });
  });

  it('passes errors through', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold<RolloutOutput>('-x-#', { x: a0 }, new Error('upstream'));
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 }))).toBe('---#', undefined, new Error('upstream'));
    });
  });

  it('stops at unsubscribe', () => {
    scheduler.run(({ cold, expectObservable, expectSubscriptions }) => {
      const source = cold<RolloutOutput>('-x-y-z-w-|', { x: a0, y: a1, z: b0, w: b1 });
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 })), '-----!').toBe('---A-', {
        A,
      });
      expectSubscriptions(source.subscriptions).toBe('^----!');
    });
  });

  it('works with a synchronous source and take', () => {
    const out: Group[] = [];
    src(a0, a1, b0, b1)
      .pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 }), take(1))
      .subscribe((g) => out.push(g));
    expect(out.map(ids)).toEqual([['a@0/0', 'a@0/1']]);
  });

  it('shrinks a group by its failed samples, and releases an all-failed group empty', () => {
    const out: Group[] = [];
    src(a0, failure('a@0', 1), failure('b@0', 0), failure('b@0', 1))
      .pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, onIncomplete: 'drop' }))
      .subscribe((g) => out.push(g));
    expect(out.map((g) => [g.key[0], ids(g)])).toEqual([
      ['a@0', ['a@0/0']],
      ['b@0', []],
    ]);
  });

  it('drops a redelivered trajectory id', () => {
    const out: Group[] = [];
    src(a0, a0, a1)
      .pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 }))
      .subscribe((g) => out.push(g));
    expect(out.map(ids)).toEqual([['a@0/0', 'a@0/1']]);
  });

  it('passes through with no key, and releases leaf groups with several keys', () => {
    const single: Group[] = [];
    src(a0, failure('a@0', 1), b0)
      .pipe(groupTrajectories({ groupSize: 5 }))
      .subscribe((g) => single.push(g));
    expect(single.map((g) => [g.key, ids(g)])).toEqual([
      [['a@0/0'], ['a@0/0']],
      [['b@0/0'], ['b@0/0']],
    ]);

    const even = (t: { runId: number }): string => (t.runId % 2 === 0 ? 'even' : 'odd');
    const leaves: Group[] = [];
    const a2 = traj('a@0', 2);
    const a3 = traj('a@0', 3);
    src(a0, a1, a2, a3)
      .pipe(groupTrajectories({ keys: ['taskId', even], groupSize: 2 }))
      .subscribe((g) => leaves.push(g));
    expect(leaves.map((g) => [g.key, ids(g)])).toEqual([
      [
        ['a', 'even'],
        ['a@0/0', 'a@0/2'],
      ],
      [
        ['a', 'odd'],
        ['a@0/1', 'a@0/3'],
      ],
    ]);
  });

  it('keeps stores per modelTag', () => {
    const out: Group[] = [];
    const other = traj('a@0', 1, { modelTag: 'other' });
    src(a0, other, a1)
      .pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, onIncomplete: 'release' }))
      .subscribe((g) => out.push(g));
    expect(out.map((g) => [g.modelTag, ids(g)])).toEqual([
      ['policy', ['a@0/0', 'a@0/1']],
      ['other', ['a@0/1']],
    ]);
  });

  it('is re-entrant: a group emitted while releasing another reaches the subscriber in order', () => {
    const input = new Subject<RolloutOutput>();
    const seen: string[] = [];
    input.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2 })).subscribe((g) => {
      seen.push(g.key[0]);
      if (g.key[0] === 'a@0') {
        input.next(b0);
        input.next(b1);
      }
    });
    input.next(a0);
    input.next(a1);
    expect(seen).toEqual(['a@0', 'b@0']);
  });

  it('closes a group on timeout: releases it partial, or drops it (emitted empty), and drops late arrivals', () => {
    scheduler.run(({ cold, expectObservable, time }) => {
      const t = time('----------|');
      const source = cold<RolloutOutput>('-x---y--------------z-|', { x: a0, y: b0, z: a1 });
      const late: string[] = [];
      const partA: Group = { key: ['a@0'], modelTag: 'policy', trajectories: [a0], closedBy: 'timeout' };
      const partB: Group = { key: ['b@0'], modelTag: 'policy', trajectories: [b0], closedBy: 'timeout' };
      expectObservable(
        source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, timeoutMs: t, scheduler, onLate: (i) => late.push(i.id) })),
      ).toBe('-----------p---q------|', { p: partA, q: partB });
      const dropA: Group = { key: ['a@0'], modelTag: 'policy', trajectories: [], closedBy: 'timeout', dropped: 1 };
      const dropB: Group = { key: ['b@0'], modelTag: 'policy', trajectories: [], closedBy: 'timeout', dropped: 1 };
      expectObservable(
        source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, timeoutMs: t, onTimeout: 'drop', scheduler })),
      ).toBe('-----------p---q------|', { p: dropA, q: dropB });
      scheduler.flush();
      expect(late).toEqual(['a@0/1']);
    });
  });

  it('a complete group cancels its timeout; unsubscribing cancels every pending one', () => {
    scheduler.run(({ cold, expectObservable, time }) => {
      const t = time('-----|');
      const source = cold<RolloutOutput>('-xy-------|', { x: a0, y: a1 });
      expectObservable(source.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, timeoutMs: t, scheduler }))).toBe('--A-------|', {
        A,
      });
      const open = cold<RolloutOutput>('-x-------|', { x: a0 });
      expectObservable(open.pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, timeoutMs: t, scheduler })), '---!').toBe('----');
    });
  });

  it('errors when more groups are open than its capacity, and rejects bad options', () => {
    let error: unknown;
    concat(
      src(a0, b0),
      throwError(() => new Error('unreached')),
    )
      .pipe(groupTrajectories({ keys: ['groupId'], groupSize: 2, capacity: 1 }))
      .subscribe({ error: (e: unknown) => (error = e) });
    expect(error).toBeInstanceOf(ConfigError);
    expect(() => groupTrajectories({ groupSize: 0 })).toThrow(ConfigError);
  });
});
