/**
 * A rollout worker of a Kafka deployment, on the bundled reverse task: joins the workers' consumer group on the
 * `tasks` topic, loads each weights version the trainer (`kafka-trainer.js`) announces, rolls the tasks out and
 * publishes the trajectories. Start as many as you like; a worker that dies has its unfinished tasks redelivered to
 * the others. It stops when the run it serves ends.
 *
 * Run: `npm run build && KAFKA_BROKERS=127.0.0.1:9092 node dist/examples/kafka-rollout-worker.js`.
 * Environment: `KAFKA_BROKERS` (required), `RXRL_KAFKA_PREFIX` topic prefix (default `rxrl`), `RXRL_WORKER_ID`,
 * `RXRL_WORKER_CONCURRENCY` tasks at once (default 8), `RXRL_ROLLOUT_DELAY_MS` simulated extra latency per task
 * (default 0).
 *
 * One line per task on stderr (`[worker w] start …` / `[worker w] done …`); the last stdout line is a JSON summary,
 * where `steps` is the number of train steps of the run it served.
 */
import { CharTokenizer, createKafka, initBackend, kafkaTopics, type KafkaEvent } from '../lib/index.js';
import { kafkaRolloutWorker } from '../pipelines/index.js';
import { stringTransformTask } from '../recipes/index.js';

const env = process.env;
const workerId = env.RXRL_WORKER_ID ?? `w${process.pid}`;
const backend = await initBackend('auto', { logger: { info: () => undefined } });
const task = stringTransformTask({ transform: 'reverse', alphabet: 'abcde', minLength: 4, maxLength: 4 });
const controller = new AbortController();
process.once('SIGINT', () => controller.abort());
process.once('SIGTERM', () => controller.abort());

let run = '';
let finalVersion = -1;
const onEvent = (event: KafkaEvent): void => {
  const p = event.payload;
  switch (event.type) {
    case 'worker.task_start':
      process.stderr.write(`[worker ${workerId}] start task=${String(p.taskId)} index=${String(p.index)} version=${String(p.version)}\n`);
      break;
    case 'worker.weights_loaded':
      run = String(p.run);
      process.stderr.write(`[worker ${workerId}] loaded version=${String(p.version)} run=${run}\n`);
      break;
    case 'worker.run_end':
      finalVersion = Number(p.version);
      break;
    case 'kafka.join':
      process.stderr.write(`[worker ${workerId}] assignment ${JSON.stringify(p.assignment)}\n`);
      break;
    default:
      break;
  }
};

process.stderr.write(`[worker ${workerId}] ${backend}, waiting for tasks on ${env.RXRL_KAFKA_PREFIX ?? 'rxrl'}.tasks\n`);
let tasks = 0;
let duplicates = 0;
let skipped = 0;
let trajectories = 0;
await new Promise<void>((resolve, reject) => {
  kafkaRolloutWorker({
    kafka: createKafka(env.KAFKA_BROKERS ?? '', { clientId: `rxrl-worker-${workerId}` }),
    topics: kafkaTopics(env.RXRL_KAFKA_PREFIX ?? 'rxrl'),
    tokenizer: new CharTokenizer(task.characters),
    evaluator: task.evaluator,
    workerId,
    concurrency: Number(env.RXRL_WORKER_CONCURRENCY ?? 8),
    rolloutDelayMs: Number(env.RXRL_ROLLOUT_DELAY_MS ?? 0),
    signal: controller.signal,
    onEvent,
  }).subscribe({
    next: (result) => {
      if (result.outcome === 'duplicate') duplicates++;
      else if (result.outcome === 'skipped') skipped++;
      else {
        tasks++;
        trajectories += result.trajectories;
        process.stderr.write(
          `[worker ${workerId}] done task=${result.taskId} index=${result.index} trajectories=${result.trajectories} failures=${result.failures}\n`,
        );
      }
    },
    error: reject,
    complete: resolve,
  });
});
console.log(
  JSON.stringify({ example: 'kafka-rollout-worker', workerId, run, steps: finalVersion, tasks, trajectories, duplicates, skipped }),
);
