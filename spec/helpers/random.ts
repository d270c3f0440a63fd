import { createRng } from '../../lib/core/random.js';

/**
 * A tiny seeded PRNG for reproducible tests (mulberry32) and a few samplers on top of it.
 */

/** A source of uniform numbers in `[0, 1)`. */
export type Rng = () => number;

/**
 * A seeded test stream: the library's generator (`lib/core/random.ts`) as a plain function.
 *
 * @param seed - Any integer; equal seeds give equal sequences.
 * @returns A function returning uniform numbers in `[0, 1)`.
 */
export function mulberry32(seed: number): Rng {
  const rng = createRng(seed);
  return () => rng.next();
}

/** Uniform number in `[lo, hi)`. */
export function uniform(rng: Rng, lo: number, hi: number): number {
  return lo + (hi - lo) * rng();
}

/** Uniform integer in `[lo, hi]`. */
export function randomInt(rng: Rng, lo: number, hi: number): number {
  return lo + Math.floor(rng() * (hi - lo + 1));
}

/** Standard normal sample (Box–Muller). */
export function randomNormal(rng: Rng): number {
  const u = 1 - rng();
  const v = rng();
  return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
}

/** `n` uniform numbers in `[lo, hi)`, rounded to float32 so tensor and array versions see the same values. */
export function randomArray(rng: Rng, n: number, lo = -1, hi = 1): number[] {
  return Array.from({ length: n }, () => Math.fround(uniform(rng, lo, hi)));
}

/** A `rows × cols` matrix of float32-rounded uniform numbers in `[lo, hi)`. */
export function randomMatrix(rng: Rng, rows: number, cols: number, lo = -1, hi = 1): number[][] {
  return Array.from({ length: rows }, () => randomArray(rng, cols, lo, hi));
}

/**
 * A right-padded 0/1 mask: each row has a random length in `[0, cols]` (so some rows may be empty), and with
 * probability `holes` each kept token is masked out anyway (like tool output inside a multi-turn response).
 */
export function randomMask(rng: Rng, rows: number, cols: number, holes = 0.1): number[][] {
  return Array.from({ length: rows }, () => {
    const length = randomInt(rng, 0, cols);
    return Array.from({ length: cols }, (_, t) => (t < length && rng() >= holes ? 1 : 0));
  });
}
