/** The specs' wait: a total bound, or, given a progress measure, a bound on the time without progress. */
import { describe, expect, it } from 'vitest';

import { waitFor } from './waitFor.js';

describe('waitFor', () => {
  it('without a progress measure, fails once its timeout passed in all', async () => {
    await expect(waitFor(() => false, { timeoutMs: 30, intervalMs: 5, what: 'never' })).rejects.toThrow(
      'waitFor timed out after 30 ms: never',
    );
  });

  it('goes on past its timeout while progress changes, however slowly the condition comes true', async () => {
    let polls = 0;
    const started = Date.now();
    // Progress on every poll; the condition holds only once the timeout has passed many times over.
    await waitFor(() => ++polls > 20 && Date.now() - started > 100, { timeoutMs: 1, intervalMs: 5, progress: () => polls });
    expect(polls).toBeGreaterThan(20);
  });

  it('fails when progress stops, naming what it awaited as it was then', async () => {
    let step = 0;
    const wait = waitFor(() => false, { timeoutMs: 50, intervalMs: 5, progress: () => Math.min(++step, 5), what: () => `step ${step}` });
    await expect(wait).rejects.toThrow(/waitFor timed out after 50 ms without progress: step \d+/);
  });
});
