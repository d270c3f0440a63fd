/**
 * Helpers for specs against the real broker, in the kafkajs `testHelpers` style: unique topic and group names per
 * test, topic creation, raw produce/consume, and `waitFor` (spec/helpers/waitFor.ts) that fails loudly on timeout.
 */
import { randomBytes } from 'node:crypto';

import type { Kafka, KafkaMessage, Message } from 'kafkajs';
import { inject } from 'vitest';

import { createKafka, createProducer } from '../../lib/kafka/client.js';
import { waitFor } from '../helpers/waitFor.js';

export { waitFor, type WaitForOptions } from '../helpers/waitFor.js';

/** The broker list of this run; throws (never skips) when the global setup provided none. */
export function brokers(): string {
  const value = inject('kafkaBrokers');
  if (!value) {
    throw new Error('no Kafka broker: spec/kafka/globalSetup.ts did not start one and KAFKA_BROKERS is not set');
  }
  return value;
}

/** A kafkajs client for this run's broker (errors only on stderr). */
export function kafkaClient(clientId = 'rxrl-spec'): Kafka {
  return createKafka(brokers(), { clientId, logLevel: 'error' });
}

/** A name no other test (or earlier run) uses: `<prefix>-<time>-<random>`. */
export function uniqueName(prefix: string): string {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
}

/** Creates a topic with `partitions` partitions and waits for its leaders. */
export async function createTopic(kafka: Kafka, topic: string, partitions = 1): Promise<void> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true });
  } finally {
    await admin.disconnect();
  }
}

/** Produces raw messages (idempotent producer, `acks: -1`). */
export async function produce(kafka: Kafka, topic: string, messages: Message[]): Promise<void> {
  const producer = createProducer(kafka);
  await producer.connect();
  try {
    await producer.send({ topic, acks: -1, messages });
  } finally {
    await producer.disconnect();
  }
}

/** Committed offsets of a group on a topic, by partition (`-1` where nothing is committed). */
export async function committedOffsets(kafka: Kafka, groupId: string, topic: string): Promise<Map<number, number>> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    const [entry] = await admin.fetchOffsets({ groupId, topics: [topic] });
    return new Map((entry?.partitions ?? []).map((p) => [p.partition, Number(p.offset)]));
  } finally {
    await admin.disconnect();
  }
}

/** Reads `count` messages of `topic` from the beginning with a throwaway group; fails after `timeoutMs`. */
export async function readMessages(kafka: Kafka, topic: string, count: number, timeoutMs = 20_000): Promise<KafkaMessage[]> {
  const consumer = kafka.consumer({ groupId: uniqueName('reader'), maxWaitTimeInMs: 100 });
  const messages: KafkaMessage[] = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ message }) => {
        messages.push(message);
      },
    });
    await waitFor(() => messages.length >= count, { timeoutMs, what: `${count} messages on ${topic} (got ${messages.length})` });
  } finally {
    await consumer.disconnect();
  }
  return messages;
}
