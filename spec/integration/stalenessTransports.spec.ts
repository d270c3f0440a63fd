/**
 * The staleness checks, run unchanged through every transport of the policy loop: in process (grpoPipeline over an
 * engine with random latencies) and over Kafka (kafkaTrainer with two kafkaRolloutWorker subscriptions on the real
 * broker, one of them slow). The loop is the same code on both; these checks keep it so.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Kafka } from 'kafkajs';

import { lastValueFrom, toArray } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';

import type { Evaluator } from '../../lib/core/evaluator.js';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../../lib/model/types.js';
import { ConfigError } from '../../lib/core/errors.js';
import { ensureTopics } from '../../lib/kafka/client.js';
import { kafkaTopics, type KafkaEvent } from '../../lib/kafka/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { createRng, type Rng } from '../../lib/core/random.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Batch, Task } from '../../lib/core/types.js';
import { grpoPipeline } from '../../pipelines/grpoPipeline.js';
import { kafkaRolloutWorker } from '../../pipelines/kafkaRolloutWorker.js';
import { kafkaTrainer } from '../../pipelines/kafkaTrainer.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { flatOrAlternating } from '../helpers/fixtures.js';
import { kafkaClient, uniqueName } from '../kafka/helpers.js';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const task = stringTransformTask({ transform: 'reverse', alphabet: 'abcd', minLength: 2, maxLength: 2, validationSize: 1 });
const tokenizer = new CharTokenizer(task.characters);
const MODEL = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };

let kafka: Kafka;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  kafka = kafkaClient('rxrl-staleness-transports-spec');
});

/** Records every batch it trains (with the step that trained it), taking a random time per step. */
class RecordingTrainer implements Trainer {
  step = 0;
  readonly batches: { step: number; batch: Batch }[] = [];
  constructor(
    private readonly rng: Rng,
    private readonly weights: () => NamedWeights,
    readonly modelTag = 'policy',
  ) {}
  async trainStep(batch: Batch): Promise<StepResult> {
    const step = this.step;
    this.batches.push({ step, batch });
    await sleep(12 * this.rng.next());
    this.step++;
    return {
      step,
      version: step + 1,
      metrics: { ...batch.metrics },
      skipped: false,
      trajectoryIds: batch.meta.trajectoryIds,
      weights: this.weights,
    };
  }
}

/** Answers after a random latency, tagged with the version it started with. */
class LatencyEngine implements RolloutEngine {
  readonly modelTag = 'policy';
  readonly tokenizer = tokenizer;
  version = 0;
  constructor(private readonly rng: Rng) {}
  async generate(requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> {
    const version = this.version;
    await sleep(this.rng.next() < 0.15 ? 15 + 15 * this.rng.next() : 6 * this.rng.next());
    return requests.map(() => ({ tokens: [3, tokenizer.eosId], logprobs: [-1, -1], finishReason: 'stop', policyVersion: version }));
  }
  async loadWeights(version: number): Promise<void> {
    this.version = version;
  }
}

interface Run {
  readonly mode: StalenessMode;
  readonly eta: number;
  readonly seed: number;
  readonly tasks: readonly Task[];
  readonly batchSize: number;
  /** Dynamic sampling: tasks admitted per step (the zero-variance filter on). Default `batchSize`. */
  readonly generationBatchSize?: number | undefined;
  readonly groupSize: number;
  /** Scores the samples. Default the task's own evaluator. */
  readonly evaluator?: Evaluator | undefined;
  readonly trainer: RecordingTrainer;
  /** The model whose weights the trainer announces (unchanged by the recording trainer). */
  readonly policy: PolicyModel;
  readonly onAdmit: (task: Task, index: number) => void;
  /** Sees the transport's events (Kafka's `trainer.*`). */
  readonly onEvent?: ((event: KafkaEvent) => void) | undefined;
}

/** A transport of the loop: runs it to its end, returning the step results. */
interface Transport {
  readonly name: string;
  readonly seeds: readonly number[];
  run(run: Run): Promise<StepResult[]>;
}

const inProcess: Transport = {
  name: 'in process',
  seeds: [1, 2, 3],
  run: ({ mode, eta, seed, tasks, batchSize, groupSize, trainer, onAdmit, ...run }) =>
    lastValueFrom(
      grpoPipeline({
        tasks: [...tasks],
        engines: [new LatencyEngine(createRng(seed, 'engine'))],
        trainer,
        evaluator: run.evaluator ?? task.evaluator,
        mode,
        stalenessThreshold: eta,
        batchSize,
        ...dynamicSampling(run.generationBatchSize),
        groupSize,
        maxTokens: task.maxAnswerLength + 1,
        onAdmit,
      }).pipe(toArray()),
    ),
};

const overKafka: Transport = {
  name: 'Kafka',
  seeds: [1],
  run: async ({ mode, eta, tasks, batchSize, groupSize, trainer, policy, onAdmit, onEvent, ...run }) => {
    const topics = kafkaTopics(uniqueName('stale'));
    await ensureTopics(kafka, topics, { tasks: 4, trajectories: 2 });
    // Two workers, one slow: groups come back out of admission order.
    const workers = [0, 15].map((rolloutDelayMs, i) =>
      lastValueFrom(
        kafkaRolloutWorker({
          kafka,
          topics,
          tokenizer,
          evaluator: run.evaluator ?? task.evaluator,
          workerId: `${topics.tasks}-w${i}`,
          concurrency: 2,
          rolloutDelayMs,
        }).pipe(toArray()),
      ),
    );
    const steps = await lastValueFrom(
      kafkaTrainer({
        kafka,
        topics,
        tasks: [...tasks],
        trainer,
        policy,
        padId: tokenizer.padId,
        weightsDir: mkdtempSync(join(tmpdir(), 'rxrl-stale-')),
        mode,
        stalenessThreshold: eta,
        batchSize,
        ...dynamicSampling(run.generationBatchSize),
        groupSize,
        maxTokens: task.maxAnswerLength + 1,
        onAdmit,
        ...(onEvent ? { onEvent } : {}),
      }).pipe(toArray()),
    );
    await Promise.all(workers);
    return steps;
  },
};

/** The loop settings of dynamic sampling with `generationBatchSize` tasks a step, or none. */
function dynamicSampling(generationBatchSize: number | undefined) {
  return generationBatchSize === undefined ? {} : { generationBatchSize, advantage: { filterZeroVariance: true } };
}

interface Trial {
  readonly staleness: number[];
  /** Per trained batch, the admission batches (⌊index / batchSize⌋) of its tasks, and its step. */
  readonly admissionBatches: { step: number; batches: number[] }[];
  readonly admitted: string[];
  readonly trained: string[];
  readonly steps: number;
}

async function trial(
  transport: Transport,
  mode: StalenessMode,
  seed: number,
  eta = 1,
  onEvent?: (event: KafkaEvent) => void,
): Promise<Trial & { batchSize: number }> {
  const rng = createRng(seed, `${transport.name}/${mode}/${eta}`);
  const batchSize = 2 + Math.floor(rng.next() * 2);
  const groupSize = 2;
  const count = batchSize * (3 + Math.floor(rng.next() * 2));
  const policy = PolicyModel.create(MODEL, seed);
  const trainer = new RecordingTrainer(createRng(seed, 'trainer'), () => policy.getWeights());
  const indexOf = new Map<string, number>();
  try {
    const tasks = task.train.slice(0, count);
    const results = await transport.run({
      mode,
      eta,
      seed,
      tasks,
      batchSize,
      groupSize,
      trainer,
      policy,
      onAdmit: (t, index) => indexOf.set(t.id, index),
      onEvent,
    });
    return {
      staleness: trainer.batches.flatMap(({ step, batch }) => batch.meta.policyVersions.map((v) => step - v)),
      admissionBatches: trainer.batches.map(({ step, batch }) => ({
        step,
        batches: [...new Set(batch.meta.taskIds.map((id) => Math.floor((indexOf.get(id) ?? -batchSize) / batchSize)))],
      })),
      admitted: [...indexOf.keys()].sort(),
      trained: trainer.batches.flatMap(({ batch }) => [...new Set(batch.meta.taskIds)]).sort(),
      steps: results.length,
      batchSize,
    };
  } finally {
    policy.dispose();
  }
}

describe.each([inProcess, overKafka])('staleness modes through the loop: $name', (transport) => {
  it.each(transport.seeds)(
    'sync: every trajectory on-policy; each batch is the admission batch of its step (seed %i)',
    async (seed) => {
      const t = await trial(transport, 'sync', seed);
      expect(Math.max(...t.staleness)).toBe(0);
      expect(t.admissionBatches).toEqual(t.admissionBatches.map(({ step }) => ({ step, batches: [step] })));
      expect(t.trained).toEqual(t.admitted);
    },
    120_000,
  );

  it.each(transport.seeds.flatMap((seed) => [1, 2].map((eta) => [seed, eta])))(
    'batch-async: staleness never exceeds η; each batch is one admission batch, in order (seed %i, η %i)',
    async (seed, eta) => {
      const t = await trial(transport, 'batch-async', seed, eta);
      expect(Math.max(...t.staleness)).toBeLessThanOrEqual(eta);
      expect(Math.min(...t.staleness)).toBeGreaterThanOrEqual(0);
      expect(t.admissionBatches).toEqual(t.admissionBatches.map(({ step }) => ({ step, batches: [step] })));
      expect(t.trained).toEqual(t.admitted);
    },
    120_000,
  );

  it.each(transport.seeds)(
    'fully-async: staleness recorded, never negative; every admitted task trained once (seed %i)',
    async (seed) => {
      const t = await trial(transport, 'fully-async', seed);
      expect(Math.min(...t.staleness)).toBeGreaterThanOrEqual(0);
      expect(Math.max(...t.staleness)).toBeLessThan(t.steps);
      expect(t.trained).toEqual(t.admitted);
    },
    120_000,
  );
});

describe.each([inProcess, overKafka])('dynamic sampling through the loop: $name', (transport) => {
  it.each(['sync', 'batch-async'] as const)(
    '%s: each step trains the first batchSize informative groups of its own admission batch; every admitted group is accounted for',
    async (mode) => {
      // Every third task's samples all score 1 (no signal); the others' two samples score 0 and 1.
      const flat = (id: string): boolean => task.train.findIndex((t) => t.id === id) % 3 === 0;
      const evaluator = flatOrAlternating(flat);
      const policy = PolicyModel.create(MODEL, 5);
      const trainer = new RecordingTrainer(createRng(5, 'trainer'), () => policy.getWeights());
      const admitted: string[] = [];
      try {
        const steps = await transport.run({
          ...{ mode, eta: 1, seed: 5, tasks: task.train.slice(0, 12), batchSize: 2, generationBatchSize: 4, groupSize: 2 },
          evaluator,
          trainer,
          policy,
          onAdmit: (t, index) => (admitted[index] = t.id),
        });
        expect(steps).toHaveLength(3);
        for (const { step, batch } of trainer.batches) {
          const own = admitted.slice(4 * step, 4 * step + 4);
          expect([...new Set(batch.meta.taskIds)]).toEqual(own.filter((id) => !flat(id)).slice(0, 2));
          expect(batch.metrics?.['batch/groups']).toBe(4);
          expect(Math.max(...batch.meta.policyVersions.map((v) => step - v))).toBeLessThanOrEqual(mode === 'sync' ? 0 : 1);
        }
      } finally {
        policy.dispose();
      }
    },
    120_000,
  );
});

describe('the Kafka rollout stage', () => {
  it.each([
    ['sync', 0],
    ['batch-async', 1],
    ['batch-async', 2],
  ] as const)(
    '%s (η %i): each task goes out requiring the version its admission batch waited for',
    async (mode, eta) => {
      const admitted: { index: number; minVersion: number }[] = [];
      const onEvent = (event: KafkaEvent): void => {
        if (event.type === 'trainer.admitted')
          admitted.push({ index: event.payload.index as number, minVersion: event.payload.minVersion as number });
      };
      const t = await trial(overKafka, mode, 2, Math.max(eta, 1), onEvent);
      expect(admitted).toHaveLength(t.admitted.length);
      expect(admitted).toEqual(admitted.map(({ index }) => ({ index, minVersion: Math.max(0, Math.floor(index / t.batchSize) - eta) })));
    },
    120_000,
  );
});

describe("the loop's checks on a Kafka run", () => {
  it('a policy no agent samples from fails the run with a ConfigError before it touches the broker', async () => {
    const topics = kafkaTopics(uniqueName('idle'));
    const writer = PolicyModel.create(MODEL, 1);
    const idle = PolicyModel.create(MODEL, 2);
    try {
      const policy = (model: PolicyModel, tag: string): { trainer: RecordingTrainer; policy: PolicyModel } => ({
        trainer: new RecordingTrainer(createRng(1, tag), () => model.getWeights(), tag),
        policy: model,
      });
      const run = lastValueFrom(
        kafkaTrainer({
          kafka,
          topics,
          tasks: task.train.slice(0, 2),
          policies: [policy(writer, 'writer'), policy(idle, 'idle')],
          episodes: {
            environment: {
              turnOrder: ['writer'],
              maxTurns: 1,
              reset: () => ({ observe: () => 'a', step: () => ({ rewards: {}, done: true }) }),
            },
            agents: [{ name: 'writer', policy: 'writer' }],
          },
          padId: tokenizer.padId,
          weightsDir: mkdtempSync(join(tmpdir(), 'rxrl-idle-')),
          batchSize: 1,
          groupSize: 1,
          maxTokens: 2,
        }),
      );
      await expect(run).rejects.toBeInstanceOf(ConfigError);
      await expect(run).rejects.toMatchObject({ context: { key: 'policies', modelTag: 'idle' } });
      const admin = kafka.admin();
      await admin.connect();
      try {
        expect(await admin.listTopics()).not.toContain(topics.tasks);
      } finally {
        await admin.disconnect();
      }
    } finally {
      writer.dispose();
      idle.dispose();
    }
  });
});
