import { Subject, from, lastValueFrom, take, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import { syncWeights } from '../../operators/syncWeights.js';
import { train } from '../../operators/train.js';
import type { NamedWeights } from '../../lib/model/types.js';
import type { StepResult, Trainer } from '../../lib/train/types.js';
import type { Batch } from '../../lib/core/types.js';
import { collate } from '../../lib/data/collate.js';
import { ScriptedEngine, traj } from '../helpers/fixtures.js';

const weights: NamedWeights = new Map([['w', { shape: [1], data: new Float32Array([0.5]) }]]);

class SlowTrainer implements Trainer {
  readonly modelTag = 'policy';
  step = 0;
  active = 0;
  maxActive = 0;
  constructor(private readonly fail = -1) {}
  async trainStep(batch: Batch, signal?: AbortSignal): Promise<StepResult> {
    this.active++;
    this.maxActive = Math.max(this.maxActive, this.active);
    try {
      await new Promise((resolve) => setTimeout(resolve, 5));
      signal?.throwIfAborted();
      if (this.step === this.fail) throw new Error('trainer broke');
      const step = this.step++;
      return {
        step,
        version: step + 1,
        metrics: { 'actor/rows': batch.size },
        skipped: false,
        trajectoryIds: batch.meta.trajectoryIds,
        weights: () => weights,
      };
    } finally {
      this.active--;
    }
  }
}

const batchOf = (name: string): Batch => collate([traj(`${name}@0`, 0), traj(`${name}@0`, 1)], { padId: 0, modelTag: 'policy' });

describe('train', () => {
  it('trains one batch at a time, in order, even when batches arrive together', async () => {
    const trainer = new SlowTrainer();
    const results = await lastValueFrom(from(['a', 'b', 'c'].map(batchOf)).pipe(train(trainer), toArray()));
    expect(results.map((r) => [r.step, r.version, r.trajectoryIds[0]])).toEqual([
      [0, 1, 'a@0/0'],
      [1, 2, 'b@0/0'],
      [2, 3, 'c@0/0'],
    ]);
    expect(trainer.maxActive).toBe(1);
  });

  it('passes trainer errors to the subscriber', async () => {
    await expect(lastValueFrom(from(['a', 'b'].map(batchOf)).pipe(train(new SlowTrainer(1))))).rejects.toThrow('trainer broke');
  });

  it('stops after take and aborts the step on signal', async () => {
    const trainer = new SlowTrainer();
    const input = new Subject<Batch>();
    const got: number[] = [];
    input.pipe(train(trainer), take(1)).subscribe((r) => got.push(r.step));
    input.next(batchOf('a'));
    input.next(batchOf('b'));
    await new Promise((resolve) => setTimeout(resolve, 30));
    expect(got).toEqual([0]);
    expect(trainer.step).toBe(1);

    const controller = new AbortController();
    const done = lastValueFrom(from([batchOf('a')]).pipe(train(new SlowTrainer(), { signal: controller.signal })));
    controller.abort();
    await expect(done).rejects.toMatchObject({ name: 'AbortError' });
  });
});

describe('syncWeights', () => {
  it('publishes every step to every engine before passing it on', async () => {
    const engines = [new ScriptedEngine(), new ScriptedEngine()];
    const published: number[] = [];
    const results = await lastValueFrom(
      from(['a', 'b'].map(batchOf)).pipe(
        train(new SlowTrainer()),
        syncWeights(engines, {
          onPublished: (v) => {
            published.push(v);
            expect(engines.every((e) => e.version === v)).toBe(true);
          },
        }),
        toArray(),
      ),
    );
    expect(results.map((r) => r.version)).toEqual([1, 2]);
    expect(published).toEqual([1, 2]);
    expect(engines.map((e) => e.loads.map((l) => l.version))).toEqual([
      [1, 2],
      [1, 2],
    ]);
    expect(engines[0].loads[0].names).toEqual(['w']);
  });

  it('copies the weights once for all engines, and not at all when every engine samples from the trainer', async () => {
    const counting = (): { trainer: SlowTrainer; copies: () => number } => {
      const trainer = new SlowTrainer();
      let copies = 0;
      const step = trainer.trainStep.bind(trainer);
      trainer.trainStep = async (batch, signal) => ({ ...(await step(batch, signal)), weights: () => (copies++, weights) });
      return { trainer, copies: () => copies };
    };
    const shared = Object.assign(new ScriptedEngine(), { sharesTrainerWeights: true });
    const sharing = counting();
    await lastValueFrom(from(['a', 'b'].map(batchOf)).pipe(train(sharing.trainer), syncWeights([shared])));
    expect(sharing.copies()).toBe(0);
    expect(shared.version).toBe(2);
    const mixed = counting();
    await lastValueFrom(
      from(['a', 'b'].map(batchOf)).pipe(train(mixed.trainer), syncWeights([new ScriptedEngine(), shared, new ScriptedEngine()])),
    );
    expect(mixed.copies()).toBe(2);
  });

  it('accounts for each step: the wait for its batch, preparation, training and sync add up to its wall time', async () => {
    // Each batch reaches the trainer 20 ms after the previous step; the trainer reports its own seconds.
    const slowSource = new Subject<Batch>();
    const results: StepResult[] = [];
    const done = new Promise<void>((resolve) =>
      slowSource
        .pipe(
          train({
            modelTag: 'policy',
            step: 0,
            trainStep: async (batch) => ({
              ...(await new SlowTrainer().trainStep(batch)),
              metrics: { 'timing/step_s': 0.005, 'timing/prepare_s': 0.001 },
            }),
          }),
          syncWeights([new ScriptedEngine()]),
        )
        .subscribe({ next: (r) => results.push(r), complete: resolve }),
    );
    for (const name of ['a', 'b']) {
      await new Promise((r) => setTimeout(r, 20));
      slowSource.next(batchOf(name));
      while (results.length < (name === 'a' ? 1 : 2)) await new Promise((r) => setTimeout(r, 2));
    }
    slowSource.complete();
    await done;
    for (const { metrics: m } of results) {
      for (const key of ['timing/wait_s', 'timing/sync_s', 'timing/total_s']) expect(m[key]).toBeGreaterThanOrEqual(0);
      expect(m['timing/wait_s'] + m['timing/prepare_s'] + m['timing/step_s'] + m['timing/sync_s']).toBeCloseTo(m['timing/total_s'], 9);
    }
  });

  it('passes load failures to the subscriber', async () => {
    const engine = new ScriptedEngine();
    engine.loadWeights = () => Promise.reject(new Error('disk full'));
    await expect(lastValueFrom(from([batchOf('a')]).pipe(train(new SlowTrainer()), syncWeights([engine])))).rejects.toThrow('disk full');
  });
});
