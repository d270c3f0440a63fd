/**
 * Parity of the Llama-family decoder with transformers, on the tiny random-weight fixtures that
 * `scripts/make_hf_fixtures.py` makes (Qwen2: tied, q/k/v biases, F32, old config layout; Qwen3: head_dim ≠
 * hidden/heads, q/k norms, F16; Llama 3: llama3 rope scaling, BF16, sharded; all GQA with 2 kv heads).
 */
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { ALL_BACKENDS } from '../helpers/backends.js';
import { loadModelDir, policyConfigFromHf, readModelDir, saveModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel } from '../../lib/model/transformer.js';

/** Largest |logit − transformers' logit| accepted (float32 on both sides, different summation orders). */
const LOGIT_TOLERANCE = 1e-4;
/** Relative tolerance of gradients against torch autograd (plus an absolute floor). */
const GRAD_RTOL = 1e-3;
const GRAD_ATOL = 1e-4;

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'hf');
const NAMES = ['tiny-qwen2', 'tiny-qwen3', 'tiny-llama'] as const;
const quiet = { info: () => undefined };

interface Expected {
  readonly dtype: string;
  readonly logits: {
    readonly input_ids: number[][];
    readonly attention_mask: number[][];
    readonly position_ids: number[][];
    readonly logits: number[][][];
  };
  readonly greedy: { readonly prompt_ids: number[]; readonly max_new_tokens: number; readonly output_ids: number[] }[];
  readonly grad: {
    readonly input_ids: number[][];
    readonly attention_mask: number[][];
    readonly position_ids: number[][];
    readonly sum_logprobs: number;
    readonly grads: Record<string, { readonly shape: number[]; readonly data: number[] }>;
  };
}

async function expected(name: string): Promise<Expected> {
  return JSON.parse(await readFile(join(FIXTURES, `${name}.expected.json`), 'utf8')) as Expected;
}

/** Whether `python3 -c 'import transformers'` works here (then written directories are loaded by transformers). */
function hasTransformers(): boolean {
  return spawnSync('python3', ['-c', 'import transformers, torch'], { stdio: 'ignore' }).status === 0;
}

function inputs(x: {
  input_ids: number[][];
  attention_mask: number[][];
  position_ids: number[][];
}): [tf.Tensor2D, tf.Tensor2D, tf.Tensor2D] {
  return [
    tf.tensor2d(x.input_ids, undefined, 'int32'),
    tf.tensor2d(x.attention_mask, undefined, 'float32'),
    tf.tensor2d(x.position_ids, undefined, 'int32'),
  ];
}

/** Largest difference over positions whose attention mask is 1 (padded rows are undefined in transformers). */
function maxLogitDiff(ours: number[][][], theirs: number[][][], mask: number[][]): number {
  let worst = 0;
  ours.forEach((row, b) =>
    row.forEach((logits, t) => {
      if (mask[b][t] !== 1) return;
      logits.forEach((x, v) => {
        worst = Math.max(worst, Math.abs(x - theirs[b][t][v]));
      });
    }),
  );
  return worst;
}

describe.each(ALL_BACKENDS)('Llama-family decoder vs transformers (%s backend)', (backend) => {
  beforeAll(async () => {
    await initBackend(backend, { logger: quiet });
  });

  describe.each(NAMES)('%s', (name) => {
    let model: PolicyModel;
    let exp: Expected;
    beforeAll(async () => {
      exp = await expected(name);
      model = (await loadModelDir(join(FIXTURES, name))).model;
    });
    afterAll(() => model.dispose());

    it(`logits match to ${LOGIT_TOLERANCE} (left-padded batch, explicit positions)`, () => {
      const [ids, mask, pos] = inputs(exp.logits);
      const logits = model.logits(ids, mask, pos);
      const diff = maxLogitDiff(logits.arraySync() as number[][][], exp.logits.logits, exp.logits.attention_mask);
      tf.dispose([ids, mask, pos, logits]);
      expect(diff).toBeLessThanOrEqual(LOGIT_TOLERANCE);
    });

    it('greedy generation (KV cache, and batched with another prompt) equals transformers token for token', async () => {
      for (const g of exp.greedy) {
        const [alone] = await model.generate([{ promptTokens: g.prompt_ids, maxTokens: g.max_new_tokens, temperature: 0, stopTokens: [] }]);
        expect(alone.tokens).toEqual(g.output_ids);
      }
      const batched = await model.generate(
        exp.greedy.map((g) => ({ promptTokens: g.prompt_ids, maxTokens: g.max_new_tokens, temperature: 0, stopTokens: [] })),
      );
      expect(batched.map((r) => r.tokens)).toEqual(exp.greedy.map((g) => g.output_ids));
    });

    it('gradients of the summed log-probs equal torch autograd', () => {
      const [ids, mask, pos] = inputs(exp.grad);
      const B = ids.shape[0];
      const T = ids.shape[1];
      // Count a target only where both it and its context token are real (as the fixture script does).
      const m = exp.grad.attention_mask;
      const target = tf.tensor2d(
        m.map((row) => row.slice(1).map((x, t) => x * row[t])),
        [B, T - 1],
      );
      const vars = model.trainableVariables();
      const names = model.weightNames();
      const { value, grads } = tf.variableGrads(
        () => tf.sum(tf.mul(model.tokenLogprobs(ids, mask, pos).logprobs, target)) as tf.Scalar,
        vars,
      );
      expect(value.dataSync()[0]).toBeCloseTo(exp.grad.sum_logprobs, 3);
      for (const [weight, ref] of Object.entries(exp.grad.grads)) {
        const v = vars[names.indexOf(weight)];
        expect(v, weight).toBeDefined();
        // Linear weights are held [in, out]; the reference is Hugging Face's [out, in].
        const g = grads[v.name];
        const hf = ref.shape.length === 2 && weight.endsWith('_proj.weight') ? tf.transpose(g) : g;
        const ours = hf.dataSync();
        if (hf !== g) hf.dispose();
        expect(ours.length, weight).toBe(ref.data.length);
        let worst = 0;
        ref.data.forEach((r, i) => {
          worst = Math.max(worst, Math.abs(ours[i] - r) - GRAD_RTOL * Math.abs(r));
        });
        expect(worst, weight).toBeLessThanOrEqual(GRAD_ATOL);
      }
      tf.dispose([ids, mask, pos, target, value, grads]);
    });
  });
});

describe('model directories', () => {
  let dir: string;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    dir = await mkdtemp(join(tmpdir(), 'rxrl-modeldir-'));
  });
  afterAll(async () => rm(dir, { recursive: true, force: true }));

  it('reads both config layouts, F32/F16/BF16 and shards into the documented configuration', async () => {
    const qwen2 = await readModelDir(join(FIXTURES, 'tiny-qwen2'));
    expect(qwen2.config).toMatchObject({
      modelType: 'qwen2',
      qkvBias: true,
      oBias: false,
      tieWordEmbeddings: true,
      ropeTheta: 1e6,
      nKvHeads: 2,
    });
    expect(qwen2.weights.has('lm_head.weight')).toBe(false);
    expect(qwen2.special).toEqual({ eosTokenId: [482, 480], padTokenId: 480 });
    const qwen3 = await readModelDir(join(FIXTURES, 'tiny-qwen3'));
    expect(qwen3.config).toMatchObject({ modelType: 'qwen3', qkNorm: true, headDim: 32, ropeTheta: 10000, tieWordEmbeddings: false });
    const llama = await readModelDir(join(FIXTURES, 'tiny-llama'));
    expect(llama.config.ropeScaling).toEqual({
      type: 'llama3',
      factor: 8,
      lowFreqFactor: 1,
      highFreqFactor: 4,
      originalMaxPositionEmbeddings: 32,
    });
    expect(llama.special).toEqual({ bosTokenId: 500, eosTokenId: [504, 501] });
  });

  it('writes a directory that reads back equal, and that transformers loads with the same logits when it is installed', async () => {
    const exp = await expected('tiny-qwen3');
    const { model } = await loadModelDir(join(FIXTURES, 'tiny-qwen3'));
    const out = join(dir, 'qwen3-copy');
    await saveModelDir(out, model, { special: { eosTokenId: [482, 480], padTokenId: 480 } });
    expect((await readdir(out)).sort()).toEqual(['config.json', 'generation_config.json', 'model.safetensors']);
    const back = await readModelDir(out);
    expect(back.config).toEqual(model.config);
    const original = model.getWeights();
    for (const [name, w] of original) expect(Array.from(back.weights.get(name)!.data), name).toEqual(Array.from(w.data));
    const [ids, mask, pos] = inputs(exp.logits);
    const ours = model.logits(ids, mask, pos).arraySync() as number[][][];
    tf.dispose([ids, mask, pos]);
    model.dispose();
    if (!hasTransformers()) {
      // No Python here: the file layout must match the fixture transformers wrote.
      const raw = JSON.parse(await readFile(join(out, 'config.json'), 'utf8')) as Record<string, unknown>;
      expect(raw).toMatchObject({ architectures: ['Qwen3ForCausalLM'], model_type: 'qwen3', head_dim: 32, num_key_value_heads: 2 });
      console.info('hfParity: transformers is not importable; checked the file layout only');
      return;
    }
    const run = spawnSync('python3', [join(import.meta.dirname, '..', '..', 'scripts', 'hf_logits.py'), out], {
      input: JSON.stringify(exp.logits),
      encoding: 'utf8',
      maxBuffer: 64 << 20,
    });
    expect(run.status, run.stderr).toBe(0);
    const answer = JSON.parse(run.stdout) as { logits: number[][][]; model_type: string };
    expect(answer.model_type).toBe('qwen3');
    expect(maxLogitDiff(ours, answer.logits, exp.logits.attention_mask)).toBeLessThanOrEqual(LOGIT_TOLERANCE);
    console.info('hfParity: transformers loaded the written directory');
  }, 240_000);

  it('rejects unknown model types and unsupported features with a ConfigError naming the key', async () => {
    const base = JSON.parse(await readFile(join(FIXTURES, 'tiny-qwen3', 'config.json'), 'utf8')) as Record<string, unknown>;
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ ...base, model_type: 'mistral' }, /model_type "mistral" is not supported/],
      [{ ...base, use_sliding_window: true }, /use_sliding_window/],
      [{ ...base, num_experts: 8 }, /num_experts .*mixture-of-experts/],
      [{ ...base, hidden_act: 'gelu' }, /hidden_act/],
      [{ ...base, rope_parameters: { rope_type: 'yarn', rope_theta: 1e4, factor: 4 } }, /rope_parameters rope type "yarn"/],
      [{ ...base, num_key_value_heads: 3 }, /nKvHeads/],
      [{ ...base, hidden_size: 'wide' }, /hidden_size must be a positive integer/],
    ];
    for (const [config, message] of cases) {
      expect(() => policyConfigFromHf(config, 'config.json'), message.source).toThrow(ConfigError);
      expect(() => policyConfigFromHf(config, 'config.json')).toThrow(message);
    }
    const broken = join(dir, 'broken');
    await saveModelDir(broken, { config: { vocabSize: 8, dModel: 8, nLayers: 1, nHeads: 2, dFF: 8, maxSeqLen: 8 }, weights: new Map() });
    await writeFile(join(broken, 'config.json'), '{"model_type": "llama",');
    await expect(readModelDir(broken)).rejects.toThrow(/config\.json: not valid JSON/);
    // Valid JSON that is not an object (a `null` generation config crashed the reader with a TypeError).
    await saveModelDir(broken, { config: { vocabSize: 8, dModel: 8, nLayers: 1, nHeads: 2, dFF: 8, maxSeqLen: 8 }, weights: new Map() });
    await writeFile(join(broken, 'generation_config.json'), 'null');
    await expect(readModelDir(broken)).rejects.toThrow(/generation_config\.json: not a JSON object/);
    await writeFile(join(broken, 'config.json'), '[1, 2]');
    await expect(readModelDir(broken)).rejects.toThrow(/config\.json: not a JSON object/);
  });
});
