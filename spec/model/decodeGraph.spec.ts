import * as tf from '@tensorflow/tfjs-core';
import { fileURLToPath } from 'node:url';
import { join } from 'node:path';
import { beforeAll, describe, expect, it } from 'vitest';

import { BackendUnavailableError } from '../../lib/core/errors.js';
import { initBackend, nativeBackendInstalled } from '../../lib/model/backend.js';
import { GraphBuilder, GraphSession, graphSessionsAvailable } from '../../lib/model/tfGraph.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { DECODE_STEPS, LOGIT_TOLERANCE, greedy, maxDiff, randomAdapter, stepLogits } from '../helpers/decoding.js';

const quiet = { info: (): void => undefined };
const FIXTURES = fileURLToPath(new URL('../fixtures/hf/', import.meta.url));

describe('graph sessions', () => {
  it('are unavailable on the wasm backend, where decoding stays eager', async () => {
    await initBackend('wasm', { logger: quiet });
    expect(graphSessionsAvailable()).toBe(false);
    expect(() => new GraphSession(new GraphBuilder(), [], [])).toThrow(/native tensorflow backend/);
  });
});

describe.runIf(nativeBackendInstalled())('the prefill and the decoding step as graphs (native backend)', () => {
  beforeAll(async () => {
    await initBackend('tensorflow', { logger: quiet });
  });

  it('runs a written graph: inputs of any batch size, a split, outputs in order', async () => {
    const g = new GraphBuilder();
    const x = g.placeholder('x', 'float32', [null, 3]);
    const w = g.placeholder('w', 'float32');
    const y = g.op('MatMul', [x, w], { T: { type: 'float32' }, transpose_a: { b: false }, transpose_b: { b: true } });
    const flat = g.op('Reshape', [y, g.ints([-1])], { T: { type: 'float32' }, Tshape: { type: 'int32' } });
    const split = g.op('SplitV', [flat, g.ints([1, -1]), g.int(0)], {
      T: { type: 'float32' },
      Tlen: { type: 'int32' },
      num_split: { i: 2 },
    });
    const session = new GraphSession(g, [x, w], [y, split.replace(':0', ':1')]);
    for (const rows of [1, 3]) {
      const xs = tf.tensor2d(
        Array.from({ length: rows * 3 }, (_, i) => i - 2),
        [rows, 3],
      );
      const ws = tf.tensor2d([1, 0, 2, -1, 1, 0.5], [2, 3]);
      const [product, rest] = session.run([xs, ws]);
      expect(product.shape).toEqual([rows, 2]);
      expect(Array.from(await product.data())).toEqual(Array.from(await tf.matMul(xs, ws, false, true).data()));
      expect(Array.from(await rest.data())).toEqual(Array.from(await product.data()).slice(1));
      tf.dispose([xs, ws, product, rest]);
    }
    session.dispose();
    expect(() => session.run([])).toThrow(/disposed/);
  });

  it('a graph TensorFlow refuses is a BackendUnavailableError that says how to sample op by op', () => {
    const g = new GraphBuilder();
    const x = g.placeholder('x', 'float32');
    const y = g.op('NoSuchOp', [x], { T: { type: 'float32' } });
    expect(() => new GraphSession(g, [x], [y])).toThrow(BackendUnavailableError);
    expect(() => new GraphSession(g, [x], [y])).toThrow(/setGraphDecoding\(false\)/);
  });

  for (const name of ['tiny-llama', 'tiny-qwen2', 'tiny-qwen3']) {
    it(`${name}: the graphs' prefill, steps and extension give the eager passes' logits (fused copy or variables, base or adapter view)`, async () => {
      const { model: base } = await loadModelDir(join(FIXTURES, name));
      const adapter = randomAdapter(base.config, 13);
      const view = PolicyModel.withAdapter(base, adapter);
      for (const model of [base, view]) {
        for (const fused of [true, false]) {
          model.setGraphDecoding(false);
          const eager = stepLogits(model, fused);
          model.setGraphDecoding(true);
          const before = tf.memory().numTensors;
          const graph = stepLogits(model, fused);
          expect(tf.memory().numTensors).toBe(before); // the passes' feeds and the old caches are freed
          expect(graph).toHaveLength(DECODE_STEPS + 2);
          expect(maxDiff(graph, eager)).toBeLessThan(LOGIT_TOLERANCE);
        }
      }
      // The view's graph reads its adapter: its logits are not the base's.
      expect(maxDiff(stepLogits(view, false), stepLogits(base, false))).toBeGreaterThan(1e-2);
      const V = base.config.vocabSize;
      view.setGraphDecoding(true);
      // Without and with a shared prefix (run once, then each prompt's rest through the extension graph).
      for (const shared of [0, 33]) {
        const cached = await view.generate(greedy(V, shared));
        const recomputed = await view.generateRecompute(greedy(V, shared));
        expect(cached.map((r) => r.tokens)).toEqual(recomputed.map((r) => r.tokens));
      }
      view.dispose();
      adapter.dispose();
      base.dispose();
    });
  }

  it('reads the variables by default (no fused copy to rebuild after each update), the copy when asked for', async () => {
    const [{ model: graph }, { model: eager }] = [
      await loadModelDir(join(FIXTURES, 'tiny-llama')),
      await loadModelDir(join(FIXTURES, 'tiny-llama')),
    ];
    const blocksRead = (model: PolicyModel): number => {
      const lease = model.samplingLeaseInternal();
      lease.release();
      return lease.blocks[0].qkv.length;
    };
    expect(blocksRead(graph)).toBe(3); // the variables: q, k and v apart
    graph.setSamplingWeights(true);
    expect(blocksRead(graph)).toBe(1); // the fused copy
    eager.setGraphDecoding(false);
    expect(blocksRead(eager)).toBe(1); // eager decoding takes the copy where it fits
    graph.dispose();
    eager.dispose();
  });

  it('an untied head and a changed structure (fused copy, then variables) each get their graph', async () => {
    const config = { vocabSize: 1100, dModel: 32, nLayers: 2, nHeads: 4, nKvHeads: 2, dFF: 64, maxSeqLen: 64 };
    for (const tieWordEmbeddings of [false, true]) {
      const model = PolicyModel.create({ ...config, tieWordEmbeddings }, 4);
      for (const fused of [true, false, true]) {
        model.setGraphDecoding(false);
        const eager = stepLogits(model, fused);
        model.setGraphDecoding(true);
        expect(maxDiff(stepLogits(model, fused), eager)).toBeLessThan(LOGIT_TOLERANCE);
      }
      model.dispose();
    }
  });
});
