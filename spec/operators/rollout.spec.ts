import { firstValueFrom, from, lastValueFrom, take, toArray } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { rollout } from '../../operators/rollout.js';
import { ConfigError, EngineError, EvaluationError } from '../../lib/core/errors.js';
import type { Evaluator } from '../../lib/core/evaluator.js';
import { isSampleFailure, type RolloutOutput, type Trajectory } from '../../lib/core/types.js';
import { LocalEngine } from '../../lib/engine/local.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { ScriptedEngine, task } from '../helpers/fixtures.js';
import { scriptedWeights, writeAt } from '../helpers/scripted.js';

const exact: Evaluator = { evaluate: (t, response) => ({ reward: response === t.answer ? 1 : 0, metrics: { len: response.length } }) };

describe('rollout', () => {
  it('expands each task into its group and scores every sample', async () => {
    const engine = new ScriptedEngine(() => ({ tokens: [4, 3, 2], logprobs: [-1, -2, -3], finishReason: 'stop', policyVersion: 0 }));
    const out = await lastValueFrom(
      from([task('t1'), task('t2', 'xy', 'zz')]).pipe(
        rollout(engine, { samplesPerTask: 3, concurrency: 4, maxTokens: 8, evaluator: exact }),
        toArray(),
      ),
    );
    const trajectories = out as Trajectory[];
    expect(trajectories.map((t) => t.id).sort()).toEqual(['t1@0/0', 't1@0/1', 't1@0/2', 't2@0/0', 't2@0/1', 't2@0/2']);
    const first = trajectories.find((t) => t.id === 't1@0/0')!;
    expect(first).toMatchObject({
      taskId: 't1',
      groupId: 't1@0',
      runId: 0,
      modelTag: 'policy',
      policyVersion: 0,
      promptTokens: [1, 3, 4],
      responseTokens: [4, 3, 2],
      logprobs: [-1, -2, -3],
      lossMask: [1, 1, 1],
      reward: 1,
      finishReason: 'stop',
      metrics: { len: 2 },
    });
    expect(trajectories.find((t) => t.taskId === 't2')!.reward).toBe(0);
  });

  it('records when each sample was generated and when it was scored, in that order', async () => {
    const calls: { generate?: number; evaluate?: number } = {};
    const engine = new ScriptedEngine(() => {
      calls.generate = performance.now();
      return { tokens: [4, 3, 2], logprobs: [-1, -2, -3], finishReason: 'stop', policyVersion: 0 };
    });
    const timedEvaluator: Evaluator = {
      evaluate: (t, response) => {
        calls.evaluate = performance.now();
        return { reward: response === t.answer ? 1 : 0 };
      },
    };
    const [out] = await lastValueFrom(
      from([task('t1')]).pipe(rollout(engine, { samplesPerTask: 1, concurrency: 1, maxTokens: 8, evaluator: timedEvaluator }), toArray()),
    );
    const { generate, reward } = (out as Trajectory).timing!;
    expect(generate[0]).toBeLessThanOrEqual(calls.generate!);
    expect(calls.generate!).toBeLessThanOrEqual(generate[1]);
    expect(generate[1]).toBeLessThanOrEqual(reward[0]);
    expect(reward[0]).toBeLessThanOrEqual(calls.evaluate!);
    expect(calls.evaluate!).toBeLessThanOrEqual(reward[1]);
  });

  it('hands the evaluator how each response ended and its tokens, beside the text', async () => {
    const engine = new ScriptedEngine((_request, call) =>
      call % 2 === 0
        ? { tokens: [4, 3, 2], logprobs: [-1, -1, -1], finishReason: 'stop', policyVersion: 0 }
        : { tokens: [4, 3], logprobs: [-1, -1], finishReason: 'length', policyVersion: 0 },
    );
    const seen: unknown[] = [];
    const recording: Evaluator = { evaluate: (_t, response, _s, info) => (seen.push({ response, ...info }), { reward: 0 }) };
    await lastValueFrom(
      from([task('t1')]).pipe(rollout(engine, { samplesPerTask: 4, concurrency: 2, maxTokens: 2, evaluator: recording }), toArray()),
    );
    const stopped = { response: 'ba', finishReason: 'stop', tokens: [4, 3, 2] };
    const cut = { response: 'ba', finishReason: 'length', tokens: [4, 3] };
    expect(seen.filter((s) => JSON.stringify(s) === JSON.stringify(stopped))).toHaveLength(2);
    expect(seen.filter((s) => JSON.stringify(s) === JSON.stringify(cut))).toHaveLength(2);
  });

  it('never has more samples in flight than its concurrency', async () => {
    const engine = new ScriptedEngine(undefined, 3);
    const tasks = Array.from({ length: 10 }, (_, i) => task(`t${i}`));
    const out = await lastValueFrom(
      from(tasks).pipe(rollout(engine, { samplesPerTask: 4, concurrency: 5, maxTokens: 4, evaluator: exact }), toArray()),
    );
    expect(out).toHaveLength(40);
    expect(engine.maxInFlight).toBe(5);
  });

  it('reports failed samples without failing the stream', async () => {
    const engine = new ScriptedEngine((_, call) =>
      call === 1
        ? new EngineError('server said 500', { retriable: true })
        : { tokens: [3], logprobs: [-1], finishReason: 'length', policyVersion: 0 },
    );
    let evaluations = 0;
    const flaky: Evaluator = {
      evaluate: () => {
        evaluations++;
        if (evaluations === 2) return { reward: Number.NaN };
        if (evaluations === 3) throw new Error('evaluator crashed');
        return { reward: 1 };
      },
    };
    const out: RolloutOutput[] = await lastValueFrom(
      from([task('t')]).pipe(rollout(engine, { samplesPerTask: 5, concurrency: 1, maxTokens: 4, evaluator: flaky }), toArray()),
    );
    const failures = out.filter(isSampleFailure);
    expect(out).toHaveLength(5);
    expect(failures.map((f) => f.error.name).sort()).toEqual(['EngineError', 'EvaluationError', 'EvaluationError']);
    expect(failures.every((f) => f.groupId === 't@0')).toBe(true);
    expect(failures.some((f) => f.error instanceof EvaluationError && /non-finite/.test(f.error.message))).toBe(true);
  });

  it('derives deterministic, distinct seeds per sample', async () => {
    const seeds: number[] = [];
    const engine = new ScriptedEngine((request) => {
      seeds.push(request.seed!);
      return { tokens: [3], logprobs: [-1], finishReason: 'stop', policyVersion: 0 };
    });
    const run = (): Promise<RolloutOutput[]> =>
      lastValueFrom(
        from([task('t')]).pipe(rollout(engine, { samplesPerTask: 4, concurrency: 1, maxTokens: 2, evaluator: exact, seed: 9 }), toArray()),
      );
    await run();
    const firstSeeds = seeds.splice(0);
    await run();
    expect(seeds).toEqual(firstSeeds);
    expect(new Set(firstSeeds).size).toBe(4);
  });

  it('cancels in-flight generations on unsubscribe (synchronous source with take)', async () => {
    const engine = new ScriptedEngine(undefined, 20);
    const first = await firstValueFrom(
      from(Array.from({ length: 5 }, (_, i) => task(`t${i}`))).pipe(
        rollout(engine, { samplesPerTask: 2, concurrency: 3, maxTokens: 2, evaluator: exact }),
        take(1),
      ),
    );
    expect(first.id).toBe('t0@0/0');
    await new Promise((resolve) => setTimeout(resolve, 5));
    expect(engine.inFlight).toBe(0);
  });

  it('emits a sample that outlives sampleTimeoutMs as an EngineError failure, and the stream goes on', async () => {
    // The first call hangs (a stuck engine), the others answer at once.
    const engine = new ScriptedEngine(undefined, 1);
    const slow = new ScriptedEngine(undefined, 60_000);
    const mixed = {
      modelTag: engine.modelTag,
      tokenizer: engine.tokenizer,
      get version() {
        return engine.version;
      },
      calls: 0,
      generate(requests: Parameters<ScriptedEngine['generate']>[0], signal?: AbortSignal) {
        return (this.calls++ === 0 ? slow : engine).generate(requests, signal);
      },
      loadWeights: engine.loadWeights.bind(engine),
    };
    const out = await lastValueFrom(
      from([task('t')]).pipe(
        rollout(mixed, { samplesPerTask: 3, concurrency: 3, maxTokens: 2, evaluator: exact, sampleTimeoutMs: 50 }),
        toArray(),
      ),
    );
    const failures = out.filter(isSampleFailure);
    expect(failures).toHaveLength(1);
    expect(failures[0].error).toBeInstanceOf(EngineError);
    expect(failures[0].error.message).toContain('did not finish within 50 ms');
    expect(out.filter((o) => !isSampleFailure(o))).toHaveLength(2);
    expect(slow.inFlight).toBe(0);
    expect(() => rollout(engine, { samplesPerTask: 1, concurrency: 1, maxTokens: 1, evaluator: exact, sampleTimeoutMs: 0 })).toThrow(
      ConfigError,
    );
  });

  it('errors with the abort when its signal fires, and rejects bad options', async () => {
    const controller = new AbortController();
    const engine = new ScriptedEngine(undefined, 50);
    const done = lastValueFrom(
      from([task('t')]).pipe(
        rollout(engine, { samplesPerTask: 2, concurrency: 2, maxTokens: 2, evaluator: exact, signal: controller.signal }),
      ),
    );
    setTimeout(() => controller.abort(), 5);
    await expect(done).rejects.toMatchObject({ name: 'AbortError' });
    expect(() => rollout(engine, { samplesPerTask: 0, concurrency: 1, maxTokens: 1, evaluator: exact })).toThrow(ConfigError);
    expect(() => rollout(engine, { samplesPerTask: 1, concurrency: Infinity, maxTokens: 1, evaluator: exact })).toThrow(ConfigError);
  });
});

describe('rollout with ignoreEos, on an in-process engine', () => {
  const tokenizer = new CharTokenizer();
  const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
  const noReward: Evaluator = { evaluate: () => ({ reward: 0 }) };

  beforeAll(async () => {
    await initBackend('cpu', { logger: { info: () => undefined } });
  });

  /** Samples of 'ab=' from a real model that writes 'dcba' then its stop token (eos), with probability ≈ 1. */
  async function samples(ignoreEos: boolean | undefined): Promise<Trajectory[]> {
    const model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, writeAt(4, 'dcba')));
    try {
      const engine = new LocalEngine(model, { tokenizer });
      const out = await lastValueFrom(
        from([{ id: 't', prompt: 'ab=' }]).pipe(
          rollout(engine, { samplesPerTask: 4, concurrency: 4, maxTokens: 9, evaluator: noReward, ignoreEos }),
          toArray(),
        ),
      );
      expect(out.filter(isSampleFailure)).toEqual([]);
      return out as Trajectory[];
    } finally {
      model.dispose();
    }
  }

  it('without it a sample ends at the stop token; with it every sample runs to exactly maxTokens past it', async () => {
    const scripted = [...tokenizer.encode('dcba'), tokenizer.eosId];
    for (const stopping of [await samples(undefined), await samples(false)]) {
      for (const t of stopping) expect(t).toMatchObject({ responseTokens: scripted, finishReason: 'stop' });
    }
    const running = await samples(true);
    expect(running).toHaveLength(4);
    for (const t of running) {
      expect(t.finishReason).toBe('length');
      expect(t.responseTokens).toHaveLength(9);
      expect(t.responseTokens.slice(0, 5)).toEqual(scripted);
      expect(t.logprobs).toHaveLength(9);
    }
  });
});
