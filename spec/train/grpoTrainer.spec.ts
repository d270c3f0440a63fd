import * as tf from '@tensorflow/tfjs-core';
import '@tensorflow/tfjs-backend-cpu';
import { beforeAll, describe, expect, it } from 'vitest';
import { collate } from '../../lib/data/collate.js';
import { ConfigError } from '../../lib/core/errors.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import { initBackend } from '../../lib/model/backend.js';
import { ALL_BACKENDS } from '../helpers/backends.js';
import type { Batch, Trajectory } from '../../lib/core/types.js';
import { traj } from '../helpers/fixtures.js';

const config: PolicyConfig = { vocabSize: 9, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };

function rows(model: PolicyModel): Trajectory[] {
  // Two prompts, two responses each; log-probs are those of the current model so the PPO ratio starts at 1.
  const shapes: [number[], number[], number][] = [
    [[1, 3, 4], [5, 6, 2], 1],
    [[1, 3, 4], [6, 2], 0],
    [[1, 7], [8, 5, 5, 2], 1],
    [[1, 7], [3, 2], 0],
  ];
  return shapes.map(([promptTokens, responseTokens, reward], i) => {
    const t = traj(`g${i >> 1}@0`, i & 1, {
      promptTokens,
      responseTokens,
      reward,
      logprobs: responseTokens.map(() => 0),
      lossMask: responseTokens.map(() => 1),
    });
    return { ...t, logprobs: responseLogprobs(model, t) };
  });
}

function responseLogprobs(model: PolicyModel, t: Trajectory): number[] {
  return tf.tidy(() => {
    const ids = [...t.promptTokens, ...t.responseTokens];
    const out = model.tokenLogprobs(
      tf.tensor2d([ids], [1, ids.length], 'int32'),
      tf.ones([1, ids.length]) as tf.Tensor2D,
      tf.tensor2d([ids.map((_, i) => i)], [1, ids.length], 'int32'),
    );
    return [...out.logprobs.dataSync()].slice(t.promptTokens.length - 1);
  });
}

function batchOf(model: PolicyModel, advantages = [1, -1, 1, -1]): Batch {
  return collate(rows(model), { padId: 0, modelTag: 'policy', advantages });
}

describe.each(ALL_BACKENDS)('GrpoTrainer (%s backend)', (backend) => {
  beforeAll(async () => {
    await initBackend(backend, { logger: { info: () => undefined } });
  });

  it('raises the log-prob of positive-advantage responses and lowers the others', async () => {
    const model = PolicyModel.create(config, 3);
    const trainer = new GrpoTrainer(model, { learningRate: 1e-3 });
    const before = rows(model);
    const result = await trainer.trainStep(batchOf(model));
    const after = rows(model);
    const total = (t: Trajectory): number => t.logprobs.reduce((a, b) => a + b, 0);
    expect(total(after[0])).toBeGreaterThan(total(before[0]));
    expect(total(after[1])).toBeLessThan(total(before[1]));
    // The step ascends the advantage-weighted objective as a whole (one Adam step is sign-like per weight, so
    // the per-row moves above hold for a small enough step).
    const objective = (ts: Trajectory[]): number => ts.reduce((s, t, i) => s + (i & 1 ? -1 : 1) * total(t), 0);
    expect(objective(after)).toBeGreaterThan(objective(before));
    expect(result).toMatchObject({ step: 0, version: 1, skipped: false });
    expect(result.metrics['actor/pg_clipfrac']).toBe(0);
    expect(Math.abs(result.metrics['actor/ppo_kl'])).toBeLessThan(1e-5);
    expect(result.metrics['actor/grad_norm']).toBeGreaterThan(0);
    expect(result.metrics['rollout/staleness_max']).toBe(0);
    trainer.dispose();
    model.dispose();
  });

  it("times the step's parts: micro-batch gradients and the updates, both inside the step's own seconds", async () => {
    const model = PolicyModel.create(config, 3);
    const trainer = new GrpoTrainer(model, { learningRate: 1e-3, microBatchSize: 1, ppoEpochs: 2 });
    const { metrics } = await trainer.trainStep(batchOf(model));
    const forwardBackward = metrics['timing/forward_backward_s'];
    const optimizer = metrics['timing/optimizer_s'];
    expect(forwardBackward).toBeGreaterThan(0);
    expect(optimizer).toBeGreaterThan(0);
    expect(forwardBackward + optimizer).toBeLessThanOrEqual(metrics['timing/step_s']);
    trainer.dispose();
    model.dispose();
  });

  it('trains only the weights `trainable` selects: the rest stay put and have no optimizer state', async () => {
    const model = PolicyModel.create(config, 3);
    const top = (name: string): boolean => name.startsWith('model.layers.0.mlp.') || name === 'model.norm.weight';
    const trainer = new GrpoTrainer(model, { learningRate: 1e-2, trainable: top });
    const before = model.getWeights();
    await trainer.trainStep(batchOf(model));
    const after = model.getWeights();
    for (const [name, w] of before) {
      const changed = w.data.some((x, i) => x !== after.get(name)!.data[i]);
      expect(changed, name).toBe(top(name));
    }
    const state = await trainer.optimizerState();
    const trained = model.weightNames().filter(top);
    expect([...state.keys()].sort()).toEqual(['iter', ...trained.map((n) => `m/${n}`), ...trained.map((n) => `v/${n}`)].sort());
    const resumed = new GrpoTrainer(model, { learningRate: 1e-2, trainable: top });
    await resumed.restore({ step: 1, optimizer: state });
    const again = await resumed.optimizerState();
    for (const [name, w] of state) expect(Array.from(again.get(name)!.data), name).toEqual(Array.from(w.data));
    expect(() => new GrpoTrainer(model, { trainable: () => false })).toThrow(ConfigError);
    trainer.dispose();
    resumed.dispose();
    model.dispose();
  });

  it('restores an optimizer state in the layout TF.js Adam checkpoints were written in, and saves it back unchanged', async () => {
    const model = PolicyModel.create(config, 3);
    const names = model.weightNames();
    const variables = model.trainableVariables();
    // What the trainer saved while it ran tf.train.adam: iter, then m/<name> and v/<name> in the variables' shapes.
    const reference = tf.train.adam(1e-3);
    for (let step = 0; step < 2; step++) {
      tf.tidy(() =>
        reference.applyGradients(
          variables.map((v, i) => ({ name: v.name, tensor: tf.randomNormal(v.shape, 0, 1, 'float32', 10 * step + i) })),
        ),
      );
    }
    const [iter, ...moments] = await reference.getWeights();
    const saved = new Map<string, { shape: readonly number[]; data: Float32Array }>([
      ['iter', { shape: [1], data: Float32Array.from(await iter.tensor.data()) }],
    ]);
    moments.forEach((x, i) =>
      saved.set(`${i < names.length ? 'm' : 'v'}/${names[i % names.length]}`, {
        shape: x.tensor.shape,
        data: x.tensor.dataSync() as Float32Array,
      }),
    );
    tf.dispose(iter.tensor);
    const trainer = new GrpoTrainer(model, { learningRate: 1e-3 });
    await trainer.restore({ step: 2, optimizer: saved });
    const again = await trainer.optimizerState();
    expect([...again.keys()]).toEqual([...saved.keys()]);
    for (const [name, w] of saved) {
      expect(again.get(name)!.shape, name).toEqual(w.shape);
      expect(Array.from(again.get(name)!.data), name).toEqual(Array.from(w.data));
    }
    await expect(trainer.restore({ step: 2, optimizer: new Map([...saved].filter(([name]) => name !== 'iter')) })).rejects.toThrow(
      ConfigError,
    );
    const short = new Map(saved);
    short.set(`v/${names[0]}`, { shape: [1], data: new Float32Array(1) });
    await expect(trainer.restore({ step: 2, optimizer: short })).rejects.toThrow(ConfigError);
    trainer.dispose();
    reference.dispose();
    model.dispose();
  });

  it('gives the same update with micro-batches (gradient accumulation) as with one pass', async () => {
    const a = PolicyModel.create(config, 5);
    const b = PolicyModel.create(config, 5);
    for (const mode of ['token-mean', 'seq-mean-token-sum'] as const) {
      const whole = new GrpoTrainer(a, { learningRate: 1e-2, microBatchSize: 4, lossAggregation: mode });
      const micro = new GrpoTrainer(b, { learningRate: 1e-2, microBatchSize: 1, lossAggregation: mode });
      const batch = batchOf(a);
      await whole.trainStep(batch);
      await micro.trainStep(batch);
      const wa = a.getWeights();
      const wb = b.getWeights();
      for (const [name, w] of wa) {
        const other = wb.get(name)!.data;
        // Float32 tolerance: the native and wasm kernels sum in another order than the JS one (after one Adam
        // step at lr 1e-2 the weights differ by up to ~2e-5 there).
        w.data.forEach((x, i) => expect(other[i]).toBeCloseTo(x, backend === 'cpu' ? 5 : 4));
      }
      whole.dispose();
      micro.dispose();
    }
    a.dispose();
    b.dispose();
  });

  it('scores a micro-batch of zero-advantage rows forward only: same gradients, losses and metrics', async () => {
    // A zero advantage at every token gives an exactly zero gradient; 1e-30 is differentiated and adds ~1e-30.
    const model = PolicyModel.create(config, 11);
    const trainer = new GrpoTrainer(model, { microBatchSize: 2 });
    const inert = await trainer.computeGradients(batchOf(model, [1, -1, 0, 0]));
    const tiny = await trainer.computeGradients(batchOf(model, [1, -1, 1e-30, -1e-30]));
    expect(inert.microBatchLosses).toHaveLength(2);
    expect(inert.microBatchLosses[1]).toBe(0);
    expect(inert.gradNorm).toBeGreaterThan(0);
    expect(inert.gradNorm).toBeCloseTo(tiny.gradNorm, 6);
    for (const [name, g] of inert.gradients) g.data.forEach((x, i) => expect(x).toBeCloseTo(tiny.gradients.get(name)!.data[i], 6));
    // ...and costs no backward pass: fewer kernels than the same batch differentiated whole
    const kernels = async (advantages: number[]): Promise<number> =>
      (
        await tf.profile(async () => {
          await trainer.computeGradients(batchOf(model, advantages));
          return [];
        })
      ).kernels.length;
    expect(await kernels([1, -1, 0, 0])).toBeLessThan(await kernels([1, -1, 1e-30, -1e-30]));
    const none = await trainer.computeGradients(batchOf(model, [0, 0, 0, 0]));
    await trainer.trainStep(batchOf(model, [1, -1, 0, 0])); // creates Adam's moments
    const tensors = tf.memory().numTensors;
    await trainer.trainStep(batchOf(model, [1, -1, 0, 0]));
    await trainer.trainStep(batchOf(model, [0, 0, 0, 0]));
    expect(tf.memory().numTensors).toBe(tensors); // the forward-only path leaks nothing either
    expect([...none.gradients.keys()]).toEqual([...model.getWeights().keys()]);
    for (const g of none.gradients.values()) expect(g.data.every((x) => x === 0)).toBe(true);
    expect(none.microBatchLosses).toEqual([0, 0]);
    const bonus = new GrpoTrainer(model, { microBatchSize: 2, entropyCoef: 0.01 }); // the bonus moves every row
    expect((await bonus.computeGradients(batchOf(model, [0, 0, 0, 0]))).gradNorm).toBeGreaterThan(0);
    const metrics = async (advantages: number[]): Promise<number> => {
      const twin = PolicyModel.create(config, 11);
      const t = new GrpoTrainer(twin, { microBatchSize: 2 });
      const entropy = (await t.trainStep(batchOf(twin, advantages))).metrics['actor/entropy'];
      t.dispose();
      twin.dispose();
      return entropy;
    };
    expect(await metrics([1, -1, 0, 0])).toBeCloseTo(await metrics([1, -1, 1e-30, -1e-30]), 6);
    bonus.dispose();
    trainer.dispose();
    model.dispose();
  });

  it('differentiates zero-advantage micro-batches too with skipZeroAdvantage false (the same work as TRL)', async () => {
    const model = PolicyModel.create(config, 11);
    const skipping = new GrpoTrainer(model, { microBatchSize: 2 });
    const whole = new GrpoTrainer(model, { microBatchSize: 2, skipZeroAdvantage: false });
    const kernels = async (trainer: GrpoTrainer, advantages: number[]): Promise<number> =>
      (
        await tf.profile(async () => {
          await trainer.computeGradients(batchOf(model, advantages));
          return [];
        })
      ).kernels.length;
    // Every micro-batch differentiated: as many kernels as a batch whose rows all carry a signal.
    expect(await kernels(whole, [1, -1, 0, 0])).toBe(await kernels(whole, [1, -1, 1e-30, -1e-30]));
    expect(await kernels(whole, [0, 0, 0, 0])).toBeGreaterThan(await kernels(skipping, [0, 0, 0, 0]));
    // ...and the same gradients.
    const [a, b] = [
      await skipping.computeGradients(batchOf(model, [1, -1, 0, 0])),
      await whole.computeGradients(batchOf(model, [1, -1, 0, 0])),
    ];
    for (const [name, g] of a.gradients) g.data.forEach((x, i) => expect(x).toBeCloseTo(b.gradients.get(name)!.data[i], 6));
    expect(b.microBatchLosses).toEqual(a.microBatchLosses);
    skipping.dispose();
    whole.dispose();
    model.dispose();
  });

  it('skips the update on a NaN loss and reports it, leaving weights unchanged', async () => {
    const model = PolicyModel.create(config, 7);
    const trainer = new GrpoTrainer(model);
    const batch = batchOf(model, [Number.NaN, 1, 1, -1]);
    const before = model.getWeights();
    const result = await trainer.trainStep(batch);
    expect(result.skipped).toBe(true);
    expect(result.metrics['actor/skipped_nonfinite']).toBe(1);
    expect(result.version).toBe(1);
    for (const [name, w] of model.getWeights()) expect([...w.data]).toEqual([...before.get(name)!.data]);
    trainer.dispose();
    model.dispose();
  });

  it('leaks no tensors across steps with PPO epochs, mini-batches, KL loss and importance weights', async () => {
    const model = PolicyModel.create(config, 9);
    const reference = PolicyModel.create(config, 9);
    const trainer = new GrpoTrainer(model, {
      ppoEpochs: 2,
      miniBatches: 2,
      microBatchSize: 1,
      klLoss: { coef: 0.1 },
      reference,
      importanceCap: 2,
      entropyCoef: 0.01,
      clipRatioC: 3,
    });
    const batch = batchOf(model);
    await trainer.trainStep(batch); // creates the optimizer slots
    const tensors = tf.memory().numTensors;
    const result = await trainer.trainStep(batch);
    expect(tf.memory().numTensors).toBe(tensors);
    expect(result.metrics['actor/updates']).toBe(4);
    expect(result.metrics['actor/kl_loss']).toBeGreaterThan(0);
    expect(result.metrics['actor/is_weight_mean']).toBeGreaterThan(0);
    trainer.dispose();
    model.dispose();
    reference.dispose();
  });

  it('counts an empty batch as a skipped step and rejects bad options', async () => {
    const model = PolicyModel.create(config, 1);
    const trainer = new GrpoTrainer(model);
    const result = await trainer.trainStep(collate([], { padId: 0, modelTag: 'policy' }));
    expect(result).toMatchObject({ step: 0, version: 1, skipped: true });
    expect(() => new GrpoTrainer(model, { microBatchSize: 0 })).toThrow(ConfigError);
    expect(() => new GrpoTrainer(model, { lossAggregation: 'sum' as never })).toThrow(ConfigError);
    trainer.dispose();
    model.dispose();
  });

  it('drops rows staler than maxStaleness, counting them, and trains on the rest', async () => {
    const model = PolicyModel.create(config, 13);
    const trainer = new GrpoTrainer(model, { maxStaleness: 1, learningRate: 1e-2 });
    const fresh = rows(model);
    // At step 0 every row has staleness 0 − version; give two rows a version two steps older via a later step.
    await trainer.trainStep(collate(fresh, { padId: 0, modelTag: 'policy', advantages: [0, 0, 0, 0] }));
    await trainer.trainStep(collate(fresh, { padId: 0, modelTag: 'policy', advantages: [0, 0, 0, 0] }));
    const stale = fresh.map((t, i) => ({ ...t, policyVersion: i < 2 ? 0 : 2 }));
    const result = await trainer.trainStep(collate(stale, { padId: 0, modelTag: 'policy', advantages: [1, -1, 1, -1] }));
    expect(result.metrics['rollout/dropped_stale']).toBe(2);
    expect(result.metrics['rollout/staleness_max']).toBe(2);
    expect(result.skipped).toBe(false);
    const allStale = await trainer.trainStep(collate(fresh, { padId: 0, modelTag: 'policy', advantages: [1, -1, 1, -1] }));
    expect(allStale.metrics['rollout/dropped_stale']).toBe(4);
    expect(allStale.metrics['actor/pg_loss']).toBe(0);
    expect(() => new GrpoTrainer(model, { maxStaleness: -1 })).toThrow(ConfigError);
    trainer.dispose();
    model.dispose();
  });

  it("minimizes the response tokens' cross-entropy with loss 'cross-entropy', whatever the rollout log-probs say", async () => {
    const model = PolicyModel.create(config, 11);
    const trainer = new GrpoTrainer(model, { loss: 'cross-entropy', learningRate: 1e-2 });
    const nll = (ts: Trajectory[]): number =>
      -ts.reduce((s, t) => s + t.logprobs.reduce((a, b) => a + b, 0), 0) / ts.reduce((n, t) => n + t.logprobs.length, 0);
    // Rollout log-probs of 0 (a reference output was never sampled) must not change the loss: it reads the policy's own.
    const data = rows(model).map((t) => ({ ...t, logprobs: t.logprobs.map(() => 0) }));
    const before = nll(rows(model));
    const first = await trainer.trainStep(collate(data, { padId: 0, modelTag: 'policy', advantages: [1, 1, 1, 1] }));
    expect(first.metrics['actor/sft_loss']).toBeCloseTo(before, 4);
    expect(first.metrics['actor/pg_loss']).toBeUndefined();
    for (let i = 0; i < 4; i++) await trainer.trainStep(collate(data, { padId: 0, modelTag: 'policy', advantages: [1, 1, 1, 1] }));
    expect(nll(rows(model))).toBeLessThan(before - 0.05);
    // Advantage 0 weighs a row out: a batch of such rows moves nothing (a fresh trainer: Adam's momentum would).
    trainer.dispose();
    const fresh = new GrpoTrainer(model, { loss: 'cross-entropy', learningRate: 1e-2 });
    const weights = model.getWeights();
    const idle = await fresh.trainStep(collate(data, { padId: 0, modelTag: 'policy', advantages: [0, 0, 0, 0] }));
    expect(idle.metrics['actor/sft_loss']).toBe(0);
    for (const [name, w] of model.getWeights()) expect(Array.from(w.data)).toEqual(Array.from(weights.get(name)!.data));
    fresh.dispose();
    model.dispose();
  });
});

describe('GrpoTrainer checkpoint state', () => {
  beforeAll(async () => {
    await tf.setBackend('cpu');
  });

  it('restores step and Adam moments so the next update equals an uninterrupted one', async () => {
    const a = PolicyModel.create(config, 17);
    const trainerA = new GrpoTrainer(a, { learningRate: 1e-2 });
    const batch = batchOf(a);
    await trainerA.trainStep(batch);
    const saved = await trainerA.optimizerState();
    expect([...saved.keys()].slice(0, 2)).toEqual(['iter', `m/${a.weightNames()[0]}`]);

    // A fresh process: same weights, restored optimizer state and step (c: same weights, fresh optimizer).
    const b = PolicyModel.fromWeights(config, a.getWeights());
    const c = PolicyModel.fromWeights(config, a.getWeights());
    const trainerC = new GrpoTrainer(c, { learningRate: 1e-2 });
    await trainerC.restore({ step: 1 });
    const trainerB = new GrpoTrainer(b, { learningRate: 1e-2 });
    await trainerB.restore({ step: trainerA.step, optimizer: saved });
    expect(trainerB.step).toBe(1);
    const ra = await trainerA.trainStep(batch);
    const rb = await trainerB.trainStep(batch);
    expect(rb.version).toBe(ra.version);
    for (const [name, w] of a.getWeights()) {
      const other = b.getWeights().get(name)!.data;
      w.data.forEach((x, i) => expect(other[i]).toBeCloseTo(x, 6));
    }
    // Without the moments the update differs: the restored state matters.
    await trainerC.trainStep(batch);
    const name = a.weightNames()[0];
    const diff = a
      .getWeights()
      .get(name)!
      .data.reduce((m, x, i) => Math.max(m, Math.abs(x - c.getWeights().get(name)!.data[i])), 0);
    expect(diff).toBeGreaterThan(1e-4);
    trainerC.dispose();
    trainerA.dispose();
    trainerB.dispose();
    a.dispose();
    b.dispose();
    c.dispose();
  });
});

describe('GrpoTrainer agrees across backends', () => {
  /** Three PPO steps (KL loss, mini-batches, micro-batches) on one backend: the metrics and the trained log-probs. */
  async function train(
    backend: (typeof ALL_BACKENDS)[number],
  ): Promise<{ metrics: Record<string, number>[]; logprobs: (readonly number[])[] }> {
    await initBackend(backend, { logger: { info: () => undefined } });
    const model = PolicyModel.create(config, 11);
    const reference = PolicyModel.create(config, 11);
    const trainer = new GrpoTrainer(model, {
      learningRate: 1e-2,
      ppoEpochs: 2,
      miniBatches: 2,
      microBatchSize: 1,
      klLoss: { coef: 0.1 },
      reference,
    });
    const batch = batchOf(model);
    const metrics: Record<string, number>[] = [];
    for (let step = 0; step < 3; step++) metrics.push((await trainer.trainStep(batch)).metrics);
    const logprobs = rows(model).map((t) => t.logprobs);
    trainer.dispose();
    model.dispose();
    reference.dispose();
    return { metrics, logprobs };
  }

  it('gives the pure-JS reference results to float32 tolerance on every other backend', async () => {
    const expected = await train('cpu');
    for (const backend of ALL_BACKENDS.slice(1)) {
      const got = await train(backend);
      got.logprobs.forEach((row, r) =>
        row.forEach((x, i) => expect(Math.abs(x - expected.logprobs[r][i]), `${backend} logprob ${r}/${i}`).toBeLessThan(1e-3)),
      );
      for (const [step, m] of got.metrics.entries()) {
        for (const key of ['actor/pg_loss', 'actor/kl_loss', 'actor/entropy', 'actor/grad_norm']) {
          expect(expected.metrics[step]).toHaveProperty([key]);
          const want = expected.metrics[step][key];
          expect(Math.abs(m[key] - want), `${backend} step ${step} ${key}`).toBeLessThanOrEqual(1e-3 * Math.max(1, Math.abs(want)));
        }
      }
    }
  });
});
