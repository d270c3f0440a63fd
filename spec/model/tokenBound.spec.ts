import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { HfTokenizer, loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { FIRST_COMPOSING_CODE_POINT, tokenCountBound } from '../../lib/model/tokenBound.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { mulberry32, randomInt, type Rng } from '../helpers/random.js';

const FIXTURES = ['tiny-llama', 'tiny-qwen2', 'tiny-qwen3'].map((name) =>
  fileURLToPath(new URL(`../fixtures/hf/${name}/`, import.meta.url)),
);

/** Pieces texts are made of: ASCII, accents precomposed and combining, Hangul jamo, emoji, runs of spaces, special tokens. */
const PIECES = [
  'a',
  'ab',
  ' ',
  '    ',
  '\n',
  'é',
  'e\u0301',
  '\u1100\u1161\u11a8',
  '\u03b1\u0313\u0300\u0345',
  '🙂',
  'Ω',
  '\u2126',
  '½',
  '<|im_end|>',
  '<|endoftext|>',
  '12',
  '!?',
  '\u0301\u0301',
];

function randomText(rng: Rng, pieces: readonly string[]): string {
  let text = '';
  const count = randomInt(rng, 0, 60);
  for (let i = 0; i < count; i++) text += pieces[randomInt(rng, 0, pieces.length - 1)];
  return text;
}

describe('Tokenizer.minTokens: a lower bound on the tokens of a text, without encoding it', () => {
  it.each(FIXTURES)('never passes the true count for the byte-level BPE of %s, and grows with the text', async (dir) => {
    const tokenizer = await loadTokenizer(dir);
    expect(tokenizer).toBeInstanceOf(HfTokenizer);
    const rng = mulberry32(31);
    for (let i = 0; i < 400; i++) {
      const text = randomText(rng, PIECES);
      expect(tokenizer.minTokens!(text)).toBeLessThanOrEqual(tokenizer.encode(text).length);
    }
    expect(tokenizer.minTokens!('ab '.repeat(10_000))).toBeGreaterThan(1000);
  });

  it('never passes the true count for the character tokenizer', () => {
    const tokenizer = new CharTokenizer();
    const rng = mulberry32(7);
    const pieces = ['a', 'b', '1', '+', '=', '<pad>', '<bos>', '<eos>'];
    for (let i = 0; i < 400; i++) {
      const text = randomText(rng, pieces);
      expect(tokenizer.minTokens(text)).toBeLessThanOrEqual(tokenizer.encode(text).length);
    }
    expect(tokenizer.minTokens('<eos>'.repeat(4))).toBe(4);
  });

  it('gives no bound where none provably holds: a deleting normalizer, a stripping added token, truncation, a non-BPE model', () => {
    const base = JSON.parse(readFileSync(`${FIXTURES[0]}tokenizer.json`, 'utf8')) as Record<string, unknown>;
    expect(tokenCountBound(base)).toBeTypeOf('function');
    expect(tokenCountBound({ ...base, normalizer: { type: 'Lowercase' } })).toBeUndefined();
    expect(tokenCountBound({ ...base, normalizer: { type: 'Sequence', normalizers: [{ type: 'StripAccents' }] } })).toBeUndefined();
    expect(tokenCountBound({ ...base, added_tokens: [{ id: 0, content: '<s>', rstrip: true }] })).toBeUndefined();
    expect(tokenCountBound({ ...base, truncation: { max_length: 8 } })).toBeUndefined();
    expect(tokenCountBound({ ...base, pre_tokenizer: { type: 'Whitespace' } })).toBeUndefined();
    expect(tokenCountBound({ ...base, model: { ...(base.model as object), type: 'WordPiece' } })).toBeUndefined();
  });

  it('rests on a fact of Unicode normalization, checked over every code point', () => {
    // Composition absorbs a code point into the one before only where it comes after the first in a canonical
    // decomposition. No code point below U+0300 decomposes (canonically or not) to a sequence starting with one.
    const absorbable = new Set<number>();
    for (let c = 0; c <= 0x10ffff; c++) {
      if (c >= 0xd800 && c <= 0xdfff) continue;
      for (const later of [...String.fromCodePoint(c).normalize('NFD')].slice(1)) absorbable.add(later.codePointAt(0)!);
    }
    expect(absorbable.has(0x301)).toBe(true); // combining acute
    expect(absorbable.has(0x1161)).toBe(true); // Hangul vowel
    for (let c = 0; c < FIRST_COMPOSING_CODE_POINT; c++) {
      for (const form of ['NFD', 'NFKD'] as const) {
        const first = String.fromCodePoint(c).normalize(form).codePointAt(0)!;
        if (absorbable.has(first)) expect.unreachable(`U+${c.toString(16)} decomposes (${form}) to a code point composition absorbs`);
      }
    }
    expect(Math.min(...absorbable)).toBe(FIRST_COMPOSING_CODE_POINT);
  });
});
