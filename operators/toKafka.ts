import { Observable, type OperatorFunction } from 'rxjs';
import type { IHeaders, Message, Producer, TopicMessages } from 'kafkajs';
import { ConfigError } from '../lib/core/errors.js';
import { KafkaBridgeError } from '../lib/kafka/errors.js';
import { BatchSender } from './internal/batchSender.js';

/** Options of {@link toKafka}. */
export interface ToKafkaOptions<T> {
  /** Destination topic, fixed or per item. */
  readonly topic: string | ((item: T) => string);
  /** Encodes an item (for example `encodeTrajectoryMessage`). Throwing errors the stream. */
  readonly encode: (item: T) => Uint8Array;
  /** Message key (items with equal keys land in the same partition, in order). Default: none. */
  readonly key?: (item: T) => string | undefined;
  /** Extra message headers. */
  readonly headers?: (item: T) => Readonly<Record<string, string>>;
  /** Most messages per produce request. Default 500. */
  readonly maxBatchSize?: number;
  /** Most items waiting for a send; more is an error (the upstream is expected to be bounded). Default 100 000. */
  readonly capacity?: number;
}

interface Pending<T> {
  readonly item: T;
  readonly topic: string;
  readonly message: Message;
}

/**
 * Publishes each item to Kafka and re-emits it, in input order, once the broker has acknowledged it with
 * `acks: -1` (every in-sync replica has it). Items that arrive while a send is in flight are gathered into the
 * next produce request, so a fast source is sent in batches of up to `maxBatchSize` and a slow one with no added
 * latency. One request is in flight at a time. Pair it with an idempotent producer (`createProducer`) so retries
 * never duplicate a message. Completion waits for the last acknowledgement; a failed send errors the stream with a
 * {@link KafkaBridgeError}.
 *
 * ```
 * source:  -a-b-c------d--|
 * toKafka(producer, { topic: 't', encode })      (send takes ---)
 * output:  ----a---(bc)----d|        a sent alone, b and c gathered while a was in flight
 * ```
 *
 * @example
 * ```ts
 * import { createKafka, createProducer, encodeTrajectoryMessage } from 'rxrl';
 * import { rollout, toKafka } from 'rxrl/operators';
 * const producer = createProducer(createKafka(process.env.KAFKA_BROKERS ?? 'localhost:9092'));
 * await producer.connect();
 * tasks$.pipe(
 *   rollout(engine, { samplesPerTask: 8, concurrency: 64, maxTokens: 16, evaluator }),
 *   toKafka(producer, { topic: 'rxrl.trajectories', encode: (output) => encodeTrajectoryMessage({ run, output }) }),
 * ).subscribe((output) => console.log('acknowledged', output.id));
 * ```
 * @param producer - a connected kafkajs producer (idempotent: see `createProducer`).
 * @param options - topic, encoder, key, headers and batch size.
 * @returns an operator that re-emits each item after the broker acknowledged it.
 * @see fromKafka
 */
export function toKafka<T>(producer: Producer, options: ToKafkaOptions<T>): OperatorFunction<T, T> {
  const maxBatchSize = options.maxBatchSize ?? 500;
  const capacity = options.capacity ?? 100_000;
  if (!Number.isInteger(maxBatchSize) || maxBatchSize < 1) {
    throw new ConfigError(`toKafka maxBatchSize must be an integer >= 1, got ${maxBatchSize}`);
  }
  if (!Number.isInteger(capacity) || capacity < 1) {
    throw new ConfigError(`toKafka capacity must be an integer >= 1, got ${capacity}`);
  }
  const topicOf =
    typeof options.topic === 'string'
      ? (
          (topic: string) => () =>
            topic
        )(options.topic)
      : options.topic;
  return (source) =>
    new Observable<T>((subscriber) => {
      const sender = new BatchSender<T, Pending<T>>({
        encode: (item) => pendingOf(item, options, topicOf),
        send: (batch) => sendBatch(producer, batch),
        maxBatchSize,
        capacity,
        sent: (batch) => {
          for (const { item } of batch) subscriber.next(item);
        },
        error: (error) => subscriber.error(error),
        complete: () => subscriber.complete(),
      });
      const subscription = source.subscribe({
        next: (item) => {
          if (sender.push(item)) return;
          const waiting = sender.waiting;
          subscriber.error(
            new ConfigError(`toKafka holds ${waiting} unsent items, its capacity; raise 'capacity' or slow the source`, {
              context: { capacity },
            }),
          );
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => sender.end(),
      });
      return () => {
        sender.close();
        subscription.unsubscribe();
      };
    });
}

/** One produce request (`acks: -1`); a failure is a {@link KafkaBridgeError} naming the topics. */
async function sendBatch<T>(producer: Producer, batch: readonly Pending<T>[]): Promise<void> {
  try {
    await producer.sendBatch({ acks: -1, topicMessages: byTopic(batch) });
  } catch (cause) {
    const topics = [...new Set(batch.map((p) => p.topic))].join(', ');
    throw new KafkaBridgeError(`send of ${batch.length} messages to ${topics} failed: ${String(cause)}`, { cause });
  }
}

/** One item as a message for `topicOf(item)`: its encoded value, key and headers. */
function pendingOf<T>(item: T, options: ToKafkaOptions<T>, topicOf: (item: T) => string): Pending<T> {
  const value = options.encode(item);
  // Built field by field (no object spread): this runs once per message.
  const message: Message = {
    value: Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength),
  };
  const key = options.key?.(item);
  if (key !== undefined) message.key = key;
  const headers: IHeaders | undefined = options.headers?.(item);
  if (headers !== undefined) message.headers = headers;
  return { item, topic: topicOf(item), message };
}

function byTopic<T>(batch: readonly Pending<T>[]): TopicMessages[] {
  const topics = new Map<string, Message[]>();
  for (const { topic, message } of batch) {
    let messages = topics.get(topic);
    if (messages === undefined) {
      messages = [];
      topics.set(topic, messages);
    }
    messages.push(message);
  }
  return [...topics].map(([topic, messages]) => ({ topic, messages }));
}
