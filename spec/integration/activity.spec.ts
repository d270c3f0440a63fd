/**
 * Activity tracking end to end, through the `rxrl` command line and the status server (`--status-port`):
 * - a run whose inference server accepts completions and never answers: the rollout module is reported stalled in
 *   `/status`, `/metrics`, `rxrl status` and a warning line, and after `activity.stallFailSeconds` the run fails with a
 *   `StalledError` naming it;
 * - a Kafka run with two `rxrl worker` processes, one killed with SIGKILL: the trainer's `/status` shows it gone while
 *   the other keeps beating, and the run completes.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { fetchStatus, type RunStatus } from '../../lib/observe/status.js';
import { brokers, uniqueName, waitFor } from '../kafka/helpers.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

interface Proc {
  readonly child: ChildProcess;
  readonly stdout: string[];
  readonly stderr: string[];
  readonly exit: Promise<number | null>;
}

const running: Proc[] = [];

function rxrl(args: readonly string[]): Proc {
  const child = spawn(process.execPath, [cli, ...args], {
    env: { ...process.env, RXRL_LOG_LEVEL: 'silent' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const collect = (stream: NodeJS.ReadableStream, into: string[]): void => {
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => into.push(...chunk.split('\n').filter(Boolean)));
  };
  const proc: Proc = { child, stdout: [], stderr: [], exit: new Promise((resolve) => child.once('close', (code) => resolve(code))) };
  collect(child.stdout!, proc.stdout);
  collect(child.stderr!, proc.stderr);
  running.push(proc);
  return proc;
}

/** The status server's URL, from the line `rxrl run|trainer` prints once it listens. */
async function statusUrl(proc: Proc): Promise<string> {
  let url: string | undefined;
  await waitFor(
    () => {
      url = proc.stderr.map((line) => /status on (http:\/\/[\d.:]+)\/status/.exec(line)?.[1]).find(Boolean);
      return url !== undefined || proc.child.exitCode !== null;
    },
    { timeoutMs: 60_000 },
  );
  if (url === undefined) throw new Error(`no status URL:\n${proc.stderr.join('\n')}`);
  return url;
}

/** Polls `/status` until `accept` holds; the last document. */
async function statusUntil(url: string, accept: (status: RunStatus) => boolean, timeoutMs = 90_000): Promise<RunStatus> {
  let last: RunStatus | undefined;
  await waitFor(
    async () => {
      last = await fetchStatus(url).catch(() => last);
      return last !== undefined && accept(last);
    },
    { timeoutMs, intervalMs: 100 },
  ).catch((error: unknown) => {
    throw new Error(`${(error as Error).message}; last status: ${JSON.stringify(last)}`);
  });
  return last as RunStatus;
}

beforeAll(() => {
  if (!existsSync(cli)) throw new Error('dist/cli/main.js missing: run `npm run build` (npm test builds first)');
});

afterEach(async () => {
  for (const proc of running.splice(0)) {
    if (proc.child.exitCode === null && proc.child.signalCode === null) proc.child.kill('SIGKILL');
    await proc.exit;
  }
});

describe('a stalled rollout (an inference server that never answers)', () => {
  let server: Server | undefined;
  afterEach(async () => {
    server?.closeAllConnections();
    await new Promise((resolve) => server?.close(resolve));
  });

  it('is reported stalled in /status, /metrics and rxrl status, then fails the run naming the module', async () => {
    // Weight updates succeed; completions are accepted and never answered.
    const pending: string[] = [];
    server = createServer((request, response) => {
      if (request.url?.endsWith('/completions')) {
        pending.push(request.url);
        return;
      }
      response.writeHead(200, { 'content-type': 'application/json' }).end('{"success":true}');
    });
    await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as AddressInfo;
    const work = await mkdtemp(join(tmpdir(), 'rxrl-stall-'));
    const dir = join(work, 'run');
    const recipe = join(work, 'recipe.json');
    await writeFile(
      recipe,
      JSON.stringify({
        model: { path: fixture },
        data: { source: 'arithmetic', arithmetic: { operators: '+', maxOperand: 9, validationSize: 2 } },
        rollout: { chatTemplate: 'model', groupSize: 2, maxTokens: 4 },
        sync: { batchSize: 2 },
        openai: { baseUrl: `http://127.0.0.1:${port}/v1`, model: 'policy' },
        run: { dir, steps: 3, backend: 'cpu', seed: 1, errorPolicy: 'stop_on_error' },
        activity: { stallSeconds: 2, stallFailSeconds: 6 },
        validation: { beforeTrain: false },
      }),
    );
    const run = rxrl(['run', recipe, '--status-port', '0']);
    const url = await statusUrl(run);
    const stalled = await statusUntil(url, (status) => status.activity.stalled.includes('rollout'));
    const rollout = stalled.activity.modules.rollout;
    expect(rollout).toMatchObject({ stalled: true, completed: 0 });
    expect(rollout.inFlight).toBe(4); // batch 2 × group 2, all sent and unanswered
    expect(rollout.idleSeconds).toBeGreaterThanOrEqual(2);
    expect(stalled.activity.modules.trainer).toBeUndefined(); // no step started
    expect(pending.length).toBeGreaterThan(0);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain('rxrl_module_stalled{module="rollout"} 1');
    expect(metrics).toContain('rxrl_module_in_flight{module="rollout"} 4');
    const table = spawnSync(process.execPath, [cli, 'status', url], { encoding: 'utf8' });
    expect(table.status).toBe(0);
    expect(table.stdout).toMatch(/^rollout\s+4\s+0\s+0\s+\S+\s+\S+\s+STALLED/m);
    expect(table.stdout).toContain('stalled: rollout');
    // After stallFailSeconds the run fails (exit 1), naming the module.
    expect(await run.exit).toBe(1);
    const stderr = run.stderr.join('\n');
    expect(stderr).toContain('warning: rollout stalled: 4 in flight');
    expect(stderr).toMatch(/rxrl: StalledError: module 'rollout' stalled: 4 in flight and nothing ended for \d+ s/);
    // The stall is a line of metrics.jsonl, which the report shows.
    const lines = readFileSync(join(dir, 'metrics.jsonl'), 'utf8').trim().split('\n');
    expect(
      lines.some((line) => (JSON.parse(line) as { 'activity/stalled_s/rollout'?: number })['activity/stalled_s/rollout'] !== undefined),
    ).toBe(true);
  }, 120_000);
});

describe('a Kafka worker killed with SIGKILL', () => {
  it("shows as gone in the trainer's /status while the other worker beats on, and the run completes", async () => {
    const work = await mkdtemp(join(tmpdir(), 'rxrl-heartbeat-'));
    const recipe = join(work, 'recipe.json');
    await writeFile(
      recipe,
      JSON.stringify({
        run: { dir: join(work, 'run'), seed: 1, steps: 12, backend: 'cpu' },
        data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
        sync: { mode: 'sync', batchSize: 2 },
        rollout: { groupSize: 2 },
        kafka: { brokers: brokers(), topicPrefix: uniqueName('beat'), workerConcurrency: 2, rolloutDelayMs: 300, heartbeatMs: 300 },
        checkpoint: { every: 0 },
        validation: { beforeTrain: false },
      }),
    );
    const trainer = rxrl(['trainer', recipe, '--status-port', '0']);
    const url = await statusUrl(trainer);
    const [doomed, survivor] = [rxrl(['worker', recipe]), rxrl(['worker', recipe])];
    const idOf =
      (proc: Proc) =>
      (status: RunStatus): string | undefined =>
        Object.keys(status.activity.workers).find((id) => id.includes(`-${proc.child.pid}-`));
    const both = await statusUntil(url, (s) => [doomed, survivor].every((p) => s.activity.workers[idOf(p)(s) ?? '']?.state === 'up'));
    const doomedId = idOf(doomed)(both) as string;
    const survivorId = idOf(survivor)(both) as string;
    // Over Kafka the trainer's rollout module is the samples out at the workers.
    expect(both.activity.modules.loader.completed).toBeGreaterThan(0);
    doomed.child.kill('SIGKILL');
    const gone = await statusUntil(url, (s) => s.activity.workers[doomedId]?.state === 'gone');
    expect(gone.activity.workers[survivorId].state).toBe('up');
    expect(gone.activity.modules.rollout.started).toBeGreaterThan(0);
    // Gone after three silent heartbeat periods: its last beat is at least that old.
    expect(gone.activity.workers[doomedId].beatAgeSeconds).toBeGreaterThanOrEqual(0.9);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    expect(metrics).toContain(`rxrl_worker_up{worker="${doomedId}",`);
    expect(metrics).toMatch(new RegExp(`rxrl_worker_up\\{worker="${doomedId}",run="[^"]*"\\} 0`));
    const table = spawnSync(process.execPath, [cli, 'status', url], { encoding: 'utf8' });
    expect(table.stdout).toMatch(new RegExp(`^${doomedId}\\s.*\\sgone$`, 'm'));
    // The survivor takes over the killed worker's partitions; the run ends, and so does the survivor.
    expect(await trainer.exit).toBe(0);
    expect(JSON.parse(trainer.stdout.at(-1) ?? '{}')).toMatchObject({ steps: 12 });
    expect(await survivor.exit).toBe(0);
  }, 180_000);
});
