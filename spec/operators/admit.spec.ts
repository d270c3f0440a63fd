import { Subscription } from 'rxjs';
import { describe, expect, it } from 'vitest';
import { admit } from '../../operators/admit.js';
import { AdmissionGate } from '../../lib/sync/gate.js';
import { ConfigError } from '../../lib/core/errors.js';
import type { Task } from '../../lib/core/types.js';
import { task } from '../helpers/fixtures.js';

const tick = (): Promise<void> => new Promise((resolve) => setTimeout(resolve, 5));

function counting(n: number): { source: AsyncIterable<Task>; pulled: () => number; finished: () => boolean } {
  let pulled = 0;
  let finished = false;
  return {
    source: (async function* () {
      try {
        for (let i = 0; i < n; i++) {
          pulled++;
          yield task(`t${i}`);
        }
      } finally {
        finished = true;
      }
    })(),
    pulled: () => pulled,
    finished: () => finished,
  };
}

describe('AdmissionGate and admit', () => {
  it('sync: admits batch b only once version b is published, and pulls nothing ahead of credit', async () => {
    const gate = new AdmissionGate({ mode: 'sync', tasksPerBatch: 2 });
    const loader = counting(6);
    const seen: string[] = [];
    let done = false;
    admit(loader.source, gate).subscribe({ next: (t) => seen.push(t.id), complete: () => (done = true) });
    await tick();
    expect(seen).toEqual(['t0', 't1']);
    expect(loader.pulled()).toBe(2);
    gate.publish(1);
    await tick();
    expect(seen).toEqual(['t0', 't1', 't2', 't3']);
    gate.publish(2);
    await tick();
    expect(seen).toHaveLength(6);
    gate.publish(3);
    await tick();
    expect(done).toBe(true);
  });

  it('batch-async: batch b may start at version b − η', async () => {
    const gate = new AdmissionGate({ mode: 'batch-async', tasksPerBatch: 2, stalenessThreshold: 2 });
    const loader = counting(10);
    const seen: string[] = [];
    admit(loader.source, gate).subscribe((t) => seen.push(t.id));
    await tick();
    expect(seen).toHaveLength(6); // batches 0, 1, 2 at version 0
    gate.publish(1);
    await tick();
    expect(seen).toHaveLength(8);
  });

  it('counts batches from startVersion (a resumed run): one version of credit per batch, not a flood', async () => {
    for (const [mode, eta] of [
      ['sync', 0],
      ['batch-async', 2],
    ] as const) {
      const gate = new AdmissionGate({ mode, tasksPerBatch: 2, stalenessThreshold: mode === 'sync' ? undefined : eta, startVersion: 10 });
      expect(gate.version).toBe(10);
      const seen: string[] = [];
      admit(counting(20).source, gate).subscribe((t) => seen.push(t.id));
      await tick();
      expect(seen, mode).toHaveLength(2 * (1 + eta)); // batches 0 … η at version 10
      gate.publish(11);
      await tick();
      expect(seen, mode).toHaveLength(2 * (2 + eta));
    }
    expect(() => new AdmissionGate({ mode: 'sync', tasksPerBatch: 2, startVersion: -1 })).toThrow(ConfigError);
  });

  it('fully-async: admits while untrained tasks stay under capacity', async () => {
    const gate = new AdmissionGate({ mode: 'fully-async', tasksPerBatch: 2, capacity: 3 });
    const loader = counting(10);
    const seen: string[] = [];
    admit(loader.source, gate).subscribe((t) => seen.push(t.id));
    await tick();
    expect(seen).toHaveLength(3);
    gate.publish(1, 2);
    await tick();
    expect(seen).toHaveLength(5);
  });

  it('admissionVersion: the version batch b waits for (startVersion + b − η, at least 0), none in fully-async', () => {
    const sync = new AdmissionGate({ mode: 'sync', tasksPerBatch: 2 });
    expect([0, 1, 2, 3, 4].map((i) => sync.admissionVersion(i))).toEqual([0, 0, 1, 1, 2]);
    const resumed = new AdmissionGate({ mode: 'batch-async', tasksPerBatch: 2, stalenessThreshold: 2, startVersion: 5 });
    expect([0, 2, 4, 6].map((i) => resumed.admissionVersion(i))).toEqual([3, 4, 5, 6]);
    const early = new AdmissionGate({ mode: 'batch-async', tasksPerBatch: 1, stalenessThreshold: 2 });
    expect([0, 1, 2, 3].map((i) => early.admissionVersion(i))).toEqual([0, 0, 0, 1]);
    // mayAdmit agrees: a task may start once its admission version is published.
    expect([0, 1, 2, 3, 4].map((i) => resumed.mayAdmit(2 * i))).toEqual([true, true, true, false, false]);
    expect(new AdmissionGate({ mode: 'fully-async', tasksPerBatch: 2 }).admissionVersion(7)).toBeUndefined();
  });

  it('unsubscribing stops the loader and runs its finally', async () => {
    const gate = new AdmissionGate({ mode: 'sync', tasksPerBatch: 2 });
    const loader = counting(100);
    const subscription: Subscription = admit(loader.source, gate).subscribe();
    await tick();
    subscription.unsubscribe();
    await tick();
    expect(loader.finished()).toBe(true);
    expect(loader.pulled()).toBe(2);
  });

  it('passes loader errors to the subscriber and rejects bad options', async () => {
    const gate = new AdmissionGate({ mode: 'sync', tasksPerBatch: 1 });
    const broken = (async function* () {
      yield task('a');
      throw new Error('disk gone');
    })();
    const error = await new Promise((resolve) => {
      admit(broken, gate).subscribe({ error: resolve });
      setTimeout(() => gate.publish(1), 5);
    });
    expect(error).toMatchObject({ message: 'disk gone' });
    expect(() => new AdmissionGate({ mode: 'batch-async', tasksPerBatch: 1, stalenessThreshold: 0 })).toThrow(ConfigError);
    expect(() => new AdmissionGate({ mode: 'bogus' as never, tasksPerBatch: 1 })).toThrow(/sync, batch-async, fully-async/);
    expect(() => new AdmissionGate({ mode: 'fully-async', tasksPerBatch: 4, capacity: 3 })).toThrow(/tasksPerBatch/);
  });
});
