/**
 * The PyTorch CPU reference shared by benchmarks: runs `bench/torch_hf.py` and reads its JSON line, and the ratio
 * helper their summaries use.
 *
 * @packageDocumentation
 */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import type { PolicyConfig } from '../lib/model/transformer.js';

/**
 * Runs `python3 bench/torch_hf.py <args>` and returns its last JSON line; a failure (no python3, a crash) is a
 * `{ bench: 'hf-torch', skipped }` record, like the script's own when torch is missing.
 */
export function runTorchHf(args: readonly string[]): Record<string, unknown> {
  const script = fileURLToPath(new URL('../../bench/torch_hf.py', import.meta.url));
  const run = spawnSync('python3', [script, ...args], { encoding: 'utf8', maxBuffer: 16 << 20 });
  if (run.status !== 0) {
    return {
      bench: 'hf-torch',
      skipped: `python3 ${script} failed: ${(run.stderr || run.error?.message || '').trim().split('\n').at(-1)}`,
    };
  }
  return JSON.parse(run.stdout.trim().split('\n').at(-1)!) as Record<string, unknown>;
}

/** `a / b` to 3 decimals, or null when either is not a number (a skipped side). */
export function ratio(a: unknown, b: unknown): number | null {
  return typeof a === 'number' && typeof b === 'number' && b > 0 ? Number((a / b).toFixed(3)) : null;
}

/** The `--shape` JSON of `bench/torch_hf.py`: the `LlamaConfig` fields of a policy configuration. */
export function torchShape(config: PolicyConfig): string {
  return JSON.stringify({
    vocab_size: config.vocabSize,
    hidden_size: config.dModel,
    intermediate_size: config.dFF,
    num_hidden_layers: config.nLayers,
    num_attention_heads: config.nHeads,
    num_key_value_heads: config.nKvHeads ?? config.nHeads,
    max_position_embeddings: config.maxSeqLen,
    tie_word_embeddings: config.tieWordEmbeddings ?? false,
    rope_theta: config.ropeTheta ?? 10_000,
  });
}

/** PyTorch's figure for one size, with 2 threads and with 1. */
export interface TorchPair {
  readonly t2: unknown;
  readonly t1: unknown;
}

/**
 * Runs `bench/torch_hf.py` with 2 threads and with 1 for each size, prints both records (tagged with the size)
 * and returns each size's `field`.
 */
export function torchBySize(
  sizes: readonly string[],
  args: (size: string, threads: number) => string[],
  field: string,
): Map<string, TorchPair> {
  const out = new Map<string, TorchPair>();
  for (const size of sizes) {
    const [t2, t1] = [2, 1].map((threads) => runTorchHf(args(size, threads)));
    console.log(JSON.stringify({ ...t2, size }));
    console.log(JSON.stringify({ ...t1, size }));
    out.set(size, { t2: t2[field], t1: t1[field] });
  }
  return out;
}

/** Each benchmark row's backend, size and `field`, with that as a ratio to PyTorch's (2 threads and 1) at its size. */
export function vsTorch(
  rows: readonly Record<string, unknown>[],
  field: string,
  torch: ReadonlyMap<string, TorchPair>,
): Record<string, unknown>[] {
  return rows.map((r) => ({
    backend: r.backend,
    size: r.size,
    [field]: r[field],
    vs_torch_2_threads: ratio(r[field], torch.get(String(r.size))?.t2),
    vs_torch_1_thread: ratio(r[field], torch.get(String(r.size))?.t1),
  }));
}
