import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { describeConfig, loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { loopSettings } from '../../pipelines/parts/settings.js';

/** The ConfigError a load raises (fails the test if it does not raise one). */
function rejection(load: () => unknown): ConfigError {
  try {
    load();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return error as ConfigError;
  }
  throw new Error('expected a ConfigError');
}

describe('loadConfig', () => {
  it('resolves defaults, a JSON recipe, --set overrides and the environment, in that order', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-config-'));
    const file = join(dir, 'recipe.json');
    await writeFile(file, JSON.stringify({ sync: { mode: 'batch-async', stalenessThreshold: 2 }, trainer: { learningRate: 0.002 } }));
    const config = loadConfig({
      file,
      set: ['trainer.learningRate=0.003', 'algorithm.std=population', 'store.groupTimeoutMs=null'],
      env: { RXRL_STEPS: '42' },
    });
    expect(config.sync).toMatchObject({ mode: 'batch-async', stalenessThreshold: 2 });
    expect(config.trainer.learningRate).toBe(0.003);
    expect(config.algorithm.std).toBe('population');
    expect(config.store.groupTimeoutMs).toBeNull();
    expect(config.run.steps).toBe(42);
    expect(config.model.dModel).toBe(64);
  });

  it('reads YAML recipes', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-config-'));
    const file = join(dir, 'recipe.yaml');
    await writeFile(file, 'sync:\n  mode: fully-async\n  capacity: 64\nrollout:\n  groupSize: 4\n');
    expect(loadConfig({ file, env: {} })).toMatchObject({ sync: { mode: 'fully-async', capacity: 64 }, rollout: { groupSize: 4 } });
  });

  it('rollout.ignoreEos: false by default; true from a recipe or --set; a non-boolean refused; into the loop settings', () => {
    expect(loadConfig({ env: {} }).rollout.ignoreEos).toBe(false);
    expect(loadConfig({ values: { rollout: { ignoreEos: true } }, env: {} }).rollout.ignoreEos).toBe(true);
    const set = loadConfig({ set: ['rollout.ignoreEos=true'], env: {} });
    expect(set.rollout.ignoreEos).toBe(true);
    expect(loopSettings(set).ignoreEos).toBe(true);
    expect(loopSettings(loadConfig({ env: {} })).ignoreEos).toBe(false);
    expect(rejection(() => loadConfig({ values: { rollout: { ignoreEos: 'yes' } }, env: {} })).message).toMatch(/rollout\.ignoreEos/);
    expect(rejection(() => loadConfig({ values: { rollout: { ignoreEos: true, agent: { command: 'a' } } }, env: {} })).message).toMatch(
      /rollout\.ignoreEos: not with rollout\.agent/,
    );
  });

  it('rejects a wrong type, naming the key', () => {
    const error = rejection(() => loadConfig({ values: { checkpoint: { onStop: 'sometimes' } }, env: {} }));
    expect(error.message).toMatch(/checkpoint\.onStop/);
    expect(rejection(() => loadConfig({ values: { trainer: { learningRate: 'fast' } }, env: {} })).message).toMatch(
      /trainer\.learningRate: must be a finite number > 0/,
    );
  });

  it('rejects an unknown key, naming it, in a recipe and in --set', () => {
    expect(rejection(() => loadConfig({ values: { trainer: { learnignRate: 1 } }, env: {} })).message).toBe(
      "config: unknown key 'trainer.learnignRate' (did you mean 'trainer.learningRate'?)",
    );
    expect(rejection(() => loadConfig({ set: ['sync.η=2'], env: {} })).message).toBe("config: unknown key 'sync.η'");
  });

  it('rejects a missing required value, naming the key', () => {
    const error = rejection(() =>
      loadConfig({ values: { data: { source: 'jsonl', alphabet: 'ab' }, rollout: { evaluator: { module: './e.js' } } }, env: {} }),
    );
    expect(error.message).toBe("invalid configuration:\ndata.trainFile: required when data.source is 'jsonl'");
    expect(rejection(() => loadConfig({ values: { resume: { mode: 'from_path' } }, env: {} })).message).toMatch(/resume\.path: required/);
  });

  it('checks sync.generationBatchSize: at least sync.batchSize, and larger only with the zero-variance filter', () => {
    const sync =
      (generationBatchSize: number, filterZeroVariance = false) =>
      () =>
        loadConfig({ values: { sync: { batchSize: 4, generationBatchSize }, algorithm: { filterZeroVariance } }, env: {} });
    expect(rejection(sync(2)).message).toMatch(/sync\.generationBatchSize: must be an integer >= sync\.batchSize \(4\), got 2/);
    expect(rejection(sync(8)).message).toMatch(
      /sync\.generationBatchSize: larger than sync\.batchSize needs algorithm\.filterZeroVariance/,
    );
    expect(sync(8, true)().sync.generationBatchSize).toBe(8);
    expect(sync(4)().sync.generationBatchSize).toBe(4);
    expect(loadConfig({ env: {} }).sync.generationBatchSize).toBeNull();
  });

  it("checks trainer.algorithm 'sft': one reference a task from a dataset, no reward penalty or zero-variance filter", () => {
    const sft = (values: Record<string, unknown>) => () =>
      loadConfig({ values: { trainer: { algorithm: 'sft' }, rollout: { groupSize: 1 }, ...values }, env: {} });
    expect(sft({})().sft).toEqual({ source: 'dataset', minReward: 1 });
    expect(rejection(sft({ rollout: { groupSize: 4 } })).message).toMatch(/rollout\.groupSize: must be 1 with sft\.source 'dataset'/);
    expect(sft({ rollout: { groupSize: 4 }, sft: { source: 'rollouts', minReward: 0.5 } })().sft.minReward).toBe(0.5);
    expect(rejection(sft({ algorithm: { filterZeroVariance: true } })).message).toMatch(/algorithm\.filterZeroVariance: must be false/);
    expect(rejection(sft({ algorithm: { klInReward: { coef: 0.1 } } })).message).toMatch(/algorithm\.klInReward\.coef: must be 0/);
    expect(rejection(sft({ rollout: { groupSize: 1, worker: { module: 'w.js' } } })).message).toMatch(/rollout\.agent, rollout\.worker/);
    expect(rejection(() => loadConfig({ values: { trainer: { algorithm: 'dpo' } }, env: {} })).message).toMatch(/trainer\.algorithm/);
  });

  it("checks trainer.algorithm 'distill': one teacher, a path or a server with its model", () => {
    const distill = (teacher: Record<string, unknown>) => () =>
      loadConfig({ values: { trainer: { algorithm: 'distill' }, distill: { teacher } }, env: {} });
    expect(distill({ path: 'teacher' })().distill.teacher.path).toBe('teacher');
    expect(rejection(distill({})).message).toMatch(/distill\.teacher: give a path or a baseUrl/);
    expect(rejection(distill({ path: 't', baseUrl: 'http://h/v1', model: 'm' })).message).toMatch(
      /distill\.teacher: give a path or a baseUrl/,
    );
    expect(rejection(distill({ baseUrl: 'http://h/v1' })).message).toMatch(/distill\.teacher\.model: required/);
    expect(distill({ baseUrl: 'http://h/v1', model: 'm' })().distill.rewardCoef).toBe(0);
  });

  it('checks rollout.agent: a command or a module, not both, not beside a custom worker; env is strings; it may stand for the evaluator', () => {
    expect(
      rejection(() => loadConfig({ values: { rollout: { agent: { command: 'python3 a.py', module: './a.js' } } }, env: {} })).message,
    ).toMatch(/rollout\.agent: give a command or a module, not both/);
    expect(
      rejection(() => loadConfig({ values: { rollout: { agent: { command: 'a' }, worker: { module: './w.js' } } }, env: {} })).message,
    ).toMatch(/rollout\.agent: an agent is the rollout worker/);
    expect(rejection(() => loadConfig({ values: { rollout: { agent: { command: 'a', env: { N: 1 } } } }, env: {} })).message).toMatch(
      /rollout\.agent\.env: must be an object of strings/,
    );
    const jsonl = { source: 'jsonl', trainFile: 't.jsonl', alphabet: 'ab' };
    expect(
      loadConfig({ values: { data: jsonl, rollout: { maxTokens: 4, agent: { command: 'python3 a.py', env: { K: 'v' } } } }, env: {} })
        .rollout.agent,
    ).toEqual({
      command: 'python3 a.py',
      cwd: null,
      env: { K: 'v' },
      inheritEnv: false,
      module: null,
      export: 'default',
    });
    expect(
      loadConfig({ values: { rollout: { agent: { command: 'a' } } }, set: ['rollout.agent.inheritEnv=true'], env: {} }).rollout.agent
        .inheritEnv,
    ).toBe(true);
    expect(rejection(() => loadConfig({ values: { rollout: { agent: { command: 'a', inheritEnv: 'yes' } } }, env: {} })).message).toMatch(
      /rollout\.agent\.inheritEnv: must be true or false/,
    );
    expect(rejection(() => loadConfig({ values: { data: jsonl, rollout: { maxTokens: 4 } }, env: {} })).message).toMatch(
      /rollout\.evaluator\.module: required/,
    );
    expect(loadConfig({ values: { data: { source: 'calculator', calculator: { operators: '+-' } } }, env: {} }).data.calculator).toEqual({
      operators: '+-',
      maxOperand: 20,
      validationSize: 64,
    });
  });

  it('rejects out-of-range numbers and bad enum values, naming the key', () => {
    expect(rejection(() => loadConfig({ values: { rollout: { topP: 1.5 } }, env: {} })).message).toMatch(
      /rollout\.topP: must be a number in \(0, 1\]/,
    );
    expect(rejection(() => loadConfig({ set: ['sync.batchSize=0'], env: {} })).message).toMatch(/sync\.batchSize: must be an integer >= 1/);
    expect(rejection(() => loadConfig({ env: { RXRL_MODE: 'eventually' } })).message).toMatch(/sync\.mode: must be one of/);
    expect(rejection(() => loadConfig({ values: { model: { dModel: 30, nHeads: 4 } }, env: {} })).message).toMatch(
      /model\.nHeads: must divide model\.dModel/,
    );
  });

  it('reads integers and numbers as decimal text only: empty, hex and spaced text are refused, naming the key', () => {
    expect(rejection(() => loadConfig({ set: ['run.steps='], env: {} })).message).toMatch(/run\.steps: must be an integer >= 0/);
    expect(rejection(() => loadConfig({ set: ['run.steps=0x10'], env: {} })).message).toMatch(/run\.steps: must be an integer >= 0/);
    expect(rejection(() => loadConfig({ env: { RXRL_STEPS: '0x10' } })).message).toMatch(/run\.steps: must be an integer >= 0/);
    expect(rejection(() => loadConfig({ env: { RXRL_SEED: '' } })).message).toMatch(/run\.seed: must be/);
    expect(rejection(() => loadConfig({ values: { sync: { batchSize: ' 4' } }, env: {} })).message).toMatch(/sync\.batchSize: must be/);
    expect(rejection(() => loadConfig({ set: ['trainer.learningRate=0x1'], env: {} })).message).toMatch(/trainer\.learningRate: must be/);
    expect(rejection(() => loadConfig({ set: ['store.groupTimeoutMs='], env: {} })).message).toMatch(/store\.groupTimeoutMs: must be/);
    // Decimal text still reads as its number, from the environment, --set and a recipe's quoted values.
    const config = loadConfig({
      set: ['run.steps=16', 'trainer.learningRate=1e-3'],
      values: { sync: { batchSize: '4' } },
      env: { RXRL_SEED: '7' },
    });
    expect([config.run.steps, config.trainer.learningRate, config.sync.batchSize, config.run.seed]).toEqual([16, 0.001, 4, 7]);
  });

  it('takes checkpoint.maxShardSize as a size or a number of bytes, as documented', () => {
    expect(loadConfig({ values: { checkpoint: { maxShardSize: 1_000_000 } }, env: {} }).checkpoint.maxShardSize).toBe(1_000_000);
    expect(loadConfig({ set: ['checkpoint.maxShardSize=2000000'], env: {} }).checkpoint.maxShardSize).toBe(2_000_000);
    expect(loadConfig({ set: ['checkpoint.maxShardSize=500MB'], env: {} }).checkpoint.maxShardSize).toBe('500MB');
    expect(rejection(() => loadConfig({ values: { checkpoint: { maxShardSize: -5 } }, env: {} })).message).toMatch(
      /checkpoint\.maxShardSize/,
    );
    expect(rejection(() => loadConfig({ set: ['checkpoint.maxShardSize=lots'], env: {} })).message).toMatch(/checkpoint\.maxShardSize/);
  });

  it('names an unreadable recipe and redacts secrets when printing', async () => {
    expect(rejection(() => loadConfig({ file: '/nonexistent/recipe.json', env: {} })).message).toMatch(/cannot read recipe/);
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-config-'));
    const file = join(dir, 'list.json');
    await writeFile(file, '[1, 2]');
    expect(rejection(() => loadConfig({ file, env: {} })).message).toMatch(/mapping/);
    const printed = describeConfig(loadConfig({ env: { OPENAI_API_KEY: 'sk-secret' } }));
    expect(printed).not.toContain('sk-secret');
    expect(printed).toContain('[redacted]');
  });
});

describe('loadConfig: agents and policies (multi-agent recipes)', () => {
  const roles = [
    { name: 'writer', policy: 'writer' },
    { name: 'editor', policy: 'editor' },
  ];
  const load = (agents: Record<string, unknown>, policies: unknown): unknown =>
    loadConfig({ env: {}, values: { agents: { environment: 'writer-editor', ...agents }, policies } });

  it('reads the bundled L2 recipe: two LoRA policies with their adapters', () => {
    const config = loadConfig({ env: {}, file: join(import.meta.dirname, '..', '..', 'recipes', 'writer-editor-lora.yaml') });
    expect(config.agents).toMatchObject({ environment: 'writer-editor', granularity: 'turn', roles });
    expect(config.policies.map((p) => [p.name, p.specialization, p.lora?.rank])).toEqual([
      ['writer', 'lora', 8],
      ['editor', 'lora', 8],
    ]);
  });

  it('names the key: an agent mapped to an unknown policy, a policy nobody uses, a duplicate', () => {
    const unknown = rejection(() => load({ roles }, [{ name: 'writer', specialization: 'full' }]));
    expect(unknown.message).toMatch(/agents\.roles\[1\]\.policy: agent 'editor' maps to unknown policy 'editor'; policies: writer/);
    const unused = rejection(() =>
      load(
        { roles },
        ['writer', 'editor', 'judge'].map((name) => ({ name, specialization: 'full' })),
      ),
    );
    expect(unused.message).toMatch(/policies\[2\]: no agent samples from policy 'judge'/);
    const twice = rejection(() =>
      load(
        { roles },
        ['writer', 'editor', 'writer'].map((name) => ({ name, specialization: 'full' })),
      ),
    );
    expect(twice.message).toMatch(/policies\[2\]\.name: policy 'writer' is listed twice/);
  });

  it('names the key: a LoRA target the model lacks, a bad rank, lora on a full policy, a bad specialization', () => {
    const lacks = rejection(() =>
      load({ roles }, [
        { name: 'writer', specialization: 'lora', lora: { rank: 4, alpha: 8, targetModules: ['q_proj', 'c_attn'] } },
        { name: 'editor', specialization: 'lora' },
      ]),
    );
    expect(lacks.message).toMatch(/policies\[0\]\.lora\.targetModules\[1\]: must be one of q_proj, k_proj/);
    const rank = rejection(() =>
      load({ roles }, [
        { name: 'writer', specialization: 'lora', lora: { rank: 0 } },
        { name: 'editor', specialization: 'full' },
      ]),
    );
    expect(rank.message).toMatch(/policies\[0\]\.lora\.rank: must be a positive integer/);
    const misplaced = rejection(() =>
      load({ roles }, [
        { name: 'writer', specialization: 'full', lora: { rank: 2 } },
        { name: 'editor', specialization: 'full' },
      ]),
    );
    expect(misplaced.message).toMatch(/policies\[0\]\.lora: only for specialization 'lora'/);
    const level = rejection(() =>
      load({ roles }, [
        { name: 'writer', specialization: 'adapter' },
        { name: 'editor', specialization: 'full' },
      ]),
    );
    expect(level.message).toMatch(/policies: \[0\]\.specialization must be one of prompt, lora, full/);
    const field = rejection(() => load({ roles: [{ name: 'writer', policy: 'w', model: 'x' }] }, []));
    expect(field.message).toMatch(/agents\.roles: \[0\]\.model is not a field; fields: name, policy, prompt/);
  });

  it('agents need an environment, and an environment needs agents', () => {
    expect(rejection(() => loadConfig({ env: {}, values: { agents: { roles } } })).message).toMatch(
      /agents\.roles: needs agents\.environment/,
    );
    expect(rejection(() => loadConfig({ env: {}, values: { agents: { environment: 'writer-editor' } } })).message).toMatch(
      /agents\.roles: required when agents\.environment is 'writer-editor'/,
    );
  });
});
