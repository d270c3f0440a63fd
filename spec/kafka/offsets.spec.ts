import { describe, expect, it } from 'vitest';

import { OffsetTracker } from '../../lib/kafka/offsets.js';

describe('OffsetTracker', () => {
  it('commits up to the first outstanding offset of each partition', () => {
    const t = new OffsetTracker();
    const a = [0, 1, 2, 3].map((o) => t.deliver('x', 0, String(o)));
    const b = t.deliver('x', 1, '10');
    expect(t.committable()).toEqual([]);
    a[1]();
    a[2]();
    expect(t.committable()).toEqual([]);
    a[0]();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '3' }]);
    b();
    a[3]();
    expect(t.committable()).toEqual([
      { topic: 'x', partition: 0, offset: '4' },
      { topic: 'x', partition: 1, offset: '11' },
    ]);
    expect(t.outstanding()).toBe(0);
  });

  it('offers an offset once it moved past the last commit', () => {
    const t = new OffsetTracker();
    t.deliver('x', 0, '5')();
    const first = t.committable();
    expect(first).toEqual([{ topic: 'x', partition: 0, offset: '6' }]);
    t.markCommitted(first);
    expect(t.committable()).toEqual([]);
    t.deliver('x', 0, '6')();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '7' }]);
  });

  it('acks are idempotent', () => {
    const t = new OffsetTracker();
    const a = t.deliver('x', 0, '0');
    const b = t.deliver('x', 0, '1');
    b();
    b();
    expect(t.outstanding()).toBe(1);
    expect(t.committable()).toEqual([]);
    a();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '2' }]);
  });

  it('a redelivered offset is done only when every copy is acknowledged', () => {
    const t = new OffsetTracker();
    const first = t.deliver('x', 0, '0');
    t.deliver('x', 0, '1')();
    const again = t.deliver('x', 0, '0'); // re-read after a rebalance while the first copy is in flight
    again();
    expect(t.committable()).toEqual([]);
    first();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '2' }]);
    // A copy of an offset already done costs nothing.
    const late = t.deliver('x', 0, '1');
    expect(t.outstanding()).toBe(0);
    late();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '2' }]);
  });

  it('forgets partitions a rebalance took away; their late acks commit nothing', () => {
    const t = new OffsetTracker();
    const lost = t.deliver('x', 0, '0');
    const kept = t.deliver('x', 1, '0');
    t.retain({ x: [1] });
    lost();
    kept();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 1, offset: '1' }]);
  });

  it('handles offsets beyond 2^53', () => {
    const t = new OffsetTracker();
    t.deliver('x', 0, '9007199254740993')();
    expect(t.committable()).toEqual([{ topic: 'x', partition: 0, offset: '9007199254740994' }]);
  });
});
