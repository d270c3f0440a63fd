import { KafkaJSNonRetriableError, KafkaJSProtocolError } from 'kafkajs';
import { describe, expect, it } from 'vitest';

import { OffsetTracker } from '../../lib/kafka/offsets.js';
import { isRebalanceCommitError } from '../../operators/fromKafka.js';

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

describe('isRebalanceCommitError', () => {
  it("tells a group that moved past this member (kafkajs's protocol errors, bare or wrapped) from other failures", () => {
    const protocol = (type: string, code: number, message: string) =>
      new KafkaJSProtocolError({ type, code, retriable: false, message } as unknown as Error);
    const unknownMember = protocol('UNKNOWN_MEMBER_ID', 25, 'The coordinator is not aware of this member');
    expect(isRebalanceCommitError(unknownMember)).toBe(true);
    // The consumer's retrier rethrows it wrapped, with the message only.
    expect(isRebalanceCommitError(new KafkaJSNonRetriableError(unknownMember))).toBe(true);
    expect(isRebalanceCommitError(protocol('REBALANCE_IN_PROGRESS', 27, 'The group is rebalancing, so a rejoin is needed'))).toBe(true);
    expect(
      isRebalanceCommitError(
        new KafkaJSNonRetriableError(protocol('ILLEGAL_GENERATION', 22, 'Specified group generation id is not valid')),
      ),
    ).toBe(true);
    expect(isRebalanceCommitError(protocol('GROUP_AUTHORIZATION_FAILED', 30, 'Not authorized to access group'))).toBe(false);
    expect(isRebalanceCommitError(new KafkaJSNonRetriableError(new Error('Connection error: ECONNREFUSED')))).toBe(false);
    expect(isRebalanceCommitError(undefined)).toBe(false);
  });
});
