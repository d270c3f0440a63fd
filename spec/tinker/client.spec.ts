/**
 * rxrl's pipeline trained through the Tinker API: `grpoPipeline` with a `TinkerClientTrainer` and a `TinkerEngine`
 * pointed at rxrl's Tinker service matches the same pipeline with the embedded `GrpoTrainer` and `LocalEngine` on
 * the same LoRA adapter (same initialization, same seeds): losses and rollout log-probs within float32 tolerance.
 */
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';

import { lastValueFrom, toArray } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { LocalEngine } from '../../lib/engine/local.js';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse } from '../../lib/model/types.js';
import { initBackend } from '../../lib/model/backend.js';
import { LORA_TARGETS, LoraAdapter } from '../../lib/model/lora.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel } from '../../lib/model/transformer.js';
import { EngineError, RetriesExhaustedError } from '../../lib/core/errors.js';
import { TinkerClient, TinkerClientTrainer, TinkerEngine, TinkerError, tinkerSeed, tinkerServiceLost } from '../../lib/tinker/client.js';
import { tinkerService, type TinkerService } from '../../lib/tinker/service.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import type { StalenessMode } from '../../lib/sync/gate.js';
import { grpoPipeline } from '../../pipelines/grpoPipeline.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';

const task = stringTransformTask({ transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 6, seed: 1 });
const tokenizer = new CharTokenizer(task.characters);
const config = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 2, nHeads: 2, dFF: 64, maxSeqLen: 16 };
const RANK = 4;
const SEED = 5;
const trainerOptions = { learningRate: 0.02, clipLow: 0.2, clipHigh: 0.28, maxGradNorm: 1 };
let base: PolicyModel;
let service: TinkerService;

/** `engine` with its `generate` replaced (the rest passes through). */
function withGenerate(engine: RolloutEngine, generate: RolloutEngine['generate']): RolloutEngine {
  return {
    get modelTag() {
      return engine.modelTag;
    },
    get version() {
      return engine.version;
    },
    get tokenizer() {
      return engine.tokenizer;
    },
    loadWeights: (version, weights) => engine.loadWeights(version, weights),
    generate,
  };
}

/** Records every sample an engine gives, by seed and version. */
function recording(engine: RolloutEngine, samples: Map<string, GenerateResponse>): RolloutEngine {
  return withGenerate(engine, async (requests: readonly GenerateRequest[], signal?: AbortSignal) => {
    const out = await engine.generate(requests, signal);
    requests.forEach((r, i) => samples.set(`${r.seed}@${out[i].policyVersion}`, out[i]));
    return out;
  });
}

/** `engine` drawing with the seeds the Tinker API carries (int32), so its samples and the service's can be compared. */
function tinkerSeeded(engine: RolloutEngine): RolloutEngine {
  return withGenerate(engine, (requests, signal) =>
    engine.generate(
      requests.map((r) => (r.seed === undefined ? r : { ...r, seed: tinkerSeed(r.seed) })),
      signal,
    ),
  );
}

async function run(mode: StalenessMode, trainer: GrpoTrainer | TinkerClientTrainer, engine: RolloutEngine) {
  return lastValueFrom(
    grpoPipeline({
      tasks: task.train,
      loader: { epochs: Infinity, shuffle: true, seed: 2 },
      engines: [engine],
      trainer,
      evaluator: task.evaluator,
      mode,
      stalenessThreshold: 1,
      batchSize: 2,
      groupSize: 4,
      maxTokens: task.maxAnswerLength + 1,
      steps: 3,
      seed: 3,
    }).pipe(toArray()),
  );
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  base = PolicyModel.create(config, 1);
});

afterAll(async () => {
  await service?.close();
  base?.dispose();
});

describe('grpoPipeline trained through the Tinker API (rxrl as client and service)', () => {
  it.each(['sync', 'batch-async'] as const)(
    'matches the embedded trainer on the same adapter (%s)',
    async (mode) => {
      service = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', seed: SEED });
      // Embedded: the trainer's adapter and the engine's copy, initialized as the service initializes its first client.
      const adapter = LoraAdapter.create(config, { rank: RANK, alpha: RANK, targetModules: LORA_TARGETS }, SEED);
      const view = PolicyModel.withAdapter(base, adapter);
      const engineAdapter = LoraAdapter.fromWeights(config, adapter.lora, adapter.getWeights());
      const engineView = PolicyModel.withAdapter(base, engineAdapter);
      const local = new Map<string, GenerateResponse>();
      const embedded = await run(
        mode,
        new GrpoTrainer(view, trainerOptions),
        recording(tinkerSeeded(new LocalEngine(engineView, { tokenizer })), local),
      );

      const client = await TinkerClient.connect({ baseURL: service.url, apiKey: 'unused' });
      const remoteTrainer = await TinkerClientTrainer.create(client, 'tiny', RANK, trainerOptions);
      const remote = new Map<string, GenerateResponse>();
      const viaTinker = await run(mode, remoteTrainer, recording(new TinkerEngine(remoteTrainer, tokenizer), remote));

      expect(viaTinker).toHaveLength(3);
      // The first step samples version 0 on both sides: the same rollouts, hence the same loss.
      expect(viaTinker[0].metrics['actor/pg_loss']).toBeCloseTo(embedded[0].metrics['actor/pg_loss'], 4);
      if (mode === 'sync') {
        // In sync mode every step samples the version just trained, on both sides.
        viaTinker.forEach((step, i) => {
          expect(step.metrics['actor/pg_loss']).toBeCloseTo(embedded[i].metrics['actor/pg_loss'], 4);
          expect(step.metrics['rollout/reward_mean']).toBeCloseTo(embedded[i].metrics['rollout/reward_mean'], 6);
        });
      }
      // Every sample both sides drew with the same seed from the same version has the same tokens and log-probs.
      let compared = 0;
      for (const [key, mine] of remote) {
        const theirs = local.get(key);
        if (theirs === undefined) continue;
        compared++;
        expect(mine.tokens).toEqual(theirs.tokens);
        mine.logprobs.forEach((lp, j) => expect(lp).toBeCloseTo(theirs.logprobs[j], 4));
      }
      expect(compared).toBeGreaterThanOrEqual(8);
      // Samples of trained versions are among them: the service's Adam steps gave the embedded trainer's weights.
      // (In batch-async the versions later rollouts draw from depend on timing, so only version 0 is shared for sure.)
      if (mode === 'sync') expect([...remote.keys()].filter((k) => !k.endsWith('@0') && local.has(k)).length).toBeGreaterThanOrEqual(16);
      view.dispose();
      engineView.dispose();
      adapter.dispose();
      engineAdapter.dispose();
      await service.close();
    },
    120_000,
  );

  it('keeps maxSamplers sampling sessions: the oldest is closed when another opens', async () => {
    const svc = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', seed: SEED, maxSamplers: 2 });
    try {
      const client = await TinkerClient.connect({ baseURL: svc.url, apiKey: 'unused' });
      const trainer = await TinkerClientTrainer.create(client, 'tiny', RANK);
      const first = trainer.samplerFor(0);
      const params = { maxTokens: 2, temperature: 1, topP: 1, seed: 1, stop: [] };
      expect((await client.sample(first, [1, 2], 1, params)).sequences).toHaveLength(1);
      const second = await client.samplerOf(trainer.modelId);
      await client.samplerOf(trainer.modelId); // the third: the first is closed
      expect((await client.sample(second, [1, 2], 1, params)).sequences).toHaveLength(1);
      const gone = await client.sample(first, [1, 2], 1, params).catch((e: unknown) => e);
      expect(gone).toBeInstanceOf(TinkerError);
      expect(String(gone)).toMatch(/HTTP 404 .*no sampling session/);
    } finally {
      await svc.close();
    }
  }, 60_000);

  it("keeps its session alive with heartbeats past the service's session timeout; close() finishes it and frees its client", async () => {
    const svc = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', seed: SEED, maxModels: 1, sessionTimeoutMs: 1_000 });
    try {
      const client = await TinkerClient.connect({ baseURL: svc.url, apiKey: 'unused', heartbeatMs: 100 });
      const trainer = await TinkerClientTrainer.create(client, 'tiny', RANK);
      const post = (path: string, body: unknown): Promise<Response> =>
        fetch(`${svc.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
      // Silent but for its heartbeats, for three session timeouts: the client is still there.
      await new Promise((resolve) => setTimeout(resolve, 3_000));
      expect((await post('/api/v1/get_info', { model_id: trainer.modelId })).status).toBe(200);
      await client.close();
      expect((await post('/api/v1/session_heartbeat', { session_id: client.sessionId })).status).toBe(410);
      expect((await post('/api/v1/get_info', { model_id: trainer.modelId })).status).toBe(404);
      // Its slot is free (maxModels 1).
      const next = await TinkerClient.connect({ baseURL: svc.url, apiKey: 'unused' });
      await expect(next.createLoraModel('tiny', RANK)).resolves.toBe(`${next.sessionId}:train:0`);
      await next.close();
    } finally {
      await svc.close();
    }
  }, 60_000);

  it('bounds the requests in flight: one more is a 429, not retried (it changes state)', async () => {
    const svc = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', seed: SEED, maxInFlight: 1 });
    try {
      const client = await TinkerClient.connect({ baseURL: svc.url, apiKey: 'unused' });
      const trainer = await TinkerClientTrainer.create(client, 'tiny', RANK);
      const params = { maxTokens: 12, temperature: 1, topP: 1, seed: 1, stop: [] };
      const both = await Promise.all([0, 1].map(() => client.sample(trainer.samplerFor(0), [1, 2], 8, params).catch((e: unknown) => e)));
      const refused = both.filter((r) => r instanceof TinkerError);
      expect(refused).toHaveLength(1);
      expect(String(refused[0])).toMatch(/HTTP 429 .*1 requests are in flight/);
      expect(both.filter((r) => !(r instanceof Error))).toHaveLength(1);
    } finally {
      await svc.close();
    }
  }, 60_000);

  it('a future that never finishes fails after futureTimeoutMs; a 503 on a read is retried', async () => {
    // A service that hangs cannot be had from rxrl's own on demand: this one accepts requests and never finishes
    // them (every poll is try_again), and answers its first create_session with a 503.
    let sessions = 0;
    const server = createServer((req, res) => {
      const send = (status: number, body: unknown): void => {
        res.writeHead(status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(body));
      };
      req.resume();
      req.on('end', () => {
        if (req.url === '/api/v1/create_session' && sessions++ === 0) return send(503, { detail: 'warming up' });
        if (req.url === '/api/v1/create_session') return send(200, { session_id: 'stuck' });
        if (req.url === '/api/v1/retrieve_future') return send(200, { type: 'try_again' });
        if (req.url === '/api/v1/create_model') return send(200, { request_id: 'never' });
        send(200, {});
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    try {
      const client = await TinkerClient.connect({
        baseURL: url,
        apiKey: 'unused',
        futureTimeoutMs: 300,
        retry: { retries: 2, initialDelayMs: 1 },
      });
      expect(sessions).toBe(2);
      const stuck = await client.createLoraModel('tiny', RANK).catch((e: unknown) => e);
      expect(stuck).toBeInstanceOf(TinkerError);
      expect(String(stuck)).toMatch(/request never did not finish within 300 ms/);
      expect(tinkerServiceLost(stuck)).toBe(true);
    } finally {
      server.close();
    }
  });

  it('fails with typed errors: a service that is gone is retried then given up; a refusal is not retried', async () => {
    const gone = await tinkerService({ model: base, tokenizer, baseModel: 'tiny', seed: SEED });
    const client = await TinkerClient.connect({
      baseURL: gone.url,
      apiKey: 'unused',
      retry: { retries: 2, initialDelayMs: 1, maxDelayMs: 2 },
    });
    const trainer = await TinkerClientTrainer.create(client, 'tiny', RANK);
    const datum = {
      tokens: [1, 2, 3],
      lossFnInputs: {
        target_tokens: { dtype: 'int64' as const, data: [2, 3, 4], shape: [3] },
        weights: { dtype: 'float32' as const, data: new Float32Array([1, 1, 1]), shape: [3] },
      },
    };
    // Another model id is refused (404): a TinkerError at once, no retry.
    await expect(client.forwardBackward('nobody:train:9', [datum], 'cross_entropy', {})).rejects.toBeInstanceOf(TinkerError);
    await gone.close();
    // The service is gone. A training call is retried only when the connection was refused (nothing was sent);
    // on a connection that broke mid-request it is not (it may have trained): a typed error either way.
    const failure = await client.forwardBackward(trainer.modelId, [datum], 'cross_entropy', {}).catch((e: unknown) => e);
    expect(failure instanceof EngineError || failure instanceof RetriesExhaustedError).toBe(true);
    expect(String((failure as Error).message)).toMatch(/cannot reach the Tinker service/);
    const again = await client.forwardBackward(trainer.modelId, [datum], 'cross_entropy', {}).catch((e: unknown) => e);
    expect(again).toBeInstanceOf(RetriesExhaustedError); // refused now: retried twice, then given up
    await expect(
      TinkerClient.connect({ baseURL: gone.url, apiKey: 'unused', retry: { retries: 1, initialDelayMs: 1 } }),
    ).rejects.toBeInstanceOf(RetriesExhaustedError);
  }, 60_000);
});
