/**
 * The bookkeeping of the Kafka rollout stage, without a broker: which trajectory records go to the group store, and
 * when they are acknowledged (their step trained, and a checkpoint holding it).
 */
import { describe, expect, it } from 'vitest';

import type { KafkaRecord } from '../../lib/kafka/types.js';
import { GroupRecords } from '../../pipelines/kafkaRollout.js';

/** A record that counts its acknowledgements. */
function record(offset: number): KafkaRecord<string> & { acks: number } {
  return {
    value: `v${offset}`,
    topic: 'trajectories',
    partition: 0,
    offset: String(offset),
    key: undefined,
    headers: {},
    timestamp: '0',
    acks: 0,
    ack() {
      this.acks++;
    },
  };
}

describe('GroupRecords', () => {
  it('holds records of admitted groups only, until the step that trains them', () => {
    const groups = new GroupRecords();
    groups.admit('t0@0', 't0');
    const [a, b] = [record(0), record(1)];
    expect(groups.hold('t0@0', a)).toBe(true);
    expect(groups.hold('t9@0', b)).toBe(false); // never admitted
    expect(groups.trained(['t0@0'], true)).toEqual(['t0']);
    expect(a.acks).toBe(1);
    expect(groups.hold('t0@0', b)).toBe(false); // already trained
    expect(b.acks).toBe(0); // the caller acknowledges what it was refused
  });

  it('keeps the records of trained steps unacknowledged until a checkpoint holds them', () => {
    const groups = new GroupRecords();
    const records = [0, 1, 2].map(record);
    ['a@0', 'b@0', 'c@0'].forEach((id, i) => {
      groups.admit(id, id.slice(0, 1));
      groups.hold(id, records[i]);
    });
    groups.trained(['a@0'], false);
    groups.trained(['b@0'], false);
    expect(records.map((r) => r.acks)).toEqual([0, 0, 0]);
    groups.trained(['c@0'], true);
    expect(records.map((r) => r.acks)).toEqual([1, 1, 1]);
  });

  it('knows when every admitted group was released', () => {
    const groups = new GroupRecords();
    expect(groups.allReleased).toBe(true);
    groups.admit('a@0', 'a');
    groups.admit('a@0/w', 'a');
    groups.release();
    expect(groups.allReleased).toBe(false);
    groups.release();
    expect(groups.allReleased).toBe(true);
  });
});
