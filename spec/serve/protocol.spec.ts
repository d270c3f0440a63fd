import { describe, expect, it } from 'vitest';

import { encodeJson } from '../../lib/serve/protocol.js';
import { ITEMS_PER_TURN } from '../../lib/turns.js';

describe('encodeJson', () => {
  it('gives the text of JSON.stringify, encoding a long top-level array over several turns of the event loop', async () => {
    const choices = Array.from({ length: 3 * ITEMS_PER_TURN + 1 }, (_, i) => ({ index: i, text: `t"${i}\n`, logprobs: i % 2 ? null : { x: [1.5, -2] } }));
    const body = { id: 'cmpl-1', skipped: undefined, choices, holes: [1, undefined, 'a'], usage: { total_tokens: 3 } };
    let turns = 0;
    let ticking = true;
    const tick = (): void => {
      turns++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const text = await encodeJson(body);
    ticking = false;
    expect(text).toBe(JSON.stringify(body));
    expect(turns).toBeGreaterThanOrEqual(3);
    for (const value of [null, 'a', [1, 2], {}, 7]) expect(await encodeJson(value)).toBe(JSON.stringify(value));
  });
});
