/**
 * A character-level tokenizer for the bundled toy tasks.
 *
 * It can describe itself as Hugging Face tokenizer files ({@link CharTokenizer.files}): a `tokenizer.json` whose
 * BPE model has the special tokens and the alphabet as its vocabulary and no merges, so that
 * `transformers.AutoTokenizer.from_pretrained(dir)` encodes and decodes exactly like the class, and a
 * `tokenizer_config.json` that names the alphabet under {@link CHAR_ALPHABET_CONFIG_KEY} so `loadTokenizer(dir)`
 * rebuilds the class itself.
 *
 * @packageDocumentation
 */
import type { DecodeOptions, EncodeOptions, Tokenizer } from './types.js';
import { ConfigError, DecodeError } from '../core/errors.js';

/** Id of the padding token of every {@link CharTokenizer}. */
export const CHAR_PAD_ID = 0;
/** Id of the beginning-of-sequence token of every {@link CharTokenizer}. */
export const CHAR_BOS_ID = 1;
/** Id of the end-of-sequence (stop) token of every {@link CharTokenizer}. */
export const CHAR_EOS_ID = 2;
/** Number of special tokens placed before the alphabet. */
export const CHAR_SPECIAL_TOKENS = 3;
/** Vocabulary strings of the special tokens, by id: `<pad>`, `<bos>`, `<eos>`. */
export const CHAR_SPECIAL_LABELS: readonly string[] = ['<pad>', '<bos>', '<eos>'];
/** Key of `tokenizer_config.json` that holds a character tokenizer's alphabet. */
export const CHAR_ALPHABET_CONFIG_KEY = 'rxrl_char_alphabet';

/**
 * Alphabet of the bundled tasks: `a`–`z`, `0`–`9` and ` =+-*>:,?.()`. With the three special tokens the
 * vocabulary has 51 ids.
 */
export const DEFAULT_ALPHABET = 'abcdefghijklmnopqrstuvwxyz0123456789 =+-*>:,?.()';

/**
 * Maps each character of an alphabet to one id: `0` = pad, `1` = bos, `2` = eos, then the alphabet in order.
 * The strings `<pad>`, `<bos>` and `<eos>` inside a text are their special ids, as in a Hugging Face tokenizer.
 *
 * @example
 * ```ts
 * const tok = new CharTokenizer();
 * tok.encode('1+2=', { addBos: true }); // [1, 30, 41, 31, 40]
 * tok.decode([30, 41, 31, 2]);           // '1+2'
 * tok.decode([30, 2], { skipSpecialTokens: false }); // '1<eos>'
 * ```
 */
export class CharTokenizer implements Tokenizer {
  /** Number of ids: the special tokens plus the alphabet. */
  readonly vocabSize: number;
  /** Padding id ({@link CHAR_PAD_ID}). */
  readonly padId: number = CHAR_PAD_ID;
  /** Beginning-of-sequence id ({@link CHAR_BOS_ID}). */
  readonly bosId: number = CHAR_BOS_ID;
  /** End-of-sequence id ({@link CHAR_EOS_ID}). */
  readonly eosId: number = CHAR_EOS_ID;
  /** The ids that end generation: the eos id alone. */
  readonly stopIds: readonly number[] = [CHAR_EOS_ID];
  /** The alphabet, one character per id from {@link CHAR_SPECIAL_TOKENS} on. */
  readonly alphabet: string;

  private readonly ids: ReadonlyMap<string, number>;
  private readonly chars: readonly string[];
  /** The most UTF-16 units one token stands for: a special label (`<pad>`) or an alphabet character. */
  private readonly longestLabel: number;

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
    this.longestLabel = Math.max(...CHAR_SPECIAL_LABELS.map((label) => label.length), ...chars.map((c) => c.length));
  }

  /**
   * A lower bound on the ids of `text` without encoding it: each id stands for one character (one or two UTF-16
   * units) or one special label (`<pad>`, five).
   *
   * @param text - The text.
   * @returns `ceil(text.length / 5)` for the default labels.
   */
  minTokens(text: string): number {
    return Math.ceil(text.length / this.longestLabel);
  }

  /**
   * Token ids of `text`, one per character (a `<pad>`, `<bos>` or `<eos>` string is one special id), with the
   * bos id first when `addBos`.
   *
   * @param text - The text.
   * @param options - `addBos` prepends the bos id.
   * @returns The ids.
   * @throws {@link DecodeError} naming the first character outside the alphabet (`context.char`,
   *   `context.index` in code points).
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const out: number[] = options.addBos === true ? [this.bosId] : [];
    let index = 0; // in code points
    for (let at = 0; at < text.length; index++) {
      const special = text.startsWith('<', at) ? CHAR_SPECIAL_LABELS.findIndex((label) => text.startsWith(label, at)) : -1;
      if (special >= 0) {
        out.push(special);
        at += CHAR_SPECIAL_LABELS[special].length;
        index += CHAR_SPECIAL_LABELS[special].length - 1;
        continue;
      }
      const c = String.fromCodePoint(text.codePointAt(at) ?? 0);
      const id = this.ids.get(c);
      if (id === undefined) {
        throw new DecodeError(`character ${JSON.stringify(c)} at index ${index} is not in the tokenizer alphabet`, {
          context: { char: c, index },
        });
      }
      out.push(id);
      at += c.length;
    }
    return out;
  }

  /**
   * Text of `ids`; pad, bos and eos are dropped unless `skipSpecialTokens` is `false` (then they read `<pad>`,
   * `<bos>`, `<eos>`).
   *
   * @param ids - Token ids.
   * @param options - `skipSpecialTokens` (default `true`).
   * @returns The text.
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)`.
   */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const skip = options.skipSpecialTokens ?? true;
    let text = '';
    for (const id of ids) {
      const label = this.tokenLabel(id);
      if (!skip || id >= CHAR_SPECIAL_TOKENS) text += label;
    }
    return text;
  }

  /**
   * Whether `id` is pad, bos or eos.
   *
   * @param id - A token id.
   * @returns True for the ids below {@link CHAR_SPECIAL_TOKENS}.
   */
  isSpecial(id: number): boolean {
    return Number.isInteger(id) && id >= 0 && id < CHAR_SPECIAL_TOKENS;
  }

  /**
   * The vocabulary string of `id`: its character, or `<pad>`, `<bos>`, `<eos>`.
   *
   * @param id - A token id.
   * @returns The label.
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)`.
   */
  tokenLabel(id: number): string {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new DecodeError(`token id ${id} is outside the vocabulary [0, ${this.vocabSize})`, { context: { id } });
    }
    return id < CHAR_SPECIAL_TOKENS ? CHAR_SPECIAL_LABELS[id] : this.chars[id - CHAR_SPECIAL_TOKENS];
  }

  /**
   * Hugging Face tokenizer files that encode and decode like this tokenizer: `tokenizer.json` (a BPE model whose
   * vocabulary is the special tokens and the characters, with no merges, no normalizer and no pre-tokenizer; the
   * specials as added special tokens; a `TemplateProcessing` post-processor that prepends `<bos>` when special
   * tokens are added; a `Fuse` decoder that concatenates) and `tokenizer_config.json`
   * (`PreTrainedTokenizerFast`, the special tokens, and the alphabet under {@link CHAR_ALPHABET_CONFIG_KEY}).
   *
   * @returns File name → JSON text.
   * @example
   * ```ts
   * import { writeFile } from 'node:fs/promises';
   * for (const [name, text] of Object.entries(new CharTokenizer('ab').files())) await writeFile(`model/${name}`, text);
   * ```
   */
  files(): Readonly<Record<string, string>> {
    const vocab: Record<string, number> = {};
    CHAR_SPECIAL_LABELS.forEach((label, id) => (vocab[label] = id));
    this.chars.forEach((c, i) => (vocab[c] = i + CHAR_SPECIAL_TOKENS));
    const added = CHAR_SPECIAL_LABELS.map((content, id) => ({
      id,
      content,
      single_word: false,
      lstrip: false,
      rstrip: false,
      normalized: false,
      special: true,
    }));
    const bos = CHAR_SPECIAL_LABELS[CHAR_BOS_ID];
    const tokenizerJson = {
      version: '1.0',
      truncation: null,
      padding: null,
      added_tokens: added,
      normalizer: null,
      pre_tokenizer: null,
      post_processor: {
        type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: bos, type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
        pair: [
          { SpecialToken: { id: bos, type_id: 0 } },
          { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: bos, type_id: 1 } },
          { Sequence: { id: 'B', type_id: 1 } },
        ],
        special_tokens: { [bos]: { id: bos, ids: [CHAR_BOS_ID], tokens: [bos] } },
      },
      decoder: { type: 'Fuse' },
      model: {
        type: 'BPE',
        dropout: null,
        unk_token: null,
        continuing_subword_prefix: null,
        end_of_word_suffix: null,
        fuse_unk: false,
        byte_fallback: false,
        ignore_merges: false,
        vocab,
        merges: [],
      },
    };
    const tokenizerConfig = {
      tokenizer_class: 'PreTrainedTokenizerFast',
      pad_token: CHAR_SPECIAL_LABELS[CHAR_PAD_ID],
      bos_token: bos,
      eos_token: CHAR_SPECIAL_LABELS[CHAR_EOS_ID],
      clean_up_tokenization_spaces: false,
      added_tokens_decoder: Object.fromEntries(added.map(({ id, ...token }) => [String(id), token])),
      [CHAR_ALPHABET_CONFIG_KEY]: this.alphabet,
    };
    return {
      'tokenizer.json': `${JSON.stringify(tokenizerJson, null, 2)}\n`,
      'tokenizer_config.json': `${JSON.stringify(tokenizerConfig, null, 2)}\n`,
    };
  }
}
