/**
 * A character-level tokenizer for the bundled toy tasks.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../engine/types.js';
import { ConfigError, DecodeError } from '../errors.js';

/** Id of the padding token of every {@link CharTokenizer}. */
export const CHAR_PAD_ID = 0;
/** Id of the beginning-of-sequence token of every {@link CharTokenizer}. */
export const CHAR_BOS_ID = 1;
/** Id of the end-of-sequence (stop) token of every {@link CharTokenizer}. */
export const CHAR_EOS_ID = 2;
/** Number of special tokens placed before the alphabet. */
export const CHAR_SPECIAL_TOKENS = 3;

/**
 * Alphabet of the bundled tasks: `a`–`z`, `0`–`9` and ` =+-*>:,?.()`. With the three special tokens the
 * vocabulary has 51 ids.
 */
export const DEFAULT_ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789 =+-*>:,?.()';

/**
 * Maps each character of an alphabet to one id: `0` = pad, `1` = bos, `2` = eos, then the alphabet in order.
 *
 * @example
 * ```ts
 * const tok = new CharTokenizer();
 * tok.encode('1+2=', { addBos: true }); // [1, 30, 41, 31, 40]
 * tok.decode([30, 41, 31, 2]);           // '1+2'
 * ```
 */
export class CharTokenizer implements Tokenizer {
  /** Number of ids: the special tokens plus the alphabet. */
  readonly vocabSize: number;
  /** Padding id ({@link CHAR_PAD_ID}). */
  readonly padId = CHAR_PAD_ID;
  /** Beginning-of-sequence id ({@link CHAR_BOS_ID}). */
  readonly bosId = CHAR_BOS_ID;
  /** End-of-sequence id ({@link CHAR_EOS_ID}). */
  readonly eosId = CHAR_EOS_ID;
  /** The alphabet, one character per id from {@link CHAR_SPECIAL_TOKENS} on. */
  readonly alphabet: string;

  private readonly ids: ReadonlyMap<string, number>;
  private readonly chars: readonly string[];

  /**
   * @param alphabet - Distinct characters (by code point), in id order. Defaults to {@link DEFAULT_ALPHABET}.
   * @throws {@link ConfigError} when the alphabet is empty or repeats a character.
   */
  constructor(alphabet: string = DEFAULT_ALPHABET) {
    const chars = Array.from(alphabet);
    if (chars.length === 0) {
      throw new ConfigError('tokenizer alphabet is empty');
    }
    const ids = new Map<string, number>();
    chars.forEach((c, i) => {
      if (ids.has(c)) {
        throw new ConfigError(`tokenizer alphabet repeats ${JSON.stringify(c)}`, { context: { char: c } });
      }
      ids.set(c, i + CHAR_SPECIAL_TOKENS);
    });
    this.alphabet = alphabet;
    this.chars = chars;
    this.ids = ids;
    this.vocabSize = chars.length + CHAR_SPECIAL_TOKENS;
  }

  /**
   * Token ids of `text`, one per character, with the bos id first when `addBos`.
   *
   * @throws {@link DecodeError} naming the first character outside the alphabet.
   */
  encode(text: string, options: { addBos?: boolean } = {}): number[] {
    const out: number[] = options.addBos === true ? [this.bosId] : [];
    let index = 0;
    for (const c of text) {
      const id = this.ids.get(c);
      if (id === undefined) {
        throw new DecodeError(`character ${JSON.stringify(c)} at index ${index} is not in the tokenizer alphabet`, {
          context: { char: c, index },
        });
      }
      out.push(id);
      index++;
    }
    return out;
  }

  /**
   * Text of `ids`; pad, bos and eos are dropped.
   *
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)`.
   */
  decode(ids: readonly number[]): string {
    let text = '';
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
        throw new DecodeError(`token id ${id} is outside the vocabulary [0, ${this.vocabSize})`, { context: { id } });
      }
      if (id >= CHAR_SPECIAL_TOKENS) {
        text += this.chars[id - CHAR_SPECIAL_TOKENS];
      }
    }
    return text;
  }
}
