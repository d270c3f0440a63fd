/**
 * `npm run bench -- hostileHeartbeats [--beats 1030] [--id-kb 540]`
 *
 * The heartbeat attack on the status server (huge worker ids), in one process, on the path the trainer takes: `--beats` heartbeat records whose
 * worker ids are `--id-kb` KB each are decoded (`decodeHeartbeatMessage`) and given to the run's tracker (those that
 * do not decode count as dead letters), then `GET /status` and `GET /metrics` are asked of its status server. One
 * JSON line per stage: RSS (after a forced GC) before and after the heartbeats, and each answer's status and size.
 * Before the fix the first request ended the process (`RangeError: Invalid string length`).
 *
 * @packageDocumentation
 */
import { DecodeError } from '../lib/core/errors.js';
import { decodeHeartbeatMessage, encodeHeartbeatMessage } from '../lib/kafka/codec.js';
import { ActivityTracker } from '../lib/observe/activity.js';
import { serveStatus } from '../lib/observe/status.js';

function option(args: readonly string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

/** RSS in MB after a forced GC (when `--expose-gc` is on, as `npm run bench` runs). */
function rssMB(): number {
  (globalThis as { gc?: () => void }).gc?.();
  return Math.round(process.memoryUsage().rss / 1e6);
}

/** Runs the attack and prints what it measured. */
export async function main(args: readonly string[]): Promise<void> {
  const beats = option(args, 'beats', 1030);
  const idBytes = option(args, 'id-kb', 540) * 1024;
  const print = (line: Record<string, unknown>): void => void process.stdout.write(`${JSON.stringify(line)}\n`);
  const tracker = new ActivityTracker();
  const server = await serveStatus({ tracker, port: 0 });
  print({ stage: 'before', beats, idBytes, rssMB: rssMB() });
  let deadLetters = 0;
  const padding = 'x'.repeat(idBytes);
  for (let i = 0; i < beats; i++) {
    const bytes = encodeHeartbeatMessage({
      worker: `${i}-${padding}`,
      run: 'r',
      inFlight: 0,
      done: 0,
      failed: 0,
      leaving: false,
      timestamp: 0,
    });
    try {
      const { timestamp: _sent, ...beat } = decodeHeartbeatMessage(bytes);
      // The run argument is ignored by a tracker that knows no run filter.
      tracker.heartbeat(beat, 'r');
    } catch (error) {
      if (!(error instanceof DecodeError)) throw error;
      deadLetters++;
    }
  }
  print({ stage: 'after heartbeats', deadLetters, workers: Object.keys(tracker.snapshot().workers).length, rssMB: rssMB() });
  for (const path of ['/status', '/metrics']) {
    const response = await fetch(`${server.url}${path}`);
    const body = await response.arrayBuffer();
    print({ stage: `GET ${path}`, status: response.status, bytes: body.byteLength, rssMB: rssMB() });
  }
  await server.close();
}
