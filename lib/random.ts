/**
 * Small seeded pseudo-random numbers for shuffling and sampling: the same seed gives the same sequence on every
 * machine and backend.
 *
 * @packageDocumentation
 */

/** A seeded generator of uniform floats in [0, 1). */
export interface Rng {
  /** Next uniform float in [0, 1). */
  next(): number;
  /** Internal state, for checkpoints. */
  state(): number;
}

/**
 * Mulberry32: a 32-bit-state generator, fast and good enough for shuffling and sampling (not for cryptography).
 *
 * @param seed - any integer; equal seeds give equal sequences.
 */
export function createRng(seed: number): Rng {
  let s = seed >>> 0;
  return {
    next(): number {
      s = (s + 0x6d2b79f5) >>> 0;
      let t = s;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    },
    state(): number {
      return s;
    },
  };
}

/** Mixes several integers into one 32-bit seed (for per-epoch or per-request streams). */
export function mixSeed(...parts: readonly number[]): number {
  let h = 0x811c9dc5;
  for (const part of parts) {
    h = Math.imul(h ^ (part >>> 0), 0x01000193) >>> 0;
    h = Math.imul(h ^ (h >>> 13), 0x5bd1e995) >>> 0;
  }
  return h >>> 0;
}

/** Fisher–Yates shuffle of `0 .. n-1` driven by `rng`. */
export function shuffledIndices(n: number, rng: Rng): number[] {
  const out = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(rng.next() * (i + 1));
    const tmp = out[i];
    out[i] = out[j];
    out[j] = tmp;
  }
  return out;
}

/** A 32-bit FNV-1a hash of a string (stable across runs), for deriving seeds from ids. */
export function hashString(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) {
    h = Math.imul(h ^ text.charCodeAt(i), 0x01000193) >>> 0;
  }
  return h >>> 0;
}
