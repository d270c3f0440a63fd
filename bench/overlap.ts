/**
 * `npm run bench -- overlap [--steps N] [--batch B] [--group G] [--train MS] [--lo MS] [--hi MS]
 *   [--tail P] [--tail-lo MS] [--tail-hi MS] [--seed S]`
 *
 * How well each staleness mode overlaps rollouts with training. The real `grpoPipeline` runs with an engine
 * that sleeps for a latency drawn per sample (uniform `lo..hi` ms, and with probability `tail` a long-tail
 * latency `tailLo..tailHi` ms) and a trainer whose step sleeps `train` ms. A sample's latency is a function of its
 * seed, which depends only on its group and run id, so every mode sees exactly the same latencies.
 *
 * For each mode the ideal time is computed from the same latencies by a zero-overhead simulation of that
 * mode's rules (unbounded rollout parallelism; batch `b` admitted once step `b − η − 1` has ended; fully-async
 * admits a task while fewer than `capacity` are untrained). One JSON line per mode:
 * `{ bench, mode, eta, steps, measuredMs, idealMs, efficiency = ideal / measured }`, then a summary line with
 * speedups over sync.
 */
import { lastValueFrom, toArray } from 'rxjs';
import { createRng, hashSeed } from '../lib/core/random.js';
import type { StalenessMode } from '../lib/sync/gate.js';
import type { Task } from '../lib/core/types.js';
import { groupIdOf } from '../operators/rollout.js';
import { grpoPipeline } from '../pipelines/grpoPipeline.js';
import { LatencyEngine, SleepTrainer, constantEvaluator } from './_fakes.js';

interface Settings {
  readonly steps: number;
  readonly batch: number;
  readonly group: number;
  readonly trainMs: number;
  readonly lo: number;
  readonly hi: number;
  readonly tail: number;
  readonly tailLo: number;
  readonly tailHi: number;
  readonly seed: number;
}

/** Latency (ms) of the sample whose sampling seed is `seed`. */
function latencyOf(seed: number, s: Settings): number {
  const rng = createRng(seed, 'latency');
  const tail = rng.next() < s.tail;
  const u = rng.next();
  return tail ? s.tailLo + u * (s.tailHi - s.tailLo) : s.lo + u * (s.hi - s.lo);
}

/** Rollout time of each task: the slowest of its samples (unbounded parallelism). */
function taskTimes(tasks: readonly Task[], s: Settings): number[] {
  return tasks.map((task) => {
    let worst = 0;
    for (let run = 0; run < s.group; run++) {
      worst = Math.max(worst, latencyOf(hashSeed(s.seed, groupIdOf(task), String(run)), s));
    }
    return worst;
  });
}

/** Ideal wall time of sync / batch-async (η) under zero overhead: ordered batches. */
function idealOrdered(times: readonly number[], eta: number, s: Settings): number {
  const trainEnd: number[] = [];
  let admitted = 0;
  for (let b = 0; b < s.steps; b++) {
    const gateOpen = b - eta - 1 >= 0 ? trainEnd[b - eta - 1] : 0;
    admitted = Math.max(admitted, gateOpen);
    const rolloutEnd = admitted + Math.max(...times.slice(b * s.batch, (b + 1) * s.batch));
    const start = Math.max(rolloutEnd, b > 0 ? trainEnd[b - 1] : 0);
    trainEnd.push(start + s.trainMs);
  }
  return trainEnd[s.steps - 1];
}

/** Ideal wall time of fully-async under zero overhead: capacity-bounded admission, completion-order batches. */
function idealFullyAsync(times: readonly number[], capacity: number, s: Settings): number {
  const done: number[] = []; // completion times of admitted, untrained groups
  let next = 0;
  const admitAt = (t: number, n: number): void => {
    for (let i = 0; i < n && next < times.length; i++, next++) done.push(t + times[next]);
  };
  admitAt(0, capacity);
  let trainEnd = 0;
  for (let step = 0; step < s.steps; step++) {
    done.sort((a, b) => a - b);
    const batch = done.splice(0, s.batch);
    const start = Math.max(trainEnd, batch[batch.length - 1]);
    trainEnd = start + s.trainMs;
    admitAt(trainEnd, s.batch);
  }
  return trainEnd;
}

async function measure(mode: StalenessMode, eta: number, capacity: number, tasks: readonly Task[], s: Settings): Promise<number> {
  const engine = new LatencyEngine((request) => latencyOf(request.seed ?? 0, s));
  const trainer = new SleepTrainer(s.trainMs);
  const started = performance.now();
  await lastValueFrom(
    grpoPipeline({
      tasks: [...tasks],
      engines: [engine],
      trainer,
      evaluator: constantEvaluator,
      mode,
      stalenessThreshold: eta,
      capacity,
      batchSize: s.batch,
      groupSize: s.group,
      maxTokens: 2,
      steps: s.steps,
      seed: s.seed,
    }).pipe(toArray()),
  );
  return performance.now() - started;
}

function option(args: readonly string[], name: string, fallback: number): number {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? Number(args[i + 1]) : fallback;
}

export async function main(args: readonly string[]): Promise<void> {
  const s: Settings = {
    steps: option(args, 'steps', 20),
    batch: option(args, 'batch', 8),
    group: option(args, 'group', 4),
    trainMs: option(args, 'train', 60),
    lo: option(args, 'lo', 20),
    hi: option(args, 'hi', 60),
    tail: option(args, 'tail', 0.05),
    tailLo: option(args, 'tail-lo', 150),
    tailHi: option(args, 'tail-hi', 300),
    seed: option(args, 'seed', 1),
  };
  const tasks: Task[] = Array.from({ length: (s.steps + 4) * s.batch }, (_, i) => ({ id: `t${i}`, prompt: 'x' }));
  const times = taskTimes(tasks, s);
  const capacity = 2 * s.batch;
  const modes: { mode: StalenessMode; eta: number; ideal: number }[] = [
    { mode: 'sync', eta: 0, ideal: idealOrdered(times, 0, s) },
    { mode: 'batch-async', eta: 1, ideal: idealOrdered(times, 1, s) },
    { mode: 'batch-async', eta: 2, ideal: idealOrdered(times, 2, s) },
    { mode: 'fully-async', eta: Infinity, ideal: idealFullyAsync(times, capacity, s) },
  ];
  const measured: number[] = [];
  for (const { mode, eta, ideal } of modes) {
    const ms = await measure(mode, eta, capacity, tasks, s);
    measured.push(ms);
    console.log(
      JSON.stringify({
        bench: 'overlap',
        mode,
        eta: Number.isFinite(eta) ? eta : null,
        ...(mode === 'fully-async' ? { capacity } : {}),
        steps: s.steps,
        measuredMs: Math.round(ms),
        idealMs: Math.round(ideal),
        efficiency: Number((ideal / ms).toFixed(3)),
      }),
    );
  }
  console.log(
    JSON.stringify({
      bench: 'overlap',
      summary: true,
      settings: s,
      speedupOverSync: {
        'batch-async-1': Number((measured[0] / measured[1]).toFixed(3)),
        'batch-async-2': Number((measured[0] / measured[2]).toFixed(3)),
        'fully-async': Number((measured[0] / measured[3]).toFixed(3)),
      },
    }),
  );
}
