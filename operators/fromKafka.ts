import { Observable, type Subscriber, type TeardownLogic } from 'rxjs';
import type { Consumer, ConsumerConfig, EachBatchPayload, Kafka, KafkaMessage, Producer } from 'kafkajs';
import { ConfigError, DecodeError } from '../lib/core/errors.js';
import { CommitScheduler, type KafkaEventSink } from '../lib/kafka/commitScheduler.js';
import { DeadLetterWriter } from '../lib/kafka/deadLetter.js';
import { KafkaBridgeError } from '../lib/kafka/errors.js';
import { checkFlowLimits, FlowController } from '../lib/kafka/flowControl.js';
import { DeliveredRecord } from '../lib/kafka/record.js';
import type { KafkaEvent, KafkaRecord } from '../lib/kafka/types.js';

// Moved to lib/kafka; still importable from here.
export { DEAD_LETTER_HEADERS } from '../lib/kafka/deadLetter.js';
export { isRebalanceCommitError } from '../lib/kafka/commitScheduler.js';

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
  readonly capacity?: number | undefined;
  /** The consumer resumes once fewer than this many records are unacknowledged. Default `⌈capacity / 2⌉`. */
  readonly resumeBelow?: number | undefined;
  /** Where a group with no committed offset starts: the earliest message (default) or the next one. */
  readonly fromBeginning?: boolean | undefined;
  /**
   * Poison messages go here with the reason in their headers ({@link DEAD_LETTER_HEADERS}); their offsets are
   * committed and the stream goes on. Without it a poison message errors the stream.
   */
  readonly deadLetter?: DeadLetterOptions | undefined;
  /** Delay that gathers acknowledgements into one offset commit, in ms. Default 20. */
  readonly commitIntervalMs?: number | undefined;
  /** kafkajs consumer settings (session timeout, heartbeat, fetch sizes). */
  readonly consumer?: Omit<ConsumerConfig, 'groupId'> | undefined;
  /** Completes the stream (and closes the consumer) when it fires. */
  readonly signal?: AbortSignal | undefined;
  /** Instrumentation: joins, pauses, resumes, commits, dead letters. */
  readonly onEvent?: ((event: KafkaEvent) => void) | undefined;
  /** Receives, at teardown, the promise of the consumer's close (final commit, leave the group, disconnect). */
  readonly onClosed?: ((closing: Promise<void>) => void) | undefined;
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
  checkFlowLimits(capacity, resumeBelow, 'fromKafka');
  if (options.topics.length === 0) throw new ConfigError('fromKafka needs at least one topic');
  const settings: Settings<T> = {
    ...options,
    capacity,
    resumeBelow,
    commitIntervalMs: options.commitIntervalMs ?? 20,
    topics: [...options.topics],
  };
  return new Observable<KafkaRecord<T>>((subscriber) => consume(kafka, settings, subscriber));
}

/** {@link FromKafkaOptions} with the defaults resolved. */
interface Settings<T> extends FromKafkaOptions<T> {
  readonly capacity: number;
  readonly resumeBelow: number;
  readonly commitIntervalMs: number;
  readonly topics: string[];
}

/** What one subscription's batch handler works with. */
interface Consumption<T> {
  readonly decode: (bytes: Uint8Array) => T;
  readonly commits: CommitScheduler;
  readonly flow: FlowController;
  readonly deadLetter: DeadLetterWriter | undefined;
  readonly closed: () => boolean;
  readonly next: (record: KafkaRecord<T>) => void;
  readonly fail: (error: unknown) => void;
}

/** kafkajs consumer settings that {@link FromKafkaOptions.consumer} overrides. */
const CONSUMER_DEFAULTS = { sessionTimeout: 10_000, rebalanceTimeout: 20_000, heartbeatInterval: 1_000, maxWaitTimeInMs: 100 } as const;

/** One subscription: a consumer of its own, the state classes over it, and the teardown that closes it. */
function consume<T>(kafka: Kafka, settings: Settings<T>, subscriber: Subscriber<KafkaRecord<T>>): TeardownLogic {
  const { groupId, topics } = settings;
  const consumer = kafka.consumer({ ...CONSUMER_DEFAULTS, ...settings.consumer, groupId });
  let closed = false;
  const fail = (error: unknown): void => {
    if (!closed) subscriber.error(error);
  };
  const emit = eventSink(groupId, settings.onEvent);
  const work = consumption(consumer, settings, emit, { closed: () => closed, next: (record) => subscriber.next(record), fail });
  watchGroup(consumer, work.commits, emit, fail, groupId);

  const started = (async () => {
    await consumer.connect();
    await consumer.subscribe({ topics, fromBeginning: settings.fromBeginning ?? true });
    if (closed) return;
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      partitionsConsumedConcurrently: 1,
      eachBatch: (payload) => eachBatch(work, payload),
    });
  })();
  started.catch((cause: unknown) => {
    fail(new KafkaBridgeError(`Kafka consumer of group ${groupId} could not start: ${String(cause)}`, { cause }));
  });

  const onAbort = (): void => subscriber.complete();
  if (settings.signal?.aborted) onAbort();
  settings.signal?.addEventListener('abort', onAbort, { once: true });

  return () => {
    closed = true;
    work.flow.close();
    settings.signal?.removeEventListener('abort', onAbort);
    work.commits.stop();
    closeConsumer(consumer, started, work.commits, settings);
  };
}

/** The commit scheduler, flow controller and dead-letter writer of one subscription, wired to its consumer. */
function consumption<T>(
  consumer: Consumer,
  settings: Settings<T>,
  emit: KafkaEventSink,
  stream: Pick<Consumption<T>, 'closed' | 'next' | 'fail'>,
): Consumption<T> {
  const { groupId, topics } = settings;
  const commits = new CommitScheduler({
    commit: (offsets) => consumer.commitOffsets(offsets.map((o) => ({ ...o }))),
    intervalMs: settings.commitIntervalMs,
    emit,
    onGiveUp: stream.fail,
  });
  const flow = new FlowController({
    capacity: settings.capacity,
    resumeBelow: settings.resumeBelow,
    pause: () => consumer.pause(topics.map((topic) => ({ topic }))),
    resume: () => consumer.resume(topics.map((topic) => ({ topic }))),
    emit,
  });
  const target = settings.deadLetter;
  const deadLetter =
    target &&
    new DeadLetterWriter({
      topic: target.topic,
      groupId,
      send: (record) => target.producer.send(record),
      markDone: (topic, partition, offset) => commits.deliver(topic, partition, offset)(),
      emit,
    });
  return { ...stream, decode: settings.decode, commits, flow, deadLetter };
}

/** Reports joins (and forgets the partitions a rebalance took away) and crashes (fatal unless kafkajs restarts). */
function watchGroup(
  consumer: Consumer,
  commits: CommitScheduler,
  emit: KafkaEventSink,
  fail: (error: unknown) => void,
  groupId: string,
): void {
  consumer.on(consumer.events.GROUP_JOIN, (event) => {
    commits.retain(event.payload.memberAssignment);
    emit('kafka.join', { assignment: event.payload.memberAssignment, memberId: event.payload.memberId });
  });
  consumer.on(consumer.events.CRASH, (event) => {
    emit('kafka.crash', { error: String(event.payload.error), restart: event.payload.restart });
    if (!event.payload.restart) {
      fail(
        new KafkaBridgeError(`Kafka consumer of group ${groupId} crashed: ${String(event.payload.error)}`, { cause: event.payload.error }),
      );
    }
  });
}

/** Once the start settled: the final commit, then leaving the group; the outcome goes to `onClosed`. */
function closeConsumer<T>(consumer: Consumer, started: Promise<void>, commits: CommitScheduler, settings: Settings<T>): void {
  const closing = (async () => {
    await started.catch(() => undefined);
    await commits.flush().catch(() => undefined);
    await consumer.disconnect();
  })();
  const reported = closing.catch((cause: unknown) => {
    throw new KafkaBridgeError(`Kafka consumer of group ${settings.groupId} did not close cleanly: ${String(cause)}`, { cause });
  });
  if (settings.onClosed) settings.onClosed(reported);
  else reported.catch(() => undefined);
}

/**
 * Emits a batch's messages as records until the capacity is reached (then pauses: unresolved messages are
 * fetched again after the resume), dead-letters poison messages, and resolves what it handled.
 */
async function eachBatch<T>(
  work: Consumption<T>,
  { batch, resolveOffset, heartbeat, isRunning, isStale }: EachBatchPayload,
): Promise<void> {
  const { topic, partition } = batch;
  // kafkajs parses an offset on every resolve, so resolve once: the last message handled, before returning.
  let handled: string | undefined;
  const resolveHandled = (): void => {
    if (handled !== undefined) resolveOffset(handled);
    handled = undefined;
  };
  for (const message of batch.messages) {
    if (work.closed() || !isRunning() || isStale()) return resolveHandled();
    if (work.flow.full) {
      work.flow.pause();
      return resolveHandled();
    }
    let value: T;
    try {
      value = decodeValue(work.decode, message);
    } catch (error) {
      resolveHandled();
      if (!(await rejectPoison(work, topic, partition, message, error))) return;
      resolveOffset(message.offset);
      continue;
    }
    work.flow.admit();
    const ack = work.commits.deliver(topic, partition, message.offset);
    const record = new DeliveredRecord(value, topic, partition, message, ack, () => work.flow.release());
    handled = message.offset;
    work.next(record);
  }
  resolveHandled();
  if (!work.closed()) await heartbeat();
}

/** The message's decoded value; a tombstone (no value) is a {@link DecodeError}. */
function decodeValue<T>(decode: (bytes: Uint8Array) => T, message: KafkaMessage): T {
  if (message.value === null) throw new DecodeError('message has no value (a tombstone)');
  return decode(message.value);
}

/** Dead-letters a poison message; false (after failing the stream) when that is impossible or the send failed. */
async function rejectPoison<T>(
  work: Consumption<T>,
  topic: string,
  partition: number,
  message: KafkaMessage,
  error: unknown,
): Promise<boolean> {
  if (!(error instanceof DecodeError) || work.deadLetter === undefined) {
    work.fail(error);
    return false;
  }
  try {
    await work.deadLetter.write(topic, partition, message, error);
    return true;
  } catch (sendError) {
    work.fail(sendError);
    return false;
  }
}

/** Wraps a type and payload in the {@link KafkaEvent} envelope, numbering the ids within the group. */
function eventSink(groupId: string, onEvent: ((event: KafkaEvent) => void) | undefined): KafkaEventSink {
  let seq = 0;
  return (type, payload) => {
    onEvent?.({ id: `${groupId}#${seq++}`, type, timestamp: Date.now(), payload });
  };
}
