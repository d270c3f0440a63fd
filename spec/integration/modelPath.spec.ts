import { spawn, spawnSync } from 'node:child_process';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { loadModelDir, readModelDir } from '../../lib/model/modelDir.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
/** A random-weight Qwen2 (tied head, q/k/v biases, 2 kv heads) with a byte-level BPE tokenizer, made by transformers. */
const FIXTURE = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

/** Whether `python3 -c 'import transformers, torch'` works here (then the checkpoint is loaded by transformers). */
function hasTransformers(): boolean {
  return spawnSync('python3', ['-c', 'import transformers, torch'], { stdio: 'ignore' }).status === 0;
}

function runCli(args: readonly string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [cli, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
  child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
  return new Promise((resolve) => child.on('exit', (code) => resolve({ code, stdout, stderr })));
}

let dir: string;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-model-path-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe('rxrl run --set model.path=<Hugging Face directory> (built CLI)', () => {
  it('trains the model with its own tokenizer and writes checkpoints that are complete model directories', async () => {
    const recipe = join(dir, 'recipe.json');
    await writeFile(
      recipe,
      JSON.stringify({
        run: { dir: 'run', seed: 2, steps: 4, backend: 'cpu' },
        data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 4 } },
        rollout: { groupSize: 3 },
        sync: { mode: 'sync', batchSize: 2 },
        // A random model scores 0 on every sample (no advantage): the entropy bonus makes sure the weights move.
        trainer: { learningRate: 0.01, entropyCoef: 0.01 },
        checkpoint: { every: 2, keepLast: 0 },
        validation: { beforeTrain: false },
      }),
    );
    const result = await runCli(['run', recipe, '--set', `model.path=${FIXTURE}`]);
    expect(result.code, result.stderr).toBe(0);
    const summary = JSON.parse(result.stdout.trim().split('\n').at(-1)!) as { steps: number };
    expect(summary.steps).toBe(4);

    const checkpoint = join(dir, 'run', 'global_step_4');
    const files = await readdir(checkpoint);
    for (const name of ['config.json', 'generation_config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json']) {
      expect(files, name).toContain(name);
    }
    // Same architecture and tokenizer as the directory it started from; the weights moved.
    const original = await readModelDir(FIXTURE);
    const trained = await readModelDir(checkpoint);
    expect(trained.config).toEqual(original.config);
    expect([...trained.weights.keys()].sort()).toEqual([...original.weights.keys()].sort());
    const moved = [...original.weights].filter(([name, w]) => w.data.some((x, i) => x !== trained.weights.get(name)!.data[i]));
    expect(moved.length).toBeGreaterThan(0);
    const sample = 'cba\r\n🙂 <|im_end|>';
    expect((await loadTokenizer(checkpoint)).encode(sample)).toEqual((await loadTokenizer(FIXTURE)).encode(sample));
    const raw = JSON.parse(await readFile(join(checkpoint, 'config.json'), 'utf8')) as Record<string, unknown>;
    const fixtureRaw = JSON.parse(await readFile(join(FIXTURE, 'config.json'), 'utf8')) as Record<string, unknown>;
    for (const key of [
      'architectures',
      'model_type',
      'hidden_size',
      'num_key_value_heads',
      'tie_word_embeddings',
      'vocab_size',
      'eos_token_id',
    ]) {
      expect(raw[key], key).toEqual(fixtureRaw[key]);
    }

    const ids = [[...(await loadTokenizer(checkpoint)).encode('abc=cba')]];
    const { model } = await loadModelDir(checkpoint);
    const ours = tf.tidy(() => {
      const T = ids[0].length;
      const out = model.logits(
        tf.tensor2d(ids, [1, T], 'int32'),
        tf.ones([1, T]) as tf.Tensor2D,
        tf.tensor2d([[...Array(T).keys()]], [1, T], 'int32'),
      );
      return out.arraySync() as number[][][];
    });
    model.dispose();
    if (!hasTransformers()) {
      console.info('modelPath: transformers is not importable; checked the directory against the fixture layout only');
      return;
    }
    const python = spawnSync('python3', [join(root, 'scripts', 'hf_logits.py'), checkpoint], {
      input: JSON.stringify({ input_ids: ids, texts: ['abc=cba'] }),
      encoding: 'utf8',
      maxBuffer: 64 << 20,
    });
    expect(python.status, python.stderr).toBe(0);
    const answer = JSON.parse(python.stdout) as { logits: number[][][]; encoded: number[][]; model_type: string };
    expect(answer.model_type).toBe('qwen2');
    expect(answer.encoded).toEqual(ids);
    let diff = 0;
    answer.logits[0].forEach((row, t) => row.forEach((x, v) => (diff = Math.max(diff, Math.abs(x - ours[0][t][v])))));
    expect(diff).toBeLessThanOrEqual(1e-4);
    console.info('modelPath: transformers loaded the run checkpoint with the same logits');
  }, 240_000);
});
