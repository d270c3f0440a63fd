/**
 * The trainer half of a Kafka deployment, on the bundled reverse task: admits tasks to the `tasks` topic, trains
 * on the trajectories that rollout workers (`kafka-rollout-worker.js`, any number, any machine sharing the weights
 * directory) publish, and announces each new version on the `weights` topic.
 *
 * Run: `npm run build && KAFKA_BROKERS=127.0.0.1:9092 node dist/examples/kafka-trainer.js`, then start workers.
 * Environment:
 * - `KAFKA_BROKERS` (required), `RXRL_KAFKA_PREFIX` topic prefix (default `rxrl`);
 * - `RXRL_STEPS` train steps (default 30), `RXRL_MODE` `sync` | `batch-async` | `fully-async` (default `sync`),
 *   `RXRL_BATCH_SIZE` tasks per step (16), `RXRL_GROUP_SIZE` samples per task (8), `RXRL_SEED` (3);
 * - `RXRL_WEIGHTS_DIR` shared weights directory (default `runs/kafka/<prefix>`);
 * - `RXRL_KAFKA_WORKERS` rollout workers to run inside this process too (default 0: start them separately);
 * - `RXRL_REPORT` path of a JSON report: every admitted task and, per step, the groups and trajectories trained.
 *
 * Progress goes to stderr; the last stdout line is a JSON summary.
 */
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';

import { lastValueFrom, tap, type Subscription } from 'rxjs';

import {
  CharTokenizer,
  GrpoTrainer,
  PolicyModel,
  createKafka,
  initBackend,
  kafkaTopics,
  type KafkaEvent,
  type StalenessMode,
} from '../lib/index.js';
import { printProgress } from '../operators/index.js';
import { EMBEDDED_MODEL, EMBEDDED_TRAINER, kafkaRolloutWorker, kafkaTrainer } from '../pipelines/index.js';
import { stringTransformTask } from '../recipes/index.js';

const env = process.env;
const steps = Number(env.RXRL_STEPS ?? 30);
const mode = (env.RXRL_MODE ?? 'sync') as StalenessMode;
const batchSize = Number(env.RXRL_BATCH_SIZE ?? 16);
const groupSize = Number(env.RXRL_GROUP_SIZE ?? 8);
const seed = Number(env.RXRL_SEED ?? 3);
const prefix = env.RXRL_KAFKA_PREFIX ?? 'rxrl';
const localWorkers = Number(env.RXRL_KAFKA_WORKERS ?? 0);
const weightsDir = env.RXRL_WEIGHTS_DIR ?? join('runs', 'kafka', prefix);

const backend = await initBackend('auto', { logger: { info: () => undefined } });
const task = stringTransformTask({ transform: 'reverse', alphabet: 'abcde', minLength: 4, maxLength: 4, seed });
const tokenizer = new CharTokenizer(task.characters);
const policy = PolicyModel.create({ ...EMBEDDED_MODEL, vocabSize: tokenizer.vocabSize }, seed);
const trainer = new GrpoTrainer(policy, { ...EMBEDDED_TRAINER, seed });
const kafka = createKafka(env.KAFKA_BROKERS ?? '', { clientId: 'rxrl-trainer' });
const topics = kafkaTopics(prefix);
const controller = new AbortController();
process.once('SIGINT', () => controller.abort());
process.once('SIGTERM', () => controller.abort());

// What the report and the summary count.
const admitted: { taskId: string; groupId: string; index: number }[] = [];
const trained: { step: number; version: number; groupIds: string[]; trajectoryIds: string[] }[] = [];
let duplicates = 0;
let deadLetters = 0;
const onEvent = (event: KafkaEvent): void => {
  const p = event.payload;
  if (event.type === 'trainer.admitted') admitted.push({ taskId: String(p.taskId), groupId: String(p.groupId), index: Number(p.index) });
  if (event.type === 'trainer.trained') {
    trained.push({
      step: Number(p.step),
      version: Number(p.version),
      groupIds: p.groupIds as string[],
      trajectoryIds: p.trajectoryIds as string[],
    });
  }
  if (event.type === 'trainer.duplicate') duplicates++;
  if (event.type === 'kafka.dead_letter') {
    deadLetters++;
    process.stderr.write(`dead letter: ${String(p.topic)}@${String(p.offset)}: ${String(p.reason)}\n`);
  }
};

// Optional in-process workers (the same code as kafka-rollout-worker.js, sharing this process's tfjs engine).
const workers: Subscription[] = [];
for (let i = 0; i < localWorkers; i++) {
  workers.push(
    kafkaRolloutWorker({
      kafka,
      topics,
      tokenizer,
      evaluator: task.evaluator,
      workerId: `local-${process.pid}-${i}`,
      signal: controller.signal,
    }).subscribe({
      error: (error: unknown) => process.stderr.write(`local worker ${i} failed: ${String(error)}\n`),
    }),
  );
}

process.stderr.write(
  `trainer: ${mode}, ${steps} steps of ${batchSize}×${groupSize} on topics ${prefix}.* (${backend}); waiting for workers\n`,
);
const started = performance.now();
const rewards: number[] = [];
let stalenessMax = 0;
await lastValueFrom(
  kafkaTrainer({
    kafka,
    topics,
    tasks: task.train,
    loader: { epochs: Infinity, shuffle: true, seed },
    trainer,
    policy,
    padId: tokenizer.padId,
    weightsDir,
    mode,
    batchSize,
    groupSize,
    maxTokens: task.maxAnswerLength + 1,
    steps,
    seed,
    signal: controller.signal,
    onEvent,
  }).pipe(
    tap((step) => {
      const m = step.metrics;
      rewards.push(m['rollout/reward_mean']);
      stalenessMax = Math.max(stalenessMax, m['rollout/staleness_max'] ?? 0);
    }),
    printProgress({ total: steps }),
  ),
  { defaultValue: undefined },
);
for (const worker of workers) worker.unsubscribe();

const trainedGroups = trained.flatMap((s) => s.groupIds);
if (env.RXRL_REPORT) {
  await writeFile(env.RXRL_REPORT, JSON.stringify({ prefix, mode, admitted, trained, duplicates, deadLetters }, null, 1));
}
console.log(
  JSON.stringify({
    example: 'kafka-trainer',
    mode,
    backend,
    steps: trainer.step,
    seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
    admittedTasks: admitted.length,
    trainedTasks: trainedGroups.length,
    tasksTrainedTwice: trainedGroups.length - new Set(trainedGroups).size,
    duplicatesDropped: duplicates,
    deadLetters,
    stalenessMax,
    rewardFirst: rewards[0],
    rewardLast: rewards.at(-1),
  }),
);
trainer.dispose();
policy.dispose();
