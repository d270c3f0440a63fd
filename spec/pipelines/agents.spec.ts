import { mkdtemp, readFile, readdir, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../lib/config/schema.js';
import { loadPeftAdapter } from '../../lib/model/lora.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { runAgents } from '../../pipelines/agents.js';
import { tinyModelConfig } from '../../lib/model/policies.js';
import { writerEditorTask } from '../../recipes/writerEditor.js';

const roles = [
  { name: 'writer', policy: 'writer' },
  { name: 'editor', policy: 'editor' },
];

function config(values: Record<string, unknown>): ReturnType<typeof loadConfig> {
  return loadConfig({
    env: {},
    values: {
      run: { dir: null, seed: 1, steps: 3, backend: 'auto' },
      sync: { batchSize: 4 },
      rollout: { groupSize: 4 },
      data: { task: { validationSize: 20 } },
      checkpoint: { every: 0, onStop: false },
      resume: { mode: 'disable' },
      ...values,
    },
  });
}

describe('runAgents (multi-agent recipes: L1 prompt, L2 LoRA, L3 full)', () => {
  it('L2: two adapters on one frozen base; only adapters train, sync and are saved (PEFT), the base stays bit for bit', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    const lora = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj', 'down_proj'] };
    const summary = await runAgents(
      config({
        run: { dir, seed: 1, steps: 3, backend: 'auto' },
        agents: { environment: 'writer-editor', roles },
        policies: [
          { name: 'writer', specialization: 'lora', lora },
          { name: 'editor', specialization: 'lora', lora },
        ],
      }),
    );
    expect(summary.policies.map((p) => [p.name, p.specialization, p.steps, p.agents])).toEqual([
      ['writer', 'lora', 3, ['writer']],
      ['editor', 'lora', 3, ['editor']],
    ]);
    // The tiny model: 2 layers, d 64, dFF 256; rank 4 on q (64→64), v (64→64), down (256→64).
    const perLayer = 4 * (64 + 64) + 4 * (64 + 64) + 4 * (256 + 64);
    for (const policy of summary.policies) {
      expect(policy.trainableParameters).toBe(2 * perLayer);
      expect(policy.syncBytes).toBe(2 * perLayer * 4);
    }
    // The saved base is the seeded initial model, unchanged by training.
    const task = writerEditorTask({ seed: 1, validationSize: 20 });
    const tokenizer = new CharTokenizer(task.characters);
    const initial = PolicyModel.create({ ...tinyModelConfig(config({}).model), vocabSize: tokenizer.vocabSize }, 1);
    const { model: base } = await loadModelDir(join(dir, 'base'));
    for (const [name, w] of initial.getWeights()) expect(base.getWeights().get(name)?.data, name).toEqual(w.data);
    // Each policy is a PEFT adapter directory over that base, and training moved it off its zero-B start.
    for (const policy of summary.policies) {
      expect(policy.savedTo).toBe(join(dir, 'policies', policy.name));
      const { adapter, baseModel } = await loadPeftAdapter(policy.savedTo as string, base.config);
      expect(baseModel).toBe(join(dir, 'base'));
      const moved = [...adapter.getWeights()].filter(([name]) => name.includes('lora_B')).some(([, w]) => w.data.some((x) => x !== 0));
      expect(moved).toBe(true);
      adapter.dispose();
    }
    // Metrics are namespaced per policy.
    const lines = (await readFile(join(dir, 'metrics.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    expect(lines).toHaveLength(6);
    const keys = lines.flatMap((l) => Object.keys(l).filter((k) => !['step', 'version', 'time'].includes(k)));
    expect(keys.every((k) => k.startsWith('writer/') || k.startsWith('editor/'))).toBe(true);
    expect(keys).toContain('editor/actor/pg_loss');
    expect(summary.valFinal['val/writer/reward_mean']).toBeGreaterThanOrEqual(0);
    initial.dispose();
    base.dispose();
  }, 120_000);

  it('L2: a policy starts from its adapterPath (a PEFT directory), the other from a fresh adapter', async () => {
    const lora = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj'] };
    const l2 = (dir: string, steps: number, writer: Record<string, unknown>, more: Record<string, unknown> = {}) =>
      config({
        run: { dir, seed: 1, steps, backend: 'auto' },
        agents: { environment: 'writer-editor', roles },
        policies: [
          { name: 'writer', specialization: 'lora', lora, ...writer },
          { name: 'editor', specialization: 'lora', lora },
        ],
        ...more,
      });
    const first = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    await runAgents(l2(first, 2, {}));
    const start = join(first, 'policies', 'writer');
    // One step at a learning rate of 1e-30 moves nothing: the saved writer is its starting adapter.
    const second = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    const summary = await runAgents(l2(second, 1, { adapterPath: start }, { trainer: { learningRate: 1e-30 } }));
    const { model: base } = await loadModelDir(join(second, 'base'));
    const read = async (dir: string) => (await loadPeftAdapter(dir, base.config)).adapter;
    const [before, writer, editor] = [
      await read(start),
      await read(summary.policies[0].savedTo as string),
      await read(summary.policies[1].savedTo as string),
    ];
    const after = writer.getWeights();
    for (const [name, w] of before.getWeights()) {
      const got = after.get(name)?.data ?? new Float32Array(0);
      expect(Math.max(...w.data.map((x, i) => Math.abs(x - (got[i] ?? Number.NaN)))), name).toBeLessThan(1e-12);
    }
    // The editor had no adapterPath: its B is still (about) PEFT's zero.
    const editorB = [...editor.getWeights()].filter(([name]) => name.includes('lora_B')).flatMap(([, w]) => [...w.data]);
    expect(Math.max(...editorB.map(Math.abs))).toBeLessThan(1e-20);
    await expect(runAgents(l2(second, 1, { adapterPath: start, lora: { ...lora, alpha: 4 } }))).rejects.toThrow(
      /policies\[0\]\.adapterPath: the adapter in .*writer has rank 4, alpha 8, targets q_proj, v_proj; the policy's lora has rank 4, alpha 4/,
    );
    for (const m of [base, before, writer, editor]) m.dispose();
  });

  it('L1 and L3: one shared full policy, or one full model per agent; each saved as a model directory', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    const shared = await runAgents(
      config({
        run: { dir, seed: 1, steps: 2, backend: 'auto' },
        agents: { environment: 'writer-editor', roles: roles.map((r) => ({ ...r, policy: 'both' })) },
        policies: [{ name: 'both', specialization: 'prompt' }],
      }),
    );
    expect(shared.policies).toHaveLength(1);
    expect(shared.policies[0]).toMatchObject({ name: 'both', steps: 2, agents: ['writer', 'editor'], trainableParameters: 133056 });
    const { model } = await loadModelDir(join(dir, 'policies', 'both'));
    expect(model.config.nLayers).toBe(2);
    model.dispose();
    const full = await runAgents(
      config({
        agents: { environment: 'writer-editor', roles },
        policies: roles.map((r) => ({ name: r.policy, specialization: 'full' })),
        run: { dir: null, seed: 1, steps: 2, backend: 'auto' },
      }),
    );
    expect(full.policies.map((p) => p.trainableParameters)).toEqual([133056, 133056]);
    expect(full.policies.every((p) => p.savedTo === null)).toBe(true);
  }, 120_000);

  it('the two-agent recipe learns from scratch: both agents gain held-out reward in 25 steps (L3)', async () => {
    const summary = await runAgents(
      config({
        run: { dir: null, seed: 1, steps: 25, backend: 'auto' },
        sync: { batchSize: 16 },
        rollout: { groupSize: 8 },
        data: { task: { validationSize: 100 } },
        trainer: { learningRate: 2e-3 },
        agents: { environment: 'writer-editor', roles },
        policies: roles.map((r) => ({ name: r.policy, specialization: 'full' })),
      }),
    );
    const initial = summary.valInitial as Record<string, number>;
    for (const agent of ['writer', 'editor']) {
      expect(summary.valFinal[`val/${agent}/reward_mean`], agent).toBeGreaterThan(initial[`val/${agent}/reward_mean`] + 0.15);
    }
  }, 180_000);

  it('checkpoints every policy (adapter and optimizer) and resumes losslessly: 2 + 2 steps equal 4 straight', async () => {
    const lora = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj'] };
    const level = {
      agents: { environment: 'writer-editor', roles },
      policies: [
        { name: 'writer', specialization: 'lora', lora },
        { name: 'editor', specialization: 'full' },
      ],
      checkpoint: { every: 1, keepLast: 2, onStop: false },
      resume: { mode: 'auto' },
      validation: { beforeTrain: false },
    };
    const straightDir = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    await runAgents(config({ ...level, run: { dir: straightDir, seed: 1, steps: 4, backend: 'auto' } }));
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-agents-'));
    const first = await runAgents(config({ ...level, run: { dir, seed: 1, steps: 2, backend: 'auto' } }));
    expect(first.policies.map((p) => p.steps)).toEqual([2, 2]);
    const lines: string[] = [];
    const taken: string[] = [];
    const resumed = await runAgents(config({ ...level, run: { dir, seed: 1, steps: 4, backend: 'auto' } }), {
      log: (line) => lines.push(line),
      onStep: (step) => taken.push(`${step.modelTag}:${step.step}`),
    });
    expect(taken.sort()).toEqual(['editor:2', 'editor:3', 'writer:2', 'writer:3']);
    expect(lines.some((line) => line.startsWith(`resuming from ${join(dir, 'global_step_2')}`))).toBe(true);
    expect(resumed.policies.map((p) => p.steps)).toEqual([4, 4]);
    // keepLast 2: the newest two checkpoints remain.
    expect((await readdir(dir)).filter((n) => n.startsWith('global_step_')).sort()).toEqual(['global_step_3', 'global_step_4']);
    // Each step of each policy appears once in metrics.jsonl.
    const steps = (await readFile(join(dir, 'metrics.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    expect(
      steps
        .map(
          (l) =>
            `${l.step}:${
              Object.keys(l)
                .find((k) => k.endsWith('/actor/pg_loss'))
                ?.split('/')[0]
            }`,
        )
        .sort(),
    ).toEqual(['0:editor', '0:writer', '1:editor', '1:writer', '2:editor', '2:writer', '3:editor', '3:writer']);
    // ... and in trained.jsonl, with the trajectories it trained on, as the straight run's.
    type Trained = { policy: string; step: number; trajectoryIds: string[] };
    const trained = async (d: string): Promise<string[]> =>
      (await readFile(join(d, 'trained.jsonl'), 'utf8'))
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Trained)
        .map((l) => `${l.step}:${l.policy}:${l.trajectoryIds.length}:${l.trajectoryIds[0]}`)
        .sort();
    expect((await trained(dir)).map((l) => l.split(':').slice(0, 2).join(':'))).toEqual([
      '0:editor',
      '0:writer',
      '1:editor',
      '1:writer',
      '2:editor',
      '2:writer',
      '3:editor',
      '3:writer',
    ]);
    expect(await trained(dir)).toEqual(await trained(straightDir));
    // The resumed run sampled and scored what the straight one did, step for step ...
    const straightSteps = (await readFile(join(straightDir, 'metrics.jsonl'), 'utf8'))
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>);
    const rewards = (ls: Record<string, number>[]): string[] =>
      ls
        .flatMap((l) =>
          ['writer', 'editor']
            .filter((t) => `${t}/rollout/reward_mean` in l)
            .map((t) => `${l.step}:${t}:${l[`${t}/rollout/reward_mean`].toFixed(9)}`),
        )
        .sort();
    expect(rewards(steps)).toEqual(rewards(straightSteps));
    // ... and ends where it does, weight for weight (to float32 noise: the engine's batches differ in size).
    const close = (a: Float32Array | undefined, b: Float32Array, name: string): void => {
      expect(a?.length, name).toBe(b.length);
      let worst = 0;
      for (let i = 0; i < b.length; i++) worst = Math.max(worst, Math.abs((a as Float32Array)[i] - b[i]));
      expect(worst, name).toBeLessThan(1e-5);
    };
    const task = writerEditorTask({ seed: 1, validationSize: 20 });
    const vocab = new CharTokenizer(task.characters).vocabSize;
    const { model: straightEditor } = await loadModelDir(join(straightDir, 'policies', 'editor'));
    const { model: resumedEditor } = await loadModelDir(join(dir, 'policies', 'editor'));
    expect(straightEditor.config.vocabSize).toBe(vocab);
    for (const [name, w] of straightEditor.getWeights())
      close(resumedEditor.getWeights().get(name)?.data as Float32Array, w.data as Float32Array, name);
    const { adapter: straightWriter } = await loadPeftAdapter(join(straightDir, 'policies', 'writer'), straightEditor.config);
    const { adapter: resumedWriter } = await loadPeftAdapter(join(dir, 'policies', 'writer'), straightEditor.config);
    for (const [name, w] of straightWriter.getWeights())
      close(resumedWriter.getWeights().get(name)?.data as Float32Array, w.data as Float32Array, name);
    // Running the finished run again trains nothing.
    const again: string[] = [];
    await runAgents(config({ ...level, run: { dir, seed: 1, steps: 4, backend: 'auto' } }), { log: (line) => again.push(line) });
    expect(again).toContain('run already finished: 4 of 4 steps trained');
    for (const m of [straightEditor, resumedEditor]) m.dispose();
    for (const a of [straightWriter, resumedWriter]) a.dispose();
  }, 180_000);

  it('KL terms against the initial policy (the shared base) for LoRA and full policies alike', async () => {
    const steps: Record<string, number>[] = [];
    await runAgents(
      config({
        agents: { environment: 'writer-editor', roles },
        policies: [
          { name: 'writer', specialization: 'lora', lora: { rank: 2, alpha: 4, targetModules: ['q_proj'] } },
          { name: 'editor', specialization: 'full' },
        ],
        trainer: { klLoss: { coef: 0.1 } },
        algorithm: { klInReward: { coef: 0.05 } },
        run: { dir: null, seed: 1, steps: 2, backend: 'auto' },
        validation: { beforeTrain: false },
      }),
      { onStep: (step) => steps.push(step.metrics) },
    );
    for (const tag of ['writer', 'editor']) {
      const first = steps.find((m) => `${tag}/actor/kl_loss` in m) as Record<string, number>;
      // Step 0 trains on samples of the initial policy: both KL terms start at 0 (to float32 rounding).
      expect(Math.abs(first[`${tag}/actor/kl_loss`]), tag).toBeLessThan(1e-5);
      expect(first[`${tag}/actor/kl_coef`]).toBeCloseTo(0.1, 6);
      expect(Math.abs(first[`${tag}/actor/reward_kl_penalty`]), tag).toBeLessThan(1e-5);
      // After one update the policy has moved off the base, so the (k1) KL of its samples is no longer 0. A rank-2
      // adapter moves little (|KL| ~ 1e-6): the low-variance estimator's loss, ~KL², can still round to 0.
      const second = steps.filter((m) => `${tag}/actor/kl_loss` in m)[1];
      expect(Math.abs(second[`${tag}/actor/reward_kl_penalty`]), tag).toBeGreaterThan(1e-7);
    }
  }, 120_000);

  it("a recipe's own environment module, on its own JSONL data (L1: one policy for both agents)", async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-agents-module-'));
    await writeFile(
      join(dir, 'env.mjs'),
      [
        "export const echo = { turnOrder: ['caller', 'echoer'], maxTurns: 2, reset: (task) => { let said = ''; return {",
        "  observe: (agent) => (agent === 'caller' ? task.prompt : `${task.prompt}${said}>`),",
        "  step: (agent, response) => { if (agent === 'caller') said = response;",
        "    return { rewards: { [agent]: response === task.answer ? 1 : 0 }, done: agent === 'echoer' }; } }; } };",
        'export const notAnEnvironment = 42;',
        '',
      ].join('\n'),
    );
    const lines = (words: string[]): string =>
      words.map((w, i) => JSON.stringify({ id: `${w}${i}`, prompt: `${w}=`, answer: [...w].reverse().join('') })).join('\n');
    await writeFile(join(dir, 'train.jsonl'), lines(['ab', 'ba', 'aab', 'bba', 'abb', 'bab']));
    await writeFile(join(dir, 'val.jsonl'), lines(['aa', 'bb', 'aba']));
    const recipe = (exportName: string): ReturnType<typeof loadConfig> =>
      config({
        data: { source: 'jsonl', trainFile: 'train.jsonl', validationFile: 'val.jsonl', alphabet: 'ab=>' },
        rollout: { groupSize: 2, maxTokens: 4 },
        sync: { batchSize: 2 },
        agents: {
          environment: 'module',
          module: { module: './env.mjs', export: exportName },
          roles: [
            { name: 'caller', policy: 'p' },
            { name: 'echoer', policy: 'p' },
          ],
        },
        policies: [{ name: 'p', specialization: 'prompt' }],
        run: { dir: null, seed: 1, steps: 2, backend: 'auto' },
      });
    const summary = await runAgents(recipe('echo'), { baseDir: dir });
    expect(summary.recipe).toBe('train');
    expect(summary.policies[0]).toMatchObject({ name: 'p', steps: 2, agents: ['caller', 'echoer'] });
    expect(summary.valFinal['val/episodes']).toBe(3);
    expect(summary.valFinal).toHaveProperty('val/echoer/reward_mean');
    await expect(runAgents(recipe('notAnEnvironment'), { baseDir: dir })).rejects.toThrow(
      /agents\.module\.export: not a MultiAgentEnvironment/,
    );
    await expect(runAgents(recipe('missing'), { baseDir: dir })).rejects.toThrow(/agents\.module\.export: .*has no export 'missing'/);
    expect(() => loadConfig({ env: {}, values: { agents: { environment: 'module', roles } } })).toThrow(
      /agents\.module\.module: required when agents\.environment is 'module'/,
    );
  }, 120_000);

  it('refuses a recipe without an environment, or a role prompt the tokenizer cannot encode, naming the key', async () => {
    await expect(runAgents(config({}))).rejects.toThrow(/agents\.environment/);
    const prompted = roles.map((r, i) => (i === 1 ? { ...r, prompt: 'check: ' } : r));
    await expect(
      runAgents(
        config({
          agents: { environment: 'writer-editor', roles: prompted },
          policies: roles.map((r) => ({ name: r.policy, specialization: 'full' })),
        }),
      ),
    ).rejects.toThrow(/agents\.roles\[1\]\.prompt: the tokenizer cannot encode it/);
  });
});
