import { lastValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import type { AgentSpec, MultiAgentEnvironment } from '../../lib/agent/environment.js';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights } from '../../lib/model/types.js';
import { ConfigError } from '../../lib/core/errors.js';
import { createRng, type Rng } from '../../lib/core/random.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Batch, Task } from '../../lib/core/types.js';
import { multiAgentPipeline } from '../../pipelines/multiAgentPipeline.js';
import { tinyTokenizer } from '../helpers/fixtures.js';

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** An engine of one policy whose latency is random (uniform 0–6 ms, a 15 % tail of 15–30 ms). */
class LatencyEngine implements RolloutEngine {
  readonly tokenizer = tinyTokenizer;
  version = 0;
  loads: number[] = [];
  constructor(
    readonly modelTag: string,
    private readonly rng: Rng,
  ) {}
  async generate(requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> {
    const version = this.version;
    await sleep(this.rng.next() < 0.15 ? 15 + 15 * this.rng.next() : 6 * this.rng.next());
    return requests.map(() => ({ tokens: [3, 2], logprobs: [-1, -1], finishReason: 'stop', policyVersion: version }));
  }
  async loadWeights(version: number): Promise<void> {
    this.loads.push(version);
    this.version = version;
  }
}

/** A trainer that records its batches and takes a random time per step. */
class RecordingTrainer implements Trainer {
  step = 0;
  batches: { step: number; batch: Batch }[] = [];
  constructor(
    readonly modelTag: string,
    private readonly rng: Rng,
    private readonly slowdown = 1,
  ) {}
  async trainStep(batch: Batch): Promise<StepResult> {
    const step = this.step;
    this.batches.push({ step, batch });
    await sleep(12 * this.slowdown * this.rng.next());
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

/**
 * Three turns (writer, editor, writer); an episode may end after the first turn (`stopEarly` of them, by the
 * task), so some slots are skipped. Each agent is rewarded 1 per turn.
 */
function environment(stopEarly: ReadonlySet<string>): MultiAgentEnvironment {
  return {
    turnOrder: ['writer', 'editor'],
    maxTurns: 3,
    reset: (task) => ({
      observe: (agent, turn) => `${task.prompt}${agent[0]}${turn}`,
      step: (agent, _response, turn) => ({ rewards: { [agent]: 1 }, done: turn === 2 || (turn === 0 && stopEarly.has(task.id)) }),
    }),
  };
}

interface Trial {
  readonly staleness: Map<string, number[]>;
  readonly rows: Map<string, string[]>;
  readonly loads: Map<string, number[]>;
  readonly steps: Map<string, number>;
  readonly taskCount: number;
  readonly groupSize: number;
}

/** One random run: two policies (writer, editor) or one shared policy, random sizes and latencies. */
async function trial(mode: StalenessMode, seed: number, shared: boolean, eta = 1): Promise<Trial> {
  const rng = createRng(seed, mode, String(shared));
  const batchSize = 1 + Math.floor(rng.next() * 3);
  const groupSize = 1 + Math.floor(rng.next() * 3);
  const taskCount = batchSize * (3 + Math.floor(rng.next() * 3));
  const capacity = batchSize * (1 + Math.floor(rng.next() * 3));
  const tasks: Task[] = Array.from({ length: taskCount }, (_, i) => ({ id: `t${i}`, prompt: 'ab' }));
  const stopEarly = new Set(tasks.filter(() => rng.next() < 0.3).map((t) => t.id));
  const tags = shared ? ['shared'] : ['writer', 'editor'];
  // The editor trains three times slower than the writer: a slow policy must not break the other's bound.
  const policies = tags.map((tag, i) => ({
    engine: new LatencyEngine(tag, createRng(seed, 'engine', tag)),
    trainer: new RecordingTrainer(tag, createRng(seed, 'trainer', tag), 1 + 2 * i),
  }));
  const agents: AgentSpec[] = [
    { name: 'writer', policy: tags[0] },
    { name: 'editor', policy: tags[tags.length - 1] },
  ];
  const results = await lastValueFrom(
    multiAgentPipeline({
      tasks,
      environment: environment(stopEarly),
      agents,
      policies: policies.map((p) => ({ trainer: p.trainer, engines: [p.engine] })),
      mode,
      stalenessThreshold: eta,
      capacity,
      batchSize,
      groupSize,
      maxTokens: 2,
    }).pipe(toArray()),
  );
  const out: Trial = { staleness: new Map(), rows: new Map(), loads: new Map(), steps: new Map(), taskCount, groupSize };
  for (const { engine, trainer } of policies) {
    const tag = trainer.modelTag;
    out.staleness.set(
      tag,
      trainer.batches.flatMap(({ step, batch }) => batch.meta.policyVersions.map((v) => step - v)),
    );
    out.rows.set(
      tag,
      trainer.batches.flatMap(({ batch }) => batch.meta.trajectoryIds),
    );
    out.loads.set(tag, engine.loads);
    out.steps.set(tag, results.filter((r) => r.modelTag === tag).length);
    // A policy's step metrics split its rows by agent: a shared policy has rows of both.
    for (const r of results.filter((x) => x.modelTag === tag)) {
      const rows = ['writer', 'editor'].reduce((n, agent) => n + (r.metrics[`${tag}/agents/${agent}/rows`] ?? 0), 0);
      expect(rows).toBe(r.trajectoryIds.length);
    }
    for (const { batch } of trainer.batches) expect(batch.meta.modelTag).toBe(tag);
  }
  // Every played slot is trained once, by its own policy: writer slots /writer/0 and /writer/2, editor /editor/1.
  const played = (turn: number): number => tasks.filter((t) => turn === 0 || !stopEarly.has(t.id)).length * groupSize;
  const expected = shared ? { shared: played(0) + played(1) + played(2) } : { writer: played(0) + played(2), editor: played(1) };
  for (const [tag, n] of Object.entries(expected)) {
    const rows = out.rows.get(tag) ?? [];
    expect(new Set(rows).size).toBe(rows.length);
    expect(rows).toHaveLength(n);
  }
  return out;
}

const SEEDS = [1, 2, 3, 4];

describe('multiAgentPipeline: per-policy staleness (property: random latencies, a slow policy, early ends)', () => {
  it.each(SEEDS.flatMap((seed) => [false, true].map((shared) => [seed, shared] as const)))(
    'sync: every trajectory of every policy has staleness 0, nothing lost (seed %i, shared %s)',
    async (seed, shared) => {
      const t = await trial('sync', seed, shared);
      for (const staleness of t.staleness.values()) expect(Math.max(...staleness)).toBe(0);
    },
  );

  it.each(SEEDS.flatMap((seed) => [1, 2].map((eta) => [seed, eta] as const)))(
    'batch-async: each policy stays within η in its own versions (seed %i, η %i)',
    async (seed, eta) => {
      const t = await trial('batch-async', seed, false, eta);
      for (const staleness of t.staleness.values()) expect(Math.max(...staleness)).toBeLessThanOrEqual(eta);
    },
  );

  it('batch-async actually overlaps: some trajectories of each policy are stale', async () => {
    const trials = await Promise.all(SEEDS.map((seed) => trial('batch-async', seed, false, 2)));
    for (const tag of ['writer', 'editor']) expect(Math.max(...trials.flatMap((t) => t.staleness.get(tag) ?? []))).toBeGreaterThan(0);
  });

  it.each(SEEDS)('fully-async: each policy publishes after each of its own steps (seed %i)', async (seed) => {
    const t = await trial('fully-async', seed, false);
    for (const [tag, loads] of t.loads) expect(loads).toEqual(Array.from({ length: t.steps.get(tag) ?? 0 }, (_, i) => i + 1));
  });

  it('one policy per agent: each has its own version counter and namespaced metrics', async () => {
    const writer = { engine: new LatencyEngine('writer', createRng(9)), trainer: new RecordingTrainer('writer', createRng(9)) };
    const editor = { engine: new LatencyEngine('editor', createRng(10)), trainer: new RecordingTrainer('editor', createRng(10)) };
    const tasks: Task[] = Array.from({ length: 12 }, (_, i) => ({ id: `t${i}`, prompt: 'ab' }));
    const steps = await lastValueFrom(
      multiAgentPipeline({
        tasks,
        environment: environment(new Set()),
        agents: [
          { name: 'writer', policy: 'writer' },
          { name: 'editor', policy: 'editor' },
        ],
        policies: [writer, editor].map((p) => ({ trainer: p.trainer, engines: [p.engine] })),
        mode: 'batch-async',
        batchSize: 3,
        groupSize: 2,
        maxTokens: 2,
        steps: 2,
      }).pipe(toArray()),
    );
    await sleep(40);
    expect(writer.trainer.step).toBe(2);
    expect(editor.trainer.step).toBe(2);
    expect(steps.filter((s) => s.modelTag === 'writer').map((s) => s.version)).toEqual([1, 2]);
    const writerStep = steps.find((s) => s.modelTag === 'writer') as StepResult;
    // The writer has two slots per task (turns 0 and 2): 3 tasks feed it 6 groups of 2.
    expect(writerStep.metrics['writer/batch/groups']).toBe(6);
    expect(writerStep.metrics['batch/groups']).toBeUndefined();
    expect(writerStep.metrics['writer/agents/writer/rows']).toBe(12);
    expect(writerStep.metrics['writer/agents/editor/rows']).toBeUndefined();
    expect(writer.trainer.batches[0].batch.size).toBe(12);
    expect(editor.trainer.batches[0].batch.size).toBe(6);
    expect(writer.trainer.batches[0].batch.meta.groupIds.every((g) => /\/writer\/[02]$/.test(g))).toBe(true);
  });

  it('configuration errors name the key: an unknown policy, a policy no agent uses, a missing agent', () => {
    const engine = new LatencyEngine('writer', createRng(1));
    const trainer = new RecordingTrainer('writer', createRng(1));
    const base = { tasks: [], environment: environment(new Set()), batchSize: 1, groupSize: 1, maxTokens: 2 };
    const unknown = (): unknown =>
      multiAgentPipeline({
        ...base,
        agents: [
          { name: 'writer', policy: 'writer' },
          { name: 'editor', policy: 'nobody' },
        ],
        policies: [{ trainer, engines: [engine] }],
      });
    expect(unknown).toThrow(ConfigError);
    expect(unknown).toThrow(/agents\[1\]\.policy: agent 'editor' maps to unknown policy 'nobody'/);
    const idle = new RecordingTrainer('idle', createRng(1));
    const unused = (): unknown =>
      lastValueFrom(
        multiAgentPipeline({
          ...base,
          agents: [
            { name: 'writer', policy: 'writer' },
            { name: 'editor', policy: 'writer' },
          ],
          policies: [
            { trainer, engines: [engine] },
            { trainer: idle, engines: [new LatencyEngine('idle', createRng(2))] },
          ],
        }),
      );
    return expect(unused())
      .rejects.toThrow(/policy 'idle' gets no trajectories/)
      .then(() =>
        expect(() =>
          multiAgentPipeline({ ...base, agents: [{ name: 'writer', policy: 'writer' }], policies: [{ trainer, engines: [engine] }] }),
        ).toThrow(/agent 'editor' of the environment's turnOrder has no agent spec/),
      );
  });
});
