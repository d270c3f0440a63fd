/**
 * rxrl's Tinker service under hostile or careless clients (issue 31): raw HTTP and protobuf for requests the SDK
 * would never send, the official SDK where it is the natural client. Each block is one row of the audit.
 */
import { execFile } from 'node:child_process';
import { copyFile, mkdtemp, readdir, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import type { Tokenizer } from '../../lib/model/types.js';
import { ConfigError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { LORA_TARGETS, LoraAdapter } from '../../lib/model/lora.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import type { PolicyModel } from '../../lib/model/transformer.js';
import { decodeSampleResponse, encodeForwardBackwardRequest, type WireDatum } from '../../lib/tinker/proto.js';
import { runTinkerCommand } from '../../lib/tinker/command.js';
import { tinkerService, type TinkerService, type TinkerServiceOptions } from '../../lib/tinker/service.js';
import { lacks } from '../helpers/testSetup.js';
import { sField, sparseBomb } from '../../bench/_protobuf.js';

const run = promisify(execFile);
const python = process.env.RXRL_TINKER_PYTHON ?? 'python3';
const fixture = fileURLToPath(new URL('../fixtures/hf/tiny-qwen3', import.meta.url));
/** The fixture's context (`max_position_embeddings`) and vocabulary. */
const CONTEXT = 128;
const KEY = 'tml-local';
let model: PolicyModel;
let tokenizer: Tokenizer;
const services: TinkerService[] = [];

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  model = (await loadModelDir(fixture)).model;
  tokenizer = await loadTokenizer(fixture);
});

afterAll(async () => {
  for (const service of services) await service.close();
  model?.dispose();
});

/** A service over the fixture, closed after the file. */
async function start(options: Partial<TinkerServiceOptions> = {}): Promise<TinkerService> {
  const service = await tinkerService({
    model,
    tokenizer,
    baseModel: 'tiny-qwen3',
    tokenizerId: fixture,
    apiKey: KEY,
    seed: 1,
    ...options,
  });
  services.push(service);
  return service;
}

interface Answer {
  readonly status: number;
  readonly json: Record<string, unknown>;
  readonly bytes: Uint8Array;
  readonly type: string;
}

/** POSTs JSON (or protobuf bytes) with the key; the answer's status and body. */
async function post(service: TinkerService, path: string, body: unknown): Promise<Answer> {
  const binary = body instanceof Uint8Array;
  const response = await fetch(`${service.url}${path}`, {
    method: 'POST',
    headers: { 'content-type': binary ? 'application/x-protobuf' : 'application/json', 'x-api-key': KEY },
    body: binary ? body : JSON.stringify(body),
  });
  const bytes = new Uint8Array(await response.arrayBuffer());
  const type = response.headers.get('content-type') ?? '';
  const json = type.includes('json') ? (JSON.parse(Buffer.from(bytes).toString('utf8')) as Record<string, unknown>) : {};
  return { status: response.status, json, bytes, type };
}

/** Polls a future until it settles. */
async function result(service: TinkerService, future: Answer): Promise<Answer> {
  expect(future.status).toBe(200);
  for (;;) {
    const answer = await post(service, '/api/v1/retrieve_future', { request_id: future.json.request_id });
    if (answer.json.type !== 'try_again') return answer;
  }
}

async function session(service: TinkerService): Promise<string> {
  return (await post(service, '/api/v1/create_session', {})).json.session_id as string;
}

/** A LoRA training client of rank 2 in `sessionId`; its model id. */
async function trainingClient(service: TinkerService, sessionId: string, seq = 0): Promise<string> {
  const created = await result(
    service,
    await post(service, '/api/v1/create_model', {
      session_id: sessionId,
      model_seq_id: seq,
      base_model: 'tiny-qwen3',
      lora_config: { rank: 2 },
    }),
  );
  return created.json.model_id as string;
}

/** A cross_entropy datum of `n` input tokens. */
function datum(n: number): WireDatum {
  const tokens = Array.from({ length: n + 1 }, (_, i) => (i * 7 + 3) % 480);
  return {
    tokens: tokens.slice(0, n),
    lossFnInputs: {
      target_tokens: { dtype: 'int64', data: tokens.slice(1), shape: [n] },
      weights: { dtype: 'float32', data: new Float32Array(n).fill(1), shape: [n] },
    },
  };
}

/** Runs a Python snippet with the SDK against `service`; its last stdout line is JSON. */
async function sdk<T>(service: TinkerService, body: string): Promise<T> {
  const script = [
    'import json, sys',
    'import tinker',
    'from tinker import types',
    `sc = tinker.ServiceClient(base_url=sys.argv[1], api_key="${KEY}")`,
    body,
  ].join('\n');
  const { stdout } = await run(python, ['-c', script, service.url], {
    env: { ...process.env, TINKER_TELEMETRY: '0', HF_HUB_OFFLINE: '1' },
    timeout: 120_000,
  });
  return JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as T;
}

/** Python lines that run `expr` and record `name: <exception type>: <message>` (or `ok`) in `res`. */
function attempt(name: string, expr: string): string[] {
  return [
    'try:',
    `    ${expr}`,
    `    res[${JSON.stringify(name)}] = "ok"`,
    'except Exception as e:',
    `    res[${JSON.stringify(name)}] = type(e).__name__ + ": " + str(e).split(" for self.request_id=")[0]`,
  ];
}

describe('row 2: a tiny request cannot make the service expand a huge tensor', () => {
  it('refuses an unknown model before decoding the payload (404, not a protobuf error of the tensor)', async () => {
    const service = await start();
    const answer = await post(service, '/api/v1/forward_backward', sparseBomb('sess-none:train:0', 1, 2n ** 40n));
    expect(answer.status).toBe(404);
    const garbage = Uint8Array.from([...sField(1, 'sess-none:train:0'), 0x1a, 0xff, 0xff, 0xff, 0x0f]);
    expect((await post(service, '/api/v1/forward_backward', garbage)).status).toBe(404);
  });

  it("refuses a sparse tensor whose dense size is past the model's context before expanding it (400)", async () => {
    const service = await start();
    const modelId = await trainingClient(service, await session(service));
    const bomb = sparseBomb(modelId, 1, 2 ** 22);
    expect(bomb.length).toBeLessThan(200);
    const answer = await post(service, '/api/v1/forward_backward', bomb);
    expect(answer.status).toBe(400);
    expect(String(answer.json.detail)).toContain(String(CONTEXT));
    // The client still trains afterwards.
    const ok = await result(
      service,
      await post(
        service,
        '/api/v1/forward_backward',
        encodeForwardBackwardRequest({
          modelId,
          seqId: 2,
          data: [datum(8)],
          lossFn: 'cross_entropy',
          lossFnConfig: {},
          forwardOnly: false,
        }),
      ),
    );
    expect(ok.type).toContain('protobuf');
  });
});

describe('row 3: saved states are read from the state directory only', () => {
  it.skipIf(lacks('python'))(
    'refuses tinker://../weights/x, a link out of the state dir and a missing state alike, through the SDK, with one error that names no file',
    async () => {
      const dir = await mkdtemp(join(tmpdir(), 'rxrl-tinker-hostile-'));
      const stateDir = join(dir, 'state');
      const service = await start({ stateDir });
      const saved = await sdk<{ model: string; path: string }>(
        service,
        [
          'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
          'print(json.dumps({"model": tc.model_id, "path": tc.save_state("ckpt").result().path}))',
        ].join('\n'),
      );
      const [modelDir] = await readdir(stateDir);
      // A state outside the state dir (`<stateDir>/../x.safetensors`), and a link inside the state dir to it.
      await copyFile(join(stateDir, modelDir, 'ckpt.safetensors'), join(dir, 'x.safetensors'));
      await symlink(join(dir, 'x.safetensors'), join(stateDir, modelDir, 'link.safetensors'));
      const out = await sdk<Record<string, string>>(
        service,
        [
          'res = {}',
          'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
          ...attempt('own', `tc.load_state(${JSON.stringify(saved.path)}).result()`),
          ...attempt('outside', 'tc.load_state("tinker://../weights/x").result()'),
          ...attempt('missing', 'tc.load_state("tinker://../weights/nothing").result()'),
          ...attempt('link', `tc.load_state("tinker://${saved.model}/weights/link").result()`),
          ...attempt('fromState', 'sc.create_training_client_from_state("tinker://../weights/x").result()'),
          ...attempt('fromStateMissing', 'sc.create_training_client_from_state("tinker://../weights/nothing").result()'),
          'print(json.dumps(res))',
        ].join('\n'),
      );
      expect(out.own).toBe('ok');
      for (const name of ['outside', 'missing', 'link', 'fromState', 'fromStateMissing']) {
        expect(out[name], name).not.toBe('ok');
        expect(out[name], name).not.toContain(dir);
        expect(out[name], name).not.toMatch(/ENOENT|ELOOP|safetensors|inside/);
      }
      // Whether the file exists outside or not, the error is the same (but for the path the client gave).
      const masked = (text: string): string => text.replace(/tinker:\/\/[^'" ]*/g, '<path>');
      expect(masked(out.outside)).toBe(masked(out.missing));
      expect(masked(out.link)).toBe(masked(out.missing));
      expect(masked(out.fromState)).toBe(masked(out.fromStateMissing));
    },
    120_000,
  );
});

describe("row 4: datums past the model's context are refused; heavy work leaves healthz answering", () => {
  it('refuses a datum longer than the context with a 400 naming the limit', async () => {
    const service = await start();
    const modelId = await trainingClient(service, await session(service));
    const body = encodeForwardBackwardRequest({
      modelId,
      seqId: 1,
      data: [datum(CONTEXT + 72)],
      lossFn: 'cross_entropy',
      lossFnConfig: {},
      forwardOnly: false,
    });
    const answer = await post(service, '/api/v1/forward_backward', body);
    expect(answer.status).toBe(400);
    expect(String(answer.json.detail)).toContain(String(CONTEXT));
    const fits = encodeForwardBackwardRequest({
      modelId,
      seqId: 2,
      data: [datum(CONTEXT)],
      lossFn: 'cross_entropy',
      lossFnConfig: {},
      forwardOnly: false,
    });
    expect((await result(service, await post(service, '/api/v1/forward_backward', fits))).type).toContain('protobuf');
  });

  it('answers /api/v1/healthz while a long forward_backward runs (before its future settles)', async () => {
    // pollMs 1: retrieve_future answers try_again at once while the work runs; chunks of 32 padded positions: the
    // forward pass below is 16 chunks.
    const service = await start({ pollMs: 1, chunkTokens: 32 });
    const modelId = await trainingClient(service, await session(service));
    const data = Array.from({ length: 32 }, () => datum(16));
    const future = await post(
      service,
      '/api/v1/forward_backward',
      encodeForwardBackwardRequest({ modelId, seqId: 1, data, lossFn: 'cross_entropy', lossFnConfig: {}, forwardOnly: false }),
    );
    expect(future.status).toBe(200);
    const health = await fetch(`${service.url}/api/v1/healthz`, { headers: { 'x-api-key': KEY } });
    expect(health.status).toBe(200);
    const during = await post(service, '/api/v1/retrieve_future', { request_id: future.json.request_id });
    expect(during.json.type).toBe('try_again');
    expect((await result(service, future)).type).toContain('protobuf');
  }, 120_000);
});

describe('row 5: training clients are freed', () => {
  it.skipIf(lacks('python'))(
    'frees the clients of a session the SDK closes: later sessions can create as many',
    async () => {
      const service = await start({ maxModels: 2 });
      const script = [
        'res = {}',
        'a = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2).result()',
        'b = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2).result()',
        'sc.close("success").result()',
        `sc2 = tinker.ServiceClient(base_url=sys.argv[1], api_key="${KEY}")`,
        ...attempt('third', 'sc2.create_lora_training_client(base_model="tiny-qwen3", rank=2).result()'),
        ...attempt('fourth', 'sc2.create_lora_training_client(base_model="tiny-qwen3", rank=2).result()'),
        'print(json.dumps(res))',
      ].join('\n');
      const out = await sdk<Record<string, string>>(service, script);
      expect(out).toEqual({ third: 'ok', fourth: 'ok' });
    },
    120_000,
  );

  it("serves unload_model (the SDK's UnloadModelRequest): the client is gone and its slot free", async () => {
    const service = await start({ maxModels: 1 });
    const s = await session(service);
    const first = await trainingClient(service, s, 0);
    const unloaded = await result(service, await post(service, '/api/v1/unload_model', { model_id: first, type: 'unload_model' }));
    expect(unloaded.json).toEqual({ model_id: first, type: 'unload_model' });
    expect((await post(service, '/api/v1/get_info', { model_id: first })).status).toBe(404);
    expect(await trainingClient(service, s, 1)).toBe(`${s}:train:1`);
    expect((await post(service, '/api/v1/unload_model', { model_id: first })).status).toBe(404);
  });

  it('frees the clients of a session that stops heartbeating, and keeps those of one that heartbeats', async () => {
    const service = await start({ maxModels: 2, sessionTimeoutMs: 1_000 });
    const live = await session(service);
    const silent = await session(service);
    const kept = await trainingClient(service, live);
    const freed = await trainingClient(service, silent);
    let beating = true;
    const beats = (async () => {
      while (beating) {
        await post(service, '/api/v1/session_heartbeat', { session_id: live });
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    })();
    try {
      // Wait (bounded) until a second client of the live session fits: the silent session's is freed (a probe of
      // that client itself would keep its session alive).
      const deadline = Date.now() + 60_000;
      const second = { session_id: live, model_seq_id: 1, base_model: 'tiny-qwen3', lora_config: { rank: 2 } };
      let created: Answer;
      while ((created = await post(service, '/api/v1/create_model', second)).status !== 200) {
        expect(created.status).toBe(429);
        if (Date.now() > deadline) throw new Error(`the silent session's client ${freed} was never freed`);
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
      expect((await result(service, created)).json.model_id).toBe(`${live}:train:1`);
      expect((await post(service, '/api/v1/get_info', { model_id: freed })).status).toBe(404);
      expect((await post(service, '/api/v1/session_heartbeat', { session_id: silent })).status).toBe(410);
      expect((await post(service, '/api/v1/get_info', { model_id: kept })).status).toBe(200);
    } finally {
      beating = false;
      await beats;
    }
  }, 120_000);
});

describe('row 6: named sampler weights are bounded', () => {
  it.skipIf(lacks('python'))(
    "keeps the newest names only; an evicted name answers the SDK's not-found error",
    async () => {
      const service = await start({ maxSamplerWeights: 3 });
      const out = await sdk<Record<string, string>>(
        service,
        [
          'res = {}',
          'tc = sc.create_lora_training_client(base_model="tiny-qwen3", rank=2)',
          'paths = [tc.save_weights_for_sampler(f"w{i}").result().path for i in range(6)]',
          'prompt = types.ModelInput.from_ints([5, 17, 42])',
          'params = types.SamplingParams(max_tokens=2, seed=1)',
          ...attempt('oldest', 'sc.create_sampling_client(model_path=paths[0]).sample(prompt, 1, params).result()'),
          ...attempt('third', 'sc.create_sampling_client(model_path=paths[2]).sample(prompt, 1, params).result()'),
          ...attempt('newest', 'sc.create_sampling_client(model_path=paths[5]).sample(prompt, 1, params).result()'),
          ...attempt('fourth', 'sc.create_sampling_client(model_path=paths[3]).sample(prompt, 1, params).result()'),
          'print(json.dumps(res))',
        ].join('\n'),
      );
      expect(out.oldest).toMatch(/^NotFoundError/);
      expect(out.third).toMatch(/^NotFoundError/);
      expect(out.newest).toBe('ok');
      expect(out.fourth).toBe('ok');
    },
    120_000,
  );

  it('keeps no more bytes of sampler weights than maxSamplerWeightBytes', async () => {
    const probe = LoraAdapter.create(model.config, { rank: 2, alpha: 2, targetModules: LORA_TARGETS }, 0);
    const bytes = [...probe.getWeights().values()].reduce((sum, w) => sum + w.data.byteLength, 0);
    probe.dispose();
    // Room for two rank-2 snapshots and a half.
    const service = await start({ maxSamplerWeightBytes: Math.floor(2.5 * bytes) });
    const s = await session(service);
    const modelId = await trainingClient(service, s);
    for (const name of ['a', 'b', 'c']) {
      expect(
        (await result(service, await post(service, '/api/v1/save_weights_for_sampler', { model_id: modelId, path: name }))).json.path,
      ).toBe(`tinker://${modelId}/sampler_weights/${name}`);
    }
    const open = async (name: string): Promise<number> =>
      (
        await post(service, '/api/v1/create_sampling_session', {
          session_id: s,
          sampling_session_seq_id: 0,
          model_path: `tinker://${modelId}/sampler_weights/${name}`,
        })
      ).status;
    expect(await open('a')).toBe(404);
    expect(await open('b')).toBe(200);
    expect(await open('c')).toBe(200);
    // One snapshot larger than the whole bound is refused, and nothing is kept.
    const tiny = await start({ maxSamplerWeightBytes: bytes - 1 });
    const t = await session(tiny);
    const m = await trainingClient(tiny, t);
    expect((await result(tiny, await post(tiny, '/api/v1/save_weights_for_sampler', { model_id: m, path: 'big' }))).json.category).toBe(
      'user',
    );
  });
});

describe('row 7: one bad sample request fails alone', () => {
  it('refuses max_tokens past the context at once; the valid requests sent with it are sampled', async () => {
    const service = await start();
    const sampler = (
      await post(service, '/api/v1/create_sampling_session', { session_id: await session(service), base_model: 'tiny-qwen3' })
    ).json.sampling_session_id;
    const request = (maxTokens: number, seed: number): Promise<Answer> =>
      post(service, '/api/v1/asample', {
        sampling_session_id: sampler,
        num_samples: 2,
        prompt: { chunks: [{ type: 'encoded_text', tokens: [5, 17, 42, 8] }] },
        sampling_params: { max_tokens: maxTokens, seed, temperature: 1 },
      });
    const [a, bad, b] = await Promise.all([request(8, 1), request(1e9, 2), request(8, 3)]);
    expect(bad.status).toBe(400);
    expect(String(bad.json.detail)).toContain('max_tokens');
    for (const future of [a, b]) {
      const answer = await result(service, future);
      expect(answer.type).toContain('protobuf');
      expect(decodeSampleResponse(answer.bytes).sequences).toHaveLength(2);
    }
    // The longest that fits is accepted.
    expect((await result(service, await request(CONTEXT - 4, 4))).type).toContain('protobuf');
    for (const params of [{ temperature: -1 }, { temperature: 'hot' }, { top_p: 0 }, { seed: 1.5 }, { max_tokens: 0 }]) {
      const refused = await post(service, '/api/v1/asample', {
        sampling_session_id: sampler,
        prompt: { chunks: [{ type: 'encoded_text', tokens: [5] }] },
        sampling_params: { max_tokens: 2, ...params },
      });
      expect(refused.status, JSON.stringify(params)).toBe(400);
    }
  }, 120_000);
});

describe('row 8: a sampler lives while requests on it are pending', () => {
  it('serves every accepted request of a sampler evicted while more than a batch of sequences waits on it', async () => {
    const service = await start({ maxSamplers: 1 });
    const s = await session(service);
    const modelId = await trainingClient(service, s);
    const saved = await result(service, await post(service, '/api/v1/save_weights_for_sampler', { model_id: modelId }));
    const sampler = saved.json.sampling_session_id as string;
    const futures = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        post(service, '/api/v1/asample', {
          sampling_session_id: sampler,
          num_samples: 128,
          prompt: { chunks: [{ type: 'encoded_text', tokens: [5, 17, 42, 8] }] },
          sampling_params: { max_tokens: 24, seed: i },
        }),
      ),
    );
    // A second sampling session evicts the first (maxSamplers 1) while its 512 sequences are queued.
    expect((await post(service, '/api/v1/create_sampling_session', { session_id: s, base_model: 'tiny-qwen3' })).status).toBe(200);
    expect(
      (
        await post(service, '/api/v1/asample', {
          sampling_session_id: sampler,
          prompt: { chunks: [{ type: 'encoded_text', tokens: [5] }] },
        })
      ).status,
    ).toBe(404);
    for (const future of futures) {
      const answer = await result(service, future);
      expect(answer.json.error).toBeUndefined();
      expect(decodeSampleResponse(answer.bytes).sequences).toHaveLength(128);
    }
  }, 180_000);
});

describe('row 9: an empty key and malformed input', () => {
  it('refuses an empty or blank apiKey at start (the service, and `rxrl tinker --api-key ""` before it loads anything)', async () => {
    await expect(start({ apiKey: '' })).rejects.toBeInstanceOf(ConfigError);
    await expect(start({ apiKey: '   ' })).rejects.toBeInstanceOf(ConfigError);
    const lines: string[] = [];
    const command = runTinkerCommand({
      model: fixture,
      apiKey: '',
      port: 0,
      backend: 'cpu',
      signal: AbortSignal.abort(),
      out: (line) => lines.push(line),
    });
    await expect(command).rejects.toBeInstanceOf(ConfigError);
    expect(lines).toEqual([]);
  });

  it('answers malformed input with 400 and no internal text', async () => {
    const service = await start();
    const sampler = (
      await post(service, '/api/v1/create_sampling_session', { session_id: await session(service), base_model: 'tiny-qwen3' })
    ).json.sampling_session_id;
    const cases: [string, unknown][] = [
      ['/api/v1/asample', { sampling_session_id: sampler, prompt: { chunks: [null] } }],
      ['/api/v1/asample', { sampling_session_id: sampler, prompt: null }],
      [
        '/api/v1/asample',
        { sampling_session_id: sampler, prompt: { chunks: [{ type: 'encoded_text', tokens: [1] }] }, sampling_params: [] },
      ],
      ['/api/v1/sessions/%zz/finish', {}],
      ['/api/v1/optim_step', { model_id: 'x', adam_params: 3 }],
      ['/api/v1/create_model', { session_id: await session(service), base_model: 'tiny-qwen3', lora_config: 7 }],
      ['/api/v1/retrieve_future', { request_id: { a: 1 } }],
    ];
    for (const [path, body] of cases) {
      const answer = await post(service, path, body);
      expect([400, 404], `${path} ${JSON.stringify(body)}`).toContain(answer.status);
      expect(String(answer.json.detail)).not.toMatch(/Cannot read|undefined|URI malformed|TypeError/);
    }
    expect((await post(service, '/api/v1/sessions/%zz/finish', {})).status).toBe(400);
    expect((await post(service, '/api/v1/asample', cases[0][1])).status).toBe(400);
    // Ids nested deeper than any recursion: quoted without recursing (a 404 or 400, never a 500).
    for (const depth of [2_000, 100_000]) {
      const deep = `{"model_id":${'['.repeat(depth)}${']'.repeat(depth)}}`;
      const answer = await fetch(`${service.url}/api/v1/get_info`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-api-key': KEY },
        body: deep,
      });
      expect([400, 404], String(depth)).toContain(answer.status);
    }
  });

  it('keeps authentication on every route and clean 4xx for malformed protobuf and JSON', async () => {
    const service = await start();
    for (const path of ['/api/v1/healthz', '/api/v1/get_server_capabilities']) {
      expect((await fetch(`${service.url}${path}`)).status, path).toBe(401);
    }
    for (const path of [
      '/api/v1/create_session',
      '/api/v1/forward_backward',
      '/api/v1/asample',
      '/api/v1/unload_model',
      '/api/v1/retrieve_future',
      '/api/v1/sessions/x/finish',
      '/api/v1/nothing',
    ]) {
      const answer = await fetch(`${service.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' });
      expect(answer.status, path).toBe(401);
    }
    const protobuf = await fetch(`${service.url}/api/v1/forward_backward`, {
      method: 'POST',
      headers: { 'content-type': 'application/x-protobuf', 'x-api-key': KEY },
      body: Uint8Array.from([0x0a, 0xff]),
    });
    expect(protobuf.status).toBe(400);
    const json = await fetch(`${service.url}/api/v1/create_model`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-api-key': KEY },
      body: '{"a":',
    });
    expect(json.status).toBe(400);
  });
});
