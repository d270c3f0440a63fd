/**
 * Cost of one KV-cache decoding step of SmolLM2-135M (the model directory at `~/.cache/rxrl-models/SmolLM2-135M-Instruct`,
 * or a random model of its shape when that is absent), 16 rows and a 45-token prompt as a GRPO group samples, on the
 * base model and on a view with a rank-16 LoRA adapter on all seven projections; for each, generation reading the
 * variables (the unfused path, as training reads them) and the fused, adapter-merged sampling weights; and on the
 * native backend each of those op by op (`eager`) and as one TensorFlow graph (`graph`, `PolicyModel.setGraphDecoding`).
 * The variants run interleaved in one process (the machine's load drifts); kernels per step (those dispatched from
 * JavaScript) are counted with `tf.profile`.
 *
 * Usage: `npm run bench -- decode [--backend tensorflow] [--rows 16] [--prompt 45] [--reps 10] [--new 16] [--model-dir DIR]`.
 * Prints the cost of building the fused copy (first build, and a rebuild as after each training step), one JSON
 * line per variant (`generateSeconds`: a whole `generate` of `--new` tokens per row, the fused one including a
 * rebuild of the copy), then a `decode-summary` line with the fused/variables ratios (eager) and the graph/eager
 * ratios.
 *
 * @packageDocumentation
 */
import { access } from 'node:fs/promises';
import { join } from 'node:path';

import * as tf from '@tensorflow/tfjs-core';

import { initBackend, type BackendName } from '../lib/model/backend.js';
import { graphSessionsAvailable } from '../lib/model/tfGraph.js';
import { padPrompts, type PromptBatch } from '../lib/model/generate.js';
import { LORA_TARGETS, LoraAdapter } from '../lib/model/lora.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { samplingWeightBytes, type BlockWeights, type SamplingLease } from '../lib/model/samplingWeights.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { SMOLLM2_135M, SMOLLM2_DIR } from './hf.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : fallback;
}

/** One measured way of decoding. */
interface Variant {
  readonly model: string;
  readonly path: 'variables' | 'fused';
  /** Op by op, or as one graph. */
  readonly exec: 'eager' | 'graph';
  readonly policy: PolicyModel;
  /** The blocks read (undefined: the variables). */
  blocks: readonly BlockWeights[] | undefined;
  readonly stepMs: number[];
  readonly prefillMs: number[];
}

type Caches = ReturnType<PolicyModel['prefillInternal']>['caches'];

function disposeCaches(caches: Caches): void {
  for (const c of caches) tf.dispose([c.k, c.v]);
}

/** One decoding step after the prompt (the caches are left as they are); resolves when its logits are read. */
async function step(v: Variant, caches: Caches, batch: PromptBatch): Promise<void> {
  v.policy.setGraphDecoding(v.exec === 'graph');
  const b = batch.rows;
  const tokens = Int32Array.from({ length: b }, (_, r) => 5 + r);
  const positions = Int32Array.from({ length: b }, () => batch.width);
  const mask = new Float32Array(b * (batch.width + 1)).fill(1);
  const out = v.policy.decodeInternal(tokens, positions, mask, caches, v.blocks);
  await out.logits.data();
  out.logits.dispose();
  disposeCaches(out.caches);
}

async function measure(v: Variant, batch: PromptBatch): Promise<void> {
  let start = performance.now();
  const { logits, caches } = v.policy.prefillInternal(batch, v.blocks);
  await logits.data();
  v.prefillMs.push(performance.now() - start);
  logits.dispose();
  await step(v, caches, batch); // warm
  start = performance.now();
  await step(v, caches, batch);
  v.stepMs.push(performance.now() - start);
  disposeCaches(caches);
}

async function kernelsPerStep(v: Variant, batch: PromptBatch): Promise<number> {
  const { logits, caches } = v.policy.prefillInternal(batch, v.blocks);
  logits.dispose();
  const info = await tf.profile(() => step(v, caches, batch));
  disposeCaches(caches);
  return info.kernels.length;
}

const median = (xs: readonly number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

/** Seconds of `generate` (16 new tokens per row, no stop token) with the policy's current sampling setting. */
async function generateSeconds(policy: PolicyModel, prompts: readonly number[][], newTokens: number): Promise<number> {
  const start = performance.now();
  await policy.generate(prompts.map((promptTokens, i) => ({ promptTokens, maxTokens: newTokens, seed: i, stopTokens: [] })));
  return (performance.now() - start) / 1000;
}

/** Runs the benchmark; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  await initBackend(flag(args, '--backend', 'tensorflow') as BackendName, { logger: { info: () => undefined } });
  const rows = Number(flag(args, '--rows', '16'));
  const promptLength = Number(flag(args, '--prompt', '45'));
  const reps = Number(flag(args, '--reps', '10'));
  const newTokens = Number(flag(args, '--new', '16'));
  const dir = flag(args, '--model-dir', SMOLLM2_DIR);
  const found = await access(join(dir, 'config.json')).then(
    () => true,
    () => false,
  );
  const base = found ? (await loadModelDir(dir)).model : PolicyModel.create(SMOLLM2_135M, 1);
  const adapter = LoraAdapter.create(base.config, { rank: 16, alpha: 32, targetModules: LORA_TARGETS }, 1);
  const view = PolicyModel.withAdapter(base, adapter);
  const V = base.config.vocabSize;
  const prompts = Array.from({ length: rows }, (_, i) =>
    Array.from({ length: promptLength }, (_, j) => 100 + ((i * 7 + j * 13) % Math.min(3000, V - 100))),
  );
  const batch = padPrompts(prompts);
  const variants: Variant[] = [];
  const leases: SamplingLease[] = [];
  for (const [name, policy] of [
    ['base', base],
    ['lora', view],
  ] as const) {
    // The first build, then a rebuild as after a training step (weightsChanged), which is what a GRPO step pays.
    const fuseMs: number[] = [];
    policy.setSamplingWeights(true); // graph decoding alone would read the variables
    let lease = policy.samplingLeaseInternal();
    for (let i = 0; i < 2; i++) {
      lease.release();
      policy.weightsChanged();
      const start = performance.now();
      lease = policy.samplingLeaseInternal();
      await lease.blocks[lease.blocks.length - 1].down.w.data();
      fuseMs.push(Math.round(performance.now() - start));
    }
    leases.push(lease);
    for (const exec of graphSessionsAvailable() ? (['eager', 'graph'] as const) : (['eager'] as const)) {
      variants.push({ model: name, path: 'variables', exec, policy, blocks: undefined, stepMs: [], prefillMs: [] });
      variants.push({ model: name, path: 'fused', exec, policy, blocks: lease.blocks, stepMs: [], prefillMs: [] });
    }
    console.log(
      JSON.stringify({ bench: 'decode-fuse', model: name, fuseMs, samplingWeightBytes: samplingWeightBytes(base.config, policy.adapter) }),
    );
  }
  for (let rep = 0; rep < reps; rep++) for (const v of variants) await measure(v, batch);
  const results: {
    model: string;
    path: string;
    exec: string;
    decodeMsPerStep: number;
    prefillSeconds: number;
    kernelsPerStep: number;
    generateSeconds: number;
  }[] = [];
  for (const v of variants) {
    v.policy.setSamplingWeights(v.path === 'fused');
    v.policy.setGraphDecoding(v.exec === 'graph');
    await generateSeconds(v.policy, prompts, 2); // builds what this way needs first (a graph)
    v.policy.weightsChanged(); // the fused copy is rebuilt in the measured generation, as after a training step
    const seconds = await generateSeconds(v.policy, prompts, newTokens);
    const row = {
      bench: 'decode',
      modelDir: found ? dir : null,
      model: v.model,
      path: v.path,
      exec: v.exec,
      rows,
      promptLength,
      decodeMsPerStep: Number(median(v.stepMs).toFixed(1)),
      prefillSeconds: Number((median(v.prefillMs) / 1000).toFixed(3)),
      kernelsPerStep: await kernelsPerStep(v, batch),
      generateSeconds: Number(seconds.toFixed(2)),
      newTokens,
    };
    results.push(row);
    console.log(JSON.stringify(row));
  }
  type Key = 'decodeMsPerStep' | 'prefillSeconds' | 'kernelsPerStep' | 'generateSeconds';
  const of = (model: string, path: string, exec: string, key: Key): number | undefined =>
    results.find((r) => r.model === model && r.path === path && r.exec === exec)?.[key];
  /** Each measure of `a` over `b`, where both ran. */
  const ratios = (a: (key: Key) => number | undefined, b: (key: Key) => number | undefined): Partial<Record<Key, number>> => {
    const keys: Key[] = ['decodeMsPerStep', 'prefillSeconds', 'kernelsPerStep', 'generateSeconds'];
    return Object.fromEntries(
      keys.flatMap((key) => {
        const [x, y] = [a(key), b(key)];
        return x === undefined || y === undefined ? [] : [[key, Number((x / y).toFixed(3))]];
      }),
    );
  };
  const models = ['base', 'lora'];
  console.log(
    JSON.stringify({
      bench: 'decode-summary',
      fusedOverVariables: Object.fromEntries(
        models.map((m) => [
          m,
          ratios(
            (k) => of(m, 'fused', 'eager', k),
            (k) => of(m, 'variables', 'eager', k),
          ),
        ]),
      ),
      graphOverEager: graphSessionsAvailable()
        ? Object.fromEntries(
            models.flatMap((m) =>
              ['fused', 'variables'].map((p) => [
                `${m}-${p}`,
                ratios(
                  (k) => of(m, p, 'graph', k),
                  (k) => of(m, p, 'eager', k),
                ),
              ]),
            ),
          )
        : null,
    }),
  );
  for (const lease of leases) lease.release();
  view.dispose();
  adapter.dispose();
  base.dispose();
}
