import { describe, expect, it } from 'vitest';
import { spanSeconds } from '../../lib/observe/spans.js';

describe('spanSeconds', () => {
  it('counts overlapping spans once and adds disjoint ones', () => {
    expect(
      spanSeconds([
        [0, 1000],
        [500, 1500],
        [3000, 3500],
      ]),
    ).toBeCloseTo(2, 9);
    expect(
      spanSeconds([
        [3000, 3500],
        [0, 1000],
        [200, 300],
      ]),
    ).toBeCloseTo(1.5, 9);
  });

  it('joins touching spans and ignores empty or reversed ones', () => {
    expect(
      spanSeconds([
        [0, 1000],
        [1000, 2000],
      ]),
    ).toBeCloseTo(2, 9);
    expect(
      spanSeconds([
        [5, 5],
        [9, 2],
      ]),
    ).toBe(0);
    expect(spanSeconds([])).toBe(0);
  });

  it('matches a plain count over a millisecond grid on seeded random spans', () => {
    let seed = 7;
    const next = (): number => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    for (let trial = 0; trial < 20; trial++) {
      const spans = Array.from({ length: 8 }, (): [number, number] => {
        const start = Math.floor(next() * 200);
        return [start, start + Math.floor(next() * 60)];
      });
      const covered = Array.from({ length: 300 }, (_, ms) => spans.some(([a, b]) => ms >= a && ms < b)).filter(Boolean).length;
      expect(spanSeconds(spans)).toBeCloseTo(covered / 1000, 9);
    }
  });
});
