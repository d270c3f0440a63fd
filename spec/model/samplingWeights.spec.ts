import * as tf from '@tensorflow/tfjs-core';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';

import { collate } from '../../lib/data/collate.js';
import { initBackend, nativeBackendInstalled, oneDnnKernels } from '../../lib/model/backend.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import {
  MAX_SAMPLING_COPIES,
  SAMPLING_WEIGHTS_MEMORY_SHARE,
  samplingWeightBytes,
  samplingWeightsFit,
} from '../../lib/model/samplingWeights.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import { LOGIT_TOLERANCE, DECODE_STEPS, greedy, maxDiff, randomAdapter, stepLogits } from '../helpers/decoding.js';
import { traj } from '../helpers/fixtures.js';

const quiet = { info: (): void => undefined };
const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));

describe('sampling weights (fused, adapter-merged blocks)', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
  });

  for (const name of ['tiny-llama', 'tiny-qwen2', 'tiny-qwen3']) {
    it(`${name}: prefill and decode steps give the variables' logits, with and without an adapter`, async () => {
      const { model: base } = await loadModelDir(join(FIXTURES, name));
      const adapter = randomAdapter(base.config, 3);
      const view = PolicyModel.withAdapter(base, adapter);
      const before = tf.memory().numTensors;
      for (const model of [base, view]) {
        const reference = stepLogits(model, false);
        const fused = stepLogits(model, true);
        expect(fused).toHaveLength(DECODE_STEPS + 2);
        expect(maxDiff(fused, reference)).toBeLessThan(LOGIT_TOLERANCE);
        expect(maxDiff(fused, reference)).toBeGreaterThanOrEqual(0);
      }
      // The adapter matters, so the view's fused copy is not the base's.
      expect(maxDiff(stepLogits(view, true), stepLogits(base, true))).toBeGreaterThan(1e-2);
      // Nothing leaks beyond the two cached copies (the base's, the view's), which invalidation frees.
      base.weightsChanged();
      expect(tf.memory().numTensors).toBe(before);
      const cached = await view.generate(greedy(base.config.vocabSize));
      const recomputed = await view.generateRecompute(greedy(base.config.vocabSize));
      expect(cached.map((r) => r.tokens)).toEqual(recomputed.map((r) => r.tokens));
      view.dispose();
      adapter.dispose();
      base.dispose();
    });
  }

  it('a GRPO step is sampled at the next generation (the trainer calls weightsChanged), on a view and on a full model', async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-llama'));
    const adapter = randomAdapter(base.config, 5);
    const view = PolicyModel.withAdapter(base, adapter);
    const V = base.config.vocabSize;
    for (const model of [view, base]) {
      const before = await model.generate(greedy(V)); // builds the fused copy
      const rows = [
        traj('g0@0', 0, {
          promptTokens: [5, 9, 14],
          responseTokens: [before[0].tokens[0], 7, 2],
          reward: 1,
          logprobs: [0, 0, 0],
          lossMask: [1, 1, 1],
        }),
        traj('g0@0', 1, {
          promptTokens: [5, 9, 14],
          responseTokens: [before[0].tokens[0], 2],
          reward: 0,
          logprobs: [0, 0],
          lossMask: [1, 1],
        }),
      ];
      const trainer = new GrpoTrainer(model, { learningRate: 5e-2 });
      await trainer.trainStep(collate(rows, { padId: 0, modelTag: 'policy', advantages: [-1, 1] }));
      trainer.dispose();
      const after = await model.generate(greedy(V));
      const reference = await model.generateRecompute(greedy(V)); // reads the variables
      expect(after.map((r) => r.logprobs[0])).not.toEqual(before.map((r) => r.logprobs[0]));
      after.forEach((r, i) => {
        expect(r.tokens).toEqual(reference[i].tokens);
        r.logprobs.forEach((lp, t) => expect(Math.abs(lp - reference[i].logprobs[t])).toBeLessThan(LOGIT_TOLERANCE));
      });
    }
    view.dispose();
    adapter.dispose();
    base.dispose();
  });

  it('setWeights (base or adapter) is sampled at the next generation, in every view of a changed base', async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-qwen2'));
    const adapter = randomAdapter(base.config, 7);
    const view = PolicyModel.withAdapter(base, adapter);
    const V = base.config.vocabSize;
    const expectRecomputed = async (model: PolicyModel): Promise<number[]> => {
      const cached = await model.generate(greedy(V));
      const reference = await model.generateRecompute(greedy(V));
      cached.forEach((r, i) =>
        r.logprobs.forEach((lp, t) => expect(Math.abs(lp - reference[i].logprobs[t])).toBeLessThan(LOGIT_TOLERANCE)),
      );
      return cached.map((r) => r.logprobs[0]);
    };
    const first = { view: await expectRecomputed(view), base: await expectRecomputed(base) };
    // The adapter changes: the view samples the new one.
    const other = randomAdapter(base.config, 8);
    view.setWeights(other.getWeights());
    other.dispose();
    const second = await expectRecomputed(view);
    expect(second).not.toEqual(first.view);
    // The base changes: both the base and the view (whose copy merged the old base) sample the new base.
    const rng = createRng(9, 'new-base');
    base.setWeights(
      new Map([...base.getWeights()].map(([name, w]) => [name, { shape: w.shape, data: normalArray(w.data.length, 0.1, rng) }])),
    );
    expect(await expectRecomputed(base)).not.toEqual(first.base);
    expect(await expectRecomputed(view)).not.toEqual(second);
    view.dispose();
    adapter.dispose();
    base.dispose();
  });

  it('a generation keeps the copy it started with when the weights change meanwhile, and frees it when done', async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-llama'));
    const V = base.config.vocabSize;
    const start = tf.memory().numTensors;
    let changes = 0;
    const requests = greedy(V).map((r) => ({
      ...r,
      maxTokens: 6,
      onToken: (): void => {
        changes++;
        base.weightsChanged(); // between steps: the copy in use must not be disposed under the generation
      },
    }));
    const out = await base.generate(requests);
    expect(changes).toBe(18);
    expect(out.map((r) => r.tokens.length)).toEqual([6, 6, 6]);
    expect(tf.memory().numTensors).toBe(start); // the stale copy was freed at the end, and none is cached
    base.dispose();
  });

  it(`keeps at most MAX_SAMPLING_COPIES copies per base: the least recently used view's goes and is rebuilt at its next generation`, async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-qwen2'));
    const adapters = [1, 2, 3].map((seed) => randomAdapter(base.config, seed));
    const views = adapters.map((adapter) => PolicyModel.withAdapter(base, adapter));
    const start = tf.memory().numTensors;
    const alone = [];
    for (const view of views) {
      alone.push(await view.generate(greedy(base.config.vocabSize)));
      view.weightsChanged();
    }
    expect(tf.memory().numTensors).toBe(start);
    const held: number[] = [];
    for (const view of views) {
      await view.generate(greedy(base.config.vocabSize));
      held.push(tf.memory().numTensors - start);
    }
    const copy = held[0];
    expect(MAX_SAMPLING_COPIES).toBe(2);
    expect(held).toEqual([copy, 2 * copy, 2 * copy]); // the third view's copy replaced the first's
    // The first view's copy is rebuilt (the second's goes), and every view still samples what it sampled alone.
    const again = await Promise.all(views.map((view) => view.generate(greedy(base.config.vocabSize))));
    expect(again.map((r) => r.map((x) => x.tokens))).toEqual(alone.map((r) => r.map((x) => x.tokens)));
    expect(tf.memory().numTensors - start).toBe(2 * copy);
    base.weightsChanged();
    expect(tf.memory().numTensors).toBe(start);
    views.forEach((view) => view.dispose());
    adapters.forEach((adapter) => adapter.dispose());
    base.dispose();
  });

  it('sizes the copy and builds it only where it fits; setSamplingWeights(false) reads the variables', async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-qwen2'));
    const c = base.config;
    const adapter = randomAdapter(c, 1);
    const qkv = c.dModel * (c.nHeads + 2 * c.nKvHeads) * c.headDim + (c.nHeads + 2 * c.nKvHeads) * c.headDim;
    expect(samplingWeightBytes(c, null)).toBe(4 * c.nLayers * (qkv + 2 * c.dModel * c.dFF));
    expect(samplingWeightBytes(c, adapter)).toBe(
      4 * c.nLayers * (qkv + 4 * c.dModel * c.dFF - c.dModel * c.dFF + c.nHeads * c.headDim * c.dModel),
    );
    expect(samplingWeightsFit(c, null, 1e12)).toBe(true);
    const bytes = base.numParameters() * 4 + samplingWeightBytes(c, null);
    expect(samplingWeightsFit(c, null, bytes / SAMPLING_WEIGHTS_MEMORY_SHARE)).toBe(true);
    expect(samplingWeightsFit(c, null, bytes / SAMPLING_WEIGHTS_MEMORY_SHARE - 1)).toBe(false);
    const before = tf.memory().numTensors;
    base.setSamplingWeights(false);
    await base.generate(greedy(c.vocabSize));
    expect(tf.memory().numTensors).toBe(before); // no copy was made
    base.setSamplingWeights(true);
    await base.generate(greedy(c.vocabSize));
    expect(tf.memory().numTensors).toBeGreaterThan(before); // the copy is cached for the next generation
    base.setSamplingWeights(false);
    expect(tf.memory().numTensors).toBe(before);
    adapter.dispose();
    base.dispose();
  });
});

describe.runIf(nativeBackendInstalled())('sampling weights on the native backend', () => {
  beforeAll(async () => {
    await initBackend('tensorflow', { logger: quiet });
  });

  it("stores the fused gate/up transposed with oneDNN's kernels (in-major without), and either gives the variables' logits", async () => {
    const { model: base } = await loadModelDir(join(FIXTURES, 'tiny-llama'));
    const adapter = randomAdapter(base.config, 11);
    const view = PolicyModel.withAdapter(base, adapter);
    const { dModel: d, dFF: f } = base.config;
    const layouts: { variable: string; outMajor: boolean; shape: number[] }[] = [];
    // Graph decoding (the native default) reads the variables; the copy is asked for.
    for (const model of [base, view]) model.setSamplingWeights(true);
    const previous = process.env.TF_ENABLE_ONEDNN_OPTS;
    try {
      for (const variable of ['1', '0']) {
        process.env.TF_ENABLE_ONEDNN_OPTS = variable;
        expect(oneDnnKernels()).toBe(variable === '1');
        for (const model of [base, view]) {
          model.weightsChanged(); // the next lease builds a copy under this setting
          const lease = model.samplingLeaseInternal();
          const gateUp = lease.blocks[0].gateUp;
          expect(gateUp).toHaveLength(1);
          layouts.push({ variable, outMajor: gateUp[0].outMajor, shape: gateUp[0].w.shape });
          lease.release();
          expect(maxDiff(stepLogits(model, true), stepLogits(model, false))).toBeLessThan(LOGIT_TOLERANCE);
        }
      }
    } finally {
      if (previous === undefined) delete process.env.TF_ENABLE_ONEDNN_OPTS;
      else process.env.TF_ENABLE_ONEDNN_OPTS = previous;
    }
    expect(layouts).toEqual([
      { variable: '1', outMajor: true, shape: [2 * f, d] },
      { variable: '1', outMajor: true, shape: [2 * f, d] },
      { variable: '0', outMajor: false, shape: [d, 2 * f] },
      { variable: '0', outMajor: false, shape: [d, 2 * f] },
    ]);
    view.dispose();
    adapter.dispose();
    base.dispose();
  });
});
