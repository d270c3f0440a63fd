/**
 * `/health` under a flood: `rxrl serve` (started in this process, the embedded default model) answers many
 * concurrent `/v1/completions` requests with many prompts and a large `n` (the clients on a worker thread, so that
 * parsing their answers does not count against the server), while a prober asks `/health` one request at a time. Prints one JSON line: `/health` latency percentiles, event-loop delay percentiles
 * (`perf_hooks.monitorEventLoopDelay`) and throughput.
 *
 * Usage: `npm run bench -- flood [--backend wasm] [--clients 50] [--prompts 32] [--n 128] [--max-tokens 12]
 * [--logprobs 0] [--max-batch 256]`. The defaults are the flood of issue 20 (50 × 32 × 128 samples); smaller
 * floods (`--clients 8`) finish sooner with the same per-batch behaviour.
 *
 * @packageDocumentation
 */
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { Worker } from 'node:worker_threads';

import { EMBEDDED_MODEL } from '../pipelines/embedded.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { createRng } from '../lib/core/random.js';
import { serve } from '../lib/serve/server.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const at = args.indexOf(`--${name}`);
  return at >= 0 && args[at + 1] !== undefined ? args[at + 1] : fallback;
}

/** The `q`-quantile of ascending `sorted`, in ms rounded to 0.1. */
function quantile(sorted: readonly number[], q: number): number {
  if (sorted.length === 0) return NaN;
  return Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] * 10) / 10;
}

/** Posts every body at once from a worker thread; resolves with the completion tokens of all answers. */
function runClients(url: string, bodies: readonly string[]): Promise<number> {
  const code = `
    const { parentPort, workerData } = require('node:worker_threads');
    Promise.all(workerData.bodies.map(async (body) => {
      const response = await fetch(workerData.url, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      const json = await response.json();
      if (!response.ok) throw new Error('completions answered ' + response.status + ': ' + JSON.stringify(json).slice(0, 200));
      return json.usage ? json.usage.completion_tokens : 0;
    })).then((tokens) => parentPort.postMessage({ tokens: tokens.reduce((a, b) => a + b, 0) }), (error) => parentPort.postMessage({ error: String(error) }));
  `;
  return new Promise((resolve, reject) => {
    const worker = new Worker(code, { eval: true, workerData: { url, bodies } });
    worker.once('message', (message: { tokens?: number; error?: string }) => {
      void worker.terminate();
      if (message.error !== undefined) reject(new Error(message.error));
      else resolve(message.tokens ?? 0);
    });
    worker.once('error', reject);
  });
}

/** Runs the flood; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const backend = flag(args, 'backend', 'wasm') as BackendName;
  const clients = Number(flag(args, 'clients', '50'));
  const promptsPerRequest = Number(flag(args, 'prompts', '32'));
  const n = Number(flag(args, 'n', '128'));
  const maxTokens = Number(flag(args, 'max-tokens', '12'));
  const logprobs = Number(flag(args, 'logprobs', '0'));
  const maxBatchSize = Number(flag(args, 'max-batch', '256'));
  await initBackend(backend, { logger: { info: () => undefined } });
  const tokenizer = new CharTokenizer();
  const model = PolicyModel.create({ ...EMBEDDED_MODEL, vocabSize: tokenizer.vocabSize }, 1);
  const server = await serve({ model, tokenizer, maxBatchSize, maxSamplesPerRequest: promptsPerRequest * n });
  const rng = createRng(1, 'flood');
  const letters = 'abcdefghij';
  const prompt = (): string =>
    Array.from({ length: 3 + Math.floor(rng.next() * 5) }, () => letters[Math.floor(rng.next() * letters.length)]).join('') + '=';
  const body = (): string =>
    JSON.stringify({
      model: server.modelName,
      prompt: Array.from({ length: promptsPerRequest }, prompt),
      n,
      max_tokens: maxTokens,
      seed: 1,
      ...(logprobs > 0 ? { logprobs } : {}),
    });

  const delay = monitorEventLoopDelay({ resolution: 5 });
  const health: number[] = [];
  let done = false;
  let tokens = 0;
  const started = performance.now();
  delay.enable();
  // The clients run on a thread of their own: parsing megabytes of responses is theirs to pay, not the server's.
  const flood = runClients(`${server.baseURL}/completions`, Array.from({ length: clients }, body))
    .then((sum) => {
      tokens = sum;
    })
    .finally(() => {
      done = true;
    });
  const probe = (async () => {
    while (!done) {
      const t0 = performance.now();
      await (await fetch(`${server.url}/health`)).json();
      health.push(performance.now() - t0);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
  })();
  let seconds: number;
  try {
    await flood;
    seconds = (performance.now() - started) / 1000;
  } finally {
    await probe;
    delay.disable();
    await server.close();
    model.dispose();
  }
  const sorted = [...health].sort((a, b) => a - b);
  const ms = (ns: number): number => Math.round(ns / 1e5) / 10;
  console.log(
    JSON.stringify({
      bench: 'flood',
      backend,
      clients,
      prompts: promptsPerRequest,
      n,
      maxTokens,
      logprobs,
      maxBatchSize,
      samples: clients * promptsPerRequest * n,
      seconds: Math.round(seconds * 10) / 10,
      samplesPerSecond: Math.round((clients * promptsPerRequest * n) / seconds),
      tokensPerSecond: Math.round(tokens / seconds),
      healthMs: { count: sorted.length, p50: quantile(sorted, 0.5), p99: quantile(sorted, 0.99), max: quantile(sorted, 1) },
      eventLoopDelayMs: { p50: ms(delay.percentile(50)), p99: ms(delay.percentile(99)), max: ms(delay.max) },
    }),
  );
}
