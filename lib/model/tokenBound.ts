/**
 * A lower bound on how many tokens a Hugging Face tokenizer makes of a text, read off its `tokenizer.json` and
 * computed without encoding: a server refuses a prompt of megabytes that cannot fit its context before spending
 * seconds tokenizing it.
 *
 * The bound is given only where it provably holds: a byte-level BPE (every token stands for at least one byte of
 * the normalized text and at most `longest` bytes, its label in the byte alphabet or an added token's content), no
 * added token that swallows the whitespace around it (`lstrip`, `rstrip`), no fused unknown tokens, no
 * pre-tokenizer that removes text, no truncation, and a normalizer that deletes nothing:
 *
 * ```
 * none            tokens ≥ ⌈ utf8Bytes(text) / longest ⌉
 * NFC NFD NFKC NFKD tokens ≥ ⌈ #(UTF-16 units below U+0300 in text) / longest ⌉
 * ```
 *
 * Why the second line: normalizing never deletes a code point below U+0300. Each decomposes to a sequence whose
 * first code point composition never absorbs (composition absorbs a code point into the one before it only where
 * a canonical decomposition has it after its first, and those are all from U+0300 up: combining marks, Hangul
 * vowels and trailing consonants), so each leaves a code point of its own, of at least one byte. (The spec checks
 * this over every code point.)
 *
 * @packageDocumentation
 */
import { Buffer } from 'node:buffer';

/** A parsed JSON object. */
type Json = Readonly<Record<string, unknown>>;

/** The smallest code point that canonical composition may absorb into the one before it (U+0300, a combining mark). */
export const FIRST_COMPOSING_CODE_POINT = 0x300;

/** Unicode normalizers that delete nothing (`tokenizer.json` `normalizer.type`). */
const UNICODE_FORMS = new Set(['NFC', 'NFD', 'NFKC', 'NFKD']);

/** Pre-tokenizers that split text without dropping any (`Split` unless its behavior is `Removed`). */
const KEEPING_PRE_TOKENIZERS = new Set(['ByteLevel', 'Split', 'Digits', 'Punctuation']);

/** The 256 characters GPT-2's byte-level alphabet spells bytes with (`bytes_to_unicode`). */
const BYTE_ALPHABET: ReadonlySet<string> = (() => {
  const kept = (b: number): boolean => (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
  const chars = new Set<string>();
  let shifted = 0;
  for (let b = 0; b < 256; b++) chars.add(String.fromCharCode(kept(b) ? b : 256 + shifted++));
  return chars;
})();

function isJson(value: unknown): value is Json {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Bytes of text a vocabulary label stands for, at most: its length in the byte alphabet, else its UTF-8 size. */
function labelBytes(label: string): number {
  for (const c of label) if (!BYTE_ALPHABET.has(c)) return Buffer.byteLength(label);
  return label.length;
}

/** Whether the pre-tokenizer is byte-level and removes nothing. */
function byteLevelKeepingAll(pre: unknown): boolean {
  if (!isJson(pre)) return false;
  const steps = pre.type === 'Sequence' && Array.isArray(pre.pretokenizers) ? (pre.pretokenizers as unknown[]) : [pre];
  const keeps = steps.every(
    (step) => isJson(step) && KEEPING_PRE_TOKENIZERS.has(String(step.type)) && step.behavior !== 'Removed' && step.behavior !== 'removed',
  );
  return keeps && steps.some((step) => isJson(step) && step.type === 'ByteLevel');
}

/**
 * The lower bound of a `tokenizer.json` (see the module comment), or `undefined` where none provably holds.
 *
 * @param tokenizer - The parsed `tokenizer.json`.
 * @returns A function from a text to a number of tokens `encode` makes at least (special tokens not added).
 */
export function tokenCountBound(tokenizer: Json): ((text: string) => number) | undefined {
  const model = tokenizer.model;
  if (!isJson(model) || model.type !== 'BPE' || !isJson(model.vocab)) return undefined;
  if (tokenizer.truncation !== null && tokenizer.truncation !== undefined) return undefined; // encode may cut the text
  if (model.fuse_unk === true && model.unk_token !== null && model.unk_token !== undefined) return undefined;
  if (!byteLevelKeepingAll(tokenizer.pre_tokenizer)) return undefined;
  const normalizer = tokenizer.normalizer;
  const unicode = isJson(normalizer) && UNICODE_FORMS.has(String(normalizer.type));
  if (normalizer !== null && normalizer !== undefined && !unicode) return undefined;
  let longest = 1;
  for (const label of Object.keys(model.vocab)) longest = Math.max(longest, labelBytes(label));
  for (const added of Array.isArray(tokenizer.added_tokens) ? (tokenizer.added_tokens as unknown[]) : []) {
    if (!isJson(added) || typeof added.content !== 'string' || added.lstrip === true || added.rstrip === true) return undefined;
    longest = Math.max(longest, Buffer.byteLength(added.content));
  }
  if (!unicode) return (text) => Math.ceil(Buffer.byteLength(text) / longest);
  return (text) => {
    let kept = 0;
    for (let i = 0; i < text.length; i++) if (text.charCodeAt(i) < FIRST_COMPOSING_CODE_POINT) kept++;
    return Math.ceil(kept / longest);
  };
}
