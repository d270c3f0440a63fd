/**
 * Kafka bridge throughput: trajectories per second through `toKafka` → broker → `fromKafka` (encode, idempotent
 * `acks: -1` produce, consume with pause/resume bookkeeping, decode, acknowledge, commit), versus raw kafkajs moving
 * the same bytes (the same pre-encoded messages, the same idempotent producer and batch size, an `eachBatch`
 * consumer with kafkajs auto-commit, no decoding). Same broker, same process. Rounds alternate the two paths (and
 * which goes first), because the machine is shared and its speed drifts: `ratio` is the median over rounds of
 * rxrl/raw within a round (paired, so drift cancels); `ratioOfMedians` divides the two medians.
 *
 * Usage: `npm run bench -- kafka [--count 20000] [--rounds 7] [--partitions 4] [--response 64]`. Uses
 * `KAFKA_BROKERS`, or starts the pinned local broker (`lib/kafka/broker.ts`) for the run. Prints one JSON line.
 *
 * @packageDocumentation
 */
import { randomBytes } from 'node:crypto';

import type { Kafka, Message, Producer } from 'kafkajs';
import { Subject, firstValueFrom, from, lastValueFrom, take, tap } from 'rxjs';

import { startKafkaBroker, kafkaVersion, type KafkaBroker } from '../lib/kafka/broker.js';
import { createKafka, createProducer } from '../lib/kafka/client.js';
import { decodeTrajectoryMessage, encodeTrajectoryMessage } from '../lib/kafka/codec.js';
import type { KafkaEvent, TrajectoryMessage } from '../lib/kafka/types.js';
import type { Trajectory } from '../lib/core/types.js';
import { fromKafka } from '../operators/fromKafka.js';
import { toKafka } from '../operators/toKafka.js';
import { median } from './_stats.js';

/** Messages per produce request, for both paths. */
const BATCH = 500;

function flag(args: readonly string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : undefined;
}

function makeTrajectories(count: number, responseLength: number): TrajectoryMessage[] {
  return Array.from({ length: count }, (_, i) => {
    const groupId = `task-${Math.floor(i / 8)}@0`;
    const trajectory: Trajectory = {
      id: `${groupId}/${i % 8}`,
      taskId: `task-${Math.floor(i / 8)}`,
      groupId,
      runId: i % 8,
      modelTag: 'policy',
      policyVersion: 3,
      promptTokens: Array.from({ length: 32 }, (_, t) => (t * 7 + i) % 50),
      responseTokens: Array.from({ length: responseLength }, (_, t) => (t * 13 + i) % 50),
      logprobs: Array.from({ length: responseLength }, (_, t) => -0.01 * ((t + i) % 300)),
      lossMask: Array.from({ length: responseLength }, () => 1),
      reward: (i % 5) / 4,
      finishReason: 'stop',
      metrics: { accuracy: i % 2 },
      task: { id: `task-${Math.floor(i / 8)}`, prompt: 'abcd=', answer: 'dcba' },
    };
    return { run: 'bench', output: trajectory };
  });
}

async function createTopic(kafka: Kafka, partitions: number): Promise<string> {
  const topic = `bench-${randomBytes(4).toString('hex')}`;
  const admin = kafka.admin();
  await admin.connect();
  await admin.createTopics({ topics: [{ topic, numPartitions: partitions }], waitForLeaders: true });
  await admin.disconnect();
  return topic;
}

/** toKafka → broker → fromKafka; seconds from the first send to the last acknowledged record. */
async function rxrlRound(kafka: Kafka, producer: Producer, items: readonly TrajectoryMessage[], partitions: number): Promise<number> {
  const topic = await createTopic(kafka, partitions);
  const joined = new Subject<void>();
  let closing: Promise<void> = Promise.resolve();
  const received = lastValueFrom(
    fromKafka(kafka, {
      groupId: `${topic}-rx`,
      topics: [topic],
      decode: decodeTrajectoryMessage,
      capacity: 4096,
      onEvent: (e: KafkaEvent) => e.type === 'kafka.join' && joined.next(),
      onClosed: (c) => (closing = c),
    }).pipe(
      tap((record) => record.ack()),
      take(items.length),
    ),
  );
  await firstValueFrom(joined);
  const started = performance.now();
  await lastValueFrom(
    from(items).pipe(toKafka(producer, { topic, encode: encodeTrajectoryMessage, key: (m) => m.output.groupId, maxBatchSize: BATCH })),
  );
  await received;
  const seconds = (performance.now() - started) / 1000;
  await closing;
  return seconds;
}

/** Raw kafkajs: the same bytes, the same producer settings, an eachBatch consumer with auto-commit. */
async function rawRound(kafka: Kafka, producer: Producer, messages: readonly Message[], partitions: number): Promise<number> {
  const topic = await createTopic(kafka, partitions);
  const consumer = kafka.consumer({ groupId: `${topic}-raw`, maxWaitTimeInMs: 100, sessionTimeout: 10_000, heartbeatInterval: 1_000 });
  await consumer.connect();
  await consumer.subscribe({ topics: [topic], fromBeginning: true });
  let count = 0;
  let done!: () => void;
  const all = new Promise<void>((resolve) => (done = resolve));
  const joined = new Promise<void>((resolve) => consumer.on(consumer.events.GROUP_JOIN, () => resolve()));
  await consumer.run({
    eachBatch: async ({ batch }) => {
      count += batch.messages.length;
      if (count >= messages.length) done();
    },
  });
  await joined;
  const started = performance.now();
  for (let i = 0; i < messages.length; i += BATCH) {
    await producer.send({ topic, acks: -1, messages: messages.slice(i, i + BATCH) });
  }
  await all;
  const seconds = (performance.now() - started) / 1000;
  await consumer.disconnect();
  return seconds;
}

/** Runs the benchmark; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const count = Number(flag(args, '--count') ?? 20_000);
  const rounds = Number(flag(args, '--rounds') ?? 7);
  const partitions = Number(flag(args, '--partitions') ?? 4);
  const responseLength = Number(flag(args, '--response') ?? 64);
  let broker: KafkaBroker | undefined;
  const brokers = process.env.KAFKA_BROKERS ?? (broker = await startKafkaBroker()).brokers;
  const kafka = createKafka(brokers, { clientId: 'rxrl-bench', logLevel: 'error' });
  const producer = createProducer(kafka);
  await producer.connect();
  try {
    const items = makeTrajectories(count, responseLength);
    // The raw path moves the same bytes, encoded once up front.
    const messages: Message[] = items.map((m) => ({ key: m.output.groupId, value: Buffer.from(encodeTrajectoryMessage(m)) }));
    const bytes = messages.reduce((n, m) => n + (m.value as Buffer).length, 0);
    // Warm-up: JIT, connections, the group coordinator.
    const warm = items.slice(0, Math.min(count, 5000));
    for (let w = 0; w < 2; w++) {
      await rawRound(kafka, producer, messages.slice(0, warm.length), partitions);
      await rxrlRound(kafka, producer, warm, partitions);
    }
    const rx: number[] = [];
    const raw: number[] = [];
    for (let r = 0; r < rounds; r++) {
      if (r % 2 === 0) {
        raw.push(await rawRound(kafka, producer, messages, partitions));
        rx.push(await rxrlRound(kafka, producer, items, partitions));
      } else {
        rx.push(await rxrlRound(kafka, producer, items, partitions));
        raw.push(await rawRound(kafka, producer, messages, partitions));
      }
    }
    const rxRate = count / median(rx);
    const rawRate = count / median(raw);
    const paired = median(rx.map((seconds, r) => raw[r] / seconds));
    console.log(
      JSON.stringify({
        bench: 'kafka',
        kafka: broker?.version ?? (await kafkaVersion().catch(() => 'external')),
        brokers: broker ? 'local' : 'KAFKA_BROKERS',
        trajectories: count,
        bytesPerTrajectory: Math.round(bytes / count),
        responseTokens: responseLength,
        partitions,
        batch: BATCH,
        rounds,
        rxrlTrajectoriesPerSecond: Math.round(rxRate),
        rawTrajectoriesPerSecond: Math.round(rawRate),
        ratio: Number(paired.toFixed(3)),
        ratioOfMedians: Number((rxRate / rawRate).toFixed(3)),
        rxrlSeconds: rx.map((s) => Number(s.toFixed(3))),
        rawSeconds: raw.map((s) => Number(s.toFixed(3))),
      }),
    );
  } finally {
    await producer.disconnect();
    await broker?.stop();
  }
}
