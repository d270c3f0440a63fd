/** The dead-letter writer behind fromKafka, over a hand-settled send function (no broker). */
import type { KafkaMessage, ProducerRecord } from 'kafkajs';
import { describe, expect, it } from 'vitest';

import { DecodeError } from '../../lib/core/errors.js';
import { DEAD_LETTER_HEADERS, DeadLetterWriter } from '../../lib/kafka/deadLetter.js';
import { isKafkaBridgeError } from '../../lib/kafka/errors.js';
import type { KafkaEventType } from '../../lib/kafka/types.js';
import { DEAD_LETTER_HEADERS as fromOperator } from '../../operators/fromKafka.js';

const poison = (): KafkaMessage => ({
  key: Buffer.from('k-1'),
  value: Buffer.from([0xde, 0xad]),
  timestamp: '1700000000000',
  attributes: 0,
  offset: '42',
  headers: { trace: 'abc' },
});

function setup() {
  const sends: { record: ProducerRecord; resolve: () => void; reject: (error: unknown) => void }[] = [];
  const done: string[] = [];
  const events: { type: KafkaEventType; payload: Readonly<Record<string, unknown>> }[] = [];
  const writer = new DeadLetterWriter({
    topic: 'rxrl.dlq',
    groupId: 'trainer',
    send: (record) => new Promise<void>((resolve, reject) => sends.push({ record, resolve, reject })),
    markDone: (topic, partition, offset) => done.push(`${topic}/${partition}@${offset}`),
    emit: (type, payload) => events.push({ type, payload }),
  });
  return { writer, sends, done, events };
}

/** Lets the promise callbacks queued so far run. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await Promise.resolve();
};

describe('DeadLetterWriter', () => {
  it('sends the original key, value and headers plus the reason, and marks the offset done only after the send', async () => {
    const { writer, sends, done, events } = setup();
    const message = poison();
    const writing = writer.write('rxrl.tasks', 3, message, new DecodeError('bad magic byte'));
    await settle();
    expect(sends.length).toBe(1);
    const { record } = sends[0];
    expect(record.topic).toBe('rxrl.dlq');
    expect(record.acks).toBe(-1);
    expect(record.messages).toEqual([
      {
        key: message.key,
        value: message.value,
        headers: {
          trace: 'abc',
          [DEAD_LETTER_HEADERS.reason]: 'bad magic byte',
          [DEAD_LETTER_HEADERS.error]: 'DecodeError',
          [DEAD_LETTER_HEADERS.topic]: 'rxrl.tasks',
          [DEAD_LETTER_HEADERS.partition]: '3',
          [DEAD_LETTER_HEADERS.offset]: '42',
          [DEAD_LETTER_HEADERS.group]: 'trainer',
        },
      },
    ]);
    expect(message.headers).toEqual({ trace: 'abc' }); // the consumed message is left as it was
    expect(done).toEqual([]); // not before the broker took it
    expect(events).toEqual([]);
    sends[0].resolve();
    await writing;
    expect(done).toEqual(['rxrl.tasks/3@42']);
    expect(events).toEqual([
      {
        type: 'kafka.dead_letter',
        payload: { topic: 'rxrl.tasks', partition: 3, offset: '42', reason: 'bad magic byte', deadLetterTopic: 'rxrl.dlq' },
      },
    ]);
  });

  it('a failed send is a KafkaBridgeError with the cause; the offset is not marked done and nothing is reported', async () => {
    const { writer, sends, done, events } = setup();
    const writing = writer.write('rxrl.tasks', 0, poison(), new DecodeError('bad magic byte'));
    await settle();
    const cause = new Error('not enough in-sync replicas');
    sends[0].reject(cause);
    const error = await writing.then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(isKafkaBridgeError(error)).toBe(true);
    expect((error as Error).cause).toBe(cause);
    expect(done).toEqual([]);
    expect(events).toEqual([]);
  });

  it('a message without headers gets only the dead-letter ones', async () => {
    const { writer, sends } = setup();
    const message = { ...poison(), headers: undefined } as unknown as KafkaMessage;
    const writing = writer.write('t', 1, message, new DecodeError('tombstone'));
    await settle();
    expect(Object.keys(sends[0].record.messages[0].headers ?? {}).sort()).toEqual(Object.values(DEAD_LETTER_HEADERS).sort());
    sends[0].resolve();
    await writing;
  });

  it('fromKafka still exports the same header names', () => {
    expect(fromOperator).toBe(DEAD_LETTER_HEADERS);
  });
});
