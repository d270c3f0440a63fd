/**
 * Dead-lettering of poison messages (messages that fail to decode): each goes to a dead-letter topic with its
 * original key, value and headers plus the reason, and its offset is marked done only once the broker took it.
 * Plain logic over an injected send function; `fromKafka` wires it to a kafkajs producer.
 *
 * @packageDocumentation
 */

import type { IHeaders, KafkaMessage, ProducerRecord } from 'kafkajs';

import type { DecodeError } from '../core/errors.js';
import type { KafkaEventSink } from './commitScheduler.js';
import { KafkaBridgeError } from './errors.js';

/** Headers a dead-lettered message carries, besides its original ones. */
export const DEAD_LETTER_HEADERS = {
  /** Why decoding failed (the error message). */
  reason: 'rxrl-dlq-reason',
  /** Name of the decode error (`DecodeError`). */
  error: 'rxrl-dlq-error',
  /** Where the message came from. */
  topic: 'rxrl-dlq-topic',
  partition: 'rxrl-dlq-partition',
  offset: 'rxrl-dlq-offset',
  /** Consumer group that rejected it. */
  group: 'rxrl-dlq-group',
} as const;

/** Options of {@link DeadLetterWriter}. */
export interface DeadLetterWriterOptions {
  /** Dead-letter topic. */
  readonly topic: string;
  /** Consumer group that rejects the messages (written in {@link DEAD_LETTER_HEADERS}.group). */
  readonly groupId: string;
  /** Sends a record (an idempotent producer's `send`; kafkajs retries inside it). */
  readonly send: (record: ProducerRecord) => Promise<unknown>;
  /** Marks the poison message's offset done, once it is on the dead-letter topic. */
  readonly markDone: (topic: string, partition: number, offset: string) => void;
  /** Receives `kafka.dead_letter` (`topic`, `partition`, `offset`, `reason`, `deadLetterTopic`). */
  readonly emit: KafkaEventSink;
}

/**
 * Writes poison messages to the dead-letter topic.
 *
 * @example
 * ```ts
 * const dlq = new DeadLetterWriter({ topic: 'rxrl.dlq', groupId: 'trainer', send: (r) => producer.send(r), markDone, emit });
 * await dlq.write('rxrl.tasks', 0, message, new DecodeError('bad magic'));
 * ```
 */
export class DeadLetterWriter {
  constructor(private readonly options: DeadLetterWriterOptions) {}

  /**
   * Sends `message` (read from `topic`/`partition`) with the reason `error` to the dead-letter topic (all
   * in-sync replicas acknowledging), then reports it and marks its offset done.
   *
   * @throws {@link KafkaBridgeError} (its `cause` the send's error) when the send fails; the offset is then not
   *   marked done.
   */
  async write(topic: string, partition: number, message: KafkaMessage, error: DecodeError): Promise<void> {
    const { options } = this;
    const headers: IHeaders = {
      ...(message.headers ?? {}),
      [DEAD_LETTER_HEADERS.reason]: error.message,
      [DEAD_LETTER_HEADERS.error]: error.name,
      [DEAD_LETTER_HEADERS.topic]: topic,
      [DEAD_LETTER_HEADERS.partition]: String(partition),
      [DEAD_LETTER_HEADERS.offset]: message.offset,
      [DEAD_LETTER_HEADERS.group]: options.groupId,
    };
    try {
      await options.send({ topic: options.topic, acks: -1, messages: [{ key: message.key, value: message.value, headers }] });
    } catch (cause) {
      throw new KafkaBridgeError(`could not dead-letter ${topic}/${partition}@${message.offset}: ${String(cause)}`, { cause });
    }
    options.emit('kafka.dead_letter', { topic, partition, offset: message.offset, reason: error.message, deadLetterTopic: options.topic });
    options.markDone(topic, partition, message.offset);
  }
}
