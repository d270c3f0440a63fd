import * as tf from '@tensorflow/tfjs-core';
import { spawnSync } from 'node:child_process';
import { mkdtemp, readFile, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { collate } from '../../lib/data/collate.js';
import type { NamedWeights } from '../../lib/model/types.js';
import { ConfigError, ShapeError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import {
  LoraAdapter,
  loadPeftAdapter,
  readPeftAdapterConfig,
  savePeftAdapter,
  validateLoraConfig,
  type LoraConfig,
} from '../../lib/model/lora.js';
import { saveModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { createRng, normalArray } from '../../lib/core/random.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import type { Trajectory } from '../../lib/core/types.js';
import { ALL_BACKENDS } from '../helpers/backends.js';
import { traj } from '../helpers/fixtures.js';

const quiet = { info: (): void => undefined };
// Grouped-query attention and q/k/v biases, so every target has its own shape.
const CONFIG: PolicyConfig = {
  vocabSize: 11,
  dModel: 16,
  nLayers: 2,
  nHeads: 4,
  nKvHeads: 2,
  dFF: 24,
  maxSeqLen: 12,
  modelType: 'qwen2',
  qkvBias: true,
};
const ALL: LoraConfig = { rank: 4, alpha: 8, targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] };

/** An adapter with every tensor random (B too: a fresh adapter's B is 0, which would hide a wrong product). */
function randomAdapter(lora: LoraConfig, seed: number): LoraAdapter {
  const fresh = LoraAdapter.create(CONFIG, lora, seed);
  const rng = createRng(seed, 'random-adapter');
  const weights: NamedWeights = new Map(
    [...fresh.getWeights()].map(([name, w]) => [name, { shape: w.shape, data: normalArray(w.data.length, 0.2, rng) }]),
  );
  fresh.dispose();
  return LoraAdapter.fromWeights(CONFIG, lora, weights);
}

const INPUT = {
  ids: [
    [1, 3, 4, 5, 6, 2],
    [0, 0, 1, 7, 8, 9],
  ],
  mask: [
    [1, 1, 1, 1, 1, 1],
    [0, 0, 1, 1, 1, 1],
  ],
  pos: [
    [0, 1, 2, 3, 4, 5],
    [0, 0, 0, 1, 2, 3],
  ],
};

function logitsOf(model: PolicyModel): number[][][] {
  return tf.tidy(() =>
    model
      .logits(
        tf.tensor2d(INPUT.ids, undefined, 'int32'),
        tf.tensor2d(INPUT.mask, undefined, 'float32'),
        tf.tensor2d(INPUT.pos, undefined, 'int32'),
      )
      .arraySync(),
  );
}

function maxDiff(a: number[][][], b: number[][][]): number {
  let worst = 0;
  a.forEach((row, i) =>
    row.forEach((v, t) => (INPUT.mask[i][t] === 1 ? v.forEach((x, k) => (worst = Math.max(worst, Math.abs(x - b[i][t][k])))) : undefined)),
  );
  return worst;
}

function sameWeights(a: NamedWeights, b: NamedWeights): boolean {
  return a.size === b.size && [...a].every(([name, w]) => b.get(name)?.data.every((x, i) => Object.is(x, w.data[i])) === true);
}

describe('LoRA configuration', () => {
  it('resolves the scale (alpha / r, or alpha / √r with rsLoRA) and orders targets as in a block', () => {
    expect(validateLoraConfig({ rank: 4, alpha: 8, targetModules: ['v_proj', 'q_proj'] })).toMatchObject({
      scale: 2,
      targetModules: ['q_proj', 'v_proj'],
      dropout: 0,
    });
    expect(validateLoraConfig({ rank: 4, alpha: 8, targetModules: ['q_proj'], rsLora: true }).scale).toBe(4);
  });

  it('names the key of every invalid field', () => {
    const cases: [LoraConfig, RegExp][] = [
      [{ ...ALL, rank: 0 }, /^policies\.coder\.lora\.rank must be a positive integer, got 0$/],
      [{ ...ALL, alpha: -1 }, /^policies\.coder\.lora\.alpha must be a positive number/],
      [{ ...ALL, dropout: 0.1 }, /^policies\.coder\.lora\.dropout must be 0/],
      [{ ...ALL, targetModules: [] }, /^policies\.coder\.lora\.targetModules must be a non-empty list/],
      [
        { ...ALL, targetModules: ['q_proj', 'qkv_proj' as never] },
        /^policies\.coder\.lora\.targetModules\[1\] must be one of q_proj, .* \(the model has no other linear layer in a block\), got "qkv_proj"$/,
      ],
      [{ ...ALL, targetModules: ['q_proj', 'q_proj'] }, /^policies\.coder\.lora\.targetModules\[1\] is listed twice/],
    ];
    for (const [lora, message] of cases) {
      expect(() => validateLoraConfig(lora, 'policies.coder.lora')).toThrow(ConfigError);
      expect(() => validateLoraConfig(lora, 'policies.coder.lora')).toThrow(message);
    }
  });
});

describe.each(ALL_BACKENDS)('LoRA adapters on a shared base (%s backend)', (backend) => {
  let base: PolicyModel;
  let baseLogits: number[][][];
  beforeAll(async () => {
    await initBackend(backend, { logger: quiet });
    base = PolicyModel.create(CONFIG, 5);
    baseLogits = logitsOf(base);
  });
  afterAll(() => base.dispose());

  it('a fresh adapter (B = 0) computes the base bit for bit; views share the base and own nothing of it', () => {
    const before = tf.memory().numTensors;
    const adapter = LoraAdapter.create(CONFIG, ALL, 1);
    const view = PolicyModel.withAdapter(base, adapter);
    const other = PolicyModel.withAdapter(base, LoraAdapter.create(CONFIG, { rank: 2, alpha: 2, targetModules: ['q_proj'] }, 2));
    // Two views add the adapters' tensors and two small constants each (RoPE tables), never a copy of the base.
    expect(tf.memory().numTensors - before).toBe(adapter.variables().length + 2 * 2 + other.trainableVariables().length);
    expect(maxDiff(logitsOf(view), baseLogits)).toBe(0);
    expect(view.weightNames()).toEqual(adapter.weightNames());
    expect(view.numParameters()).toBe(base.numParameters() + adapter.numParameters());
    expect(adapter.numParameters()).toBe(2 * (4 * (16 + 16) + 2 * 4 * (16 + 8) + 4 * (16 + 16) + 2 * 4 * (16 + 24) + 4 * (24 + 16)));
    view.dispose();
    other.adapter?.dispose();
    other.dispose();
    adapter.dispose();
    expect(tf.memory().numTensors).toBe(before);
    expect(maxDiff(logitsOf(base), baseLogits)).toBe(0); // the base survived its views
  });

  it('merging the adapter into the base gives the logits of base + adapter', () => {
    const adapter = randomAdapter(ALL, 3);
    const view = PolicyModel.withAdapter(base, adapter);
    const merged = PolicyModel.fromWeights(CONFIG, view.mergedWeights());
    const adapted = logitsOf(view);
    expect(maxDiff(adapted, baseLogits)).toBeGreaterThan(1e-2); // the adapter matters
    expect(maxDiff(logitsOf(merged), adapted)).toBeLessThan(2e-5);
    merged.dispose();
    view.dispose();
    adapter.dispose();
  });

  it('GRPO training moves only the adapter: the base is unchanged bit for bit, the sampled log-probs follow the advantages', async () => {
    const baseWeights = base.getWeights();
    const adapter = LoraAdapter.create(CONFIG, { rank: 2, alpha: 4, targetModules: ['q_proj', 'v_proj', 'down_proj'] }, 4);
    const view = PolicyModel.withAdapter(base, adapter);
    const frozen = adapter.getWeights();
    const rows: Trajectory[] = [
      traj('g0@0', 0, { promptTokens: [1, 3, 4], responseTokens: [5, 6, 2], reward: 1, logprobs: [0, 0, 0], lossMask: [1, 1, 1] }),
      traj('g0@0', 1, { promptTokens: [1, 3, 4], responseTokens: [6, 2], reward: 0, logprobs: [0, 0], lossMask: [1, 1] }),
    ];
    /** The model's log-probs of a trajectory's response tokens. */
    const responseLogprobs = (model: PolicyModel, t: Trajectory): number[] =>
      tf.tidy(() => {
        const ids = [...t.promptTokens, ...t.responseTokens];
        const out = model.tokenLogprobs(
          tf.tensor2d([ids], undefined, 'int32'),
          tf.ones([1, ids.length]) as tf.Tensor2D,
          tf.tensor2d([ids.map((_, i) => i)], undefined, 'int32'),
        );
        return Array.from(out.logprobs.dataSync()).slice(t.promptTokens.length - 1);
      });
    const sum = (model: PolicyModel, t: Trajectory): number => responseLogprobs(model, t).reduce((a, b) => a + b, 0);
    const withLogprobs = rows.map((t) => ({ ...t, logprobs: responseLogprobs(view, t) }));
    const [up, down] = withLogprobs.map((t) => sum(view, t));
    const trainer = new GrpoTrainer(view, { learningRate: 1e-2 });
    for (let step = 0; step < 3; step++)
      await trainer.trainStep(collate(withLogprobs, { padId: 0, modelTag: 'policy', advantages: [1, -1] }));
    expect(sameWeights(base.getWeights(), baseWeights)).toBe(true);
    expect(sameWeights(adapter.getWeights(), frozen)).toBe(false);
    expect(sum(view, withLogprobs[0])).toBeGreaterThan(up);
    expect(sum(view, withLogprobs[1])).toBeLessThan(down);
    trainer.dispose();
    view.dispose();
    adapter.dispose();
  });
});

describe('PEFT adapter directories', () => {
  let dir: string;
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
    dir = await mkdtemp(join(tmpdir(), 'rxrl-lora-'));
  });

  it('write PEFT names and config, and read back bit for bit (with or without the adapter name in tensor names)', async () => {
    const adapter = randomAdapter({ ...ALL, targetModules: ['q_proj', 'o_proj', 'up_proj'] }, 6);
    const out = join(dir, 'adapter');
    await savePeftAdapter(out, adapter, 'tiny-base');
    const config = JSON.parse(await readFile(join(out, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
    expect(config).toMatchObject({
      peft_type: 'LORA',
      task_type: 'CAUSAL_LM',
      r: 4,
      lora_alpha: 8,
      lora_dropout: 0,
      target_modules: ['q_proj', 'o_proj', 'up_proj'],
      bias: 'none',
      base_model_name_or_path: 'tiny-base',
    });
    expect(adapter.weightNames()).toContain('base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight');
    await expect(loadPeftAdapter(out, CONFIG, { maxWeightBytes: 10 })).rejects.toThrow(
      /adapter_model\.safetensors: \d+ bytes, more than the 10 allowed/,
    );
    const back = await loadPeftAdapter(out, CONFIG);
    expect(back.baseModel).toBe('tiny-base');
    expect(sameWeights(back.adapter.getWeights(), adapter.getWeights())).toBe(true);
    back.adapter.dispose();

    // PEFT's in-memory names carry the adapter name ("default"); files saved from them may too.
    const { encodeSafetensors } = await import('../../lib/model/safetensors.js');
    const named = new Map(
      [...adapter.getWeights()].map(([name, w]) => [name.replace(/\.lora_([AB])\.weight$/, '.lora_$1.default.weight'), w]),
    );
    await writeFile(join(out, 'adapter_model.safetensors'), encodeSafetensors(named));
    const again = await loadPeftAdapter(out, CONFIG);
    expect(sameWeights(again.adapter.getWeights(), adapter.getWeights())).toBe(true);
    again.adapter.dispose();
    adapter.dispose();
  });

  it('name what rxrl does not compute as PEFT would, and reject tensors of another shape', async () => {
    const out = join(dir, 'variants');
    const adapter = LoraAdapter.create(CONFIG, { rank: 2, alpha: 2, targetModules: ['q_proj'] }, 1);
    await savePeftAdapter(out, adapter);
    const good = JSON.parse(await readFile(join(out, 'adapter_config.json'), 'utf8')) as Record<string, unknown>;
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ use_dora: true }, /use_dora is not supported/],
      [{ target_modules: '.*proj' }, /target_modules must be a list of module names/],
      [{ rank_pattern: { 'model.layers.0': 8 } }, /rank_pattern is not supported/],
      [{ layers_to_transform: [0] }, /layers_to_transform is not supported/],
      [{ bias: 'all' }, /bias must be 'none'/],
      [{ peft_type: 'IA3' }, /peft_type must be 'LORA'/],
      [{ target_modules: ['q_proj', 'lm_head'] }, /target_modules\[1\] must be one of/],
    ];
    for (const [change, message] of cases) {
      await writeFile(join(out, 'adapter_config.json'), JSON.stringify({ ...good, ...change }));
      await expect(readPeftAdapterConfig(out)).rejects.toThrow(ConfigError);
      await expect(readPeftAdapterConfig(out)).rejects.toThrow(message);
    }
    await writeFile(join(out, 'adapter_config.json'), JSON.stringify({ ...good, r: 3 }));
    await expect(loadPeftAdapter(out, CONFIG)).rejects.toThrow(ShapeError);
    await expect(loadPeftAdapter(out, CONFIG)).rejects.toThrow(/lora_A\.weight has shape \[2, 16\], expected \[3, 16\]/);
    const kept = adapter.getWeights();
    const short = new Map([...kept].map(([name, w]) => [name, { shape: w.shape, data: w.data.subarray(1) }]));
    expect(() => adapter.setWeights(short)).toThrow(/has \d+ values for shape/);
    expect(sameWeights(adapter.getWeights(), kept)).toBe(true); // checked before anything changed
    const base = PolicyModel.create(CONFIG, 1);
    const view = PolicyModel.withAdapter(base, adapter);
    await expect(saveModelDir(join(dir, 'view'), view)).rejects.toThrow(/LoRA adapter view/);
    const otherShape = PolicyModel.create({ ...CONFIG, dFF: 32 }, 1);
    expect(() => PolicyModel.withAdapter(otherShape, adapter)).toThrow(/another architecture \(dFF differ\)/);
    expect(() => PolicyModel.withAdapter(view, adapter)).toThrow(/already an adapter view/);
    otherShape.dispose();
    view.dispose();
    base.dispose();
    adapter.dispose();
  });

  it('is loaded by Python peft with the same logits as rxrl computes, when torch, transformers and peft are importable', async () => {
    const base = PolicyModel.create(CONFIG, 8);
    const adapter = randomAdapter(ALL, 9);
    const view = PolicyModel.withAdapter(base, adapter);
    const baseDir = join(dir, 'peft-base');
    const adapterDir = join(dir, 'peft-adapter');
    await saveModelDir(baseDir, base);
    await savePeftAdapter(adapterDir, adapter, baseDir);
    const ours = logitsOf(view);
    const hasPeft = spawnSync('python3', ['-c', 'import torch, transformers, peft'], { stdio: 'ignore' }).status === 0;
    if (!hasPeft) {
      // No peft here: the directory must still hold exactly PEFT's two files, with PEFT's tensor names.
      const { loadSafetensors } = await import('../../lib/model/safetensors.js');
      const { weights } = await loadSafetensors(join(adapterDir, 'adapter_model.safetensors'));
      expect([...weights.keys()].sort()).toEqual(adapter.weightNames().sort());
      console.info('lora: peft is not importable; checked the file layout only');
    } else {
      const run = spawnSync(
        'python3',
        [join(import.meta.dirname, '..', '..', 'scripts', 'hf_logits.py'), baseDir, '--adapter', adapterDir],
        {
          input: JSON.stringify({ input_ids: INPUT.ids, attention_mask: INPUT.mask, position_ids: INPUT.pos }),
          encoding: 'utf8',
          maxBuffer: 64 << 20,
        },
      );
      expect(run.status, run.stderr).toBe(0);
      const answer = JSON.parse(run.stdout) as { logits: number[][][]; peft: string | null };
      expect(answer.peft).toBeTypeOf('string');
      expect(maxDiff(ours, answer.logits)).toBeLessThan(1e-4);
      expect(maxDiff(logitsOf(base), answer.logits)).toBeGreaterThan(1e-2); // peft applied the adapter
      console.info(`lora: peft ${answer.peft} loaded the adapter with the same logits`);
    }
    view.dispose();
    adapter.dispose();
    base.dispose();
  }, 240_000);
});

describe('LoRA through the GRPO pipeline', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
  });

  it('trains the adapter only and ships only the adapter to the rollout engine, whose base is a separate copy', async () => {
    const { grpoPipeline } = await import('../../pipelines/grpoPipeline.js');
    const { LocalEngine } = await import('../../lib/engine/local.js');
    const { CharTokenizer } = await import('../../lib/model/tokenizer.js');
    const { stringTransformTask } = await import('../../recipes/stringTransform.js');
    const { lastValueFrom, toArray } = await import('rxjs');
    const task = stringTransformTask({ alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 4, seed: 2 });
    const tokenizer = new CharTokenizer(task.characters);
    const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 };
    const lora: LoraConfig = { rank: 2, alpha: 4, targetModules: ['q_proj', 'v_proj', 'up_proj'] };
    const base = PolicyModel.create(config, 4);
    const rolloutBase = PolicyModel.fromWeights(config, base.getWeights());
    const adapter = LoraAdapter.create(config, lora, 1);
    const rolloutAdapter = LoraAdapter.create(config, lora, 1);
    const policy = PolicyModel.withAdapter(base, adapter);
    const engine = new LocalEngine(PolicyModel.withAdapter(rolloutBase, rolloutAdapter), { tokenizer });
    const shipped: string[][] = [];
    const load = engine.loadWeights.bind(engine);
    engine.loadWeights = (version, weights) => {
      shipped.push([...weights.keys()]);
      return load(version, weights);
    };
    const baseBefore = base.getWeights();
    const trainer = new GrpoTrainer(policy, { learningRate: 1e-2 });
    const steps = await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: 2, shuffle: true, seed: 1 },
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        batchSize: 3,
        groupSize: 4,
        maxTokens: 4,
        steps: 3,
      }).pipe(toArray()),
    );
    expect(steps.map((s) => s.version)).toEqual([1, 2, 3]);
    expect(shipped).toHaveLength(3);
    for (const names of shipped) expect(names).toEqual(adapter.weightNames());
    expect(sameWeights(base.getWeights(), baseBefore)).toBe(true);
    expect(sameWeights(rolloutBase.getWeights(), baseBefore)).toBe(true);
    expect(sameWeights(rolloutAdapter.getWeights(), adapter.getWeights())).toBe(true);
    const fresh = LoraAdapter.create(config, lora, 1);
    expect(sameWeights(adapter.getWeights(), fresh.getWeights())).toBe(false);
    fresh.dispose();
    trainer.dispose();
    for (const m of [policy, base, rolloutBase]) m.dispose();
    adapter.dispose();
    rolloutAdapter.dispose();
  });
});
