/**
 * Hugging Face tokenizers (`tokenizer.json`, as Llama 3, Qwen2, Qwen3 and SmolLM2 ship them) behind rxrl's
 * {@link Tokenizer} interface, and the loader of a model directory's tokenizer.
 *
 * Encoding and decoding run on `@huggingface/tokenizers` (pure JavaScript). Which ids are bos, eos and pad comes
 * from the model's own files, never from constants:
 *
 * ```
 * eosId   = tokenizer_config.json eos_token            (else generation_config.json's first eos_token_id)
 * stopIds = [eosId, ...generation_config.json eos_token_id]   (deduplicated)
 * bosId   = tokenizer_config.json bos_token            (undefined when null or absent, as for Qwen)
 * padId   = tokenizer_config.json pad_token            (else eosId)
 * ```
 *
 * Special tokens in `tokenizer_config.json` may be strings or `{ "content": … }` objects. Decoding follows
 * `transformers` 5: `clean_up_tokenization_spaces` is ignored for BPE models (it would strip spaces before
 * punctuation) unless the config forces it.
 *
 * @packageDocumentation
 */
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

import { Tokenizer as JsTokenizerClass } from '@huggingface/tokenizers';

import type { DecodeOptions, EncodeOptions, Tokenizer } from './types.js';
import { DecodeError } from '../core/errors.js';
import { tokenCountBound } from './tokenBound.js';
import { CHAR_ALPHABET_CONFIG_KEY, CharTokenizer } from './tokenizer.js';

/** A parsed JSON object. */
export type JsonRecord = Readonly<Record<string, unknown>>;

/** File names of a model directory that the tokenizer layer reads. */
export const TOKENIZER_FILES = {
  tokenizer: 'tokenizer.json',
  config: 'tokenizer_config.json',
  specialTokensMap: 'special_tokens_map.json',
  chatTemplate: 'chat_template.jinja',
  generationConfig: 'generation_config.json',
} as const;

/** Keys of the named special tokens that `transformers` hands to chat templates (its `special_tokens_map`). */
const NAMED_SPECIAL_TOKENS = ['bos_token', 'eos_token', 'unk_token', 'sep_token', 'pad_token', 'cls_token', 'mask_token'] as const;

/** What an {@link HfTokenizer} is built from. */
export interface HfTokenizerSources {
  /** The parsed `tokenizer.json`. */
  readonly tokenizer: JsonRecord;
  /** The parsed `tokenizer_config.json` (special tokens, clean-up flag). */
  readonly config: JsonRecord;
  /** The parsed `generation_config.json`, whose `eos_token_id` (a number or a list) adds stop ids. */
  readonly generationConfig?: JsonRecord | undefined;
  /**
   * The original texts of the tokenizer files, file name → content, returned by {@link HfTokenizer.files}.
   * Default: `tokenizer.json` and `tokenizer_config.json` re-serialized from the objects.
   */
  readonly texts?: Readonly<Record<string, string>>;
}

/** The part of `@huggingface/tokenizers`' `Tokenizer` that this module uses (the package ships no usable types). */
interface JsTokenizer {
  readonly model: { readonly vocab: readonly (string | undefined)[]; readonly config?: { readonly type?: unknown } } | null;
  encode(text: string, options: { add_special_tokens: boolean }): { ids: (number | undefined)[] };
  decode(ids: number[], options: { skip_special_tokens: boolean; clean_up_tokenization_spaces: boolean }): string;
  token_to_id(token: string): number | undefined;
  get_added_tokens_decoder(): Map<number, { readonly content: string; readonly special: boolean }>;
}

/**
 * A Hugging Face tokenizer: byte-level BPE and the other `tokenizer.json` models that `@huggingface/tokenizers`
 * implements, with special tokens taken from the model's files (see the module comment).
 *
 * @example
 * ```ts
 * import { readFile } from 'node:fs/promises';
 * const read = async (f: string) => JSON.parse(await readFile(`qwen/${f}`, 'utf8'));
 * const tok = new HfTokenizer({ tokenizer: await read('tokenizer.json'), config: await read('tokenizer_config.json') });
 * tok.decode(tok.encode('Hello<|im_end|>'));                            // 'Hello'
 * tok.decode(tok.encode('Hello<|im_end|>'), { skipSpecialTokens: false }); // 'Hello<|im_end|>'
 * ```
 */
export class HfTokenizer implements Tokenizer {
  /** Number of ids: the model's vocabulary and the added tokens. */
  readonly vocabSize: number;
  /** The pad token's id, or `eosId` when the model has none. */
  readonly padId: number;
  /** The bos token's id, `undefined` when the model has none. */
  readonly bosId: number | undefined;
  /** The eos (end-of-turn) token's id. */
  readonly eosId: number;
  /** `eosId`, then the generation config's other eos ids. */
  readonly stopIds: readonly number[];
  /**
   * The named special tokens of `tokenizer_config.json` as strings (`bos_token`, `eos_token`, `pad_token`, …; only
   * those set), as `transformers` passes them to chat templates.
   */
  readonly specialTokens: Readonly<Record<string, string>>;

  private readonly tok: JsTokenizer;
  private readonly labels: readonly (string | undefined)[];
  private readonly special: ReadonlySet<number>;
  private readonly cleanUp: boolean;
  private readonly texts: Readonly<Record<string, string>>;
  private readonly bound: ((text: string) => number) | undefined;

  /**
   * @param sources - The parsed files (and their texts).
   * @throws {@link DecodeError} naming the file (and key) when `tokenizer.json` cannot be built, a special token
   *   is malformed or not in the vocabulary, the generation config's `eos_token_id` is not an id or a list of ids,
   *   or no eos token is named anywhere.
   */
  constructor(sources: HfTokenizerSources) {
    const { tokenizer, config } = sources;
    if (!isRecord(tokenizer) || !isRecord(tokenizer.model)) {
      throw new DecodeError(`${TOKENIZER_FILES.tokenizer} must be an object with a "model"`, {
        context: { file: TOKENIZER_FILES.tokenizer },
      });
    }
    if (!isRecord(config)) {
      throw new DecodeError(`${TOKENIZER_FILES.config} must be a JSON object`, { context: { file: TOKENIZER_FILES.config } });
    }
    const modelType = tokenizer.model.type;
    // transformers 5 ignores the clean-up for BPE unless forced; the config key's name says why.
    const cleanUp =
      config.clean_up_tokenization_spaces === true &&
      (modelType !== 'BPE' || config.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output === true);
    let tok: JsTokenizer;
    try {
      // Every key the JS tokenizer requires, present (null where tokenizer.json leaves it out).
      const json = { normalizer: null, pre_tokenizer: null, post_processor: null, decoder: null, added_tokens: [], ...tokenizer };
      tok = new JsTokenizerClass(json, { ...config, clean_up_tokenization_spaces: cleanUp }) as JsTokenizer;
    } catch (cause) {
      throw new DecodeError(`${TOKENIZER_FILES.tokenizer}: ${cause instanceof Error ? cause.message : String(cause)}`, {
        cause,
        context: { file: TOKENIZER_FILES.tokenizer },
      });
    }
    this.tok = tok;
    this.bound = tokenCountBound(tokenizer);
    this.cleanUp = cleanUp;
    this.labels = [...(tok.model?.vocab ?? [])];
    this.vocabSize = this.labels.length;

    const special = new Set<number>();
    for (const [id, added] of tok.get_added_tokens_decoder()) if (added.special) special.add(id);
    const extra = config.additional_special_tokens ?? config.extra_special_tokens;
    if (Array.isArray(extra)) {
      extra.forEach((value, i) => {
        const content = tokenContent(value, TOKENIZER_FILES.config, `additional_special_tokens[${i}]`);
        if (content !== undefined) special.add(this.idOf(content, TOKENIZER_FILES.config, `additional_special_tokens[${i}]`));
      });
    }
    this.special = special;

    const named = namedSpecialTokens(config);
    this.specialTokens = named;

    const generationEos = eosIds(sources.generationConfig, this.vocabSize);
    const eosId = named.eos_token !== undefined ? this.idOf(named.eos_token, TOKENIZER_FILES.config, 'eos_token') : generationEos[0];
    if (eosId === undefined) {
      throw new DecodeError(`${TOKENIZER_FILES.config} names no eos_token and ${TOKENIZER_FILES.generationConfig} no eos_token_id`, {
        context: { file: TOKENIZER_FILES.config, key: 'eos_token' },
      });
    }
    this.eosId = eosId;
    this.stopIds = [...new Set([eosId, ...generationEos])];
    this.bosId = named.bos_token === undefined ? undefined : this.idOf(named.bos_token, TOKENIZER_FILES.config, 'bos_token');
    this.padId = named.pad_token === undefined ? eosId : this.idOf(named.pad_token, TOKENIZER_FILES.config, 'pad_token');
    this.texts = sources.texts ?? {
      [TOKENIZER_FILES.tokenizer]: JSON.stringify(tokenizer),
      [TOKENIZER_FILES.config]: `${JSON.stringify(config, null, 2)}\n`,
    };
  }

  /**
   * Token ids of `text`; special-token strings in it become their ids.
   *
   * @param text - The text.
   * @param options - `addBos` adds the tokenizer's own special tokens (its post-processor: Llama's BOS).
   * @returns The ids.
   * @throws {@link DecodeError} when a piece of the text has no id (a model without an unknown token).
   */
  encode(text: string, options: EncodeOptions = {}): number[] {
    const { ids } = this.tok.encode(text, { add_special_tokens: options.addBos === true });
    const missing = ids.findIndex((id) => id === undefined);
    if (missing >= 0) {
      throw new DecodeError(`token ${missing} of the text has no id in the vocabulary`, { context: { index: missing } });
    }
    return ids as number[];
  }

  /**
   * A lower bound on the ids of `text`, without encoding it: for a byte-level BPE, the text's bytes over the most
   * bytes one token stands for (see `tokenCountBound`); 0 for tokenizers where no bound provably holds.
   *
   * @param text - The text.
   * @returns How many ids `encode(text)` gives at least.
   */
  minTokens(text: string): number {
    return this.bound?.(text) ?? 0;
  }

  /**
   * Text of `ids`, through the tokenizer's decoder (byte-level BPE pieces become UTF-8 text).
   *
   * @param ids - Token ids.
   * @param options - `skipSpecialTokens` (default `true`) drops special tokens.
   * @returns The text.
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)`.
   */
  decode(ids: readonly number[], options: DecodeOptions = {}): string {
    const known: number[] = [];
    for (const id of ids) {
      this.checkId(id);
      if (this.labels[id] !== undefined) known.push(id); // like transformers, ids without a token are skipped
    }
    if (known.length === 0) return '';
    return this.tok.decode(known, { skip_special_tokens: options.skipSpecialTokens ?? true, clean_up_tokenization_spaces: this.cleanUp });
  }

  /**
   * Whether `id` is a special token (an added token marked special, or one of the config's additional special
   * tokens).
   *
   * @param id - A token id.
   * @returns True for special ids.
   */
  isSpecial(id: number): boolean {
    return this.special.has(id);
  }

  /**
   * The raw vocabulary string of `id` (`Ġhello`, `<|im_end|>`).
   *
   * @param id - A token id.
   * @returns The label.
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)` or without a vocabulary entry.
   */
  tokenLabel(id: number): string {
    this.checkId(id);
    const label = this.labels[id];
    if (label === undefined) throw new DecodeError(`token id ${id} has no vocabulary entry`, { context: { id } });
    return label;
  }

  /**
   * The texts the tokenizer was loaded from (`tokenizer.json`, `tokenizer_config.json`, and
   * `special_tokens_map.json` and `chat_template.jinja` when the directory had them).
   *
   * @returns File name → content.
   */
  files(): Readonly<Record<string, string>> {
    return this.texts;
  }

  private checkId(id: number): void {
    if (!Number.isInteger(id) || id < 0 || id >= this.vocabSize) {
      throw new DecodeError(`token id ${id} is outside the vocabulary [0, ${this.vocabSize})`, { context: { id } });
    }
  }

  private idOf(content: string, file: string, key: string): number {
    const id = this.tok.token_to_id(content);
    if (id === undefined) {
      throw new DecodeError(`${file}: ${key} ${JSON.stringify(content)} is not in the vocabulary`, {
        context: { file, key, token: content },
      });
    }
    return id;
  }
}

/** The parsed tokenizer files of a model directory, and their texts. */
export interface HfTokenizerFiles {
  /** `tokenizer.json`, or `undefined` when the directory has none. */
  readonly tokenizer: JsonRecord | undefined;
  /** `tokenizer_config.json`, with `special_tokens_map.json`'s entries filling keys the config lacks. */
  readonly config: JsonRecord;
  /** `generation_config.json`, when present. */
  readonly generationConfig: JsonRecord | undefined;
  /** `chat_template.jinja`, when present. */
  readonly chatTemplate: string | undefined;
  /** File name → original text of each tokenizer file that exists (not the generation config). */
  readonly texts: Readonly<Record<string, string>>;
}

/**
 * Reads the tokenizer files of a Hugging Face model directory (see {@link TOKENIZER_FILES}).
 *
 * @example
 * ```ts
 * const { config, chatTemplate } = await readTokenizerFiles('models/qwen3');
 * ```
 * @param dir - The model directory.
 * @returns The parsed files and their texts.
 * @throws {@link DecodeError} naming the file when `tokenizer_config.json` is missing, or a file is not a JSON
 *   object.
 */
export async function readTokenizerFiles(dir: string): Promise<HfTokenizerFiles> {
  const texts: Record<string, string> = {};
  const read = async (name: string, required: boolean): Promise<string | undefined> => {
    let text: string;
    try {
      text = await readFile(join(dir, name), 'utf8');
    } catch (cause) {
      if (!required && (cause as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw new DecodeError(`cannot read ${name} in ${dir}: ${cause instanceof Error ? cause.message : String(cause)}`, {
        cause,
        context: { file: name, dir },
      });
    }
    return text;
  };
  const readJson = async (name: string, required: boolean, keep: boolean): Promise<JsonRecord | undefined> => {
    const text = await read(name, required);
    if (text === undefined) return undefined;
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch (cause) {
      throw new DecodeError(`${name} in ${dir} is not JSON`, { cause, context: { file: name, dir } });
    }
    if (!isRecord(value)) throw new DecodeError(`${name} in ${dir} must be a JSON object`, { context: { file: name, dir } });
    if (keep) texts[name] = text;
    return value;
  };
  const config = await readJson(TOKENIZER_FILES.config, true, true);
  const tokenizer = await readJson(TOKENIZER_FILES.tokenizer, false, true);
  const map = await readJson(TOKENIZER_FILES.specialTokensMap, false, true);
  const generationConfig = await readJson(TOKENIZER_FILES.generationConfig, false, false);
  const chatTemplate = await read(TOKENIZER_FILES.chatTemplate, false);
  if (chatTemplate !== undefined) texts[TOKENIZER_FILES.chatTemplate] = chatTemplate;
  const merged: Record<string, unknown> = { ...config };
  for (const [key, value] of Object.entries(map ?? {})) if (merged[key] === undefined || merged[key] === null) merged[key] = value;
  return { tokenizer, config: merged, generationConfig, chatTemplate, texts };
}

/**
 * The tokenizer of a model directory: a {@link CharTokenizer} when `tokenizer_config.json` names an alphabet under
 * {@link CHAR_ALPHABET_CONFIG_KEY} (files written by {@link CharTokenizer.files}), otherwise an {@link HfTokenizer}
 * over `tokenizer.json`, `tokenizer_config.json` (+ `special_tokens_map.json`) and `generation_config.json`.
 *
 * @example
 * ```ts
 * const tokenizer = await loadTokenizer('models/qwen3-0.6b');
 * tokenizer.stopIds; // [151645, 151643]
 * ```
 * @param dir - The model directory.
 * @returns The tokenizer.
 * @throws {@link DecodeError} naming the file (and key) when a file is missing or malformed.
 */
export async function loadTokenizer(dir: string): Promise<Tokenizer> {
  const files = await readTokenizerFiles(dir);
  const alphabet = files.config[CHAR_ALPHABET_CONFIG_KEY];
  if (alphabet !== undefined) {
    if (typeof alphabet !== 'string' || alphabet.length === 0) {
      throw new DecodeError(`${TOKENIZER_FILES.config}: ${CHAR_ALPHABET_CONFIG_KEY} must be a non-empty string`, {
        context: { file: TOKENIZER_FILES.config, key: CHAR_ALPHABET_CONFIG_KEY, dir },
      });
    }
    try {
      return new CharTokenizer(alphabet);
    } catch (cause) {
      throw new DecodeError(
        `${TOKENIZER_FILES.config}: ${CHAR_ALPHABET_CONFIG_KEY}: ${cause instanceof Error ? cause.message : String(cause)}`,
        {
          cause,
          context: { file: TOKENIZER_FILES.config, key: CHAR_ALPHABET_CONFIG_KEY, dir },
        },
      );
    }
  }
  if (files.tokenizer === undefined) {
    throw new DecodeError(`${dir} has no ${TOKENIZER_FILES.tokenizer}`, { context: { file: TOKENIZER_FILES.tokenizer, dir } });
  }
  return new HfTokenizer({
    tokenizer: files.tokenizer,
    config: files.config,
    ...(files.generationConfig === undefined ? {} : { generationConfig: files.generationConfig }),
    texts: files.texts,
  });
}

/**
 * The named special tokens of a `tokenizer_config.json` (`bos_token`, `eos_token`, `unk_token`, `sep_token`,
 * `pad_token`, `cls_token`, `mask_token`) as strings, leaving out those that are null or absent: what
 * `transformers` passes to chat templates. Entries may be strings or `{ content }` objects.
 *
 * @example
 * ```ts
 * namedSpecialTokens({ bos_token: null, eos_token: { content: '<|im_end|>' } }); // { eos_token: '<|im_end|>' }
 * ```
 * @param config - The parsed `tokenizer_config.json`.
 * @returns Key → token string.
 * @throws {@link DecodeError} naming `tokenizer_config.json` and the key for an entry of another shape.
 */
export function namedSpecialTokens(config: JsonRecord): Record<string, string> {
  const named: Record<string, string> = {};
  for (const key of NAMED_SPECIAL_TOKENS) {
    const content = tokenContent(config[key], TOKENIZER_FILES.config, key);
    if (content !== undefined) named[key] = content;
  }
  return named;
}

/** The content of a special-token entry: a string, a `{ content }` object, or `undefined` for null or absent. */
function tokenContent(value: unknown, file: string, key: string): string | undefined {
  if (value === undefined || value === null) return undefined;
  if (typeof value === 'string') return value;
  if (isRecord(value) && typeof value.content === 'string') return value.content;
  throw new DecodeError(`${file}: ${key} must be a string or an object with a string "content"`, { context: { file, key } });
}

/** The generation config's `eos_token_id` entries (a number or a list of numbers), each in `[0, vocabSize)`. */
function eosIds(generationConfig: JsonRecord | undefined, vocabSize: number): number[] {
  const value = generationConfig?.eos_token_id;
  if (value === undefined || value === null) return [];
  const ids = Array.isArray(value) ? value : [value];
  if (!ids.every((id): id is number => Number.isInteger(id) && (id as number) >= 0 && (id as number) < vocabSize)) {
    throw new DecodeError(
      `${TOKENIZER_FILES.generationConfig}: eos_token_id must be a token id or a list of token ids in [0, ${vocabSize})`,
      { context: { file: TOKENIZER_FILES.generationConfig, key: 'eos_token_id' } },
    );
  }
  return ids;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
