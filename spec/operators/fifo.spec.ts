/** The queue behind toKafka, taken from the front in runs. */
import { describe, expect, it } from 'vitest';

import { Fifo } from '../../operators/internal/fifo.js';

describe('Fifo', () => {
  it('gives items back oldest first, in runs of at most n, and is empty once all are taken', () => {
    const queue = new Fifo<number>();
    for (let i = 0; i < 5; i++) queue.push(i);
    expect(queue.take(2)).toEqual([0, 1]);
    queue.push(5);
    expect(queue.length).toBe(4);
    expect(queue.take(10)).toEqual([2, 3, 4, 5]);
    expect(queue.length).toBe(0);
    expect(queue.take(3)).toEqual([]);
  });

  it('keeps order across the compaction of a long taken prefix', () => {
    const queue = new Fifo<number>();
    const n = 20_000;
    for (let i = 0; i < n; i++) queue.push(i);
    const out: number[] = [];
    while (queue.length > 0) {
      out.push(...queue.take(777));
      if (out.length === 777 * 10) for (let i = n; i < n + 100; i++) queue.push(i);
    }
    expect(out).toEqual(Array.from({ length: n + 100 }, (_, i) => i));
  });

  it('clear() drops everything queued', () => {
    const queue = new Fifo<string>();
    queue.push('a');
    queue.push('b');
    queue.clear();
    expect(queue.length).toBe(0);
    expect(queue.take(1)).toEqual([]);
  });
});
