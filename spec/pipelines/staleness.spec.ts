import { lastValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../../lib/model/types.js';
import type { Evaluator } from '../../lib/core/evaluator.js';
import { createRng, type Rng } from '../../lib/core/random.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Batch, Task } from '../../lib/core/types.js';
import { grpoPipeline } from '../../pipelines/grpoPipeline.js';
import { flatOrAlternating, tinyTokenizer } from '../helpers/fixtures.js';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** Latency: uniform 0–6 ms, with a 15 % long tail of 15–30 ms. */
function latency(rng: Rng): number {
  return rng.next() < 0.15 ? 15 + 15 * rng.next() : 6 * rng.next();
}

class LatencyEngine implements RolloutEngine {
  readonly modelTag = 'policy';
  readonly tokenizer = tinyTokenizer;
  version = 0;
  loads: number[] = [];
  constructor(private readonly rng: Rng) {}
  async generate(requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> {
    const version = this.version; // `continue`: a response is tagged with the version it started with
    await sleep(latency(this.rng));
    return requests.map(() => ({ tokens: [3, 2], logprobs: [-1, -1], finishReason: 'stop', policyVersion: version }));
  }
  async loadWeights(version: number): Promise<void> {
    this.loads.push(version);
    this.version = version;
  }
}

class RecordingTrainer implements Trainer {
  readonly modelTag = 'policy';
  step = 0;
  batches: { step: number; batch: Batch }[] = [];
  constructor(private readonly rng: Rng) {}
  async trainStep(batch: Batch): Promise<StepResult> {
    const step = this.step;
    this.batches.push({ step, batch });
    await sleep(12 * this.rng.next());
    this.step++;
    const weights: NamedWeights = new Map();
    return {
      step,
      version: step + 1,
      metrics: { ...batch.metrics },
      skipped: false,
      trajectoryIds: batch.meta.trajectoryIds,
      weights: () => weights,
    };
  }
}

const evaluator: Evaluator = { evaluate: (_task, _response) => ({ reward: 1 }) };

interface Trial {
  mode: StalenessMode;
  eta: number;
  capacity: number;
  staleness: number[];
  trainedTasks: string[];
  admitted: string[];
  loads: number[];
  steps: number;
  creditViolations: number;
}

async function trial(mode: StalenessMode, seed: number, eta = 1): Promise<Trial> {
  const rng = createRng(seed, mode);
  const batchSize = 1 + Math.floor(rng.next() * 3);
  const groupSize = 1 + Math.floor(rng.next() * 3);
  const taskCount = batchSize * (4 + Math.floor(rng.next() * 4)) + Math.floor(rng.next() * batchSize);
  const capacity = batchSize * (1 + Math.floor(rng.next() * 3));
  const engine = new LatencyEngine(createRng(seed, 'engine'));
  const trainer = new RecordingTrainer(createRng(seed, 'trainer'));
  const admitted: string[] = [];
  let creditViolations = 0;
  const tasks: Task[] = Array.from({ length: taskCount }, (_, i) => ({ id: `t${i}`, prompt: 'ab' }));
  const loader = (async function* () {
    for (let i = 0; i < tasks.length; i++) {
      // Credit check at the moment the loader is read: the engines' version is what the gate has seen (or newer).
      const trainedGroups = trainer.batches.reduce(
        (n, b) => n + (b.step < engine.version ? (b.batch.metrics?.['batch/groups'] ?? 0) : 0),
        0,
      );
      const allowed =
        mode === 'fully-async' ? i - trainedGroups < capacity : Math.floor(i / batchSize) <= engine.version + (mode === 'sync' ? 0 : eta);
      if (!allowed) creditViolations++;
      admitted.push(tasks[i].id);
      yield tasks[i];
    }
  })();
  const results = await lastValueFrom(
    grpoPipeline({
      tasks: loader,
      engines: [engine],
      trainer,
      evaluator,
      mode,
      stalenessThreshold: eta,
      capacity,
      batchSize,
      groupSize,
      maxTokens: 2,
    }).pipe(toArray()),
  );
  const staleness = trainer.batches.flatMap(({ step, batch }) => batch.meta.policyVersions.map((v) => step - v));
  const trainedTasks = trainer.batches.flatMap(({ batch }) => [...new Set(batch.meta.taskIds)]);
  const rows = trainer.batches.flatMap(({ batch }) => batch.meta.trajectoryIds);
  expect(new Set(rows).size).toBe(rows.length);
  expect(rows).toHaveLength(taskCount * groupSize);
  return { mode, eta, capacity, staleness, trainedTasks, admitted, loads: engine.loads, steps: results.length, creditViolations };
}

const SEEDS = [1, 2, 3, 4, 5, 6];

describe('staleness modes (property: random rollout latencies and train durations)', () => {
  it.each(SEEDS)('sync: every trajectory has staleness 0; nothing lost or trained twice (seed %i)', async (seed) => {
    const t = await trial('sync', seed);
    expect(Math.max(...t.staleness)).toBe(0);
    expect([...t.trainedTasks].sort()).toEqual([...t.admitted].sort());
    expect(t.creditViolations).toBe(0);
  });

  it.each(SEEDS.flatMap((seed) => [1, 2].map((eta) => [seed, eta])))(
    'batch-async: staleness never exceeds η (seed %i, η %i)',
    async (seed, eta) => {
      const t = await trial('batch-async', seed, eta);
      expect(Math.max(...t.staleness)).toBeLessThanOrEqual(eta);
      expect([...t.trainedTasks].sort()).toEqual([...t.admitted].sort());
      expect(t.creditViolations).toBe(0);
    },
  );

  it.each(SEEDS)('fully-async: weights are published after every step, within capacity (seed %i)', async (seed) => {
    const t = await trial('fully-async', seed);
    expect(t.loads).toEqual(Array.from({ length: t.steps }, (_, i) => i + 1));
    expect([...t.trainedTasks].sort()).toEqual([...t.admitted].sort());
    expect(t.creditViolations).toBe(0);
  });

  it.each(['batch-async', 'fully-async'] as const)('%s: a step budget trains exactly that many steps', async (mode) => {
    const engine = new LatencyEngine(createRng(7, 'engine'));
    const trainer = new RecordingTrainer(createRng(7, 'trainer'));
    const tasks: Task[] = Array.from({ length: 40 }, (_, i) => ({ id: `t${i}`, prompt: 'ab' }));
    const results = await lastValueFrom(
      grpoPipeline({
        tasks,
        engines: [engine],
        trainer,
        evaluator,
        mode,
        stalenessThreshold: 2,
        batchSize: 2,
        groupSize: 2,
        maxTokens: 2,
        steps: 3,
      }).pipe(toArray()),
    );
    await sleep(40);
    expect(results).toHaveLength(3);
    expect(trainer.step).toBe(3);
  });

  it('batch-async actually overlaps: some trajectories are stale when rollouts are slow', async () => {
    const stale = (await Promise.all(SEEDS.map((seed) => trial('batch-async', seed, 2)))).flatMap((t) => t.staleness);
    expect(Math.max(...stale)).toBeGreaterThan(0);
  });
});

describe('dynamic sampling (generationBatchSize > batchSize, zero-variance groups filtered)', () => {
  // Every third task's samples all score 1 (zero variance); the others' two samples score 0 and 1.
  const flat = (id: string): boolean => Number(id.slice(1)) % 3 === 0;
  const run = async (mode: StalenessMode) => {
    const engine = new LatencyEngine(createRng(3, 'engine'));
    const trainer = new RecordingTrainer(createRng(3, 'trainer'));
    const varied = flatOrAlternating(flat);
    const admitted: string[] = [];
    const results = await lastValueFrom(
      grpoPipeline({
        tasks: Array.from({ length: 40 }, (_, i) => ({ id: `t${i}`, prompt: 'ab' })),
        engines: [engine],
        trainer,
        evaluator: varied,
        mode,
        batchSize: 2,
        generationBatchSize: 4,
        groupSize: 2,
        maxTokens: 2,
        steps: 5,
        advantage: { filterZeroVariance: true },
        onAdmit: (task) => admitted.push(task.id),
      }).pipe(toArray()),
    );
    return { results, admitted, batches: trainer.batches };
  };

  it.each(['sync', 'batch-async'] as const)(
    '%s: each step trains the first batchSize informative groups of its admission batch, in admission order',
    async (mode) => {
      const { results, admitted, batches } = await run(mode);
      expect(results).toHaveLength(5);
      expect(admitted).toEqual(Array.from({ length: 20 }, (_, i) => `t${i}`)); // steps · generationBatchSize, no more
      for (const { step, batch } of batches) {
        const expected = admitted
          .slice(4 * step, 4 * step + 4)
          .filter((id) => !flat(id))
          .slice(0, 2);
        expect([...new Set(batch.meta.taskIds)]).toEqual(expected);
        expect(batch.meta.groups).toHaveLength(4); // every admitted group is accounted for (a Kafka stage acks them)
        expect(Math.max(...batch.meta.policyVersions.map((v) => step - v))).toBeLessThanOrEqual(mode === 'sync' ? 0 : 1);
      }
      // Admission batches t0–t3 … t16–t19 hold 2, 3, 3, 2, 3 informative tasks.
      expect(batches.map(({ batch }) => batch.metrics?.['batch/groups_surplus'])).toEqual([0, 1, 1, 0, 1]);
    },
  );

  it('fully-async: every step trains at most batchSize informative groups, within capacity', async () => {
    const { results, admitted, batches } = await run('fully-async');
    expect(results).toHaveLength(5);
    expect(admitted).toHaveLength(20);
    for (const { batch } of batches) {
      const ids = [...new Set(batch.meta.taskIds)];
      expect(ids.length).toBeGreaterThan(0);
      expect(ids.length).toBeLessThanOrEqual(2);
      expect(ids.filter(flat)).toEqual([]);
    }
  });

  it('refuses a generation batch below the train batch, or above it without the filter', () => {
    const config = {
      tasks: [],
      engines: [new LatencyEngine(createRng(1, 'e'))],
      trainer: new RecordingTrainer(createRng(1, 't')),
      evaluator,
    };
    const base = { ...config, batchSize: 2, groupSize: 2, maxTokens: 2 };
    expect(() => grpoPipeline({ ...base, generationBatchSize: 1 }).subscribe()).toThrow(
      /generationBatchSize: must be an integer >= batchSize \(2\), got 1/,
    );
    expect(() => grpoPipeline({ ...base, generationBatchSize: 4 }).subscribe()).toThrow(
      /generationBatchSize: larger than batchSize needs advantage\.filterZeroVariance/,
    );
  });
});
