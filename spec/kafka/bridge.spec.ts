/** toKafka and fromKafka against the real broker. */
import type { Kafka, Producer } from 'kafkajs';
import { firstValueFrom, from, lastValueFrom, map, take, tap, toArray, type Subscription } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { MultiAgentEnvironment } from '../../lib/agent/environment.js';
import { DecodeError } from '../../lib/core/errors.js';
import { createProducer } from '../../lib/kafka/client.js';
import { decodeTrajectoryMessage, encodeTrajectoryMessage } from '../../lib/kafka/codec.js';
import { KafkaBridgeError } from '../../lib/kafka/errors.js';
import type { KafkaEvent, KafkaRecord, TrajectoryMessage } from '../../lib/kafka/types.js';
import type { Trajectory } from '../../lib/core/types.js';
import { DEAD_LETTER_HEADERS, fromKafka } from '../../operators/fromKafka.js';
import { groupTrajectories } from '../../operators/groupTrajectories.js';
import { rolloutEpisodes } from '../../operators/rolloutEpisodes.js';
import { toKafka } from '../../operators/toKafka.js';
import { ScriptedEngine, task, traj } from '../helpers/fixtures.js';
import { committedOffsets, createTopic, kafkaClient, produce, readMessages, uniqueName, waitFor } from './helpers.js';

let kafka: Kafka;
let producer: Producer;

beforeAll(async () => {
  kafka = kafkaClient();
  producer = createProducer(kafka);
  await producer.connect();
});

afterAll(async () => {
  await producer?.disconnect();
});

const encode = (t: Trajectory): Uint8Array => encodeTrajectoryMessage({ run: 'r', output: t });
const trajectories = (n: number, group = 'g'): Trajectory[] => Array.from({ length: n }, (_, i) => traj(`${group}${i}@0`, 0));

/** Publishes `items` with toKafka and returns them in acknowledgement order. */
async function publish(topic: string, items: Trajectory[]): Promise<Trajectory[]> {
  return lastValueFrom(from(items).pipe(toKafka(producer, { topic, encode, key: (t) => t.groupId }), toArray()));
}

/** Subscribes fromKafka and collects records; `close()` unsubscribes and waits for the consumer to leave. */
function consume(
  topic: string,
  groupId: string,
  options: { capacity?: number; autoAck?: boolean; deadLetter?: string; onError?: (e: unknown) => void } = {},
): { records: KafkaRecord<TrajectoryMessage>[]; events: KafkaEvent[]; close: () => Promise<void>; subscription: Subscription } {
  const records: KafkaRecord<TrajectoryMessage>[] = [];
  const events: KafkaEvent[] = [];
  let closing: Promise<void> = Promise.resolve();
  const subscription = fromKafka(kafka, {
    groupId,
    topics: [topic],
    decode: decodeTrajectoryMessage,
    capacity: options.capacity,
    deadLetter: options.deadLetter === undefined ? undefined : { producer, topic: options.deadLetter },
    onEvent: (e) => events.push(e),
    onClosed: (p) => (closing = p),
  }).subscribe({
    next: (record) => {
      records.push(record);
      if (options.autoAck) record.ack();
    },
    error: (e: unknown) => options.onError?.(e),
  });
  return {
    records,
    events,
    subscription,
    close: async () => {
      subscription.unsubscribe();
      await closing;
    },
  };
}

describe('toKafka → broker → fromKafka', () => {
  it('moves trajectories intact, acknowledged in input order, and commits what was acked', async () => {
    const topic = uniqueName('bridge');
    const group = uniqueName('group');
    await createTopic(kafka, topic, 3);
    const items = trajectories(120);
    const acked = await publish(topic, items);
    expect(acked.map((t) => t.id)).toEqual(items.map((t) => t.id));

    const c = consume(topic, group, { autoAck: true });
    await waitFor(() => c.records.length >= items.length, { what: '120 records' });
    const ids = c.records.map((r) => (r.value.output as Trajectory).id).sort();
    expect(ids).toEqual(items.map((t) => t.id).sort());
    const byId = new Map(items.map((t) => [t.id, t]));
    for (const record of c.records) {
      const output = record.value.output as Trajectory;
      expect(output).toEqual(byId.get(output.id));
    }
    expect(c.records.every((r) => r.key === (r.value.output as Trajectory).groupId)).toBe(true);
    await waitFor(async () => [...(await committedOffsets(kafka, group, topic)).values()].reduce((a, b) => a + Math.max(b, 0), 0) === 120, {
      what: 'all 120 offsets committed',
    });
    await c.close();
  });

  it('pauses at capacity and resumes as records are acknowledged; never more than capacity in flight', async () => {
    const topic = uniqueName('pause');
    await createTopic(kafka, topic, 2);
    await publish(topic, trajectories(40));
    const c = consume(topic, uniqueName('group'), { capacity: 6 });
    await waitFor(() => c.events.some((e) => e.type === 'kafka.pause'), { what: 'a pause' });
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(c.records).toHaveLength(6); // nothing more while nothing is acknowledged

    let acked = 0;
    while (acked < 40) {
      await waitFor(() => c.records.length > acked, { what: `record ${acked + 1}` });
      expect(c.records.length - acked).toBeLessThanOrEqual(6);
      c.records[acked++].ack();
    }
    expect(c.records).toHaveLength(40);
    expect(c.events.filter((e) => e.type === 'kafka.resume').length).toBeGreaterThan(0);
    await c.close();
  });

  it('commits only acknowledged work: unacknowledged records are delivered again to the next member', async () => {
    const topic = uniqueName('redeliver');
    const group = uniqueName('group');
    await createTopic(kafka, topic, 1);
    const items = trajectories(10);
    await publish(topic, items);

    const first = consume(topic, group);
    await waitFor(() => first.records.length === 10, { what: '10 records' });
    // Out of order: 0..3 done, 5 done, 4 not.
    for (const i of [3, 1, 0, 2, 5]) first.records[i].ack();
    await waitFor(async () => (await committedOffsets(kafka, group, topic)).get(0) === 4, { what: 'offset 4 committed' });
    await first.close();
    expect((await committedOffsets(kafka, group, topic)).get(0)).toBe(4);

    const second = consume(topic, group, { autoAck: true });
    await waitFor(() => second.records.length === 6, { what: 'the 6 unfinished records again' });
    expect(second.records.map((r) => Number(r.offset))).toEqual([4, 5, 6, 7, 8, 9]);
    await waitFor(async () => (await committedOffsets(kafka, group, topic)).get(0) === 10, { what: 'offset 10 committed' });
    await second.close();
  });

  it('sends a poison message to the dead-letter topic with the reason, commits it and goes on', async () => {
    const topic = uniqueName('poison');
    const dlq = uniqueName('dlq');
    const group = uniqueName('group');
    await createTopic(kafka, topic, 1);
    await createTopic(kafka, dlq, 1);
    await produce(kafka, topic, [
      { key: 'a', value: Buffer.from(encode(traj('a@0', 0))) },
      { key: 'bad', value: Buffer.from('{"not":"rxrl"}'), headers: { origin: 'spec' } },
      { key: 'b', value: Buffer.from(encode(traj('b@0', 0))) },
    ]);
    const c = consume(topic, group, { autoAck: true, deadLetter: dlq });
    await waitFor(() => c.records.length === 2, { what: 'the two good records' });
    expect(c.records.map((r) => r.key)).toEqual(['a', 'b']);
    const [dead] = await readMessages(kafka, dlq, 1);
    expect(dead.key?.toString()).toBe('bad');
    expect(dead.value?.toString()).toBe('{"not":"rxrl"}');
    expect(dead.headers?.[DEAD_LETTER_HEADERS.reason]?.toString()).toMatch(/not a rxrl.v1.TrajectoryRecord record/);
    expect(dead.headers?.[DEAD_LETTER_HEADERS.error]?.toString()).toBe('DecodeError');
    expect(dead.headers?.[DEAD_LETTER_HEADERS.offset]?.toString()).toBe('1');
    expect(dead.headers?.[DEAD_LETTER_HEADERS.topic]?.toString()).toBe(topic);
    expect(dead.headers?.origin?.toString()).toBe('spec');
    expect(c.events.filter((e) => e.type === 'kafka.dead_letter')).toHaveLength(1);
    await waitFor(async () => (await committedOffsets(kafka, group, topic)).get(0) === 3, { what: 'offset 3 committed' });
    await c.close();
  });

  it('without a dead-letter topic a poison message errors the stream with a DecodeError', async () => {
    const topic = uniqueName('poison-nodlq');
    await createTopic(kafka, topic, 1);
    await produce(kafka, topic, [{ value: Buffer.from([0x72, 0x78, 2, 2, 0]) }]);
    const errors: unknown[] = [];
    const c = consume(topic, uniqueName('group'), { onError: (e) => errors.push(e) });
    await waitFor(() => errors.length === 1, { what: 'the decode error' });
    expect(errors[0]).toBeInstanceOf(DecodeError);
    await c.close();
  });

  it('unsubscribing closes the consumer and leaves the group', async () => {
    const topic = uniqueName('close');
    const group = uniqueName('group');
    await createTopic(kafka, topic, 1);
    await publish(topic, trajectories(3));
    const record = await firstValueFrom(
      fromKafka(kafka, { groupId: group, topics: [topic], decode: decodeTrajectoryMessage, onClosed: () => undefined }).pipe(take(1)),
    );
    expect(record.offset).toBe('0');
    const admin = kafka.admin();
    await admin.connect();
    await waitFor(
      async () => {
        const { groups } = await admin.describeGroups([group]);
        return groups[0]?.members.length === 0;
      },
      { what: 'the group to be empty' },
    );
    await admin.disconnect();
  });

  it('completes and closes its consumer when its signal fires', async () => {
    const topic = uniqueName('signal');
    await createTopic(kafka, topic, 1);
    await publish(topic, trajectories(2));
    const controller = new AbortController();
    let closing: Promise<void> | undefined;
    const seen: string[] = [];
    const done = lastValueFrom(
      fromKafka(kafka, {
        groupId: uniqueName('group'),
        topics: [topic],
        decode: decodeTrajectoryMessage,
        signal: controller.signal,
        onClosed: (c) => (closing = c),
      }).pipe(
        tap((record) => {
          seen.push(record.offset);
          record.ack();
          if (seen.length === 2) controller.abort();
        }),
      ),
      { defaultValue: undefined },
    );
    await done;
    expect(seen).toEqual(['0', '1']);
    await closing;
  });

  it('toKafka errors the stream with a KafkaBridgeError when the broker rejects the send', async () => {
    const idle = createProducer(kafka); // never connected
    const result = lastValueFrom(from(trajectories(2)).pipe(toKafka(idle, { topic: uniqueName('nowhere'), encode })));
    await expect(result).rejects.toBeInstanceOf(KafkaBridgeError);
  });
});

describe('multi-agent trajectories across a topic', () => {
  it('episodes published with toKafka keep their tags and slots: the far side groups them per policy', async () => {
    const topic = uniqueName('episodes');
    await createTopic(kafka, topic, 2);
    // writer, editor, writer; tasks 'short' end after the writer's first turn, so two of their slots are skipped.
    const environment: MultiAgentEnvironment = {
      turnOrder: ['writer', 'editor'],
      maxTurns: 3,
      reset: (t) => ({
        observe: (agent) => `${t.prompt}${agent[0]}`,
        step: (agent, _r, turn) => ({ rewards: { [agent]: turn + 1 }, done: t.id === 'short' && turn === 0 }),
      }),
    };
    const engines = new Map([
      ['w', new ScriptedEngine()],
      ['e', new ScriptedEngine()],
    ]);
    const published = await lastValueFrom(
      from([task('long'), task('short')]).pipe(
        rolloutEpisodes(engines, {
          environment,
          agents: [
            { name: 'writer', policy: 'w' },
            { name: 'editor', policy: 'e' },
          ],
          samplesPerTask: 2,
          concurrency: 4,
          maxTokens: 2,
        }),
        toKafka(producer, { topic, encode: (output) => encodeTrajectoryMessage({ run: 'r', output }), key: (output) => output.groupId }),
        toArray(),
      ),
    );
    expect(published).toHaveLength(2 * 2 * 3);
    const groups = await lastValueFrom(
      fromKafka(kafka, { groupId: uniqueName('group'), topics: [topic], decode: decodeTrajectoryMessage }).pipe(
        tap((record) => record.ack()),
        map((record) => record.value.output),
        take(published.length),
        groupTrajectories({ keys: ['groupId'], groupSize: 2 }),
        toArray(),
      ),
    );
    const summary = groups.map((g) => [g.key[0], g.modelTag, g.trajectories.map((t) => t.reward), g.failed ?? 0]).sort();
    expect(summary).toEqual([
      ['long@0/editor/1', 'e', [2, 2], 0],
      ['long@0/writer/0', 'w', [4, 4], 0],
      ['long@0/writer/2', 'w', [3, 3], 0],
      ['short@0/editor/1', 'e', [], 2],
      ['short@0/writer/0', 'w', [1, 1], 0],
      ['short@0/writer/2', 'w', [], 2],
    ]);
  });
});
