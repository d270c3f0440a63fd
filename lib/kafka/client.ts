/**
 * kafkajs clients configured the way the bridge needs them: a quiet logger, idempotent producers with
 * `acks: -1`, and topic creation that tolerates a concurrent creator.
 *
 * @packageDocumentation
 */
import { Kafka, Partitioners, logLevel, type Admin, type KafkaConfig, type LogEntry, type Producer, type ProducerConfig } from 'kafkajs';

import { ConfigError, isRetriable } from '../core/errors.js';
import { retry } from '../core/retry.js';
import { causeIsRetriable, KafkaBridgeError } from './errors.js';
import type { KafkaTopics } from './types.js';

/** kafkajs log levels by name (`RXRL_KAFKA_LOG`). */
const LOG_LEVELS: Readonly<Record<string, logLevel>> = {
  nothing: logLevel.NOTHING,
  error: logLevel.ERROR,
  warn: logLevel.WARN,
  info: logLevel.INFO,
  debug: logLevel.DEBUG,
};

/** Options of {@link createKafka}. */
export interface CreateKafkaOptions {
  /** Client id sent to the broker. Default `rxrl`. */
  readonly clientId?: string;
  /**
   * Least severe kafkajs log entry written to stderr (one JSON line each). Default: `RXRL_KAFKA_LOG` or `warn`.
   * Protocol error responses that kafkajs retries on its own (a coordinator still loading, a leader moving) are
   * written at `debug` only.
   */
  readonly logLevel?: 'nothing' | 'error' | 'warn' | 'info' | 'debug';
  /** Other kafkajs settings (retry, timeouts, TLS, SASL). */
  readonly config?: Omit<KafkaConfig, 'brokers' | 'clientId' | 'logLevel' | 'logCreator'>;
}

/**
 * A kafkajs client for `brokers`.
 *
 * @param brokers - `host:port` list, or a comma-separated string such as `KAFKA_BROKERS`.
 * @param options - client id, log level and other kafkajs settings.
 * @throws {@link ConfigError} when no broker is given.
 */
export function createKafka(brokers: string | readonly string[], options: CreateKafkaOptions = {}): Kafka {
  const list = parseBrokers(brokers);
  const levelName = options.logLevel ?? process.env.RXRL_KAFKA_LOG ?? 'warn';
  const level = LOG_LEVELS[levelName];
  if (level === undefined) {
    throw new ConfigError(`unknown Kafka log level '${levelName}'; valid: ${Object.keys(LOG_LEVELS).join(', ')}`);
  }
  return new Kafka({
    retry: { initialRetryTime: 100, retries: 8 },
    ...options.config,
    brokers: list,
    clientId: options.clientId ?? 'rxrl',
    logLevel: level,
    logCreator: () => (entry: LogEntry) => {
      const effective = routine(entry) ? logLevel.DEBUG : entry.level;
      if (effective > level || effective === logLevel.NOTHING) return;
      const { message, timestamp: _timestamp, logger: _logger, ...rest } = entry.log;
      process.stderr.write(
        `${JSON.stringify({ level: logLevel[entry.level], module: 'kafka', namespace: entry.namespace, msg: message, ...rest })}\n`,
      );
    },
  });
}

/**
 * Log entries that describe conditions kafkajs handles itself: protocol error responses it retries (a coordinator
 * still loading, a leader moving, a topic created concurrently), rejoining a rebalancing group, and its warning that bounded retries weaken the
 * idempotent producer (the bridge bounds them on purpose: a send that keeps failing errors the stream instead of
 * hanging, and nothing resends it behind the broker's back).
 */
function routine(entry: LogEntry): boolean {
  const message = entry.log.message;
  return (
    (entry.namespace === 'Connection' && message.startsWith('Response')) ||
    message.includes('Retrying') ||
    (entry.namespace === 'Runner' && message.startsWith('The group is rebalancing')) ||
    message.startsWith('Limiting retries for the idempotent producer')
  );
}

/**
 * Splits a broker list (`a:9092,b:9092`) and checks it is not empty.
 *
 * @throws {@link ConfigError} when the list is empty.
 */
export function parseBrokers(brokers: string | readonly string[]): string[] {
  const list = (typeof brokers === 'string' ? brokers.split(',') : [...brokers]).map((b) => b.trim()).filter(Boolean);
  if (list.length === 0) throw new ConfigError('no Kafka broker given (set KAFKA_BROKERS=host:port[,host:port])');
  return list;
}

/**
 * An idempotent producer: the broker deduplicates retried sends (`acks: -1` on every send, one request in
 * flight per connection so retries keep their order), with the Java-compatible partitioner.
 *
 * @param kafka - the client.
 * @param config - overrides (the idempotence settings cannot be turned off here).
 */
export function createProducer(kafka: Kafka, config: Omit<ProducerConfig, 'idempotent'> = {}): Producer {
  return kafka.producer({
    createPartitioner: Partitioners.DefaultPartitioner,
    ...config,
    idempotent: true,
    maxInFlightRequests: 1,
  });
}

/** Partition counts of {@link ensureTopics}. */
export interface TopicPartitions {
  /** Partitions of the tasks topic: the most workers that can share the work. Default 8. */
  readonly tasks?: number;
  /** Partitions of the trajectories topic. Default 4. */
  readonly trajectories?: number;
}

/**
 * Creates the topics of a deployment if they do not exist (weights, dead-letter and heartbeat topics get one
 * partition, so announcements stay in order). Safe to call from several processes at once.
 *
 * @param kafka - the client.
 * @param topics - the topic names.
 * @param partitions - partition counts of the tasks and trajectories topics.
 * @param signal - cancels the wait.
 * @throws {@link KafkaBridgeError} when the admin client fails.
 */
export async function ensureTopics(
  kafka: Kafka,
  topics: KafkaTopics,
  partitions: TopicPartitions = {},
  signal?: AbortSignal,
): Promise<void> {
  const wanted = [
    { topic: topics.tasks, numPartitions: partitions.tasks ?? 8 },
    { topic: topics.trajectories, numPartitions: partitions.trajectories ?? 4 },
    { topic: topics.weights, numPartitions: 1 },
    { topic: topics.deadLetter, numPartitions: 1 },
    { topic: topics.heartbeats, numPartitions: 1 },
  ];
  const admin = kafka.admin();
  try {
    await admin.connect();
    signal?.throwIfAborted();
    const existing = new Set(await admin.listTopics());
    const missing = wanted.filter((t) => !existing.has(t.topic));
    if (missing.length === 0) return;
    try {
      await admin.createTopics({ topics: missing, waitForLeaders: true });
    } catch (error) {
      // Another process may have created them between our listing and our request, or the broker created them but
      // its metadata lags behind (kafkajs then gives up on "does not host this topic-partition"): wait for them.
      if (!causeIsRetriable(error) && !isAggregateError(error)) throw error;
      await topicsReady(
        admin,
        missing.map((t) => t.topic),
        signal,
      );
    }
  } catch (cause) {
    if (signal?.aborted) throw cause;
    throw new KafkaBridgeError(`could not create topics ${wanted.map((t) => t.topic).join(', ')}: ${String(cause)}`, {
      cause,
    });
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

/** How long topics just created may take to be listed with a leader for every partition (a loaded broker lags). */
const TOPICS_READY_MS = 60_000;

/**
 * Resolves once every topic of `names` is listed and each of its partitions has a leader; retries (lib/core/retry.ts)
 * until {@link TOPICS_READY_MS}, or rejects with an AbortError when `signal` fires.
 */
async function topicsReady(admin: Admin, names: readonly string[], signal: AbortSignal | undefined): Promise<void> {
  await retry(
    async () => {
      const listed = new Set(await admin.listTopics());
      const absent = names.filter((name) => !listed.has(name));
      if (absent.length > 0) throw new KafkaBridgeError(`topics not listed yet: ${absent.join(', ')}`, { retriable: true });
      const { topics } = await admin.fetchTopicMetadata({ topics: [...names] });
      const leaderless = topics.filter((t) => t.partitions.some((p) => p.leader < 0)).map((t) => t.name);
      if (leaderless.length > 0) throw new KafkaBridgeError(`topics without a leader yet: ${leaderless.join(', ')}`, { retriable: true });
    },
    {
      retries: Infinity,
      deadlineMs: TOPICS_READY_MS,
      signal,
      isRetriable: (error) => isRetriable(error) || causeIsRetriable(error),
    },
  );
}

/** True for kafkajs's KafkaJSAggregateError (some topics existed already); by name: kafkajs is CommonJS and does not
 * export it to ESM by name. */
function isAggregateError(error: unknown): boolean {
  return error instanceof Error && error.name === 'KafkaJSAggregateError';
}
