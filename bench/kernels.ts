/**
 * `npm run bench -- kernels [--backend tensorflow] [--mode full|lora] [--batch 16] [--seq 48] [--lora 16] [--reps 3]
 * [--top 15] [--model-dir DIR]`
 *
 * Where one training step of the SmolLM2-135M model goes, kernel by kernel: the step `bench hf` times (the mean
 * next-token NLL's gradient, then the trainer's Adam over every weight, `--mode full`, or over a rank-`--lora`
 * adapter, `--mode lora`), timed plainly (`step_s`, the median of `--reps` after a warm-up), then once more with
 * every kernel dispatch timed by wrapping TF.js's engine:
 *
 * - `kernels`: the step's seconds with and without the timing, its kernels in each phase (`forward`: under the
 *   gradient tape; `backward`: inside the tape's backward pass; `optimizer`: the rest), their summed
 *   milliseconds, and how many of them returned their input's data (`shared`: a reshape to the same shape or a
 *   cast to the same dtype, which run no TensorFlow op and copy nothing); what the phases' kernels do not account
 *   for is TF.js's own work between kernels (tape, scopes, gradient accumulation) and the binding's;
 * - `kernels-top`, one per phase: the `--top` kernels by milliseconds (`count`, `ms`, `share` of the phase);
 * - `kernels-grad`: the backward by the forward op whose gradient it is (inclusive milliseconds and kernels of each
 *   gradient function, the `--top` largest), and how many output gradients TF.js filled with zeros made in
 *   JavaScript (`zero_dy`, with their bytes: each one is a host array copied to the device).
 *
 * A kernel's milliseconds are the host's time in its dispatch. On the CPU backends that is the kernel's own time; on
 * a GPU the device runs asynchronously, so run it with `CUDA_LAUNCH_BLOCKING=1` to charge each kernel its GPU time
 * (and without it to see the dispatch alone).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { initBackend, type BackendName } from '../lib/model/backend.js';
import { loadModelDir } from '../lib/model/modelDir.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { LORA_TARGETS } from '../lib/model/adapter.js';
import { LoraAdapter } from '../lib/model/lora.js';
import { adamStepper, benchRows, timed, defaultModelDir, SMOLLM2_135M } from './hf.js';
import { ConfigError } from '../lib/core/errors.js';
import { benchArgs } from './_args.js';

type Phase = 'forward' | 'backward' | 'optimizer';

interface Tally {
  count: number;
  ms: number;
  /** Of `count`, the kernels whose output is one of their inputs' data. */
  shared: number;
}

/** The part of TF.js's engine the timing wraps (private in its typings, stable across 4.x). */
interface EngineInternals {
  runKernelFunc(params: { kernelName?: string; inputs?: Record<string, tf.Tensor | undefined> }): unknown;
  addTapeNode(kernelName: string, ...rest: unknown[]): void;
  state: {
    kernelDepth: number;
    scopeStack: { name: string }[];
    activeTape: { kernelName: string; gradient?: (dys: (tf.Tensor | null)[]) => unknown }[] | null;
  };
}

/** Kernel times by phase and name, gradient functions by forward op, zero-filled gradients. */
class KernelClock {
  readonly byPhase: Record<Phase, Map<string, Tally>> = { forward: new Map(), backward: new Map(), optimizer: new Map() };
  readonly byGradient = new Map<string, Tally & { kernels: number }>();
  zeroDy = { count: 0, bytes: 0 };
  /** Top-level kernels dispatched so far (a gradient function is charged the difference across its call). */
  private kernelCount = 0;
  private restore: (() => void) | undefined;

  install(): void {
    const engine = tf.engine() as unknown as EngineInternals;
    const runKernelFunc = engine.runKernelFunc;
    const addTapeNode = engine.addTapeNode;
    engine.runKernelFunc = (params) => {
      if (engine.state.kernelDepth > 0) return runKernelFunc.call(engine, params);
      const start = performance.now();
      const out = runKernelFunc.call(engine, params);
      this.add(
        this.byPhase[phaseOf(engine)],
        params.kernelName ?? `customGrad:${engine.state.scopeStack.at(-1)?.name ?? ''}`,
        performance.now() - start,
        sharesInput(params.inputs, out),
      );
      this.kernelCount++;
      return out;
    };
    engine.addTapeNode = (kernelName, ...rest) => {
      addTapeNode.call(engine, kernelName, ...rest);
      const node = engine.state.activeTape?.at(-1);
      const gradient = node?.gradient;
      if (node === undefined || gradient === undefined) return;
      const outputs = rest[1] as tf.Tensor[];
      node.gradient = (dys) => {
        dys.forEach((dy, i) => {
          if (dy !== null && dy !== undefined) return;
          this.zeroDy.count++;
          this.zeroDy.bytes += (outputs[i]?.size ?? 0) * 4;
        });
        const tally = this.byGradient.get(kernelName) ?? { count: 0, ms: 0, shared: 0, kernels: 0 };
        this.byGradient.set(kernelName, tally);
        tally.count++;
        // A gradient function returns one thunk per input; the kernels run when the backward pass calls them.
        const thunks = this.charged(tally, () => gradient(dys)) as Record<string, () => unknown>;
        return Object.fromEntries(Object.entries(thunks).map(([input, thunk]) => [input, () => this.charged(tally, thunk)]));
      };
    };
    this.restore = () => {
      engine.runKernelFunc = runKernelFunc;
      engine.addTapeNode = addTapeNode;
    };
  }

  /** Runs `fn`, adding its milliseconds and top-level kernels to `tally`. */
  private charged(tally: Tally & { kernels: number }, fn: () => unknown): unknown {
    const [kernels, start] = [this.kernelCount, performance.now()];
    try {
      return fn();
    } finally {
      tally.ms += performance.now() - start;
      tally.kernels += this.kernelCount - kernels;
    }
  }

  uninstall(): void {
    this.restore?.();
  }

  private add(into: Map<string, Tally>, name: string, ms: number, shared: boolean): void {
    const tally = into.get(name) ?? { count: 0, ms: 0, shared: 0 };
    tally.count++;
    tally.ms += ms;
    if (shared) tally.shared++;
    into.set(name, tally);
  }
}

/** Whether a kernel's output is the data of one of its inputs (it computed and copied nothing). */
function sharesInput(inputs: Record<string, tf.Tensor | undefined> | undefined, out: unknown): boolean {
  const ids = new Set(Object.values(inputs ?? {}).map((t) => t?.dataId));
  return (Array.isArray(out) ? out : [out]).some((t) => t instanceof tf.Tensor && ids.has(t.dataId));
}

/** The phase a kernel runs in, from the engine's scope names (`tf.variableGrads` runs `forward`, then `backward`). */
function phaseOf(engine: EngineInternals): Phase {
  const names = engine.state.scopeStack.map((s) => s.name);
  if (names.includes('backward')) return 'backward';
  return names.includes('forward') ? 'forward' : 'optimizer';
}

const round = (x: number, digits = 1): number => Number(x.toFixed(digits));

function top(tallies: Map<string, Tally>, n: number): { name: string; count: number; shared: number; ms: number; share: number }[] {
  const total = [...tallies.values()].reduce((s, t) => s + t.ms, 0);
  return [...tallies.entries()]
    .sort((a, b) => b[1].ms - a[1].ms)
    .slice(0, n)
    .map(([name, t]) => ({ name, count: t.count, shared: t.shared, ms: round(t.ms), share: round(t.ms / Math.max(total, 1e-9), 3) }));
}

function phaseTotals(clock: KernelClock): Record<Phase, Tally> {
  const sum = (m: Map<string, Tally>): Tally =>
    [...m.values()].reduce((s, t) => ({ count: s.count + t.count, ms: round(s.ms + t.ms), shared: s.shared + t.shared }), {
      count: 0,
      ms: 0,
      shared: 0,
    });
  return { forward: sum(clock.byPhase.forward), backward: sum(clock.byPhase.backward), optimizer: sum(clock.byPhase.optimizer) };
}

export async function main(args: readonly string[]): Promise<void> {
  const { value, int } = benchArgs(args);
  const backend = (value('backend') ?? 'tensorflow') as BackendName;
  const mode = value('mode') ?? 'full';
  if (mode !== 'full' && mode !== 'lora')
    throw new ConfigError(`bench kernels: --mode must be full or lora, got ${mode}`, { context: { key: 'mode' } });
  const [B, T, reps, rank, n] = [int('batch', 16), int('seq', 48), int('reps', 3), int('lora', 16), int('top', 15)];
  const modelDir = value('model-dir') ?? defaultModelDir();
  await initBackend(backend, { logger: { info: () => undefined } });
  const base = modelDir ? (await loadModelDir(modelDir)).model : PolicyModel.create(SMOLLM2_135M, 1);
  const adapter = mode === 'lora' ? LoraAdapter.create(base.config, { rank, alpha: 2 * rank, targetModules: LORA_TARGETS }, 1) : null;
  const model = adapter ? PolicyModel.withAdapter(base, adapter) : base;
  const rows = benchRows(B, T, base.config.vocabSize);
  const { step, dispose } = adamStepper(model, rows);
  try {
    const stepS = await timed(step, reps);
    const clock = new KernelClock();
    clock.install();
    const start = performance.now();
    try {
      await step();
    } finally {
      clock.uninstall();
    }
    const hookedS = (performance.now() - start) / 1000;
    const phases = phaseTotals(clock);
    const kernelMs = phases.forward.ms + phases.backward.ms + phases.optimizer.ms;
    console.log(
      JSON.stringify({
        bench: 'kernels',
        backend: tf.getBackend(),
        mode,
        batch: B,
        seq: T,
        ...(adapter ? { lora_rank: rank } : {}),
        cuda_launch_blocking: process.env.CUDA_LAUNCH_BLOCKING ?? null,
        step_s: round(stepS, 3),
        timed_step_s: round(hookedS, 3),
        kernel_ms: round(kernelMs),
        phases,
        between_kernels_ms: round(hookedS * 1000 - kernelMs),
      }),
    );
    for (const phase of ['forward', 'backward', 'optimizer'] as const) {
      console.log(JSON.stringify({ bench: 'kernels-top', phase, rows: top(clock.byPhase[phase], n) }));
    }
    const grads = [...clock.byGradient.entries()].sort((a, b) => b[1].ms - a[1].ms).slice(0, n);
    console.log(
      JSON.stringify({
        bench: 'kernels-grad',
        zero_dy: clock.zeroDy,
        rows: grads.map(([op, t]) => ({ op, count: t.count, kernels: t.kernels, ms: round(t.ms) })),
      }),
    );
  } finally {
    dispose();
    tf.dispose(Object.values(rows));
    if (adapter) {
      model.dispose();
      adapter.dispose();
    }
    base.dispose();
  }
}
