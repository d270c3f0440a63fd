import { describe, expect, it } from 'vitest';

import { encodeJson } from '../../lib/serve/protocol.js';
import { ITEMS_PER_TURN } from '../../lib/core/turns.js';

describe('encodeJson', () => {
  it('gives the UTF-8 of JSON.stringify in chunks, encoding a long top-level array over several turns of the event loop', async () => {
    const choices = Array.from({ length: 3 * ITEMS_PER_TURN + 1 }, (_, i) => ({
      index: i,
      text: `t"${i}\né`,
      logprobs: i % 2 ? null : { x: [1.5, -2] },
    }));
    const body = { id: 'cmpl-1', skipped: undefined, choices, holes: [1, undefined, 'a'], usage: { total_tokens: 3 } };
    let turns = 0;
    let ticking = true;
    const tick = (): void => {
      turns++;
      if (ticking) setImmediate(tick);
    };
    setImmediate(tick);
    const chunks = await encodeJson(body);
    ticking = false;
    expect(Buffer.concat(chunks).toString('utf8')).toBe(JSON.stringify(body));
    expect(chunks.length).toBe(5); // four slices of the choices, then the rest
    expect(turns).toBeGreaterThanOrEqual(3);
    const text = async (value: unknown): Promise<string> => Buffer.concat(await encodeJson(value)).toString('utf8');
    for (const value of [null, 'a', [1, 2], {}, 7, { a: 'é', b: [] }, { long: choices, after: 1 }, { before: 'x', long: choices }]) {
      expect(await text(value)).toBe(JSON.stringify(value));
    }
  });
});
