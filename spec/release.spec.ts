/**
 * A release that fails after an error never replaces it: the first error propagates with the release's failure
 * attached (`suppressed`) and reported; `PolicyModel.dispose` disposes every tensor even when one fails.
 */
import * as tf from '@tensorflow/tfjs-core';
import { beforeAll, describe, expect, it } from 'vitest';

import { disposeEach, releaseAfter, releasing, type WithSuppressed } from '../lib/core/release.js';
import { initBackend } from '../lib/model/backend.js';
import { PolicyModel } from '../lib/model/transformer.js';

const quiet = { info: (): void => undefined };

/** What `promise` rejects with (fails the test when it resolves). */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  const outcome = await promise.then(
    () => 'resolved',
    (error: unknown) => error,
  );
  expect(outcome).not.toBe('resolved');
  return outcome;
}

describe('releasing', () => {
  it('keeps the work’s error when the release fails after it, attaching and reporting the release’s', async () => {
    const first = new Error('step failed');
    const second = new Error('dispose failed');
    const reported: unknown[][] = [];
    const outcome = await rejection(
      releasing(
        () => Promise.reject(first),
        (failed) => {
          expect(failed).toBe(true);
          throw second;
        },
        (error, after) => reported.push([error, after]),
      ),
    );
    expect(outcome).toBe(first);
    expect((first as WithSuppressed).suppressed).toEqual([second]);
    expect(reported).toEqual([[second, first]]);
  });

  it('throws the release’s failure when the work succeeded, and returns the work’s value otherwise', async () => {
    const second = new Error('dispose failed');
    expect(
      await rejection(
        releasing(
          () => Promise.resolve(1),
          () => {
            throw second;
          },
        ),
      ),
    ).toBe(second);
    let released: boolean | undefined;
    expect(
      await releasing(
        () => Promise.resolve(2),
        (failed) => (released = failed),
      ),
    ).toBe(2);
    expect(released).toBe(false);
  });

  it('releaseAfter throws the given error whatever the release does, even a non-Error', async () => {
    expect(await rejection(releaseAfter('plain', () => Promise.reject(new Error('x'))))).toBe('plain');
  });

  it('disposeEach calls every disposal and throws the first failure, the later ones suppressed onto it', () => {
    const calls: number[] = [];
    const a = new Error('a');
    const b = new Error('b');
    let thrown: unknown;
    try {
      disposeEach([
        () => calls.push(1),
        () => {
          calls.push(2);
          throw a;
        },
        () => {
          calls.push(3);
          throw b;
        },
        () => calls.push(4),
      ]);
    } catch (error) {
      thrown = error;
    }
    expect(calls).toEqual([1, 2, 3, 4]);
    expect(thrown).toBe(a);
    expect((a as WithSuppressed).suppressed).toEqual([b]);
  });
});

describe('PolicyModel.dispose after a failure', () => {
  beforeAll(async () => {
    await initBackend('cpu', { logger: quiet });
  });

  it('disposes every tensor though one fails, and never masks the error the run failed with', async () => {
    const before = tf.memory().numTensors;
    const model = PolicyModel.create({ vocabSize: 11, dModel: 8, nLayers: 1, nHeads: 2, nKvHeads: 1, dFF: 16, maxSeqLen: 8 }, 1);
    // A backend that crashed with the step (wasm's `Aborted()` after an out-of-memory) fails the disposal of the
    // first weight; it stands in for that crash, which costs gigabytes to cause for real.
    const [broken] = model.trainableVariables();
    const dispose = broken.dispose.bind(broken);
    broken.dispose = () => {
      throw new Error('RuntimeError: Aborted()');
    };
    const stepFailed = new Error('the step failed first');
    const outcome = await rejection(
      releasing(
        () => Promise.reject(stepFailed),
        () => model.dispose(),
      ),
    );
    expect(outcome).toBe(stepFailed);
    expect(((stepFailed as WithSuppressed).suppressed?.[0] as Error).message).toBe('RuntimeError: Aborted()');
    // Every other tensor was disposed: only the broken weight remains.
    expect(tf.memory().numTensors).toBe(before + 1);
    dispose();
    expect(tf.memory().numTensors).toBe(before);
  });
});
