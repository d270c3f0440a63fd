/**
 * The Kafka halves in one process against the real broker: kafkaTrainer with two kafkaRolloutWorker subscriptions,
 * in the modes and endings the process-level spec does not cover.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Kafka } from 'kafkajs';
import { lastValueFrom, toArray } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { ensureTopics } from '../../lib/kafka/client.js';
import { kafkaTopics, type KafkaEvent } from '../../lib/kafka/types.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import type { StepResult } from '../../lib/train/types.js';
import { kafkaRolloutWorker, type WorkerTaskResult } from '../../pipelines/kafkaRolloutWorker.js';
import { kafkaTrainer } from '../../pipelines/kafkaTrainer.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { kafkaClient, uniqueName } from '../kafka/helpers.js';

let kafka: Kafka;
// 16 two-letter strings: 15 to train on, 1 held out.
const task = stringTransformTask({ transform: 'reverse', alphabet: 'abcd', minLength: 2, maxLength: 2, validationSize: 1 });
const tokenizer = new CharTokenizer(task.characters);

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  kafka = kafkaClient('rxrl-pipelines-spec');
});

interface Outcome {
  readonly steps: StepResult[];
  readonly workers: WorkerTaskResult[][];
  readonly events: KafkaEvent[];
}

interface DeploymentOptions {
  mode: StalenessMode;
  tasks: number;
  batchSize: number;
  steps?: number;
  checkpointed?: (step: StepResult) => boolean;
}

async function runDeployment(options: DeploymentOptions, topics = kafkaTopics(uniqueName('pipe'))): Promise<Outcome> {
  await ensureTopics(kafka, topics, { tasks: 4, trajectories: 2 });
  const config = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };
  const policy = PolicyModel.create(config, 7);
  const trainer = new GrpoTrainer(policy, { learningRate: 1e-3 });
  const events: KafkaEvent[] = [];
  try {
    const workers = [0, 1].map((i) =>
      lastValueFrom(
        kafkaRolloutWorker({ kafka, topics, tokenizer, evaluator: task.evaluator, workerId: `${topics.tasks}-w${i}`, concurrency: 2 }).pipe(
          toArray(),
        ),
      ),
    );
    const steps = await lastValueFrom(
      kafkaTrainer({
        kafka,
        topics,
        tasks: task.train.slice(0, options.tasks),
        trainer,
        policy,
        padId: tokenizer.padId,
        weightsDir: mkdtempSync(join(tmpdir(), 'rxrl-pipes-')),
        mode: options.mode,
        batchSize: options.batchSize,
        groupSize: 2,
        maxTokens: task.maxAnswerLength + 1,
        steps: options.steps,
        ...(options.checkpointed ? { checkpointed: options.checkpointed, stepsPerCheckpoint: 2 } : {}),
        onEvent: (e) => events.push(e),
      }).pipe(toArray()),
    );
    return { steps, workers: await Promise.all(workers), events };
  } finally {
    trainer.dispose();
    policy.dispose();
  }
}

function trainedGroups(events: readonly KafkaEvent[]): string[] {
  return events.filter((e) => e.type === 'trainer.trained').flatMap((e) => e.payload.groupIds as string[]);
}

describe('kafkaTrainer + kafkaRolloutWorker (in process, real broker)', () => {
  it('fully-async with a finite loader: trains until every admitted task is trained, the last batch partial', async () => {
    expect(task.train.length).toBeGreaterThanOrEqual(10);
    const { steps, workers, events } = await runDeployment({ mode: 'fully-async', tasks: 10, batchSize: 4 });
    expect(steps.map((s) => s.step)).toEqual([0, 1, 2]);
    const admitted = events.filter((e) => e.type === 'trainer.admitted').map((e) => e.payload.groupId as string);
    expect(admitted).toHaveLength(10);
    expect(trainedGroups(events).sort()).toEqual([...admitted].sort());
    for (const step of steps) {
      expect(step.metrics['rollout/staleness_min']).toBeGreaterThanOrEqual(0);
      expect(step.metrics['rollout/staleness_max']).toBeLessThanOrEqual(step.step);
    }
    // Both workers stopped at the end of the run; together they rolled out every task at least once.
    const rolled = workers.flat().filter((r) => r.outcome === 'rolled-out');
    expect(new Set(rolled.map((r) => r.groupId))).toEqual(new Set(admitted));
  }, 120_000);

  it('sync with a step budget: exactly steps × batchSize tasks admitted, every trajectory on-policy', async () => {
    const { steps, events } = await runDeployment({ mode: 'sync', tasks: 15, batchSize: 3, steps: 3 });
    expect(steps).toHaveLength(3);
    expect(events.filter((e) => e.type === 'trainer.admitted')).toHaveLength(9);
    expect(trainedGroups(events)).toHaveLength(9);
    for (const step of steps) expect(step.metrics['rollout/staleness_max']).toBe(0);
    const published = events.filter((e) => e.type === 'trainer.published').map((e) => e.payload.version);
    expect(published).toEqual([0, 1, 2, 3]);
  }, 120_000);

  it('commits trajectory offsets only once a checkpoint holds the steps that trained them', async () => {
    // One checkpoint, after step 1 of 4: the trajectories of steps 0–1 (2 steps × 2 tasks × 2 samples, first on
    // their partitions in sync mode) are committed; those of steps 2–3 are not, a restarted trainer reads them again.
    const topics = kafkaTopics(uniqueName('ckpt'));
    const admin = kafka.admin();
    await admin.connect();
    try {
      const { steps } = await runDeployment(
        { mode: 'sync', tasks: 8, batchSize: 2, steps: 4, checkpointed: (step) => step.step === 1 },
        topics,
      );
      expect(steps).toHaveLength(4);
      const [entry] = await admin.fetchOffsets({ groupId: `${topics.trajectories}.trainer`, topics: [topics.trajectories] });
      expect(entry.partitions.reduce((n, p) => n + Math.max(0, Number(p.offset)), 0)).toBe(8);
    } finally {
      await admin.disconnect();
    }
  }, 120_000);

  it('holds every offset when no checkpoint is ever written', async () => {
    const topics = kafkaTopics(uniqueName('nockpt'));
    const admin = kafka.admin();
    await admin.connect();
    try {
      const { steps } = await runDeployment({ mode: 'sync', tasks: 6, batchSize: 2, steps: 3, checkpointed: () => false }, topics);
      expect(steps).toHaveLength(3);
      const [entry] = await admin.fetchOffsets({ groupId: `${topics.trajectories}.trainer`, topics: [topics.trajectories] });
      // Nothing committed: a trainer restarted now would read all 12 trajectories again.
      expect(entry.partitions.map((p) => Number(p.offset))).toEqual(entry.partitions.map(() => -1));
    } finally {
      await admin.disconnect();
    }
  }, 120_000);
});
