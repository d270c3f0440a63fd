/** The record fromKafka emits. */
import type { KafkaMessage } from 'kafkajs';
import { describe, expect, it } from 'vitest';

import { DeliveredRecord } from '../../lib/kafka/record.js';

const message = (over: Partial<KafkaMessage> = {}): KafkaMessage =>
  ({ key: Buffer.from('key'), value: Buffer.from('v'), timestamp: '17', attributes: 0, offset: '5', headers: {}, ...over }) as KafkaMessage;

describe('DeliveredRecord', () => {
  it('acknowledges once: the offset first, then the flow', () => {
    const calls: string[] = [];
    const record = new DeliveredRecord(
      'value',
      't',
      2,
      message(),
      () => calls.push('done'),
      () => calls.push('onAck'),
    );
    record.ack();
    record.ack();
    expect(calls).toEqual(['done', 'onAck']);
  });

  it('decodes key and headers as UTF-8 (the first value of a repeated header); no key is undefined', () => {
    const record = new DeliveredRecord(
      1,
      't',
      0,
      message({ headers: { a: Buffer.from('x'), b: [Buffer.from('y'), Buffer.from('z')], c: 'plain' } }),
      () => undefined,
      () => undefined,
    );
    expect(record.headers).toEqual({ a: 'x', b: 'y', c: 'plain' });
    expect(record.headers).toBe(record.headers);
    expect(record.key).toBe('key');
    expect([record.offset, record.timestamp, record.topic, record.partition]).toEqual(['5', '17', 't', 0]);
    expect(
      new DeliveredRecord(
        1,
        't',
        0,
        message({ key: null }),
        () => undefined,
        () => undefined,
      ).key,
    ).toBeUndefined();
  });
});
