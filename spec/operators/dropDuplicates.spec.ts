import { Subject, of, take } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { beforeEach, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { dropDuplicates } from '../../operators/dropDuplicates.js';

const id = (x: string): string => x;

describe('dropDuplicates', () => {
  let scheduler: TestScheduler;
  beforeEach(() => {
    scheduler = new TestScheduler((actual, expected) => expect(actual).toEqual(expected));
  });

  it('keeps the first item of each key and completes with the source', () => {
    scheduler.run(({ cold, expectObservable }) => {
      const source = cold('-a-b-a-c-b-|');
      expectObservable(source.pipe(dropDuplicates(id))).toBe('-a-b---c---|');
    });
  });

  it('reports every dropped item with its key', () => {
    const dropped: string[] = [];
    of('x1', 'y1', 'x2', 'x3')
      .pipe(dropDuplicates((s) => s[0], { onDuplicate: (item, key) => dropped.push(`${item}:${key}`) }))
      .subscribe();
    expect(dropped).toEqual(['x2:x', 'x3:x']);
  });

  it('remembers the last `capacity` keys only', () => {
    const out: string[] = [];
    of('a', 'b', 'c', 'a', 'c')
      .pipe(dropDuplicates(id, { capacity: 2 }))
      .subscribe((x) => out.push(x));
    // 'a' was forgotten when 'c' arrived; 'c' was still remembered.
    expect(out).toEqual(['a', 'b', 'c', 'a']);
    expect(() => dropDuplicates(id, { capacity: 0 })).toThrow(ConfigError);
  });

  it('passes errors through (its own key function included) and stops at unsubscribe', () => {
    scheduler.run(({ cold, expectObservable, expectSubscriptions }) => {
      const failing = cold('-a-#', undefined, new Error('x'));
      expectObservable(failing.pipe(dropDuplicates(id))).toBe('-a-#', undefined, new Error('x'));
      const throwing = cold('-a-b-|');
      const boom = new Error('key');
      expectObservable(
        throwing.pipe(
          dropDuplicates((x) => {
            if (x === 'b') throw boom;
            return x;
          }),
        ),
      ).toBe('-a-#', undefined, boom);
      const source = cold('-a-b-c-|');
      expectObservable(source.pipe(dropDuplicates(id)), '----!').toBe('-a-b');
      expectSubscriptions(source.subscriptions).toBe('^---!');
    });
  });

  it('works with a synchronous source and take, and re-entrantly', () => {
    const out: string[] = [];
    of('a', 'a', 'b', 'c')
      .pipe(dropDuplicates(id), take(2))
      .subscribe((x) => out.push(x));
    expect(out).toEqual(['a', 'b']);

    const input = new Subject<string>();
    const seen: string[] = [];
    input.pipe(dropDuplicates(id)).subscribe((x) => {
      seen.push(x);
      if (x === 'a') input.next('a'); // a duplicate pushed from inside the handler is dropped
      if (x === 'a') input.next('b');
    });
    input.next('a');
    input.next('b');
    expect(seen).toEqual(['a', 'b']);
  });
});
