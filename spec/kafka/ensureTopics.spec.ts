/**
 * ensureTopics against a real broker: several processes creating a deployment's topics at once all go on, each
 * once every partition has a leader (a loaded broker's metadata lags behind its creation, and kafkajs gives up on
 * "does not host this topic-partition"); a stop signal ends the wait.
 */
import { describe, expect, it } from 'vitest';

import { ensureTopics } from '../../lib/kafka/client.js';
import { kafkaTopics } from '../../lib/kafka/types.js';
import { kafkaClient, uniqueName } from './helpers.js';

describe('ensureTopics', () => {
  it('four clients racing to create the same topics all resolve, with a leader for every partition', async () => {
    const topics = kafkaTopics(uniqueName('race'));
    const clients = Array.from({ length: 4 }, (_, i) => kafkaClient(`rxrl-spec-race-${i}`));
    await Promise.all(clients.map((kafka) => ensureTopics(kafka, topics, { tasks: 4, trajectories: 2 })));
    const admin = clients[0].admin();
    await admin.connect();
    try {
      const names = [topics.tasks, topics.trajectories, topics.weights, topics.deadLetter, topics.heartbeats];
      const { topics: metadata } = await admin.fetchTopicMetadata({ topics: names });
      expect(metadata.map((t) => [t.name, t.partitions.length]).sort()).toEqual(
        [
          [topics.tasks, 4],
          [topics.trajectories, 2],
          [topics.weights, 1],
          [topics.deadLetter, 1],
          [topics.heartbeats, 1],
        ].sort(),
      );
      expect(metadata.flatMap((t) => t.partitions.filter((p) => p.leader < 0))).toEqual([]);
    } finally {
      await admin.disconnect();
    }
  });

  it('a stop signal that has fired ends it before any topic is created', async () => {
    const topics = kafkaTopics(uniqueName('stopped'));
    const kafka = kafkaClient('rxrl-spec-stopped');
    const stop = new AbortController();
    stop.abort();
    await expect(ensureTopics(kafka, topics, {}, stop.signal)).rejects.toThrow();
    const admin = kafka.admin();
    await admin.connect();
    try {
      expect((await admin.listTopics()).filter((name) => name.startsWith(topics.tasks.split('.')[0]))).toEqual([]);
    } finally {
      await admin.disconnect();
    }
  });
});
