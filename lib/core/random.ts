/**
 * Seeded pseudo-random numbers on the CPU — weight initialization, shuffling and per-request sampling streams —
 * in one place. The same seed gives the same sequence on every machine and backend.
 *
 * The generator is mulberry32 (32-bit state, period 2^32), seeded through a murmur3-style hash of the seed and
 * optional string salts, so that nearby seeds give unrelated streams. It is fast and reproducible; it is not
 * cryptographic.
 *
 * @packageDocumentation
 */

/** A seeded source of uniform numbers in `[0, 1)`. */
export interface Rng {
  /** Next uniform number in `[0, 1)`. */
  next(): number;
}

/** 2^32, to map a 32-bit integer into `[0, 1)`. */
const UINT32_RANGE = 4_294_967_296;

/** Mixes 32 bits into a well-spread 32-bit value (murmur3 finalizer). */
function mix32(x: number): number {
  let h = x >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}

/**
 * Hashes a seed (any finite number; integers up to 2^53 keep all their bits) and optional string salts to one
 * 32-bit value. Use it to derive independent streams: `hashSeed(seed, groupId, String(runId))`.
 */
export function hashSeed(seed: number, ...salts: readonly string[]): number {
  const value = Number.isFinite(seed) ? Math.trunc(seed) : 0;
  const low = value >>> 0;
  const high = Math.floor(value / UINT32_RANGE) >>> 0;
  let h = mix32(low ^ 0x9e3779b9);
  h = mix32(h ^ high ^ 0x7f4a7c15);
  for (const salt of salts) {
    for (let i = 0; i < salt.length; i++) {
      h = mix32(h ^ salt.charCodeAt(i));
    }
    h = mix32(h ^ 0x2545f491);
  }
  return h;
}

/**
 * Creates a seeded generator; equal seeds (and salts) give equal streams.
 *
 * @param seed - Integer seed.
 * @param salts - Strings that select an independent stream for the same seed (for example a weight name).
 */
export function createRng(seed: number, ...salts: readonly string[]): Rng {
  let state = hashSeed(seed, ...salts);
  return {
    next(): number {
      state = (state + 0x6d2b79f5) >>> 0;
      let t = state;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / UINT32_RANGE;
    },
  };
}

/**
 * Fills a new array with normal draws `N(0, std²)` (Box–Muller).
 *
 * @param size - Number of values.
 * @param std - Standard deviation.
 * @param rng - Source of uniforms.
 */
export function normalArray(size: number, std: number, rng: Rng): Float32Array {
  const out = new Float32Array(size);
  for (let i = 0; i < size; i += 2) {
    const u1 = 1 - rng.next(); // (0, 1]: log stays finite
    const u2 = rng.next();
    const radius = Math.sqrt(-2 * Math.log(u1)) * std;
    out[i] = radius * Math.cos(2 * Math.PI * u2);
    if (i + 1 < size) {
      out[i + 1] = radius * Math.sin(2 * Math.PI * u2);
    }
  }
  return out;
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
