/**
 * rxrl's Tinker service driven by the official `tinker` SDK (PyPI, pinned in scripts/requirements-tinker.txt and
 * installed by npm test into .cache/python): a LoRA training client on the tiny Qwen3 fixture, cross-entropy steps that lower the loss
 * on a fixed batch, log-probs equal to rxrl's own, the other two losses, and refusals.
 */
import { execFile, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import { tinkerService, type TinkerService } from '../../lib/tinker/service.js';
import { lacks } from '../helpers/testSetup.js';

const run = promisify(execFile);
const python = process.env.RXRL_TINKER_PYTHON ?? 'python3';
const fixture = fileURLToPath(new URL('../fixtures/hf/tiny-qwen3', import.meta.url));
let model: PolicyModel;
let service: TinkerService;

/** Runs a Python snippet with the SDK against the service; its last stdout line is JSON. */
async function sdk<T>(body: string): Promise<T> {
  const script = [
    'import json, sys, math',
    'import tinker',
    'from tinker import types',
    'sc = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-local")',
    body,
  ].join('\n');
  const { stdout } = await run(python, ['-c', script, service.url], {
    env: { ...process.env, TINKER_TELEMETRY: '0', HF_HUB_OFFLINE: '1' },
    timeout: 120_000,
  });
  return JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as T;
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  model = (await loadModelDir(fixture)).model;
  service = await tinkerService({
    model,
    tokenizer: await loadTokenizer(fixture),
    baseModel: 'tiny-qwen3',
    tokenizerId: fixture,
    apiKey: 'tml-local',
    seed: 1,
  });
});

afterAll(async () => {
  await service?.close();
  model?.dispose();
});

// Skipped only where npm test's setup could not make its Python environment (no root for python3-venv).
describe.skipIf(lacks('python'))("rxrl's Tinker service, through the official tinker SDK", () => {
  it('the SDK imports (npm test installs tinker==0.38.0 into .cache/python)', async () => {
    await expect(run(python, ['-c', 'import tinker'])).resolves.toBeDefined();
  });

  it("trains a LoRA client with cross_entropy + optim_step: the loss falls on a fixed batch; first log-probs are the base model's", async () => {
    const tokens = [5, 17, 42, 8, 99, 3, 250, 61, 7, 12];
    const out = await sdk<{ losses: number[]; first: number[]; info: { lora_rank: number } }>(
      [
        'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=4)',
        `tokens = ${JSON.stringify(tokens)}`,
        'datum = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})',
        'losses, first = [], None',
        'for step in range(6):',
        '    fb = tc.forward_backward([datum], "cross_entropy")',
        '    opt = tc.optim_step(types.AdamParams(learning_rate=0.02))',
        '    r = fb.result(); opt.result()',
        '    losses.append(r.metrics["loss:sum"])',
        '    if first is None: first = r.loss_fn_outputs[0]["logprobs"].tolist()',
        'info = tc.get_info()',
        'print(json.dumps({"losses": losses, "first": first, "info": {"lora_rank": info.lora_rank}}))',
      ].join('\n'),
    );
    expect(out.info.lora_rank).toBe(4);
    expect(out.losses).toHaveLength(6);
    expect(out.losses[5]).toBeLessThan(out.losses[0] * 0.8);
    // A fresh adapter is zero (B = 0): the first step scores with the base model, as rxrl's own log-probs do.
    const ours = tf.tidy(() => {
      const ids = tf.tensor2d([tokens], [1, tokens.length], 'int32');
      const mask = tf.ones([1, tokens.length]) as tf.Tensor2D;
      const positions = tf.tensor2d([tokens.map((_, i) => i)], [1, tokens.length], 'int32');
      return Array.from(model.tokenLogprobs(ids, mask, positions).logprobs.dataSync());
    });
    expect(out.first).toHaveLength(tokens.length - 1);
    out.first.forEach((lp, i) => expect(lp).toBeCloseTo(ours[i], 4));
    expect(out.losses[0]).toBeCloseTo(-ours.reduce((a, b) => a + b, 0), 3);
  }, 180_000);

  it('computes importance_sampling and ppo from the sampler log-probs and advantages', async () => {
    const out = await sdk<{ is: number[]; ppo: number[] }>(
      [
        'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
        'tokens = [5, 17, 42, 8, 99, 3]',
        'base = tc.forward([types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 5})], "cross_entropy").result()',
        'lp = base.loss_fn_outputs[0]["logprobs"].tolist()',
        'rl = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": lp, "advantages": [1.0, -1.0, 0.5, 0.0, 2.0]})',
        'a = tc.forward_backward([rl], "importance_sampling").result().metrics["loss:sum"]',
        'b = tc.forward_backward([rl], "ppo").result().metrics["loss:sum"]',
        'print(json.dumps({"is": [a], "ppo": [b]}))',
      ].join('\n'),
    );
    // On-policy (sampler log-probs = the model's): every ratio is 1, so both losses are −Σ advantages.
    expect(out.is[0]).toBeCloseTo(-2.5, 4);
    expect(out.ppo[0]).toBeCloseTo(-2.5, 4);
  }, 180_000);

  it("samples with log-probs equal to rxrl's own for the same weights and seed; save_state / load_state round-trip; a client from the state", async () => {
    const prompt = [5, 17, 42, 8];
    const out = await sdk<{
      base: { tokens: number[]; logprobs: number[]; stop: string }[];
      prompt: (number | null)[];
      trained: number[];
      restored: number[];
      before: number[];
      n: number;
      from_state: number[];
      rank2: number;
    }>(
      [
        `prompt = types.ModelInput.from_ints(${JSON.stringify(prompt)})`,
        'params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=7)',
        'base = sc.create_sampling_client(base_model="tiny-qwen3")',
        'r = base.sample(prompt, num_samples=1, sampling_params=params).result()',
        'two = base.sample(prompt, num_samples=2, sampling_params=params).result()',
        'lp = base.compute_logprobs(prompt).result()',
        'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
        'tokens = [5, 17, 42, 8, 99, 3]',
        'd = types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 5})',
        'before = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()',
        'tc.forward_backward([d], "cross_entropy").result(); tc.optim_step(types.AdamParams(learning_rate=0.05)).result()',
        'saved = tc.save_state("ckpt-1").result().path',
        'trained = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()',
        'for _ in range(3):',
        '    tc.forward_backward([d], "cross_entropy").result(); tc.optim_step(types.AdamParams(learning_rate=0.05)).result()',
        'tc.load_state(saved).result()',
        'restored = tc.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()',
        'tc2 = sc.create_training_client_from_state_with_optimizer(saved).result()',
        'from_state = tc2.forward([d], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()',
        'rank2 = tc2.get_info().lora_rank',
        'sampler = tc.save_weights_and_get_sampling_client()',
        'ts = sampler.sample(prompt, num_samples=1, sampling_params=params).result()',
        'print(json.dumps({"base": [{"tokens": list(s.tokens), "logprobs": list(s.logprobs), "stop": s.stop_reason} for s in r.sequences], "prompt": [None if x is None else x for x in lp], "trained": trained, "restored": restored, "before": before, "n": len(two.sequences), "saved": saved, "from_state": from_state, "rank2": rank2}))',
      ].join('\n'),
    );
    expect(out.n).toBe(2);
    // rxrl's own sampling of the base model with the same seed gives the same tokens and log-probs.
    const [ours] = await model.generate([{ promptTokens: prompt, maxTokens: 6, temperature: 1, seed: 7 }], {
      stopIds: (await loadTokenizer(fixture)).stopIds,
    });
    expect(out.base[0].tokens).toEqual(ours.tokens);
    out.base[0].logprobs.forEach((lp, i) => expect(lp).toBeCloseTo(ours.logprobs[i], 4));
    expect(out.base[0].stop).toBe(ours.finishReason === 'stop' ? 'stop' : 'length');
    // compute_logprobs: None for the first prompt token, then log p(token | prefix).
    expect(out.prompt[0]).toBeNull();
    const scored = tf.tidy(() =>
      Array.from(
        model
          .tokenLogprobs(
            tf.tensor2d([prompt], [1, 4], 'int32'),
            tf.ones([1, 4]) as tf.Tensor2D,
            tf.tensor2d([[0, 1, 2, 3]], [1, 4], 'int32'),
          )
          .logprobs.dataSync(),
      ),
    );
    out.prompt.slice(1).forEach((lp, i) => expect(lp).toBeCloseTo(scored[i], 4));
    // Training moved the log-probs; loading the saved state brings back exactly the saved adapter.
    expect(out.trained).not.toEqual(out.before);
    out.restored.forEach((lp, i) => expect(lp).toBeCloseTo(out.trained[i], 5));
    // A new training client made from the saved state (create_training_client_from_state_with_optimizer) has it too.
    expect(out.rank2).toBe(2);
    out.from_state.forEach((lp, i) => expect(lp).toBeCloseTo(out.trained[i], 5));
  }, 180_000);

  it('refuses what it does not do, with errors the SDK raises: another base model, an unknown loss, a wrong key', async () => {
    const out = await sdk<{ base: string; loss: string }>(
      [
        'res = {}',
        'try:',
        '    sc.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()',
        '    res["base"] = "accepted"',
        'except Exception as e:',
        '    res["base"] = type(e).__name__ + ": " + str(e)',
        'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
        'd = types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0]})',
        'try:',
        '    tc.forward_backward([d], "cispo").result()',
        '    res["loss"] = "accepted"',
        'except Exception as e:',
        '    res["loss"] = type(e).__name__ + ": " + str(e)',
        'print(json.dumps(res))',
      ].join('\n'),
    );
    expect(out.base).toMatch(/tiny-qwen3/);
    expect(out.loss).toMatch(/unknown loss_fn 'cispo'/);
    const wrong = await fetch(`${service.url}/api/v1/create_session`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'tml-other' },
      body: '{}',
    });
    expect(wrong.status).toBe(401);
    const full = await fetch(`${service.url}/api/v1/create_model`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': 'tml-local' },
      body: JSON.stringify({ session_id: 'nope', base_model: 'tiny-qwen3' }),
    });
    expect(full.status).toBe(404);
  }, 180_000);

  it('runs as `rxrl tinker --model DIR` (built CLI), serves the SDK, and stops on SIGTERM', async () => {
    const cli = fileURLToPath(new URL('../../dist/cli/main.js', import.meta.url));
    const child = spawn(process.execPath, [cli, 'tinker', '--model', fixture, '--port', '0', '--backend', 'cpu', '--api-key', 'tml-cli'], {
      stdio: ['ignore', 'pipe', 'ignore'],
    });
    try {
      const lines = createInterface({ input: child.stdout });
      const [first] = (await once(lines, 'line')) as [string];
      const listening = JSON.parse(first) as { event: string; url: string; base_model: string };
      expect(listening).toMatchObject({ event: 'listening', base_model: 'tiny-qwen3' });
      const script = [
        'import json, sys, tinker',
        'sc = tinker.ServiceClient(base_url=sys.argv[1], api_key="tml-cli")',
        'caps = sc.get_server_capabilities()',
        'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
        'd = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 1.0, 1.0]})',
        'print(json.dumps({"models": [m.model_name for m in caps.supported_models], "loss": tc.forward([d], "cross_entropy").result().metrics["loss:sum"]}))',
      ].join('\n');
      const { stdout } = await run(python, ['-c', script, listening.url], {
        env: { ...process.env, TINKER_TELEMETRY: '0' },
        timeout: 120_000,
      });
      const out = JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as { models: string[]; loss: number };
      expect(out.models).toEqual(['tiny-qwen3']);
      expect(out.loss).toBeGreaterThan(0);
      child.kill('SIGTERM');
      const [code] = (await once(child, 'exit')) as [number];
      expect(code).toBe(0);
    } finally {
      child.kill('SIGKILL');
    }
  }, 180_000);
});
