/**
 * A Kafka trainer commits the trajectories a checkpoint holds even when it has trained further meanwhile.
 *
 * Training goes on while a step's weights are published, so when the loop asks whether a checkpoint holds a step
 * (after publishing it), the trainer may be a step ahead. Asked about the trainer's current step instead of that one,
 * the answer was "no" at every checkpoint the trainer had overtaken: those records were never acknowledged, the
 * consumer filled its capacity (64 records: 16 steps of 4 trajectories) and paused for good, and the run stalled —
 * the fully-async chaos run under load ("step 58 of 60", then nothing; trained.jsonl and commits stopped 16 steps
 * after the last commit).
 *
 * Here the overtaking is made certain, on the real broker: the trainer's connection holds the announcement of version
 * 3 (the checkpointed step 2) until step 3 is trained, and the announcement of version 4 until the trajectories of
 * steps 0–2 are committed. One trajectories partition and groups of one sample: steps 0–2 are offsets 0–5.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join, sep } from 'node:path';

import type { ISocketFactory } from 'kafkajs';
import { describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { createKafka, ensureTopics } from '../../lib/kafka/client.js';
import { kafkaTopics, type KafkaEvent } from '../../lib/kafka/types.js';
import { runTraining, runWorker } from '../../pipelines/run.js';
import { trainedLines } from '../helpers/runDir.js';
import { waitFor } from '../helpers/waitFor.js';
import { brokers, kafkaClient, uniqueName } from '../kafka/helpers.js';

/** A request is held until its gate opens; later requests of its connection queue behind it, in order. */
interface Hold {
  /** Whether `request` (a whole Kafka request, size prefix first) must wait for `open`. */
  readonly matches: (request: Buffer) => boolean;
  readonly open: Promise<void>;
}

/** Kafka's Produce request (API key 0), as kafkajs writes it: one `write` of the size-prefixed request. */
function isProduce(request: Buffer, holding: string): boolean {
  return request.length > 6 && request.readInt16BE(4) === 0 && request.includes(holding);
}

/** kafkajs connections that hold the requests `holds` match until their gates open (a slow link, one way). */
function holdingSockets(holds: readonly Hold[]): ISocketFactory {
  return ({ host, port, onConnect }) => {
    const socket: Socket = connect({ host, port }, onConnect);
    const write = socket.write.bind(socket) as (chunk: Buffer, encoding?: BufferEncoding) => boolean;
    let queue = Promise.resolve();
    let queued = 0;
    socket.write = ((chunk: Buffer, encoding?: BufferEncoding) => {
      const hold = Buffer.isBuffer(chunk) ? holds.find((h) => h.matches(chunk)) : undefined;
      if (hold === undefined && queued === 0) return write(chunk, encoding);
      queued++;
      queue = queue
        .then(() => hold?.open)
        .then(() => {
          queued--;
          if (!socket.destroyed) write(chunk, encoding);
        });
      return true;
    }) as Socket['write'];
    return socket;
  };
}

describe('a Kafka trainer a step ahead of its publishing', () => {
  it('commits the trajectories of a checkpointed step it has overtaken', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-commit-ahead-'));
    try {
      const topics = kafkaTopics(uniqueName('ahead'));
      await ensureTopics(kafkaClient('rxrl-ahead-admin'), topics, { tasks: 2, trajectories: 1 });
      const runDir = join(dir, 'run');
      const config = loadConfig({
        env: {},
        values: {
          run: { dir: runDir, seed: 3, steps: 6, backend: 'cpu' },
          data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
          model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
          rollout: { groupSize: 1 },
          sync: { mode: 'fully-async', batchSize: 2, capacity: 4 },
          checkpoint: { every: 3, keepLast: 2 },
          validation: { beforeTrain: false },
          kafka: { workerConcurrency: 2 },
        },
      });
      // Steps 0–2 (version 3, checkpointed) are offsets 0–5 of the one trajectories partition.
      const committed = { offset: 0, beforeVersion4: false };
      let sawCommit!: () => void;
      const commit = new Promise<void>((resolve) => (sawCommit = resolve));
      const onEvent = (event: KafkaEvent): void => {
        if (event.type !== 'kafka.commit') return;
        for (const o of event.payload.offsets as { topic: string; offset: string }[]) {
          if (o.topic === topics.trajectories) committed.offset = Math.max(committed.offset, Number(o.offset));
        }
        if (committed.offset >= 6) sawCommit();
      };
      const stepThree = waitFor(() => trainedLines(runDir).length >= 4, { timeoutMs: 300_000 }).catch(() => undefined);
      // Version 4 goes out once steps 0–2 are committed; a trainer that never commits them is let go after 120 s.
      const versionFour = Promise.race([commit, new Promise((resolve) => setTimeout(resolve, 120_000).unref())]).then(() => {
        committed.beforeVersion4 = committed.offset >= 6;
      });
      const weights = (version: number): string => `policy${sep}v${version}`;
      const kafka = createKafka(brokers(), {
        clientId: 'rxrl-ahead-trainer',
        logLevel: 'error',
        config: {
          socketFactory: holdingSockets([
            { matches: (r) => isProduce(r, weights(3)), open: stepThree },
            { matches: (r) => isProduce(r, weights(4)), open: versionFour },
          ]),
        },
      });
      const worker = runWorker(config, { kafka: kafkaClient('rxrl-ahead-worker'), topics, workerId: uniqueName('w') });
      const summary = await runTraining(config, { kafka: { kafka, topics, weightsDir: join(runDir, 'weights'), onEvent } });
      await worker;
      expect(summary.steps).toBe(6);
      const lines = trainedLines(runDir);
      expect(lines.map((l) => l.step)).toEqual([0, 1, 2, 3, 4, 5]);
      // Step 2's weights went out only once step 3 was trained: the trainer was a step ahead when it asked whether a
      // checkpoint holds step 2 (version 3, checkpointed). It does, so steps 0–2 were committed then.
      expect(committed.beforeVersion4, `trajectory offsets committed before version 4 went out: ${committed.offset}`).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  }, 600_000);
});
