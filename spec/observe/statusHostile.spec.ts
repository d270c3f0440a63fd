/**
 * Issue 53 row 1: Kafka heartbeats with hostile worker ids, and the status server under them. The audit's attack
 * (1,030 heartbeats whose worker ids are hundreds of KB) is replayed in-process on the path the trainer takes:
 * bytes → `decodeHeartbeatMessage` → `ActivityTracker.heartbeat` → `GET /status`, `GET /metrics`.
 */
import { describe, expect, it } from 'vitest';

import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { ConfigError, DecodeError } from '../../lib/core/errors.js';
import { createKafka } from '../../lib/kafka/client.js';
import { decodeHeartbeatMessage, encodeHeartbeatMessage } from '../../lib/kafka/codec.js';
import { kafkaTopics, type HeartbeatMessage } from '../../lib/kafka/types.js';
import { WORKER_ID_MAX_LENGTH } from '../../lib/kafka/workerId.js';
import { kafkaRolloutWorker } from '../../pipelines/kafkaRolloutWorker.js';
import {
  ActivityTracker,
  DEFAULT_STATUS_MAX_BYTES,
  MAX_ERROR_MESSAGE_LENGTH,
  MAX_TRACKED_WORKERS,
  boundedStatus,
  serveStatus,
  type RunStatus,
} from '../../lib/observe/index.js';

const beat = (worker: string, run = 'run-a'): HeartbeatMessage => ({
  worker,
  run,
  inFlight: 1,
  done: 2,
  failed: 0,
  leaving: false,
  timestamp: 0,
});

/** What the trainer does with one heartbeat record: decode it, or send it to the DLQ with the error's reason. */
function consume(tracker: ActivityTracker, bytes: Uint8Array, deadLetters: string[], run = 'run-a'): void {
  try {
    const { timestamp: _sent, ...value } = decodeHeartbeatMessage(bytes);
    tracker.heartbeat(value, run);
  } catch (error) {
    if (!(error instanceof DecodeError)) throw error;
    deadLetters.push(error.message);
  }
}

async function get(url: string): Promise<{ status: number; bytes: number; text: string }> {
  const response = await fetch(url);
  const text = await response.text();
  return { status: response.status, bytes: Buffer.byteLength(text), text };
}

describe('hostile heartbeats and the status server', () => {
  it('1,030 heartbeats with 4 KB worker ids: each is a poison record, the tracker keeps none, /status and /metrics stay small', async () => {
    const tracker = new ActivityTracker();
    const deadLetters: string[] = [];
    for (let i = 0; i < 1030; i++) consume(tracker, encodeHeartbeatMessage(beat(`${i}-${'x'.repeat(4096)}`)), deadLetters);
    expect(deadLetters).toHaveLength(1030);
    expect(deadLetters[0]).toBe(`cannot decode worker: string of ${2 + 4096} characters exceeds ${WORKER_ID_MAX_LENGTH}`);
    // Bypassing the codec (a library caller) changes nothing: the tracker refuses such ids itself.
    for (let i = 0; i < 1030; i++) expect(tracker.heartbeat({ ...beat(`${i}-${'x'.repeat(4096)}`) })).toBe(false);
    const server = await serveStatus({ tracker, port: 0 });
    try {
      const status = await get(`${server.url}/status`);
      const metrics = await get(`${server.url}/metrics`);
      expect([status.status, metrics.status]).toEqual([200, 200]);
      expect((JSON.parse(status.text) as RunStatus).activity.workers).toEqual({});
      expect(status.bytes).toBeLessThan(4096);
      expect(metrics.text).not.toContain('rxrl_worker_up');
    } finally {
      await server.close();
    }
  });

  it('refuses worker ids with escape sequences or over the length bound, by their exact reason; keeps valid ones', () => {
    const tracker = new ActivityTracker();
    const deadLetters: string[] = [];
    consume(tracker, encodeHeartbeatMessage(beat('w-\u001b[2J')), deadLetters);
    consume(tracker, encodeHeartbeatMessage(beat('w\u009b31m')), deadLetters);
    consume(tracker, encodeHeartbeatMessage(beat('y'.repeat(WORKER_ID_MAX_LENGTH + 1))), deadLetters);
    consume(tracker, encodeHeartbeatMessage(beat('host-1.example:42@x_y-' + 'z'.repeat(WORKER_ID_MAX_LENGTH - 22))), deadLetters);
    expect(deadLetters).toEqual([
      'cannot decode worker: worker id has U+001B at index 2, outside [A-Za-z0-9._:@-]',
      'cannot decode worker: worker id has U+009B at index 1, outside [A-Za-z0-9._:@-]',
      `cannot decode worker: string of ${WORKER_ID_MAX_LENGTH + 1} characters exceeds ${WORKER_ID_MAX_LENGTH}`,
    ]);
    expect(Object.keys(tracker.snapshot().workers)).toEqual([`host-1.example:42@x_y-${'z'.repeat(WORKER_ID_MAX_LENGTH - 22)}`]);
  });

  it('a worker configured with an id that breaks the bound is a ConfigError before it connects', () => {
    const worker = (workerId: string): unknown =>
      kafkaRolloutWorker({
        kafka: createKafka('127.0.0.1:1'),
        topics: kafkaTopics('never-used'),
        tokenizer: new CharTokenizer('ab'),
        evaluator: { evaluate: () => ({ reward: 0 }) },
        workerId,
      });
    expect(() => worker('w 1')).toThrow(ConfigError);
    expect(() => worker('w'.repeat(WORKER_ID_MAX_LENGTH + 1))).toThrow(ConfigError);
    expect(worker('host-1.lan:9@pod_7')).toBeDefined();
  });

  it('ignores heartbeats of another run, keeps those of a worker following none yet', () => {
    const tracker = new ActivityTracker();
    expect(tracker.heartbeat(beat('w-1', 'run-a'), 'run-a')).toBe(true);
    expect(tracker.heartbeat(beat('w-2', 'run-old'), 'run-a')).toBe(false);
    expect(tracker.heartbeat(beat('w-3', ''), 'run-a')).toBe(true);
    expect(Object.keys(tracker.snapshot().workers)).toEqual(['w-1', 'w-3']);
  });

  it('remembers a bounded number of workers and cuts a remote error message', () => {
    const tracker = new ActivityTracker();
    for (let i = 0; i < MAX_TRACKED_WORKERS + 500; i++) tracker.heartbeat(beat(`w-${i}`));
    const workers = Object.keys(tracker.snapshot().workers);
    expect(workers).toHaveLength(MAX_TRACKED_WORKERS);
    expect(workers).not.toContain('w-0'); // the one heard from longest ago went first
    tracker.begin('rollout').fail(new Error('e'.repeat(10_000_000)));
    expect(tracker.snapshot().modules.rollout.lastError?.message.length).toBe(MAX_ERROR_MESSAGE_LENGTH + 1);
  });

  it('bounds /status and /metrics: past maxBytes workers heard from longest ago are left out and counted', async () => {
    let t = 0;
    const tracker = new ActivityTracker({ now: () => t });
    tracker.begin('rollout').fail(new Error('x'));
    for (let i = 0; i < 1500; i++) {
      t = i;
      tracker.heartbeat(beat(`w${String(i).padStart(4, '0')}-${'a'.repeat(WORKER_ID_MAX_LENGTH - 6)}`));
    }
    const maxBytes = 64 * 1024;
    const server = await serveStatus({ tracker, port: 0, maxBytes, info: () => ({ step: 3, metrics: { 'rollout/reward_mean': 0.5 } }) });
    try {
      const status = await get(`${server.url}/status`);
      expect(status.status).toBe(200);
      expect(status.bytes).toBeLessThanOrEqual(maxBytes);
      const document = JSON.parse(status.text) as RunStatus;
      const kept = Object.keys(document.activity.workers);
      expect(document.omitted).toEqual({ workers: MAX_TRACKED_WORKERS - kept.length, metrics: 0, modules: 0 });
      expect(kept.length).toBeGreaterThan(100);
      expect(kept).toContain(`w1499-${'a'.repeat(WORKER_ID_MAX_LENGTH - 6)}`); // the newest kept
      expect(kept).toEqual([...kept].sort());
      expect(document.activity.modules.rollout.failed).toBe(1);
      expect(document.run).toEqual({ step: 3, metrics: { 'rollout/reward_mean': 0.5 } });
      const metrics = await get(`${server.url}/metrics`);
      expect(metrics.status).toBe(200);
      expect(metrics.bytes).toBeLessThanOrEqual(maxBytes);
      expect(metrics.text).toContain('rxrl_module_failed_total{module="rollout"} 1');
      expect(metrics.text).toContain(`rxrl_status_omitted{what="workers"} ${document.omitted?.workers}`);
      expect(metrics.text).toMatch(/\n# rxrl: \d+ samples omitted to keep this answer within 65536 bytes\n$/);
    } finally {
      await server.close();
    }
    // A status that fits is returned as it is.
    const small: RunStatus = { run: {}, activity: new ActivityTracker().snapshot() };
    expect(boundedStatus(small, DEFAULT_STATUS_MAX_BYTES)).toBe(small);
  });

  it('a request whose answer throws gets a 500 and the server goes on answering', async () => {
    let broken = true;
    const tracker = new ActivityTracker();
    const info = (): { step: number } => {
      if (broken) throw new RangeError('Invalid string length');
      return { step: 1 };
    };
    const server = await serveStatus({ tracker, port: 0, info });
    try {
      const status = await get(`${server.url}/status`);
      const metrics = await get(`${server.url}/metrics`);
      expect([status.status, metrics.status]).toEqual([500, 500]);
      expect(status.text).toBe('status failed: RangeError\n');
      broken = false;
      expect((await get(`${server.url}/status`)).status).toBe(200);
    } finally {
      await server.close();
    }
  });
});
