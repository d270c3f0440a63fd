/**
 * The vocabulary the model layer speaks: weights in plain memory, the tokenizer interface, and one generation's
 * request and response. Engines, servers and the Kafka bridge build on these.
 *
 * @packageDocumentation
 */
import type { FinishReason, PolicyVersion } from '../core/types.js';

/** A weight array in plain memory: row-major data and its shape. */
export interface WeightArray {
  readonly shape: readonly number[];
  readonly data: Float32Array;
}

/** Named model weights in plain memory (no tensors), the unit of weight sync. */
export type NamedWeights = ReadonlyMap<string, WeightArray>;

/** Options of {@link Tokenizer.encode}. */
export interface EncodeOptions {
  /**
   * Add the tokenizer's own special tokens (Hugging Face `add_special_tokens=True`: Llama prepends its BOS, Qwen
   * adds nothing, the character tokenizer prepends `<bos>`). Default `false`.
   */
  readonly addBos?: boolean;
}

/** Options of {@link Tokenizer.decode}. */
export interface DecodeOptions {
  /** Drop special tokens (pad, bos, eos, `<|im_end|>`…) from the text. Default `true`. */
  readonly skipSpecialTokens?: boolean;
}

/**
 * Maps text to token ids and back: the character tokenizer of the bundled tasks and Hugging Face tokenizers
 * (`tokenizer.json`) share this interface.
 */
export interface Tokenizer {
  /** Number of token ids, including special tokens: every id is in `[0, vocabSize)`. */
  readonly vocabSize: number;
  /** Id of the padding token (the end-of-sequence id when the model has none). */
  readonly padId: number;
  /** Id of the beginning-of-sequence token, `undefined` when the model has none (Qwen). */
  readonly bosId: number | undefined;
  /** Id of the primary end-of-sequence (end-of-turn) token. */
  readonly eosId: number;
  /**
   * Every id that ends generation: `eosId` first, then the other end-of-sequence ids of the model's generation
   * config, without repeats.
   */
  readonly stopIds: readonly number[];
  /**
   * Token ids of a text. Special-token strings inside `text` (such as `<|im_end|>`) become their special ids.
   *
   * @throws {@link DecodeError} when the text cannot be encoded (a character outside a character tokenizer's
   *   alphabet).
   */
  encode(text: string, options?: EncodeOptions): number[];
  /**
   * A lower bound on `encode(text).length`, computed without encoding (a length divided by the most text one token
   * can stand for): a prompt that certainly cannot fit a context is refused before the work of encoding it. 0, or
   * absent, where the tokenizer knows no such bound (a normalizer that may delete text, say).
   */
  minTokens?(text: string): number;
  /**
   * Text of token ids; special tokens are dropped unless `skipSpecialTokens` is `false`.
   *
   * @throws {@link DecodeError} for an id outside `[0, vocabSize)`.
   */
  decode(ids: readonly number[], options?: DecodeOptions): string;
  /** True when `id` is a special token (dropped by `decode` by default). */
  isSpecial(id: number): boolean;
  /**
   * The raw vocabulary string of an id (`<|im_end|>`, `Ġhello`; `<eos>` for the character tokenizer's eos).
   *
   * @throws {@link DecodeError} for an id without a vocabulary entry.
   */
  tokenLabel(id: number): string;
  /**
   * The tokenizer files of a Hugging Face model directory, file name → UTF-8 content (`tokenizer.json`,
   * `tokenizer_config.json`, …), which `AutoTokenizer.from_pretrained(dir)` and `loadTokenizer(dir)` read back.
   */
  files(): Readonly<Record<string, string>>;
}

/** One generation request. */
export interface GenerateRequest {
  /** Prompt token ids, `[P]` (non-empty). */
  readonly promptTokens: readonly number[];
  /** Largest number of new tokens. */
  readonly maxTokens: number;
  /** Sampling temperature; 0 means greedy. Defaults to 1. */
  readonly temperature?: number;
  /** Nucleus sampling mass in (0, 1]. Defaults to 1. */
  readonly topP?: number;
  /**
   * Sample among the `topK` most likely tokens only (ties with the `topK`-th included), before top-p, as
   * transformers' `top_k`. `0` or absent: no top-k (TRL's GRPO default, `top_k=0`).
   */
  readonly topK?: number;
  /**
   * Token ids that end generation (kept in the output). Defaults to the tokenizer's `stopIds` (every
   * end-of-sequence token of the model); `[]` runs to `maxTokens`.
   */
  readonly stopTokens?: readonly number[];
  /** Seed of this request's sampling stream; equal seeds give equal samples under equal weights. */
  readonly seed?: number;
  /**
   * Called with each new token as it is sampled (streaming). In-process engines call it once per token, in order;
   * remote engines, which receive the response whole, do not call it. It must not throw (a throw is ignored).
   */
  readonly onToken?: (token: number, logprob: number) => void;
}

/** One generation result. */
export interface GenerateResponse {
  /** New token ids, `[R]`. */
  readonly tokens: number[];
  /** Log-probability of each new token under the sampling distribution's policy, `[R]`. */
  readonly logprobs: number[];
  /** Why generation ended. */
  readonly finishReason: FinishReason;
  /** Oldest policy version whose weights produced any token of this response. */
  readonly policyVersion: PolicyVersion;
}
