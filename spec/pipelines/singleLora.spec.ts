import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import OpenAI from 'openai';
import { beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadPeftAdapter, readPeftAdapterConfig } from '../../lib/model/lora.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { serve } from '../../lib/serve/server.js';
import { runTraining } from '../../pipelines/run.js';

const quiet = { info: (): void => undefined };

/** A single-agent recipe on the bundled task whose one policy is a rank-4 LoRA adapter on the tiny model. */
function recipe(dir: string, steps: number, extra: Record<string, unknown> = {}): ReturnType<typeof loadConfig> {
  return loadConfig({
    env: {},
    values: {
      run: { dir: join(dir, 'run'), steps, backend: 'cpu', seed: 3 },
      data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 8 } },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
      rollout: { groupSize: 4 },
      sync: { batchSize: 4 },
      checkpoint: { every: 2, keepLast: 3 },
      trainer: { learningRate: 0.01 },
      validation: { beforeTrain: false },
      policies: [{ name: 'reverser', specialization: 'lora', lora: { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj'] } }],
      ...extra,
    },
  });
}

const lines = (file: string): { step: number }[] =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as { step: number });

describe('a single-agent recipe with a LoRA policy', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
  });

  it('trains, checkpoints as a PEFT adapter over the saved base, resumes, and serves the adapter', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-single-lora-'));
    const first = await runTraining(recipe(dir, 4));
    expect(first.steps).toBe(4);
    const run = join(dir, 'run');
    const step4 = join(run, 'global_step_4');
    // The checkpoint is a PEFT adapter directory (no full weights) naming the base written once under base/.
    expect(existsSync(join(step4, 'adapter_model.safetensors'))).toBe(true);
    expect(existsSync(join(step4, 'model.safetensors'))).toBe(false);
    const { lora, baseModel } = await readPeftAdapterConfig(step4);
    expect(lora.rank).toBe(4);
    expect(baseModel).toBe(join(run, 'base'));
    // Training moved the adapter (its B starts at zero) and left the base as the recipe's seeded model.
    const { model: base } = await loadModelDir(join(run, 'base'));
    const { adapter } = await loadPeftAdapter(step4, base.config);
    const moved = [...adapter.getWeights()].filter(([name]) => name.includes('lora_B')).some(([, w]) => w.data.some((x) => x !== 0));
    expect(moved).toBe(true);
    expect(lines(join(run, 'trained.jsonl')).map((l) => l.step)).toEqual([0, 1, 2, 3]);

    // Resumed with a larger budget: it picks up the adapter and the optimizer, and logs each step once.
    const second = await runTraining(recipe(dir, 6));
    expect(second.resumedFrom).toBe(step4);
    expect(second.steps).toBe(6);
    expect(lines(join(run, 'trained.jsonl')).map((l) => l.step)).toEqual([0, 1, 2, 3, 4, 5]);
    const { model: baseAgain } = await loadModelDir(join(run, 'base'));
    expect([...baseAgain.getWeights().values()].map((w) => [...w.data])).toEqual([...base.getWeights().values()].map((w) => [...w.data]));

    // rxrl serve --model <run>/base --lora-modules reverser=<run>/global_step_6 answers with the adapter.
    const server = await serve({
      model: base,
      tokenizer: await loadTokenizer(join(run, 'base')),
      loraModules: { reverser: join(run, 'global_step_6') },
    });
    try {
      const client = new OpenAI({ baseURL: server.baseURL, apiKey: 'none' });
      const models = await client.models.list();
      expect(models.data.map((m) => m.id)).toContain('reverser');
      const out = await client.completions.create({ model: 'reverser', prompt: 'abc=', max_tokens: 4, temperature: 0 });
      expect(out.model).toBe('reverser');
      // What the server says is what the base plus the adapter say in-process.
      const { adapter: trained } = await loadPeftAdapter(join(run, 'global_step_6'), base.config);
      const view = PolicyModel.withAdapter(base, trained);
      const tokenizer = await loadTokenizer(join(run, 'base'));
      const [local] = await view.generate([
        { promptTokens: tokenizer.encode('abc=', { addBos: true }), maxTokens: 4, temperature: 0, stopTokens: tokenizer.stopIds },
      ]);
      expect(out.choices[0].text).toBe(tokenizer.decode(local.tokens.filter((t) => !tokenizer.stopIds.includes(t))));
      view.dispose();
      trained.dispose();
    } finally {
      await server.close();
    }
    adapter.dispose();
    base.dispose();
    baseAgain.dispose();
  });

  it('refuses a second policy, and a checkpoint of the other kind', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-single-lora-'));
    expect(() =>
      recipe(dir, 2, {
        policies: [
          { name: 'a', specialization: 'lora' },
          { name: 'b', specialization: 'full' },
        ],
      }),
    ).toThrow(/policies: a single-agent run .* trains one policy, got 2/);
    // A full-model run's checkpoint cannot resume as a LoRA policy.
    await runTraining(recipe(dir, 2, { policies: [] }));
    await expect(runTraining(recipe(dir, 4))).rejects.toThrow(ConfigError);
    await expect(runTraining(recipe(dir, 4))).rejects.toThrow(/holds a full model, but policies\[0\] is a 'lora' policy/);
  });

  it('starts from a PEFT adapter directory (adapterPath, relative to the recipe), and refuses one of another shape', async () => {
    const first = await mkdtemp(join(tmpdir(), 'rxrl-single-lora-'));
    await runTraining(recipe(first, 2));
    const trained = join(first, 'run', 'global_step_2');
    const { model: base } = await loadModelDir(join(first, 'run', 'base'));
    const { adapter: start } = await loadPeftAdapter(trained, base.config);
    const lora = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj'] };
    // A step at a learning rate of 1e-30 leaves every weight where it started: the checkpoint is the starting adapter.
    const second = await mkdtemp(join(tmpdir(), 'rxrl-single-lora-'));
    const starting = (dir: string, adapterPath: string, steps = 1): ReturnType<typeof loadConfig> =>
      recipe(dir, steps, {
        trainer: { learningRate: 1e-30 },
        checkpoint: { every: 1, keepLast: 1 },
        policies: [{ name: 'reverser', specialization: 'lora', lora, adapterPath }],
      });
    await runTraining(starting(second, 'run/global_step_2'), { baseDir: first });
    const { adapter: after } = await loadPeftAdapter(join(second, 'run', 'global_step_1'), base.config);
    const weights = after.getWeights();
    let maxDiff = 0;
    for (const [name, w] of start.getWeights()) {
      const got = weights.get(name)?.data ?? new Float32Array(0);
      expect(got.length, name).toBe(w.data.length);
      w.data.forEach((x, i) => (maxDiff = Math.max(maxDiff, Math.abs(x - (got[i] ?? Number.NaN)))));
    }
    expect(maxDiff).toBeLessThan(1e-12);
    // Not a fresh adapter: a fresh one's B is zero, the trained one's is not.
    expect([...weights].some(([name, w]) => name.includes('lora_B') && w.data.some((x) => x !== 0))).toBe(true);

    await expect(
      runTraining(
        recipe(await mkdtemp(join(tmpdir(), 'rxrl-single-lora-')), 1, {
          policies: [{ name: 'reverser', specialization: 'lora', lora: { ...lora, rank: 8 }, adapterPath: trained }],
        }),
      ),
    ).rejects.toThrow(
      /policies\[0\]\.adapterPath: the adapter in .*global_step_2 has rank 4, alpha 8, targets q_proj, v_proj; the policy's lora has rank 8/,
    );
    const fresh = await mkdtemp(join(tmpdir(), 'rxrl-single-lora-'));
    await expect(runTraining(starting(fresh, join(first, 'missing')))).rejects.toThrow(
      `policies[0].adapterPath: no adapter at '${join(first, 'missing')}' (give a PEFT adapter directory`,
    );
    await expect(runTraining(starting(fresh, first))).rejects.toThrow(`no adapter at '${first}': it has no adapter_config.json (`);
    expect(() => recipe(second, 1, { policies: [{ name: 'p', specialization: 'full', adapterPath: trained }] })).toThrow(
      /policies\[0\]\.adapterPath: only for specialization 'lora'/,
    );
    // A resumed run starts from its checkpoint, not from the adapter: it resumes with that directory gone.
    await rm(trained, { recursive: true });
    const resumed = await runTraining(starting(second, 'run/global_step_2', 2), { baseDir: first });
    expect(resumed.resumedFrom).toBe(join(second, 'run', 'global_step_1'));
    expect(resumed.steps).toBe(2);
    for (const m of [base, start, after]) m.dispose();
  });
});
