/**
 * Sampling throughput of the policy model: new tokens per second with the KV cache versus full recompute
 * (same sampling code, same seeds, so both produce the same tokens), batch 32, 64 new tokens per row, and the
 * speedup ratio.
 *
 * Usage: `npm run bench -- sample [--backends wasm,cpu,tensorflow] [--sizes small,medium] [--batch 32]
 * [--new 64] [--no-torch]`. Prints one JSON object per (backend, size); then, when `python3` imports torch and
 * transformers, PyTorch CPU's `model.generate` (KV cache, same shape, batch, prompt lengths and new tokens; 2
 * threads and 1) and a `sample-summary` line with each backend's KV-cache rate as a ratio to both.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import type { GenerateRequest } from '../lib/model/types.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { createRng } from '../lib/core/random.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';
import { torchBySize, torchShape, vsTorch } from './_torch.js';

/** One benchmarked model size. */
interface SampleCase {
  readonly name: string;
  readonly config: PolicyConfig;
}

/** Prompt lengths are drawn from `[MIN_PROMPT, MAX_PROMPT]`, so the batch is left-padded. */
const MIN_PROMPT = 8;
const MAX_PROMPT = 24;

const CASES: readonly SampleCase[] = [
  { name: 'small', config: { vocabSize: 64, dModel: 128, nLayers: 2, nHeads: 4, dFF: 512, maxSeqLen: 128 } },
  { name: 'medium', config: { vocabSize: 64, dModel: 256, nLayers: 4, nHeads: 4, dFF: 1024, maxSeqLen: 128 } },
];

function flag(args: readonly string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : undefined;
}

/** Runs the benchmark; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const backends = (flag(args, '--backends') ?? 'tensorflow,wasm').split(',') as BackendName[];
  const sizes = (flag(args, '--sizes') ?? 'small,medium').split(',');
  const batch = Number(flag(args, '--batch') ?? 32);
  const newTokens = Number(flag(args, '--new') ?? 64);
  const quiet = { info: (): void => undefined };
  const rows: Record<string, unknown>[] = [];
  for (const backend of backends) {
    try {
      await initBackend(backend, { logger: quiet });
    } catch (error) {
      console.log(JSON.stringify({ bench: 'sample', backend, skipped: error instanceof Error ? error.message : String(error) }));
      continue;
    }
    for (const c of CASES.filter((k) => sizes.includes(k.name))) {
      const row = await runCase(backend, c, batch, newTokens);
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  }
  if (args.includes('--no-torch')) return;
  const torch = torchBySize(
    sizes.filter((name) => CASES.some((c) => c.name === name)),
    (size, threads) => [
      '--threads',
      String(threads),
      '--reps',
      '3',
      '--batch',
      String(batch),
      '--sample',
      String(newTokens),
      '--shape',
      torchShape(CASES.find((c) => c.name === size)!.config),
    ],
    'sample_tok_s',
  );
  console.log(JSON.stringify({ bench: 'sample-summary', rows: vsTorch(rows, 'kvTokensPerSecond', torch) }));
}

function makeRequests(c: SampleCase, batch: number, newTokens: number): GenerateRequest[] {
  const rng = createRng(5, 'bench-sample');
  return Array.from({ length: batch }, (_, i) => {
    const length = MIN_PROMPT + Math.floor(rng.next() * (MAX_PROMPT - MIN_PROMPT + 1));
    const promptTokens = Array.from({ length }, () => 3 + Math.floor(rng.next() * (c.config.vocabSize - 3)));
    // No stop tokens: every row generates exactly `newTokens`.
    return { promptTokens, maxTokens: newTokens, temperature: 1, seed: 1000 + i, stopTokens: [] };
  });
}

async function runCase(backend: BackendName, c: SampleCase, batch: number, newTokens: number): Promise<Record<string, unknown>> {
  const model = PolicyModel.create(c.config, 1);
  const requests = makeRequests(c, batch, newTokens);
  // Warm-up on a short run (kernel setup, first allocations).
  const warm = requests.map((r) => ({ ...r, maxTokens: 4 }));
  await model.generate(warm);
  await model.generateRecompute(warm);

  const timeIt = async (f: () => Promise<{ tokens: number[] }[]>): Promise<{ seconds: number; tokens: number; out: number[][] }> => {
    const start = performance.now();
    const out = await f();
    const seconds = (performance.now() - start) / 1000;
    return { seconds, tokens: out.reduce((n, r) => n + r.tokens.length, 0), out: out.map((r) => r.tokens) };
  };
  const before = tf.memory().numTensors;
  const kv = await timeIt(() => model.generate(requests));
  const full = await timeIt(() => model.generateRecompute(requests));
  const leaked = tf.memory().numTensors - before;
  const sameTokens = JSON.stringify(kv.out) === JSON.stringify(full.out);
  model.dispose();
  const kvRate = kv.tokens / kv.seconds;
  const fullRate = full.tokens / full.seconds;
  return {
    bench: 'sample',
    backend,
    size: c.name,
    ...c.config,
    batch,
    newTokens,
    promptLength: [MIN_PROMPT, MAX_PROMPT],
    kvTokensPerSecond: Math.round(kvRate),
    recomputeTokensPerSecond: Math.round(fullRate),
    speedup: Number((kvRate / fullRate).toFixed(2)),
    kvSeconds: Number(kv.seconds.toFixed(2)),
    recomputeSeconds: Number(full.seconds.toFixed(2)),
    sameTokens,
    leakedTensors: leaked,
  };
}
