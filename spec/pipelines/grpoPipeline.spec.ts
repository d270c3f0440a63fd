import * as tf from '@tensorflow/tfjs-core';
import { lastValueFrom, tap, toArray } from 'rxjs';
import { beforeAll, describe, expect, it } from 'vitest';
import { LocalEngine } from '../../lib/engine/local.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { ConfigError, EngineError } from '../../lib/core/errors.js';
import { ActivityTracker } from '../../lib/observe/activity.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import type { StepResult } from '../../lib/train/types.js';
import type { Batch } from '../../lib/core/types.js';
import { grpoPipeline } from '../../pipelines/grpoPipeline.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';
import { SPEC_BACKENDS } from '../helpers/backends.js';

const task = stringTransformTask({ alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 4, seed: 2 });
const tokenizer = new CharTokenizer(task.characters);
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };

/** Sets up a trainer and a local engine over separate copies of one tiny policy. */
function setup(): { trainer: GrpoTrainer; engine: LocalEngine; trained: Batch[]; dispose: () => void } {
  const policy = PolicyModel.create(config, 4);
  const rolloutModel = PolicyModel.fromWeights(config, policy.getWeights());
  const engine = new LocalEngine(rolloutModel, { tokenizer });
  const trainer = new GrpoTrainer(policy, { learningRate: 1e-2 });
  const trained: Batch[] = [];
  const step = trainer.trainStep.bind(trainer);
  trainer.trainStep = (batch, signal) => {
    trained.push(batch);
    return step(batch, signal);
  };
  return {
    trainer,
    engine,
    trained,
    dispose: () => {
      trainer.dispose();
      policy.dispose();
      rolloutModel.dispose();
    },
  };
}

describe.each(SPEC_BACKENDS)('grpoPipeline (%s backend)', (backend) => {
  beforeAll(async () => {
    await initBackend(backend, { logger: { info: () => undefined } });
  });

  it('sync mode: every trained trajectory has staleness 0, versions advance once per step', async () => {
    const { trainer, engine, trained, dispose } = setup();
    const results = await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: 2, shuffle: true, seed: 1 },
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        batchSize: 3,
        groupSize: 4,
        maxTokens: 4,
        steps: 4,
      }).pipe(toArray()),
    );
    expect(results.map((r) => [r.step, r.version])).toEqual([
      [0, 1],
      [1, 2],
      [2, 3],
      [3, 4],
    ]);
    expect(trained).toHaveLength(4);
    trained.forEach((batch, step) => {
      expect(batch.size).toBe(12);
      expect(batch.meta.policyVersions.every((v) => step - v === 0)).toBe(true);
    });
    expect(results.every((r) => r.metrics['rollout/staleness_max'] === 0)).toBe(true);
    expect(engine.version).toBe(4);
    const ids = trained.flatMap((b) => b.meta.trajectoryIds);
    expect(new Set(ids).size).toBe(ids.length);
    dispose();
  });

  it('ignoreEos: every trained sample ran to maxTokens, whatever tokens it sampled', async () => {
    const { trainer, engine, trained, dispose } = setup();
    try {
      await lastValueFrom(
        grpoPipeline({
          tasks: task.train,
          engines: [engine],
          trainer,
          evaluator: task.evaluator,
          batchSize: 2,
          groupSize: 4,
          maxTokens: 5,
          ignoreEos: true,
          steps: 2,
        }).pipe(toArray()),
      );
      expect(trained).toHaveLength(2);
      for (const batch of trained) {
        expect(batch.responseLength).toBe(5);
        expect(batch.meta.finishReasons).toEqual(Array.from({ length: batch.size }, () => 'length'));
        expect(batch.responseMask.every((m) => m === 1)).toBe(true);
      }
    } finally {
      dispose();
    }
  });

  it('cancels on abort: the stream completes, rollouts stop, and no tensor is left behind', async () => {
    const tensors = tf.memory().numTensors;
    const { trainer, engine, dispose } = setup();
    const controller = new AbortController();
    const seen: StepResult[] = [];
    let generating = 0;
    const generate = engine.generate.bind(engine);
    engine.generate = async (requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]> => {
      generating++;
      try {
        return await generate(requests, signal);
      } finally {
        generating--;
      }
    };
    await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: Infinity },
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        batchSize: 2,
        groupSize: 4,
        maxTokens: 4,
        signal: controller.signal,
      }).pipe(
        tap((step) => {
          seen.push(step);
          if (step.step === 1) controller.abort();
        }),
      ),
      { defaultValue: undefined },
    );
    expect(seen).toHaveLength(2);
    await new Promise((resolve) => setTimeout(resolve, 50));
    expect(generating).toBe(0);
    dispose();
    expect(tf.memory().numTensors).toBe(tensors);
  });

  it('reports every module to the activity tracker: each read, sample, group, batch, step and publication', async () => {
    const { trainer, engine, dispose } = setup();
    const activity = new ActivityTracker();
    // One sample of each group fails: the rollout module counts it and keeps its error.
    const generate = engine.generate.bind(engine);
    let calls = 0;
    engine.generate = async (requests, signal) => {
      if (++calls % 4 === 0) throw new EngineError('no answer this time');
      return generate(requests, signal);
    };
    await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        batchSize: 3,
        groupSize: 4,
        maxTokens: 4,
        steps: 2,
        concurrency: 1,
        activity,
      }).pipe(toArray()),
    );
    const { modules, inFlight, stalled } = activity.snapshot();
    expect(inFlight).toBe(0);
    expect(stalled).toEqual([]);
    const count = (name: string): [number, number, number] => [modules[name].started, modules[name].completed, modules[name].failed];
    expect(count('loader')).toEqual([6, 6, 0]);
    expect(count('rollout')).toEqual([24, 18, 6]);
    expect(modules.rollout.lastError).toMatchObject({ name: 'EngineError', message: 'no answer this time' });
    expect(count('store')).toEqual([6, 6, 0]);
    expect(modules.store.held).toBe(0);
    expect(count('batcher')).toEqual([2, 2, 0]);
    expect(modules.batcher.held).toBe(0);
    expect(count('trainer')).toEqual([2, 2, 0]);
    expect(count('sync')).toEqual([2, 2, 0]);
    dispose();
  });

  it('rejects a pipeline without engines', () => {
    const { trainer, dispose } = setup();
    expect(() =>
      grpoPipeline({ tasks: [], engines: [], trainer, evaluator: task.evaluator, batchSize: 1, groupSize: 1, maxTokens: 1 }),
    ).toThrow(ConfigError);
    dispose();
  });
});
