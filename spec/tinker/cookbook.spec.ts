/**
 * The Tinker cookbook's RL loop (`tinker_cookbook.recipes.math_rl.train`, the arithmetic environment) runs
 * unmodified against rxrl's Tinker service on the tiny Qwen3 fixture, offline: the fixture directory is both the
 * base model's name and its tokenizer, and the `qwen3` renderer formats the chats.
 *
 * It needs the cookbook (scripts/requirements-cookbook.txt), which `npm test` installs into
 * `.cache/cookbook-venv` where torch is importable (RXRL_COOKBOOK_PYTHON names another interpreter). Without it the
 * spec says so and runs the same loop's shape with the bare SDK instead (sample a group, reward it, an
 * `importance_sampling` step on centred rewards, a new sampler).
 */
import { execFile, spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import { tinkerService, type TinkerService } from '../../lib/tinker/service.js';
import { lacks } from '../helpers/testSetup.js';

const run = promisify(execFile);
const root = fileURLToPath(new URL('../..', import.meta.url));
const fixture = fileURLToPath(new URL('../fixtures/hf/tiny-qwen3', import.meta.url));
const cookbookPython = process.env.RXRL_COOKBOOK_PYTHON ?? join(root, '.cache', 'cookbook-venv', 'bin', 'python');
const hasCookbook =
  existsSync(cookbookPython) &&
  spawnSync(cookbookPython, ['-c', 'import tinker_cookbook.recipes.math_rl.train'], {
    stdio: 'ignore',
    env: { ...process.env, HF_HUB_OFFLINE: '1' },
  }).status === 0;
const env = { ...process.env, TINKER_API_KEY: 'tml-local', TINKER_TELEMETRY: '0', HF_HUB_OFFLINE: '1', TRANSFORMERS_OFFLINE: '1' };
let model: PolicyModel;
let service: TinkerService;

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  model = (await loadModelDir(fixture)).model;
  service = await tinkerService({
    model,
    tokenizer: await loadTokenizer(fixture),
    baseModel: fixture,
    tokenizerId: fixture,
    apiKey: 'tml-local',
    seed: 1,
  });
});

afterAll(async () => {
  await service?.close();
  model?.dispose();
});

describe.skipIf(lacks('python'))("an RL loop of the Tinker cookbook against rxrl's service", () => {
  it(
    hasCookbook
      ? 'runs the cookbook math_rl loop (arithmetic) for 3 steps, offline'
      : 'runs the SDK RL loop (tinker-cookbook is not installed here)',
    async () => {
      if (hasCookbook) {
        const logPath = await mkdtemp(join(tmpdir(), 'rxrl-cookbook-'));
        const args = [
          '-m',
          'tinker_cookbook.recipes.math_rl.train',
          `model_name=${fixture}`,
          'renderer_name=qwen3',
          'env=arithmetic',
          'groups_per_batch=4',
          'group_size=4',
          'max_tokens=5',
          'max_steps=3',
          'eval_every=0',
          'save_every=0',
          'lora_rank=4',
          `log_path=${logPath}`,
          'behavior_if_log_dir_exists=delete',
        ];
        const { stdout, stderr } = await run(cookbookPython, args, {
          env: { ...env, TINKER_BASE_URL: service.url },
          timeout: 240_000,
          maxBuffer: 64 * 1024 * 1024,
        });
        expect(`${stdout}${stderr}`).toMatch(/Training completed successfully/);
        const steps = readFileSync(join(logPath, 'metrics.jsonl'), 'utf8')
          .trim()
          .split('\n')
          .map((line) => JSON.parse(line) as Record<string, number>);
        expect(steps.map((s) => s.step)).toEqual([0, 1, 2]);
        // Every step sampled 4 groups of 4 episodes through the service and trained on them.
        for (const s of steps) expect(s['env/all/total_episodes']).toBe(16);
        const saved = readFileSync(join(logPath, 'checkpoints.jsonl'), 'utf8');
        expect(saved).toMatch(/tinker:\/\/[^"]+\/weights\/final/);
        return;
      }
      process.stderr.write(
        'tinker-cookbook is not installed (scripts/requirements-cookbook.txt; npm test installs it where torch is importable): running the SDK RL loop instead\n',
      );
      const script = [
        'import json, sys',
        'import tinker',
        'from tinker import types',
        'sc = tinker.ServiceClient(base_url=sys.argv[1])',
        `tc = sc.create_lora_training_client(base_model=${JSON.stringify(fixture)}, rank=4).result()`,
        'sampler = tc.save_weights_and_get_sampling_client()',
        'prompt = [5, 17, 42, 8]',
        'losses = []',
        'for step in range(3):',
        '    r = sampler.sample(types.ModelInput.from_ints(prompt), num_samples=4, sampling_params=types.SamplingParams(max_tokens=5, seed=step)).result()',
        '    rewards = [float(s.tokens[0] % 2) for s in r.sequences]',
        '    mean = sum(rewards) / len(rewards)',
        '    data = []',
        '    for s, rew in zip(r.sequences, rewards):',
        '        toks = prompt + list(s.tokens)',
        '        n = len(toks) - 1',
        '        lp = [0.0] * (len(prompt) - 1) + list(s.logprobs)',
        '        adv = [0.0] * (len(prompt) - 1) + [rew - mean] * len(s.tokens)',
        '        data.append(types.Datum(model_input=types.ModelInput.from_ints(toks[:-1]), loss_fn_inputs={"target_tokens": toks[1:], "logprobs": lp, "advantages": adv}))',
        '    out = tc.forward_backward(data, "importance_sampling").result()',
        '    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()',
        '    sampler = tc.save_weights_and_get_sampling_client()',
        '    losses.append(out.metrics["loss:sum"])',
        'print(json.dumps({"steps": len(losses)}))',
      ].join('\n');
      const { stdout } = await run('python3', ['-c', script, service.url], { env, timeout: 120_000 });
      expect(JSON.parse(stdout.trim().split('\n').at(-1) ?? '')).toEqual({ steps: 3 });
    },
    300_000,
  );
});
