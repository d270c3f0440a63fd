import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { from, lastValueFrom, toArray } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { OpenAIEngine } from '../../lib/engine/openai.js';
import { AbortError, EngineError, RetriesExhaustedError } from '../../lib/core/errors.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { isSampleFailure, type RolloutOutput, type SampleFailure, type Trajectory } from '../../lib/core/types.js';
import { rollout } from '../../operators/rollout.js';
import { validate } from '../../pipelines/validate.js';
import { partialCreditEvaluator } from '../../recipes/stringTransform.js';

/** What the misbehaving server does with one attempt. */
type Behaviour =
  | 'ok'
  | '500'
  | '503'
  | '400'
  | 'truncated' // half the body, then the socket closes
  | 'bad-json' // a complete body that is not JSON
  | 'no-logprobs' // valid JSON without token ids
  | 'hang' // never answers
  | 'held' // answers ok when the test calls release()
  | 'slow-body' // headers and half the body, then nothing
  | 'reset' // the socket is destroyed before any answer
  | 'refuse'; // a weight update answered with { success: false }

const tokenizer = new CharTokenizer('abcde=');

/**
 * A real HTTP server that misbehaves on purpose: each prompt (keyed by its text) has a plan, one behaviour per
 * attempt (the last one repeats). It answers `ok` with a completion of `dcba` + eos.
 */
class FaultyServer {
  readonly attempts = new Map<string, number>();
  readonly updates: unknown[] = [];
  private readonly server: Server;
  private readonly open = new Set<ServerResponse>();
  url = '';

  constructor(
    private readonly plans: ReadonlyMap<string, readonly Behaviour[]>,
    private readonly updatePlan: Behaviour[] = ['ok'],
  ) {
    this.server = createServer((req, res) => void this.handle(req, res));
  }

  async start(): Promise<void> {
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.url = `http://127.0.0.1:${(this.server.address() as AddressInfo).port}`;
  }

  async close(): Promise<void> {
    for (const res of this.open) res.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }

  /** Answers of `held` requests, waiting for the test. */
  readonly held: (() => void)[] = [];

  /** Most `held` requests waiting at once. */
  maxHeld = 0;

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { prompt?: number[] };
    let key: string;
    let plan: readonly Behaviour[];
    if (req.url === '/update_weights_from_disk') {
      key = 'update';
      plan = this.updatePlan;
      this.updates.push(body);
    } else {
      key = tokenizer.decode(body.prompt ?? []);
      plan = this.plans.get(key) ?? ['ok'];
    }
    const attempt = (this.attempts.get(key) ?? 0) + 1;
    this.attempts.set(key, attempt);
    this.act(plan[Math.min(attempt, plan.length) - 1], res, key === 'update');
  }

  private act(behaviour: Behaviour, res: ServerResponse, update: boolean): void {
    const completion = JSON.stringify(
      update
        ? { success: true, message: 'ok' }
        : {
            id: 'cmpl-1',
            object: 'text_completion',
            created: 0,
            model: 'faulty',
            choices: [
              {
                index: 0,
                text: 'dcba',
                finish_reason: 'stop',
                logprobs: {
                  tokens: [...tokenizer.encode('dcba'), 2].map((t) => `token_id:${t}`),
                  token_logprobs: [-0.1, -0.2, -0.3, -0.4, -0.5],
                },
              },
            ],
          },
    );
    const json = (status: number, text: string, length = Buffer.byteLength(text)): void => {
      res.writeHead(status, { 'content-type': 'application/json', 'content-length': length });
    };
    switch (behaviour) {
      case 'ok':
        json(200, completion);
        res.end(completion);
        return;
      case '500':
      case '503':
      case '400': {
        const text = JSON.stringify({ error: { message: `planned ${behaviour}`, type: 'test', param: null, code: null } });
        json(Number(behaviour), text);
        res.end(text);
        return;
      }
      case 'truncated':
        json(200, completion);
        res.write(completion.slice(0, completion.length / 2), () => res.destroy());
        return;
      case 'bad-json': {
        const text = completion.slice(0, completion.length / 2);
        json(200, text);
        res.end(text);
        return;
      }
      case 'no-logprobs': {
        const text = JSON.stringify({
          id: 'x',
          object: 'text_completion',
          created: 0,
          model: 'faulty',
          choices: [{ index: 0, text: 'dcba', finish_reason: 'stop', logprobs: null }],
        });
        json(200, text);
        res.end(text);
        return;
      }
      case 'held':
        this.held.push(() => {
          json(200, completion);
          res.end(completion);
        });
        this.maxHeld = Math.max(this.maxHeld, this.held.length);
        return;
      case 'hang':
        this.open.add(res);
        res.on('close', () => this.open.delete(res));
        return;
      case 'slow-body':
        this.open.add(res);
        res.on('close', () => this.open.delete(res));
        json(200, completion);
        res.write(completion.slice(0, 10));
        return;
      case 'reset':
        res.socket?.destroy();
        return;
      case 'refuse': {
        const text = JSON.stringify({ success: false, message: 'weights do not fit' });
        json(200, text);
        res.end(text);
        return;
      }
    }
  }
}

const task = (prompt: string) => ({ id: prompt, prompt, answer: 'dcba' });
const retryFast = { retries: 2, initialDelayMs: 1, maxDelayMs: 4 };
/**
 * Deadline of one attempt: long enough that a prompt answer from this tiny server never misses it even on a
 * loaded machine, so that only the planned `hang` and `slow-body` attempts time out.
 */
const DEADLINE_MS = 1_000;

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-faults-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

async function withServer<T>(
  plans: Record<string, Behaviour[]>,
  run: (server: FaultyServer, engine: OpenAIEngine) => Promise<T>,
  updatePlan?: Behaviour[],
): Promise<T> {
  const server = new FaultyServer(new Map(Object.entries(plans)), updatePlan);
  await server.start();
  const engine = new OpenAIEngine({
    baseURL: `${server.url}/v1`,
    model: 'faulty',
    tokenizer,
    timeoutMs: DEADLINE_MS,
    retry: retryFast,
    weightSync: {
      directory: join(dir, server.url.split(':').at(-1)!),
      config: { vocabSize: tokenizer.vocabSize, dModel: 8, nLayers: 1, nHeads: 2, dFF: 8, maxSeqLen: 16 },
    },
  });
  try {
    return await run(server, engine);
  } finally {
    await server.close();
  }
}

function rolloutAll(engine: OpenAIEngine, prompts: string[], signal?: AbortSignal): Promise<RolloutOutput[]> {
  return lastValueFrom(
    from(prompts.map(task)).pipe(
      rollout(engine, { samplesPerTask: 1, concurrency: 4, maxTokens: 5, evaluator: partialCreditEvaluator, signal }),
      toArray(),
    ),
  );
}

describe('OpenAIEngine against a misbehaving server', () => {
  it('retries 5xx answers, truncated and malformed bodies, resets and timeouts, then succeeds', async () => {
    const plans: Record<string, Behaviour[]> = {
      'a=': ['500', 'ok'],
      'b=': ['503', '500', 'ok'],
      'c=': ['truncated', 'ok'],
      'd=': ['bad-json', 'ok'],
      'e=': ['reset', 'ok'],
      'aa=': ['hang', 'ok'],
      'bb=': ['slow-body', 'hang', 'ok'],
      'cc=': ['ok'],
    };
    await withServer(plans, async (server, engine) => {
      const out = await rolloutAll(engine, Object.keys(plans));
      expect(out.filter(isSampleFailure)).toEqual([]);
      for (const t of out as Trajectory[]) {
        expect(t.responseTokens).toEqual([...tokenizer.encode('dcba'), 2]);
        expect(t.reward).toBe(1);
      }
      for (const [prompt, plan] of Object.entries(plans)) expect(server.attempts.get(prompt)).toBe(plan.length);
      const retries = Object.values(plans).reduce((n, plan) => n + plan.length - 1, 0);
      expect(engine.stats()).toEqual({ calls: 8, attempts: 8 + retries, retries, timeouts: 3, failures: 0, weightLoads: 0 });
    });
  });

  it('gives up after its retries, never retries 4xx or unusable answers, counts failures, and the stream completes', async () => {
    const plans: Record<string, Behaviour[]> = { 'a=': ['500'], 'b=': ['400'], 'c=': ['no-logprobs'], 'd=': ['hang'], 'e=': ['ok'] };
    await withServer(plans, async (server, engine) => {
      const out = await rolloutAll(engine, Object.keys(plans));
      expect(out).toHaveLength(5);
      const failures = new Map(out.filter(isSampleFailure).map((f: SampleFailure) => [f.taskId, f.error]));
      expect([...failures.keys()].sort()).toEqual(['a=', 'b=', 'c=', 'd=']);
      const exhausted = failures.get('a=') as RetriesExhaustedError;
      expect(exhausted).toBeInstanceOf(RetriesExhaustedError);
      expect(exhausted.context.attempts).toBe(3);
      expect(exhausted.cause).toBeInstanceOf(EngineError);
      expect((exhausted.cause as EngineError).context).toMatchObject({ kind: 'status', status: 500 });
      const badRequest = failures.get('b=') as EngineError;
      expect(badRequest).toBeInstanceOf(EngineError);
      expect(badRequest.retriable).toBe(false);
      expect(badRequest.context).toMatchObject({ kind: 'status', status: 400 });
      expect(failures.get('c=')!.name).toBe('DecodeError');
      expect(((failures.get('d=') as RetriesExhaustedError).cause as EngineError).context.kind).toBe('timeout');
      expect(Object.fromEntries(server.attempts)).toEqual({ 'a=': 3, 'b=': 1, 'c=': 1, 'd=': 3, 'e=': 1 });
      expect(engine.stats()).toMatchObject({ calls: 5, failures: 4, retries: 4, timeouts: 3 });

      const metrics = await validate(engine, ['a=', 'b=', 'c=', 'e='].map(task), partialCreditEvaluator, { maxTokens: 5 });
      expect(metrics).toMatchObject({ 'val/samples': 1, 'val/failures': 3, 'val/reward_mean': 1 });
    });
  });

  it('never has more requests in flight than its concurrency', async () => {
    const prompts = ['a=', 'b=', 'c=', 'd=', 'e=', 'ab='];
    await withServer(Object.fromEntries(prompts.map((p) => [p, ['held'] as Behaviour[]])), async (server) => {
      const narrow = new OpenAIEngine({ baseURL: `${server.url}/v1`, model: 'faulty', tokenizer, concurrency: 2 });
      const done = rolloutAll(narrow, prompts);
      for (let answered = 0; answered < prompts.length; answered++) {
        const expected = Math.min(2, prompts.length - answered);
        while (server.held.length < expected) await new Promise((r) => setTimeout(r, 2));
        expect(server.held).toHaveLength(expected);
        server.held.shift()!();
      }
      expect((await done).filter(isSampleFailure)).toEqual([]);
      expect(server.maxHeld).toBe(2);
    });
  });

  it('cancels hanging requests and retry waits when the rollout is aborted', async () => {
    await withServer({ 'a=': ['hang'], 'b=': ['500'] }, async (server, engine) => {
      const slow = new OpenAIEngine({
        baseURL: `${server.url}/v1`,
        model: 'faulty',
        tokenizer,
        timeoutMs: 60_000,
        retry: { retries: 5, initialDelayMs: 60_000 },
      });
      const controller = new AbortController();
      const done = rolloutAll(slow, ['a=', 'b='], controller.signal);
      while ((server.attempts.get('a=') ?? 0) < 1 || (server.attempts.get('b=') ?? 0) < 1) await new Promise((r) => setTimeout(r, 5));
      controller.abort();
      await expect(done).rejects.toBeInstanceOf(AbortError);
      expect(slow.stats().failures).toBe(0);
      expect(Object.fromEntries(server.attempts)).toEqual({ 'a=': 1, 'b=': 1 });
      expect(engine.stats().calls).toBe(0);
    });
  });

  it('retries a weight update the server could not take, and reports a refusal', async () => {
    await withServer(
      {},
      async (server, engine) => {
        await engine.loadWeights(1, new Map([['w', { shape: [2], data: new Float32Array([1, 2]) }]]));
        expect(engine.version).toBe(1);
        expect(server.attempts.get('update')).toBe(3);
        expect(server.updates[0]).toEqual({ model_path: join(dir, server.url.split(':').at(-1)!, 'v1'), weight_version: '1' });
        expect(engine.stats()).toMatchObject({ weightLoads: 1, retries: 2 });
        await expect(engine.loadWeights(2, new Map())).rejects.toSatisfy(
          (e: unknown) => e instanceof EngineError && /weights do not fit/.test(e.message),
        );
        expect(engine.version).toBe(1);
        expect(engine.stats()).toMatchObject({ weightLoads: 1, failures: 1 });
      },
      ['503', 'reset', 'ok', 'refuse'],
    );
  });
});
