/**
 * `saveModelDir(dir, model, { sameWeightsAs })`: a LoRA run's frozen base, read from a model directory, is saved
 * into the run directory by hard-linking that directory's weight files (one file, or transformers' shards and their
 * index) instead of writing them again; where it cannot link, it writes them as before.
 */
import { cpSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { loadModelDir, readModelDir, saveModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel } from '../../lib/model/transformer.js';

const TORCH_BF16 = join(import.meta.dirname, '..', 'fixtures', 'hf', 'tiny-qwen2-bf16');
const TINY = { vocabSize: 16, dModel: 8, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 8 };

const inode = (path: string): number => statSync(path).ino;
const torchDtype = async (dir: string): Promise<unknown> =>
  (JSON.parse(await readFile(join(dir, 'config.json'), 'utf8')) as Record<string, unknown>).torch_dtype;
const values = (model: PolicyModel): number[][] => [...model.getWeights().values()].map((w) => [...w.data]);

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

describe('saveModelDir with sameWeightsAs', () => {
  it("links transformers' bfloat16 shards and their index, drops the other layout's file, and reads back the same model", async () => {
    const root = await mkdtemp(join(tmpdir(), 'rxrl-linked-'));
    const source = join(root, 'source');
    cpSync(TORCH_BF16, source, { recursive: true });
    const { model } = await loadModelDir(source);
    const dir = join(root, 'base');
    mkdirSync(dir);
    writeFileSync(join(dir, 'model.safetensors'), 'a stale single-file layout');

    await saveModelDir(dir, model, { sameWeightsAs: source });
    const weights = readdirSync(source).filter((name) => name.endsWith('.safetensors') || name.endsWith('.index.json'));
    expect(weights.length).toBeGreaterThan(2);
    for (const name of weights) expect(inode(join(dir, name)), name).toBe(inode(join(source, name)));
    expect(readdirSync(dir)).not.toContain('model.safetensors');
    expect(readdirSync(dir).filter((name) => name.endsWith('.link'))).toEqual([]);
    expect(await torchDtype(dir)).toBe('bfloat16');
    const { model: again } = await loadModelDir(dir);
    expect(values(again)).toEqual(values(model));
  });

  it('links a single model.safetensors, again without change on a second save (a resumed run)', async () => {
    const root = await mkdtemp(join(tmpdir(), 'rxrl-linked-'));
    const model = PolicyModel.create(TINY, 5);
    const source = join(root, 'source');
    await saveModelDir(source, model);
    const dir = join(root, 'base');
    const first = await saveModelDir(dir, model, { sameWeightsAs: source });
    expect(inode(join(dir, 'model.safetensors'))).toBe(inode(join(source, 'model.safetensors')));
    const second = await saveModelDir(dir, model, { sameWeightsAs: source });
    expect(second).toEqual(first);
    expect(first.bytes).toBe(statSync(join(source, 'model.safetensors')).size);
    expect(inode(join(dir, 'model.safetensors'))).toBe(inode(join(source, 'model.safetensors')));
    expect(await torchDtype(dir)).toBe('float32');
    await expect(readModelDir(dir)).resolves.toBeDefined();
  });

  it('writes the weights when the directory named has none to link', async () => {
    const root = await mkdtemp(join(tmpdir(), 'rxrl-linked-'));
    const model = PolicyModel.create(TINY, 6);
    const empty = join(root, 'empty');
    mkdirSync(empty);
    const dir = join(root, 'base');
    await saveModelDir(dir, model, { sameWeightsAs: empty, dtype: 'bfloat16' });
    expect(statSync(join(dir, 'model.safetensors')).nlink).toBe(1);
    expect(await torchDtype(dir)).toBe('bfloat16');
    const { model: again } = await loadModelDir(dir);
    expect(again.numParameters()).toBe(model.numParameters());
  });
});
