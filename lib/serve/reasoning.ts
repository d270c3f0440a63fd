/**
 * vLLM's reasoning parsers (`--reasoning-parser qwen3`, `deepseek_r1`): a reply's `<think>…</think>` block becomes the
 * message's `reasoning_content`, the rest its `content`, so agent frameworks read the answer without the thinking.
 *
 * The whole reply ({@link splitReasoning}) is split as vLLM splits it: an opening `<think>` is dropped; without a
 * closing `</think>` the reply is all content (qwen3: the model did not think) or all reasoning (deepseek_r1: it was cut
 * off while thinking); otherwise what comes before `</think>` is reasoning, what follows is content. A streamed reply
 * ({@link ReasoningStream}) is split the same way piece by piece, holding back only a tail that may still become a tag.
 *
 * @packageDocumentation
 */

/** The reasoning parsers `rxrl serve` knows (vLLM's names). */
export const REASONING_PARSERS = ['qwen3', 'deepseek_r1'] as const;

/** A reasoning parser's name. */
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

const OPEN = '<think>';
const CLOSE = '</think>';

/** A reply split in two; `reasoning` is absent when the reply has none. */
export interface SplitReply {
  readonly reasoning?: string;
  readonly content: string;
}

/**
 * Splits a whole reply into reasoning and content.
 *
 * @param parser - which model family's convention.
 * @param text - the reply's text.
 */
export function splitReasoning(parser: ReasoningParserName, text: string): SplitReply {
  const start = text.indexOf(OPEN);
  const body = start >= 0 ? text.slice(start + OPEN.length) : text;
  const end = body.indexOf(CLOSE);
  if (end < 0) return parser === 'deepseek_r1' ? { reasoning: body, content: '' } : { content: start >= 0 ? body : text };
  return { reasoning: body.slice(0, end), content: body.slice(end + CLOSE.length) };
}

/** The parts of a streamed piece: its reasoning and its content (either may be empty). */
export interface ReasoningDelta {
  readonly reasoning: string;
  readonly content: string;
}

/**
 * Splits a streamed reply piece by piece. Until `</think>` is seen, text is reasoning (deepseek_r1, or qwen3 once
 * `<think>` opened it) or content (qwen3 before any `<think>`); after it, content. A tail that is the start of a tag is
 * held back until the next piece or {@link ReasoningStream.end} says what it is.
 */
export class ReasoningStream {
  private pending = '';
  private state: 'before' | 'thinking' | 'answering';

  /** @param parser - which model family's convention. */
  constructor(private readonly parser: ReasoningParserName) {
    this.state = 'before';
  }

  /**
   * The next piece of the reply.
   *
   * @param text - the piece's text.
   * @returns what of it (and of earlier held text) is certain now.
   */
  push(text: string): ReasoningDelta {
    this.pending += text;
    let reasoning = '';
    let content = '';
    for (;;) {
      if (this.state === 'answering') {
        content += this.pending;
        this.pending = '';
        break;
      }
      // All of it may still be `<think>`.
      if (this.state === 'before' && this.pending.length < OPEN.length && OPEN.startsWith(this.pending)) break;
      if (this.state === 'before' && this.pending.startsWith(OPEN)) {
        this.pending = this.pending.slice(OPEN.length);
        this.state = 'thinking';
        continue;
      }
      if (this.state === 'before' && this.parser === 'qwen3' && !this.pending.includes(CLOSE)) {
        // No <think> opened it: content, except a tail that may still be `</think>`.
        const keep = heldTail(this.pending, CLOSE);
        content += this.pending.slice(0, this.pending.length - keep);
        this.pending = this.pending.slice(this.pending.length - keep);
        if (this.pending.length === 0 || keep > 0) break;
        continue;
      }
      const end = this.pending.indexOf(CLOSE);
      if (end >= 0) {
        reasoning += this.pending.slice(0, end);
        this.pending = this.pending.slice(end + CLOSE.length);
        this.state = 'answering';
        continue;
      }
      const keep = heldTail(this.pending, CLOSE);
      reasoning += this.pending.slice(0, this.pending.length - keep);
      this.pending = this.pending.slice(this.pending.length - keep);
      this.state = 'thinking';
      break;
    }
    return { reasoning, content };
  }

  /** The end of the reply: what was held back, as what it turned out to be. */
  end(): ReasoningDelta {
    const rest = this.pending;
    this.pending = '';
    if (this.state === 'thinking' || (this.state === 'before' && this.parser === 'deepseek_r1')) return { reasoning: rest, content: '' };
    return { reasoning: '', content: rest };
  }
}

/** How many characters at the end of `text` are the start of `tag` (and so may still become it). */
function heldTail(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (tag.startsWith(text.slice(text.length - n))) return n;
  return 0;
}
