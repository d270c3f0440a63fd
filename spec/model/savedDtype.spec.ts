/**
 * Checkpoints as `save_pretrained` writes them: bfloat16 / float16 weights, sharded with
 * `model.safetensors.index.json`. A committed fixture made by transformers (scripts/bf16_fixture.py: PyTorch's cast
 * to bfloat16, `save_pretrained(max_shard_size="100KB")`, and the logits it computes from those weights) checks, with
 * no torch here, that rxrl's bfloat16 shards of the same model hold the same bits and that rxrl reads transformers'
 * shards to the same logits; a run saved in bfloat16 resumes from its float32 master weights exactly.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';

import { loadCheckpoint } from '../../lib/checkpoint/checkpoint.js';
import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { parseShardSize } from '../../lib/core/sizes.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadModelDir, readModelDir, saveModelDir } from '../../lib/model/modelDir.js';
import { decodeSafetensors, encodeSafetensors, floatToBfloat16, floatToHalf, loadSafetensors } from '../../lib/model/safetensors.js';
import { runTraining } from '../../pipelines/run.js';

const FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'hf');
const TORCH_BF16 = join(FIXTURES, 'tiny-qwen2-bf16');

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

describe('narrow floats', () => {
  it('float16: every finite half survives float32 and back; rounding to nearest even, overflow, subnormals', () => {
    const all = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) {
      const e = (h >> 10) & 31;
      const m = h & 1023;
      const v = e === 0 ? m * 2 ** -24 : e === 31 ? (m === 0 ? Infinity : NaN) : (1 + m / 1024) * 2 ** (e - 15);
      all[h] = h & 0x8000 ? -v : v;
    }
    const back = decodeSafetensors(encodeSafetensors(new Map([['x', { shape: [65536], data: all }]]), undefined, 'F16')).weights.get(
      'x',
    )!.data;
    for (let h = 0; h < 65536; h++) if (!Number.isNaN(all[h])) expect(Object.is(back[h], all[h]), `half ${h}`).toBe(true);
    expect(floatToHalf(65520)).toBe(0x7c00); // halfway to 65536 rounds up to Infinity
    expect(floatToHalf(65504)).toBe(0x7bff);
    expect(floatToHalf(1 + 2 ** -11)).toBe(0x3c00); // a tie: to even
    expect(floatToHalf(1 + 3 * 2 ** -11)).toBe(0x3c02);
    expect(floatToHalf(3 * 2 ** -25)).toBe(0x0002); // a subnormal tie: to even
    expect(floatToHalf(2 ** -26)).toBe(0);
    expect(floatToHalf(Number.NaN) & 0x7e00).toBe(0x7e00);
  });

  it('bfloat16: the upper half rounded to nearest even; NaN stays NaN', () => {
    expect(floatToBfloat16(1)).toBe(0x3f80);
    expect(floatToBfloat16(1 + 2 ** -8)).toBe(0x3f80);
    expect(floatToBfloat16(1 + 3 * 2 ** -8)).toBe(0x3f82);
    expect(floatToBfloat16(-2)).toBe(0xc000);
    expect(floatToBfloat16(3.4e38)).toBe(0x7f80); // rounds past the largest bfloat16
    expect(floatToBfloat16(Number.NaN)).toBe(0x7fc0);
    expect(parseShardSize('50GB')).toBe(50e9);
    expect(parseShardSize('2GiB')).toBe(2 * 2 ** 30);
    expect(parseShardSize('100KB')).toBe(100e3);
    expect(() => parseShardSize('lots')).toThrow(ConfigError);
  });
});

describe('bfloat16 shards as transformers writes them', () => {
  it("rxrl's bfloat16 shards of the fixture hold the bits PyTorch's cast gives, in the same layout", async () => {
    const { model } = await loadModelDir(join(FIXTURES, 'tiny-qwen2'));
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-bf16-'));
    await saveModelDir(dir, model, { dtype: 'bfloat16', maxShardBytes: 100e3 });
    model.dispose();
    const files = readdirSync(dir).sort();
    expect(files).toEqual([
      'config.json',
      'generation_config.json',
      'model-00001-of-00002.safetensors',
      'model-00002-of-00002.safetensors',
      'model.safetensors.index.json',
    ]);
    const ours = JSON.parse(readFileSync(join(dir, 'model.safetensors.index.json'), 'utf8')) as {
      metadata: Record<string, number>;
      weight_map: Record<string, string>;
    };
    const theirs = JSON.parse(readFileSync(join(TORCH_BF16, 'model.safetensors.index.json'), 'utf8')) as typeof ours;
    expect(ours.metadata).toEqual(theirs.metadata);
    expect(Object.keys(ours.weight_map).sort()).toEqual(Object.keys(theirs.weight_map).sort());
    expect(JSON.parse(readFileSync(join(dir, 'config.json'), 'utf8'))).toMatchObject({ torch_dtype: 'bfloat16' });
    const read = async (root: string): Promise<Map<string, { dtype: string; data: Float32Array }>> => {
      const out = new Map<string, { dtype: string; data: Float32Array }>();
      for (const file of new Set(
        Object.values(JSON.parse(readFileSync(join(root, 'model.safetensors.index.json'), 'utf8')).weight_map as Record<string, string>),
      )) {
        const bytes = readFileSync(join(root, file));
        const header = JSON.parse(bytes.subarray(8, 8 + Number(bytes.readBigUInt64LE(0))).toString()) as Record<string, { dtype?: string }>;
        for (const [name, tensor] of decodeSafetensors(bytes).weights)
          out.set(name, { dtype: header[name].dtype ?? '', data: tensor.data });
      }
      return out;
    };
    const [mine, torch] = [await read(dir), await read(TORCH_BF16)];
    // bfloat16 widens to float32 exactly: equal floats are equal bits.
    for (const [name, tensor] of torch) {
      expect(mine.get(name)?.dtype, name).toBe('BF16');
      expect(tensor.dtype).toBe('BF16');
      expect(Buffer.from(mine.get(name)!.data.buffer).equals(Buffer.from(tensor.data.buffer)), name).toBe(true);
    }
    // rxrl reads its own shards back.
    const again = await readModelDir(dir);
    expect([...again.weights.keys()].sort()).toEqual([...torch.keys()].sort());
    // Where torch imports, transformers loads rxrl's shards and computes rxrl's logits (the fixture covers it elsewhere).
    if (hasTransformers()) {
      const ids = [3, 9, 27, 81, 5];
      const script = [
        'import json, sys, torch',
        'from transformers import AutoModelForCausalLM',
        'm = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)',
        'print(json.dumps(m(torch.tensor([json.loads(sys.argv[2])])).logits[0].tolist()))',
      ].join('\n');
      const python = spawnSync('python3', ['-c', script, dir, JSON.stringify(ids)], { encoding: 'utf8' });
      expect(python.status, python.stderr).toBe(0);
      const theirs = JSON.parse(python.stdout.trim().split('\n').at(-1)!) as number[][];
      expect(maxDiff(await rxrlLogits(dir, ids), theirs)).toBeLessThanOrEqual(1e-4);
    }
  });

  it("reads transformers' shards to the logits transformers computes from them (within 1e-4)", async () => {
    const expected = JSON.parse(readFileSync(join(TORCH_BF16, 'logits.json'), 'utf8')) as { ids: number[]; logits: number[][] };
    expect(maxDiff(await rxrlLogits(TORCH_BF16, expected.ids), expected.logits)).toBeLessThanOrEqual(1e-4);
  });
});

/** rxrl's logits of one row of token ids under a model directory. */
async function rxrlLogits(dir: string, tokens: readonly number[]): Promise<number[][]> {
  const { model } = await loadModelDir(dir);
  const n = tokens.length;
  const ids = tf.tensor2d([[...tokens]], [1, n], 'int32');
  const mask = tf.ones([1, n], 'int32') as tf.Tensor2D;
  const pos = tf.tensor2d([tokens.map((_, i) => i)], [1, n], 'int32');
  const logits = model.logits(ids, mask, pos);
  const rows = (logits.arraySync() as number[][][])[0];
  tf.dispose([ids, mask, pos, logits]);
  model.dispose();
  return rows;
}

function maxDiff(a: number[][], b: number[][]): number {
  let diff = 0;
  for (let t = 0; t < a.length; t++) for (let v = 0; v < a[t].length; v++) diff = Math.max(diff, Math.abs(a[t][v] - b[t][v]));
  return diff;
}

/** Whether `python3` imports torch and transformers here. */
function hasTransformers(): boolean {
  return spawnSync('python3', ['-c', 'import torch, transformers'], { stdio: 'ignore' }).status === 0;
}

describe('checkpoint.dtype bfloat16', () => {
  const recipe = (dir: string, steps: number, dtype: string, resume?: string) =>
    loadConfig({
      env: {},
      values: {
        model: { path: join(FIXTURES, 'tiny-qwen2') },
        run: { dir, seed: 4, steps, backend: 'cpu' },
        data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        rollout: { groupSize: 2 },
        sync: { batchSize: 2 },
        trainer: { learningRate: 0.01, entropyCoef: 0.01 },
        checkpoint: { every: 1, keepLast: 0, dtype, maxShardSize: '100KB' },
        validation: { beforeTrain: false },
        ...(resume ? { resume: { mode: 'from_path', path: resume } } : {}),
      },
    });

  it('writes bfloat16 shards and float32 master weights, and a resume goes on from the exact weights', async () => {
    const work = await mkdtemp(join(tmpdir(), 'rxrl-bf16-run-'));
    await runTraining(recipe(join(work, 'straight'), 2, 'float32'), { log: () => undefined });
    await runTraining(recipe(join(work, 'bf16'), 1, 'bfloat16'), { log: () => undefined });
    const first = join(work, 'bf16', 'global_step_1');
    expect(readdirSync(first)).toEqual(
      expect.arrayContaining(['master.safetensors', 'model.safetensors.index.json', 'model-00001-of-00002.safetensors']),
    );
    const checkpoint = await loadCheckpoint(first);
    const master = (await loadSafetensors(join(first, 'master.safetensors'))).weights;
    const narrow = (await readModelDir(first)).weights;
    const name = 'model.layers.0.mlp.down_proj.weight';
    expect(checkpoint.weights.get(name)!.data).toEqual(master.get(name)!.data);
    expect(narrow.get(name)!.data).not.toEqual(master.get(name)!.data);
    // Resumed in another run directory from the bfloat16 checkpoint: step 2 lands where the float32 run's did.
    await runTraining(recipe(join(work, 'resumed'), 2, 'bfloat16', first), { log: () => undefined });
    const straight = (await readModelDir(join(work, 'straight', 'global_step_2'))).weights;
    const resumed = (await loadSafetensors(join(work, 'resumed', 'global_step_2', 'master.safetensors'))).weights;
    for (const [key, tensor] of straight)
      expect(Buffer.from(resumed.get(key)!.data.buffer).equals(Buffer.from(tensor.data.buffer)), key).toBe(true);
  }, 120_000);
});
