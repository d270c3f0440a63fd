/**
 * A LoRA policy on an external OpenAI-compatible server that misbehaves at `load_lora_adapter` (issue 53, rows 7 and
 * 8): a server that answers the load without loading, and one whose load never answers. The server is a real
 * `rxrl serve` of the base model behind a node `http` proxy on loopback, written here, which forwards every request
 * but the loads it is told to answer itself or hold.
 */
import { createServer, request as httpRequest, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { readFileSync } from 'node:fs';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { EngineError } from '../../lib/core/errors.js';
import { spawnServe, type SpawnedServer } from '../../lib/serve/spawn.js';
import { runTraining } from '../../pipelines/run.js';
import { CLI, expectHandledStop, intactCheckpoint, stopWhenBlocked } from '../helpers/stopRun.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

let server: SpawnedServer;
beforeAll(async () => {
  server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', fixture, '--served-model-name', 'base'], {
    cliPath: CLI,
    stderr: 'ignore',
  });
}, 60_000);
afterAll(async () => {
  await server?.close();
});

/** What the proxy does with a `load_lora_adapter` of adapter `name`: forward it, answer 200 itself, or hold it. */
type LoadVerdict = 'forward' | 'answer' | 'hold';

const proxies: Server[] = [];
afterEach(async () => {
  for (const proxy of proxies.splice(0)) {
    proxy.closeAllConnections();
    await new Promise((resolve) => proxy.close(resolve));
  }
});

/**
 * A proxy to the `rxrl serve` process: forwards every request, but a `POST /v1/load_lora_adapter` is handled as
 * `verdict(lora_name)` says. `held` resolves with the name of the first load it holds.
 */
async function proxy(verdict: (name: string) => LoadVerdict): Promise<{ baseUrl: string; held: Promise<string> }> {
  let onHeld: (name: string) => void = () => undefined;
  const held = new Promise<string>((resolve) => (onHeld = resolve));
  const upstream = new URL(server.baseURL);
  const proxyServer = createServer((req: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.method === 'POST' && req.url === '/v1/load_lora_adapter') {
        const name = String((JSON.parse(body.toString()) as { lora_name?: unknown }).lora_name);
        const what = verdict(name);
        if (what === 'hold') return onHeld(name);
        if (what === 'answer') {
          res.writeHead(200, { 'content-type': 'text/plain' });
          return res.end(`Success: LoRA adapter '${name}' added successfully.`);
        }
      }
      const forward = httpRequest(
        { host: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers: req.headers },
        (answer) => {
          res.writeHead(answer.statusCode ?? 502, answer.headers);
          answer.pipe(res);
        },
      );
      forward.on('error', () => res.destroy());
      forward.end(body);
    });
  });
  proxies.push(proxyServer);
  await new Promise<void>((resolve) => proxyServer.listen(0, '127.0.0.1', resolve));
  const { port } = proxyServer.address() as { port: number };
  return { baseUrl: `http://127.0.0.1:${port}/v1`, held };
}

/** The LoRA recipe on the tiny fixture, rolling out on `baseUrl`. */
function recipe(dir: string, baseUrl: string, steps: number, name: string): Record<string, unknown> {
  return {
    model: { path: fixture },
    data: { source: 'arithmetic', arithmetic: { operators: '+*', maxOperand: 12, validationSize: 4 } },
    rollout: { chatTemplate: 'model', groupSize: 2, maxTokens: 6 },
    policies: [{ name, specialization: 'lora', lora: { rank: 2, alpha: 4, targetModules: ['q_proj', 'v_proj'] } }],
    sync: { batchSize: 2, mode: 'sync' },
    trainer: { learningRate: 0.01 },
    openai: { baseUrl, model: 'base' },
    run: { dir, steps, backend: 'cpu', seed: 1 },
    checkpoint: { every: 1, keepLast: 0 },
    validation: { beforeTrain: false, every: 0 },
  };
}

describe('a LoRA policy on a server that misbehaves at load_lora_adapter', () => {
  it('a server that answers the load without loading is an EngineError naming the adapter (it trained on 0-row steps and exited 0 before)', async () => {
    const { baseUrl } = await proxy(() => 'answer');
    const dir = join(await mkdtemp(join(tmpdir(), 'rxrl-lora-unloaded-')), 'run');
    const steps: number[] = [];
    const error = await runTraining(loadConfig({ env: {}, values: recipe(dir, baseUrl, 2, 'ghost') }), {
      log: () => undefined,
      onStep: (step) => steps.push(step.step),
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EngineError);
    expect((error as EngineError).context).toMatchObject({ adapter: 'ghost-v0', kind: 'not-listed', version: 0 });
    expect(steps).toEqual([]);
  }, 120_000);

  it('SIGTERM while load_lora_adapter never answers (after step 1): rxrl run exits, keeping its checkpoint', async () => {
    // Versions 0 and 1 load; the load of version 2 (made by the second step, once its checkpoint global_step_2 is saved) is held.
    const { baseUrl, held } = await proxy((name) => (name === 'held-v2' ? 'hold' : 'forward'));
    const work = await mkdtemp(join(tmpdir(), 'rxrl-lora-hold-'));
    const dir = join(work, 'run');
    const file = join(work, 'recipe.json');
    // The update's own deadline stays the default (300 s): only the signal can end the wait.
    await writeFile(file, JSON.stringify(recipe(dir, baseUrl, 5, 'held')));
    const stopped = await stopWhenBlocked({
      args: ['run', file],
      what: 'load_lora_adapter held',
      env: { RXRL_LOG_LEVEL: 'silent' },
      blocked: () => held,
      exitBoundMs: 60_000,
    });
    expectHandledStop(stopped);
    const kept = await intactCheckpoint(dir);
    expect(kept).toMatch(/global_step_2$/);
    const state = JSON.parse(readFileSync(join(kept, 'state.json'), 'utf8')) as { step: number };
    expect(state.step).toBe(2);
  }, 180_000);
});
