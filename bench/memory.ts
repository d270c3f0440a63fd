/**
 * `npm run bench -- memory [--tasks N] [--batch B] [--train MS] [--modes sync,fully-async]`
 *
 * Bounded memory under a fast producer: a loader that can yield tasks far faster than the trainer consumes them
 * (its raw rate is measured and printed beside the trainer's), an instant engine, and a trainer that sleeps
 * `train` ms per batch of `batch` tasks. The admission gate must keep memory flat. After a warm-up of 100k tasks
 * (so V8 has sized its heap to the allocation rate) and a forced GC, RSS and heap are sampled every 20 ms:
 * `growthMB` is the peak RSS growth over that baseline, `heapPeakGrowthMB` the peak heap (garbage included) and
 * `retainedMB` the heap still live after a forced GC at the end (run with `--expose-gc`, as `npm run bench` does).
 * One JSON line per mode.
 */
import { lastValueFrom, toArray } from 'rxjs';
import type { StalenessMode } from '../lib/sync/gate.js';
import type { Task } from '../lib/core/types.js';
import { grpoPipeline } from '../pipelines/grpoPipeline.js';
import { LatencyEngine, SleepTrainer, constantEvaluator } from './_fakes.js';

function* tasks(n: number): Generator<Task> {
  for (let i = 0; i < n; i++) yield { id: `t${i}`, prompt: 'x' };
}

function option(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 ? args[i + 1] : fallback;
}

/** Raw rate of the loader alone (tasks/s), over `n` tasks. */
function loaderRate(n: number): number {
  const started = performance.now();
  let count = 0;
  for (const _ of tasks(n)) count++;
  return count / ((performance.now() - started) / 1000);
}

export async function main(args: readonly string[]): Promise<void> {
  const total = Number(option(args, 'tasks', '1000000'));
  const batch = Number(option(args, 'batch', '100'));
  const trainMs = Number(option(args, 'train', '2'));
  const modes = option(args, 'modes', 'sync,fully-async').split(',') as StalenessMode[];
  const producer = loaderRate(Math.min(total, 1_000_000));
  const trainer = (batch / trainMs) * 1000;
  for (const mode of modes) {
    const samples: number[] = [];
    const heap: number[] = [];
    const sample = (): void => {
      const usage = process.memoryUsage();
      samples.push(usage.rss);
      heap.push(usage.heapUsed);
    };
    // Warm up until the heap has sized itself to the allocation rate, then take the baseline.
    await run(mode, Math.min(total, 100_000), batch, trainMs);
    (globalThis as { gc?: () => void }).gc?.();
    const baseline = process.memoryUsage().rss;
    const heapBaseline = process.memoryUsage().heapUsed;
    const timer = setInterval(sample, 20);
    const started = performance.now();
    const steps = await run(mode, total, batch, trainMs);
    clearInterval(timer);
    sample();
    (globalThis as { gc?: () => void }).gc?.();
    const heapAfter = process.memoryUsage().heapUsed;
    const peak = Math.max(...samples);
    console.log(
      JSON.stringify({
        bench: 'memory',
        mode,
        tasks: total,
        batch,
        steps,
        seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
        loaderTasksPerS: Math.round(producer),
        trainerTasksPerS: Math.round(trainer),
        producerOverTrainer: Number((producer / trainer).toFixed(1)),
        baselineMB: Number((baseline / 2 ** 20).toFixed(1)),
        peakMB: Number((peak / 2 ** 20).toFixed(1)),
        growthMB: Number(((peak - baseline) / 2 ** 20).toFixed(1)),
        heapPeakGrowthMB: Number(((Math.max(...heap) - heapBaseline) / 2 ** 20).toFixed(1)),
        ...(typeof (globalThis as { gc?: unknown }).gc === 'function'
          ? { retainedMB: Number(((heapAfter - heapBaseline) / 2 ** 20).toFixed(2)) }
          : {}),
      }),
    );
  }
}

async function run(mode: StalenessMode, total: number, batch: number, trainMs: number): Promise<number> {
  const results = await lastValueFrom(
    grpoPipeline({
      tasks: tasks(total),
      engines: [new LatencyEngine()],
      trainer: new SleepTrainer(trainMs),
      evaluator: constantEvaluator,
      mode,
      capacity: 4 * batch,
      batchSize: batch,
      groupSize: 1,
      maxTokens: 2,
    }).pipe(toArray()),
  );
  return results.length;
}
