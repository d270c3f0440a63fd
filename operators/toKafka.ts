import { Observable, type OperatorFunction } from 'rxjs';
import type { IHeaders, Message, Producer, TopicMessages } from 'kafkajs';
import { ConfigError } from '../lib/errors.js';
import { KafkaBridgeError } from '../lib/kafka/errors.js';

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
  const topicOf = typeof options.topic === 'string' ? ((topic: string) => () => topic)(options.topic) : options.topic;
  return (source) =>
    new Observable<T>((subscriber) => {
      let queue: Pending<T>[] = [];
      let sending = false;
      let sourceDone = false;
      let closed = false;

      const pump = (): void => {
        if (sending || closed) return;
        if (queue.length === 0) {
          if (sourceDone) subscriber.complete();
          return;
        }
        const batch = queue.length <= maxBatchSize ? queue : queue.slice(0, maxBatchSize);
        queue = queue.length <= maxBatchSize ? [] : queue.slice(maxBatchSize);
        sending = true;
        producer.sendBatch({ acks: -1, topicMessages: byTopic(batch) }).then(
          () => {
            sending = false;
            if (closed) return;
            for (const { item } of batch) subscriber.next(item);
            pump();
          },
          (cause: unknown) => {
            sending = false;
            if (closed) return;
            const topics = [...new Set(batch.map((p) => p.topic))].join(', ');
            subscriber.error(new KafkaBridgeError(`send of ${batch.length} messages to ${topics} failed: ${String(cause)}`, { cause }));
          },
        );
      };

      const subscription = source.subscribe({
        next: (item) => {
          if (queue.length >= capacity) {
            subscriber.error(
              new ConfigError(`toKafka holds ${queue.length} unsent items, its capacity; raise 'capacity' or slow the source`, {
                context: { capacity },
              }),
            );
            return;
          }
          let pending: Pending<T>;
          try {
            const value = options.encode(item);
            const key = options.key?.(item);
            const headers: IHeaders | undefined = options.headers?.(item);
            pending = {
              item,
              topic: topicOf(item),
              message: {
                value: Buffer.from(value.buffer, value.byteOffset, value.byteLength),
                ...(key === undefined ? {} : { key }),
                ...(headers === undefined ? {} : { headers: { ...headers } }),
              },
            };
          } catch (error) {
            subscriber.error(error);
            return;
          }
          queue.push(pending);
          pump();
        },
        error: (error: unknown) => subscriber.error(error),
        complete: () => {
          sourceDone = true;
          pump();
        },
      });
      return () => {
        closed = true;
        queue = [];
        subscription.unsubscribe();
      };
    });
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
