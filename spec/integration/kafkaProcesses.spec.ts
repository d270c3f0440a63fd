/**
 * End to end against the real broker: the trainer and two rollout workers as separate OS processes (the built
 * examples in `dist/`, which `npm test` builds first), on topics of their own.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import type { Kafka } from 'kafkajs';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { ensureTopics } from '../../lib/kafka/client.js';
import { encodeTrajectoryMessage } from '../../lib/kafka/codec.js';
import { kafkaTopics, type KafkaTopics } from '../../lib/kafka/types.js';
import { DEAD_LETTER_HEADERS } from '../../operators/fromKafka.js';
import { traj } from '../helpers/fixtures.js';
import { brokers, kafkaClient, produce, readMessages, waitFor } from '../kafka/helpers.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const TRAINER = join(root, 'dist', 'examples', 'kafka-trainer.js');
const WORKER = join(root, 'dist', 'examples', 'kafka-rollout-worker.js');

/** A node process running a built example, with its output collected line by line. */
interface Proc {
  readonly name: string;
  readonly child: ChildProcess;
  readonly stdout: string[];
  readonly stderr: string[];
  readonly exit: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

const running: Proc[] = [];

function start(name: string, file: string, env: NodeJS.ProcessEnv): Proc {
  const child = spawn(process.execPath, [file], { cwd: root, env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  const lines = (stream: NodeJS.ReadableStream, into: string[]): void => {
    let rest = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      const parts = (rest + chunk).split('\n');
      rest = parts.pop() ?? '';
      into.push(...parts);
    });
    stream.on('end', () => {
      if (rest) into.push(rest);
    });
  };
  const stdout: string[] = [];
  const stderr: string[] = [];
  lines(child.stdout!, stdout);
  lines(child.stderr!, stderr);
  const exit = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once('close', (code, signal) => resolve({ code, signal })),
  );
  const proc = { name, child, stdout, stderr, exit };
  running.push(proc);
  return proc;
}

/** What the processes of the test have written so far: while it grows, they are moving. */
function output(): number {
  return running.reduce((n, proc) => n + proc.stdout.length + proc.stderr.length, 0);
}

/** Waits until `condition` holds, failing loudly only when no process writes a line for two minutes. */
async function whileMoving(condition: () => boolean, what: string | (() => string)): Promise<void> {
  await waitFor(condition, { progress: output, intervalMs: 50, what });
}

/** Waits for a process to exit (as {@link whileMoving} waits), failing loudly with its stderr tail on a non-zero exit. */
async function finished(proc: Proc): Promise<Record<string, unknown>> {
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  void proc.exit.then((e) => (exit = e));
  await whileMoving(
    () => exit !== undefined,
    () => `${proc.name} to finish:\n${proc.stderr.slice(-30).join('\n')}`,
  );
  const { code, signal } = exit!;
  if (code !== 0) throw new Error(`${proc.name} exited with ${code ?? signal}:\n${proc.stderr.slice(-30).join('\n')}`);
  return JSON.parse(proc.stdout.at(-1) ?? '') as Record<string, unknown>;
}

/** Partitions of the tasks topic a worker holds now (from its last `assignment` line). */
function assignedTasks(proc: Proc, topics: KafkaTopics): number[] {
  const prefix = `[worker ${proc.name}] assignment `;
  for (let i = proc.stderr.length - 1; i >= 0; i--) {
    const line = proc.stderr[i];
    if (!line.startsWith(prefix)) continue;
    const assignment = JSON.parse(line.slice(prefix.length)) as Record<string, number[]>;
    if (topics.tasks in assignment) return assignment[topics.tasks];
  }
  return [];
}

/** Task ids a worker reported with `kind` (`start` or `done`), with their admission index. */
function taskLines(proc: Proc, kind: 'start' | 'done'): { taskId: string; index: number }[] {
  const pattern = new RegExp(`^\\[worker ${proc.name}\\] ${kind} task=(\\S+) index=(\\d+)`);
  return proc.stderr.flatMap((line) => {
    const m = pattern.exec(line);
    return m ? [{ taskId: m[1], index: Number(m[2]) }] : [];
  });
}

interface Report {
  readonly admitted: { taskId: string; groupId: string; index: number }[];
  readonly trained: { step: number; version: number; groupIds: string[]; trajectoryIds: string[] }[];
  readonly duplicates: number;
  readonly deadLetters: number;
}

/** Every admitted task's group was trained exactly once, and nothing else was trained. */
function expectTrainedExactlyOnce(report: Report, steps: number, batchSize: number): void {
  expect(report.admitted).toHaveLength(steps * batchSize);
  expect(report.trained).toHaveLength(steps);
  const trained = report.trained.flatMap((s) => s.groupIds).sort();
  expect(trained).toEqual(report.admitted.map((a) => a.groupId).sort());
  expect(new Set(trained).size).toBe(trained.length);
  // Trajectories too: each id once.
  const ids = report.trained.flatMap((s) => s.trajectoryIds);
  expect(new Set(ids).size).toBe(ids.length);
}

let kafka: Kafka;

beforeAll(() => {
  if (!existsSync(TRAINER) || !existsSync(WORKER)) {
    throw new Error('dist/examples/kafka-*.js missing: run `npm run build` (npm test builds first)');
  }
  kafka = kafkaClient('rxrl-integration');
});

/** Temporary directories of the running test. */
const dirs: string[] = [];

afterEach(async () => {
  for (const proc of running.splice(0)) {
    if (proc.child.exitCode === null && proc.child.signalCode === null) proc.child.kill('SIGKILL');
    await proc.exit;
  }
  // Passed or failed, nothing is left behind.
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

afterAll(() => undefined);

/** A deployment of its own: topics, weights directory, report file, common environment. */
async function deployment(): Promise<{ topics: KafkaTopics; env: NodeJS.ProcessEnv; report: string }> {
  const prefix = `e2e-${randomBytes(4).toString('hex')}`;
  const topics = kafkaTopics(prefix);
  await ensureTopics(kafka, topics, { tasks: 8, trajectories: 4 });
  const dir = mkdtempSync(join(tmpdir(), 'rxrl-e2e-'));
  dirs.push(dir);
  return {
    topics,
    report: join(dir, 'report.json'),
    env: { KAFKA_BROKERS: brokers(), RXRL_KAFKA_PREFIX: prefix, RXRL_WEIGHTS_DIR: join(dir, 'weights'), RXRL_KAFKA_LOG: 'error' },
  };
}

/** Starts two workers and waits until they share the tasks topic's partitions. */
async function twoWorkers(topics: KafkaTopics, env: NodeJS.ProcessEnv): Promise<[Proc, Proc]> {
  const a = start('A', WORKER, { ...env, RXRL_WORKER_ID: 'A' });
  const b = start('B', WORKER, { ...env, RXRL_WORKER_ID: 'B' });
  await waitFor(
    () => {
      const pa = assignedTasks(a, topics);
      const pb = assignedTasks(b, topics);
      return pa.length > 0 && pb.length > 0 && new Set([...pa, ...pb]).size === 8 && pa.length + pb.length === 8;
    },
    { progress: output, what: 'both workers holding tasks partitions' },
  );
  return [a, b];
}

describe('Kafka deployment: a trainer and two rollout workers in separate processes', () => {
  it('trains a few steps; every admitted task is trained exactly once; poison messages go to the DLQ and the run completes', async () => {
    const { topics, env, report } = await deployment();
    // Poison on both directions: a task the workers cannot decode, a trajectory the trainer cannot decode.
    await produce(kafka, topics.tasks, [{ key: 'poison-task', value: Buffer.from('not a task') }]);
    const wrongRun = encodeTrajectoryMessage({ run: 'another-run', output: traj('x@0', 0) });
    await produce(kafka, topics.trajectories, [
      { key: 'poison-trajectory', value: Buffer.from([0x72, 0x78, 2, 9]) },
      { key: 'foreign', value: Buffer.from(wrongRun) },
    ]);
    const [a, b] = await twoWorkers(topics, env);
    const steps = 4;
    const trainer = start('trainer', TRAINER, {
      ...env,
      RXRL_STEPS: String(steps),
      RXRL_BATCH_SIZE: '4',
      RXRL_GROUP_SIZE: '4',
      RXRL_MODE: 'sync',
      RXRL_REPORT: report,
    });

    const summary = await finished(trainer);
    const [sa, sb] = await Promise.all([finished(a), finished(b)]);
    expect(summary).toMatchObject({ steps, admittedTasks: 16, trainedTasks: 16, tasksTrainedTwice: 0, stalenessMax: 0 });
    expect(sa.steps).toBe(steps); // the workers stopped at the end of the run they served
    expect(sb.steps).toBe(steps);
    expect(Number(sa.tasks) + Number(sb.tasks)).toBeGreaterThanOrEqual(16);
    expectTrainedExactlyOnce(JSON.parse(readFileSync(report, 'utf8')) as Report, steps, 4);

    const dead = await readMessages(kafka, topics.deadLetter, 2);
    const byKey = new Map(dead.map((m) => [m.key?.toString(), m]));
    expect(byKey.get('poison-task')?.headers?.[DEAD_LETTER_HEADERS.topic]?.toString()).toBe(topics.tasks);
    expect(byKey.get('poison-task')?.headers?.[DEAD_LETTER_HEADERS.reason]?.toString()).toMatch(/not a rxrl.v1.TaskRecord record/);
    expect(byKey.get('poison-trajectory')?.headers?.[DEAD_LETTER_HEADERS.topic]?.toString()).toBe(topics.trajectories);
    expect(byKey.get('poison-trajectory')?.headers?.[DEAD_LETTER_HEADERS.reason]?.toString()).toMatch(/kind/);
  }, 0); // no total bound: each wait fails when the processes stop moving

  it('a worker killed mid-run (SIGKILL) loses nothing: its unfinished tasks are redelivered and trained exactly once', async () => {
    const { topics, env, report } = await deployment();
    // Each task waits 1 s before its rollout, so the killed worker surely holds unfinished tasks.
    const slow = { ...env, RXRL_ROLLOUT_DELAY_MS: '1000' };
    const [a, b] = await twoWorkers(topics, slow);
    const steps = 4;
    const trainer = start('trainer', TRAINER, {
      ...env,
      RXRL_STEPS: String(steps),
      RXRL_BATCH_SIZE: '6',
      RXRL_GROUP_SIZE: '4',
      RXRL_MODE: 'batch-async',
      RXRL_REPORT: report,
    });

    // Kill A once it has started a task of the second admission batch or later (weights have moved on by then).
    await whileMoving(() => taskLines(a, 'start').some((t) => t.index >= 6), 'worker A to start a later task');
    a.child.kill('SIGKILL');
    const killed = await a.exit;
    expect(killed.signal).toBe('SIGKILL');
    const doneByA = new Set(taskLines(a, 'done').map((t) => t.index));
    const unfinished = taskLines(a, 'start').filter((t) => !doneByA.has(t.index));
    expect(unfinished.length).toBeGreaterThan(0);

    const summary = await finished(trainer);
    await finished(b);
    expect(summary).toMatchObject({ steps, admittedTasks: 24, trainedTasks: 24, tasksTrainedTwice: 0 });
    expect(Number(summary.stalenessMax)).toBeLessThanOrEqual(1); // batch-async, η = 1
    // What A left unfinished, B rolled out.
    const doneByB = new Set(taskLines(b, 'done').map((t) => t.index));
    for (const t of unfinished) expect(doneByB.has(t.index), `task ${t.index} (${t.taskId}) redelivered to B`).toBe(true);
    expectTrainedExactlyOnce(JSON.parse(readFileSync(report, 'utf8')) as Report, steps, 6);
  }, 0); // no total bound: each wait fails when the processes stop moving
});
