import * as tf from '@tensorflow/tfjs-core';
import { describe, expect, it } from 'vitest';

import { tokenLevelRewards } from '../../lib/algos/index.js';
import { ShapeError } from '../../lib/core/errors.js';
import { mulberry32, randomArray, randomInt, randomMask } from '../helpers/random.js';
import { expectClose, expectNoLeak, mat, useCpuBackend, values } from './support.js';

useCpuBackend();

/** Plain-loop reference: reward on the last index whose mask is 1. */
function referenceTokenRewards(rewards: number[], mask: number[][]): number[] {
  return mask.flatMap((row, b) => {
    const last = row.reduce((acc, m, t) => (m > 0 ? t : acc), -1);
    return row.map((_, t) => (t === last ? rewards[b] : 0));
  });
}

function place(rewards: number[], mask: number[][], width?: number): number[] {
  return tf.tidy(() => values(tokenLevelRewards(tf.tensor1d(rewards), mat(mask, width))));
}

describe('tokenLevelRewards', () => {
  it('puts the reward on the last unmasked token and nothing on all-zero rows', () => {
    const mask = [
      [1, 1, 0],
      [1, 0, 1],
      [0, 0, 0],
    ];
    expect(place([2, 5, 7], mask)).toEqual([0, 2, 0, 0, 0, 5, 0, 0, 0]);
  });

  it('keeps ±1e4 rewards exact and a NaN reward in its own row', () => {
    const out = place(
      [1e4, -1e4, NaN],
      [
        [1, 0],
        [1, 1],
        [0, 1],
      ],
    );
    expect(out.slice(0, 4)).toEqual([1e4, 0, 0, -1e4]);
    expect(out[4]).toBe(0);
    expect(out[5]).toBeNaN();
  });

  it('agrees with a plain-loop reference on seeded random inputs', () => {
    for (let seed = 1; seed <= 20; seed++) {
      const rng = mulberry32(seed);
      const rows = randomInt(rng, 1, 8);
      const width = randomInt(rng, 1, 10);
      const rewards = randomArray(rng, rows, -5, 5);
      const mask = randomMask(rng, rows, width, 0.3);
      expectClose(place(rewards, mask), referenceTokenRewards(rewards, mask));
    }
  });

  it('handles empty batches and zero-width responses', () => {
    expect(place([], [], 4)).toEqual([]);
    expect(tf.tidy(() => tokenLevelRewards(tf.tensor1d([1, 2]), tf.zeros([2, 0])).shape)).toEqual([2, 0]);
  });

  it('leaks no tensors and checks shapes', () => {
    const rewards = tf.tensor1d([1, 2]);
    const mask = mat([
      [1, 0],
      [1, 1],
    ]);
    expectNoLeak(() => tokenLevelRewards(rewards, mask));
    expect(() => tokenLevelRewards(tf.tensor1d([1]), mask)).toThrow(ShapeError);
    tf.dispose([rewards, mask]);
  });
});
