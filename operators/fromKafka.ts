import { Observable } from 'rxjs';
import type { Batch, ConsumerConfig, IHeaders, Kafka, KafkaMessage, Producer } from 'kafkajs';
import { ConfigError, DecodeError } from '../lib/errors.js';
import { KafkaBridgeError } from '../lib/kafka/errors.js';
import { OffsetTracker } from '../lib/kafka/offsets.js';
import type { KafkaEvent, KafkaEventType, KafkaRecord } from '../lib/kafka/types.js';

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

/** Where {@link fromKafka} sends messages that fail to decode. */
export interface DeadLetterOptions {
  /** A connected producer (idempotent: see `createProducer`). */
  readonly producer: Producer;
  /** Dead-letter topic. */
  readonly topic: string;
}

/** Options of {@link fromKafka}. */
export interface FromKafkaOptions<T> {
  /** Consumer group: the group's members share the partitions. */
  readonly groupId: string;
  /** Topics to consume. */
  readonly topics: readonly string[];
  /** Decodes a message value; a {@link DecodeError} makes it a poison message. */
  readonly decode: (bytes: Uint8Array) => T;
  /** Most records emitted and not yet acknowledged; at the capacity the consumer pauses. Default 256. */
  readonly capacity?: number;
  /** The consumer resumes once fewer than this many records are unacknowledged. Default `⌈capacity / 2⌉`. */
  readonly resumeBelow?: number;
  /** Where a group with no committed offset starts: the earliest message (default) or the next one. */
  readonly fromBeginning?: boolean;
  /**
   * Poison messages go here with the reason in their headers ({@link DEAD_LETTER_HEADERS}); their offsets are
   * committed and the stream goes on. Without it a poison message errors the stream.
   */
  readonly deadLetter?: DeadLetterOptions;
  /** Delay that gathers acknowledgements into one offset commit, in ms. Default 20. */
  readonly commitIntervalMs?: number;
  /** kafkajs consumer settings (session timeout, heartbeat, fetch sizes). */
  readonly consumer?: Omit<ConsumerConfig, 'groupId'>;
  /** Completes the stream (and closes the consumer) when it fires. */
  readonly signal?: AbortSignal;
  /** Instrumentation: joins, pauses, resumes, commits, dead letters. */
  readonly onEvent?: (event: KafkaEvent) => void;
  /** Receives, at teardown, the promise of the consumer's close (final commit, leave the group, disconnect). */
  readonly onClosed?: (closing: Promise<void>) => void;
}

/** Consecutive failed commits (each retried by kafkajs) after which the stream errors. */
const MAX_COMMIT_FAILURES = 5;

/** kafkajs's messages (its non-retriable wrapper keeps only the message) for a member the group has moved past. */
const REBALANCE_MESSAGE = /coordinator is not aware of this member|group is rebalancing|generation id is not valid/i;
const REBALANCE_TYPES = new Set(['UNKNOWN_MEMBER_ID', 'REBALANCE_IN_PROGRESS', 'ILLEGAL_GENERATION']);

/**
 * Whether a failed commit failed because the group rebalanced past this member (a stall longer than its session,
 * say): kafkajs rejoins by itself, and the offsets not committed are delivered again to the partitions' owners —
 * at-least-once, as designed — so such failures do not count towards giving up.
 *
 * @internal
 */
export function isRebalanceCommitError(error: unknown): boolean {
  for (let e: unknown = error, depth = 0; e !== undefined && e !== null && depth < 4; e = (e as { cause?: unknown }).cause, depth++) {
    const { type, message } = e as { type?: unknown; message?: unknown };
    if (typeof type === 'string' && REBALANCE_TYPES.has(type)) return true;
    if (typeof message === 'string' && REBALANCE_MESSAGE.test(message)) return true;
  }
  return false;
}

/**
 * Consumes Kafka topics as a stream of {@link KafkaRecord}s, with backpressure and at-least-once delivery.
 *
 * - **Demand**: a record counts as in flight from its emission until its `ack()`. When `capacity` records are in
 *   flight the consumer pauses its topics (it keeps heartbeating, so it stays in its group) and resumes once fewer
 *   than `resumeBelow` are; memory stays bounded whatever the downstream speed.
 * - **Commits**: a partition's offset is committed once every earlier record of that partition is acknowledged,
 *   never before. A crash or a rebalance redelivers unacknowledged records (deduplicate downstream by id).
 * - **Poison messages**: a message that fails to decode goes to the dead-letter topic, original key, value and
 *   headers plus the reason; its offset is committed and the stream goes on.
 *
 * Each subscription creates, connects and finally disconnects its own consumer. Completes when `signal` fires;
 * errors with a {@link KafkaBridgeError} if the consumer cannot start or crashes for good.
 *
 * ```
 * topic:   -a-b-c-d-e-f---------        capacity 2, resumeBelow 1
 * fromKafka(kafka, { … })
 * output:  -a-b---------c-d-----        paused after b; resumed when a and b were acked
 * ack:     --------a-b-------c-d
 * commit:  ----------(2)-------(4)      next offset to read, once every earlier record is acked
 * ```
 *
 * @example
 * ```ts
 * import { createKafka, decodeTrajectoryMessage } from 'rxrl';
 * import { fromKafka } from 'rxrl/operators';
 * const kafka = createKafka(process.env.KAFKA_BROKERS ?? 'localhost:9092');
 * fromKafka(kafka, { groupId: 'trainer', topics: ['rxrl.trajectories'], decode: decodeTrajectoryMessage, capacity: 1024 })
 *   .subscribe((record) => {
 *     console.log(record.value.output.id);
 *     record.ack(); // the work is done: the offset may be committed
 *   });
 * ```
 * @param kafka - the kafkajs client.
 * @param options - group, topics, decoder, capacity, dead-letter topic and consumer settings.
 * @returns a cold Observable of records; unsubscribing commits what is acknowledged and closes the consumer.
 * @see toKafka
 */
export function fromKafka<T>(kafka: Kafka, options: FromKafkaOptions<T>): Observable<KafkaRecord<T>> {
  const capacity = options.capacity ?? 256;
  const resumeBelow = options.resumeBelow ?? Math.ceil(capacity / 2);
  const commitIntervalMs = options.commitIntervalMs ?? 20;
  if (!Number.isInteger(capacity) || capacity < 1) {
    throw new ConfigError(`fromKafka capacity must be an integer >= 1, got ${capacity}`);
  }
  if (!(Number.isInteger(resumeBelow) && resumeBelow >= 1 && resumeBelow <= capacity)) {
    throw new ConfigError(`fromKafka resumeBelow must be an integer in [1, capacity], got ${resumeBelow}`);
  }
  if (options.topics.length === 0) throw new ConfigError('fromKafka needs at least one topic');
  const topics = [...options.topics];
  const { groupId } = options;

  return new Observable<KafkaRecord<T>>((subscriber) => {
    const consumer = kafka.consumer({
      sessionTimeout: 10_000,
      rebalanceTimeout: 20_000,
      heartbeatInterval: 1_000,
      maxWaitTimeInMs: 100,
      ...options.consumer,
      groupId,
    });
    const tracker = new OffsetTracker();
    let inFlight = 0;
    let paused = false;
    let closed = false;
    let eventSeq = 0;
    let commitTimer: ReturnType<typeof setTimeout> | undefined;
    let committing: Promise<void> | undefined;
    let commitAgain = false;
    let commitFailures = 0;

    const emit = (type: KafkaEventType, payload: Record<string, unknown>): void => {
      options.onEvent?.({ id: `${groupId}#${eventSeq++}`, type, timestamp: Date.now(), payload });
    };
    const fail = (error: unknown): void => {
      if (!closed) subscriber.error(error);
    };

    const commitOnce = async (): Promise<void> => {
      do {
        commitAgain = false;
        const offsets = tracker.committable();
        if (offsets.length === 0) continue;
        try {
          await consumer.commitOffsets(offsets.map((o) => ({ ...o })));
          tracker.markCommitted(offsets);
          commitFailures = 0;
          emit('kafka.commit', { offsets });
        } catch (error) {
          const rebalance = isRebalanceCommitError(error);
          if (!rebalance) commitFailures++;
          emit('kafka.commit_failed', { error: String(error), failures: commitFailures, rebalance });
          if (commitFailures >= MAX_COMMIT_FAILURES) {
            fail(new KafkaBridgeError(`offset commit failed ${commitFailures} times in a row: ${String(error)}`, { cause: error }));
          }
          return;
        }
      } while (commitAgain);
    };
    const flush = (): Promise<void> => {
      if (committing) {
        commitAgain = true;
        return committing;
      }
      committing = commitOnce().finally(() => {
        committing = undefined;
      });
      return committing;
    };
    const scheduleCommit = (): void => {
      if (closed || commitTimer !== undefined) return;
      commitTimer = setTimeout(() => {
        commitTimer = undefined;
        void flush();
      }, commitIntervalMs);
    };

    const pause = (): void => {
      if (paused) return;
      paused = true;
      consumer.pause(topics.map((topic) => ({ topic })));
      emit('kafka.pause', { inFlight, capacity });
    };
    const maybeResume = (): void => {
      if (!paused || closed || inFlight >= resumeBelow) return;
      paused = false;
      try {
        consumer.resume(topics.map((topic) => ({ topic })));
        emit('kafka.resume', { inFlight });
      } catch {
        // The consumer stopped meanwhile; nothing to resume.
      }
    };

    const onAck = (): void => {
      inFlight--;
      scheduleCommit();
      maybeResume();
    };

    const deadLetter = async (batch: Batch, message: KafkaMessage, error: DecodeError): Promise<void> => {
      const target = options.deadLetter!;
      const headers: IHeaders = {
        ...(message.headers ?? {}),
        [DEAD_LETTER_HEADERS.reason]: error.message,
        [DEAD_LETTER_HEADERS.error]: error.name,
        [DEAD_LETTER_HEADERS.topic]: batch.topic,
        [DEAD_LETTER_HEADERS.partition]: String(batch.partition),
        [DEAD_LETTER_HEADERS.offset]: message.offset,
        [DEAD_LETTER_HEADERS.group]: groupId,
      };
      try {
        await target.producer.send({
          topic: target.topic,
          acks: -1,
          messages: [{ key: message.key, value: message.value, headers }],
        });
      } catch (cause) {
        throw new KafkaBridgeError(`could not dead-letter ${batch.topic}/${batch.partition}@${message.offset}: ${String(cause)}`, {
          cause,
        });
      }
      emit('kafka.dead_letter', {
        topic: batch.topic,
        partition: batch.partition,
        offset: message.offset,
        reason: error.message,
        deadLetterTopic: target.topic,
      });
    };

    const eachBatch = async ({
      batch,
      resolveOffset,
      heartbeat,
      isRunning,
      isStale,
    }: {
      batch: Batch;
      resolveOffset: (offset: string) => void;
      heartbeat: () => Promise<void>;
      isRunning: () => boolean;
      isStale: () => boolean;
    }): Promise<void> => {
      const { topic, partition } = batch;
      // kafkajs parses an offset on every resolve, so resolve once: the last message handled, before returning.
      let handled: string | undefined;
      const resolveHandled = (): void => {
        if (handled !== undefined) resolveOffset(handled);
        handled = undefined;
      };
      for (const message of batch.messages) {
        if (closed || !isRunning() || isStale()) return resolveHandled();
        if (inFlight >= capacity) {
          // Unresolved messages are fetched again after the resume.
          pause();
          return resolveHandled();
        }
        let value: T;
        try {
          if (message.value === null) throw new DecodeError('message has no value (a tombstone)');
          value = options.decode(message.value);
        } catch (error) {
          resolveHandled();
          if (!(error instanceof DecodeError) || options.deadLetter === undefined) {
            fail(error);
            return;
          }
          try {
            await deadLetter(batch, message, error);
          } catch (sendError) {
            fail(sendError);
            return;
          }
          tracker.deliver(topic, partition, message.offset)();
          resolveOffset(message.offset);
          scheduleCommit();
          continue;
        }
        inFlight++;
        const record = new Delivered(value, topic, partition, message, tracker.deliver(topic, partition, message.offset), onAck);
        handled = message.offset;
        subscriber.next(record);
      }
      resolveHandled();
      if (!closed) await heartbeat();
    };

    consumer.on(consumer.events.GROUP_JOIN, (event) => {
      tracker.retain(event.payload.memberAssignment);
      emit('kafka.join', { assignment: event.payload.memberAssignment, memberId: event.payload.memberId });
    });
    consumer.on(consumer.events.CRASH, (event) => {
      emit('kafka.crash', { error: String(event.payload.error), restart: event.payload.restart });
      if (!event.payload.restart) {
        fail(new KafkaBridgeError(`Kafka consumer of group ${groupId} crashed: ${String(event.payload.error)}`, { cause: event.payload.error }));
      }
    });

    const started = (async () => {
      await consumer.connect();
      await consumer.subscribe({ topics, fromBeginning: options.fromBeginning ?? true });
      if (closed) return;
      await consumer.run({ autoCommit: false, eachBatchAutoResolve: false, partitionsConsumedConcurrently: 1, eachBatch });
    })();
    started.catch((cause: unknown) => {
      fail(new KafkaBridgeError(`Kafka consumer of group ${groupId} could not start: ${String(cause)}`, { cause }));
    });

    const onAbort = (): void => subscriber.complete();
    if (options.signal?.aborted) onAbort();
    options.signal?.addEventListener('abort', onAbort, { once: true });

    return () => {
      closed = true;
      options.signal?.removeEventListener('abort', onAbort);
      if (commitTimer !== undefined) clearTimeout(commitTimer);
      const closing = (async () => {
        await started.catch(() => undefined);
        await flush().catch(() => undefined);
        await consumer.disconnect();
      })();
      const reported = closing.catch((cause: unknown) => {
        throw new KafkaBridgeError(`Kafka consumer of group ${groupId} did not close cleanly: ${String(cause)}`, { cause });
      });
      if (options.onClosed) options.onClosed(reported);
      else reported.catch(() => undefined);
    };
  });
}

/** A consumed record; key and headers are decoded on first access (most consumers never read them). */
class Delivered<T> implements KafkaRecord<T> {
  private acked = false;
  private decodedHeaders: Record<string, string> | undefined;

  constructor(
    readonly value: T,
    readonly topic: string,
    readonly partition: number,
    private readonly message: KafkaMessage,
    private readonly done: () => void,
    private readonly onAck: () => void,
  ) {}

  get offset(): string {
    return this.message.offset;
  }

  get key(): string | undefined {
    return this.message.key === null ? undefined : this.message.key.toString('utf8');
  }

  get headers(): Readonly<Record<string, string>> {
    return (this.decodedHeaders ??= stringHeaders(this.message.headers));
  }

  get timestamp(): string {
    return this.message.timestamp;
  }

  ack(): void {
    if (this.acked) return;
    this.acked = true;
    this.done();
    this.onAck();
  }
}

function stringHeaders(headers: IHeaders | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers ?? {})) {
    const first = Array.isArray(value) ? value[0] : value;
    if (first !== undefined) out[name] = first.toString();
  }
  return out;
}
