import { Subject, of, take } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { beforeEach, describe, expect, it } from 'vitest';
import { batchGroups } from '../../operators/batchGroups.js';
import { ConfigError } from '../../lib/core/errors.js';
import type { Group } from '../../lib/core/types.js';

const g = (name: string): Group => ({ key: [name], modelTag: 'policy', trajectories: [] });

describe('batchGroups', () => {
  let scheduler: TestScheduler;
  beforeEach(() => {
    scheduler = new TestScheduler((actual, expected) => expect(actual).toEqual(expected));
  });
  const [A, B, C, D, E] = ['A', 'B', 'C', 'D', 'E'].map(g);

  it('emits whole batches of batchSize groups and flushes the rest on completion', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold('-a-b-c-d-e-|', { a: A, b: B, c: C, d: D, e: E });
      expectObservable(source.pipe(batchGroups({ batchSize: 2 }))).toBe('---x---y---(z|)', {
        x: [A, B],
        y: [C, D],
        z: [E],
      });
      expectObservable(source.pipe(batchGroups({ batchSize: 2, readiness: 'batch_size_reached', dropLast: true }))).toBe('---x---y---|', {
        x: [A, B],
        y: [C, D],
      });
    });
  });

  it('loaded_batch_finished emits everything once the source is done', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold('-a-b-c-|', { a: A, b: B, c: C });
      expectObservable(source.pipe(batchGroups({ batchSize: 2, readiness: 'loaded_batch_finished' }))).toBe('-------(x|)', {
        x: [A, B, C],
      });
    });
  });

  it('passes errors through and stops at unsubscribe', () => {
    scheduler.run(({ cold, expectObservable, expectSubscriptions }) => {
      const failing = cold('-a-#', { a: A }, new Error('x'));
      expectObservable(failing.pipe(batchGroups({ batchSize: 2 }))).toBe('---#', undefined, new Error('x'));
      const source = cold('-a-b-c-d-|', { a: A, b: B, c: C, d: D });
      expectObservable(source.pipe(batchGroups({ batchSize: 2 })), '----!').toBe('---x', { x: [A, B] });
      expectSubscriptions(source.subscriptions).toBe('^---!');
    });
  });

  it('works with a synchronous source and take, and re-entrantly', () => {
    const out: Group[][] = [];
    of(A, B, C, D)
      .pipe(batchGroups({ batchSize: 2 }), take(1))
      .subscribe((b) => out.push(b));
    expect(out).toEqual([[A, B]]);

    const input = new Subject<Group>();
    const seen: string[][] = [];
    input.pipe(batchGroups({ batchSize: 1 })).subscribe((batch) => {
      seen.push(batch.map((x) => x.key[0]));
      if (batch[0] === A) input.next(B);
    });
    input.next(A);
    expect(seen).toEqual([['A'], ['B']]);
  });

  it('with batchOf, emits batch n with exactly the groups admitted in batch n, in order', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const admittedIn: Record<string, number> = { A: 0, B: 0, C: 1, D: 1, E: 2 };
      const batchOf = (x: Group): number => admittedIn[x.key[0]];
      // C and D (batch 1) complete before B (batch 0): batch 1 waits for batch 0.
      const source = cold('-a-c-d-b-e-|', { a: A, b: B, c: C, d: D, e: E });
      expectObservable(source.pipe(batchGroups({ batchSize: 2, batchOf }))).toBe('-------(xy)(z|)', {
        x: [A, B],
        y: [C, D],
        z: [E],
      });
      expectObservable(source.pipe(batchGroups({ batchSize: 2, batchOf, capacity: 2 }))).toBe(
        '-----#',
        undefined,
        new ConfigError('batchGroups holds 3 groups, over its capacity 2', { context: { capacity: 2 } }),
      );
    });
  });

  it('rejects bad options with the valid names', () => {
    expect(() => batchGroups({ batchSize: 0 })).toThrow(ConfigError);
    expect(() => batchGroups({ batchSize: 1, readiness: 'nope' as never })).toThrow(/batch_size_reached/);
  });
});
