import { describe, expect, it } from 'vitest';

import { DecodeError, ConfigError } from '../../lib/core/errors.js';
import { CHAR_BOS_ID, CHAR_EOS_ID, CHAR_PAD_ID, CHAR_SPECIAL_LABELS, CharTokenizer, DEFAULT_ALPHABET } from '../../lib/model/tokenizer.js';

describe('CharTokenizer', () => {
  const tok = new CharTokenizer();

  it('reserves 0 = pad, 1 = bos, 2 = eos and numbers the alphabet after them', () => {
    expect([tok.padId, tok.bosId, tok.eosId]).toEqual([CHAR_PAD_ID, CHAR_BOS_ID, CHAR_EOS_ID]);
    expect([tok.padId, tok.bosId, tok.eosId]).toEqual([0, 1, 2]);
    expect(tok.encode('a')).toEqual([3]);
    expect(tok.vocabSize).toBe(DEFAULT_ALPHABET.length + 3);
    expect(tok.vocabSize).toBeLessThanOrEqual(64);
  });

  it('covers lowercase letters, digits and the task punctuation', () => {
    const text = 'abcdefghijklmnopqrstuvwxyz0123456789 =+-*>:,?.()';
    expect(tok.decode(tok.encode(text))).toBe(text);
  });

  it('round-trips text, with and without bos', () => {
    const text = 'q: 12+30=? a: 42.';
    const ids = tok.encode(text, { addBos: true });
    expect(ids[0]).toBe(CHAR_BOS_ID);
    expect(ids).toHaveLength(text.length + 1);
    expect(tok.decode(ids)).toBe(text);
    expect(tok.decode([...tok.encode(text), CHAR_EOS_ID, CHAR_PAD_ID])).toBe(text);
  });

  it('encodes the documented example', () => {
    expect(tok.encode('1+2=', { addBos: true })).toEqual([1, 30, 41, 31, 40]);
    expect(tok.decode([30, 41, 31, 2])).toBe('1+2');
  });

  it('throws a DecodeError naming an unknown character', () => {
    let caught: unknown;
    try {
      tok.encode('ab#c');
    } catch (error) {
      caught = error;
    }
    expect(caught).toBeInstanceOf(DecodeError);
    expect((caught as DecodeError).context).toMatchObject({ char: '#', index: 2 });
    expect((caught as DecodeError).message).toContain('"#"');
    expect(() => tok.encode('ABC')).toThrow(DecodeError);
  });

  it('rejects ids outside the vocabulary when decoding', () => {
    expect(() => tok.decode([tok.vocabSize])).toThrow(DecodeError);
    expect(() => tok.decode([-1])).toThrow(DecodeError);
  });

  it('builds from a custom alphabet and rejects repeated or empty ones', () => {
    const small = new CharTokenizer('xy');
    expect(small.vocabSize).toBe(5);
    expect(small.encode('yx')).toEqual([4, 3]);
    expect(() => new CharTokenizer('xx')).toThrow(ConfigError);
    expect(() => new CharTokenizer('')).toThrow(ConfigError);
  });

  it('stops at eos only and labels the specials <pad>, <bos>, <eos>', () => {
    expect(tok.stopIds).toEqual([CHAR_EOS_ID]);
    expect(CHAR_SPECIAL_LABELS).toEqual(['<pad>', '<bos>', '<eos>']);
    expect([0, 1, 2, 3].map((id) => tok.tokenLabel(id))).toEqual(['<pad>', '<bos>', '<eos>', 'a']);
    expect([0, 1, 2, 3].map((id) => tok.isSpecial(id))).toEqual([true, true, true, false]);
    expect(() => tok.tokenLabel(tok.vocabSize)).toThrow(DecodeError);
  });

  it('keeps special tokens in the text when asked, and reads their strings back as special ids', () => {
    const ids = tok.encode('ab', { addBos: true });
    expect(tok.decode([...ids, CHAR_EOS_ID], { skipSpecialTokens: false })).toBe('<bos>ab<eos>');
    expect(tok.decode([...ids, CHAR_EOS_ID], { skipSpecialTokens: true })).toBe('ab');
    expect(tok.encode('a<eos>b<pad>')).toEqual([3, CHAR_EOS_ID, 4, CHAR_PAD_ID]);
    expect(() => tok.encode('a<eo')).toThrow(DecodeError); // '<' is not in the default alphabet
    const wide = new CharTokenizer('a😀<b');
    expect(wide.encode('😀<b<bos>a')).toEqual([4, 5, 6, CHAR_BOS_ID, 3]);
    let caught: unknown;
    try {
      wide.encode('😀<bos>x');
    } catch (error) {
      caught = error;
    }
    expect((caught as DecodeError).context).toMatchObject({ char: 'x', index: 6 });
  });
});
