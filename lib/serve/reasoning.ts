/**
 * vLLM's reasoning parsers (`--reasoning-parser qwen3`, `deepseek_r1`): a reply's `<think>…</think>` block becomes the
 * message's `reasoning_content`, the rest its `content`, so agent frameworks read the answer without the thinking.
 *
 * One state machine ({@link ReasoningStream}) splits every reply; a whole reply ({@link splitReasoning}) is that stream
 * fed in one piece, so a reply reads the same whole and streamed, however it is cut. The first `<think>` opens the
 * reasoning and is dropped, the first `</think>` after it closes the reasoning and is dropped, and what follows is
 * content (later tags included). The parsers differ only before any tag, as vLLM's streaming parsers do:
 * - `qwen3` requires `<think>`: text before it is content (the model did not think), a stray `</think>` there included;
 * - `deepseek_r1` does not: text before `</think>` is reasoning even without `<think>` (R1 starts thinking at once).
 *
 * A reply cut off before `</think>` keeps what it thought as reasoning (vLLM streams it so; a streamed delta can't be
 * taken back). Nothing is lost: every character but the two tags is in one part or the other.
 *
 * @packageDocumentation
 */

/** The reasoning parsers `rxrl serve` knows (vLLM's names). */
export const REASONING_PARSERS = ['qwen3', 'deepseek_r1'] as const;

/** A reasoning parser's name. */
export type ReasoningParserName = (typeof REASONING_PARSERS)[number];

const OPEN = '<think>';
const CLOSE = '</think>';

/** A reply split in two; `reasoning` is absent when the reply has none (qwen3 without `<think>`). */
export interface SplitReply {
  readonly reasoning?: string;
  readonly content: string;
}

/**
 * Splits a whole reply into reasoning and content: the {@link ReasoningStream} fed the reply in one piece.
 *
 * @param parser - which model family's convention.
 * @param text - the reply's text.
 */
export function splitReasoning(parser: ReasoningParserName, text: string): SplitReply {
  const stream = new ReasoningStream(parser);
  const first = stream.push(text);
  const last = stream.end();
  const content = first.content + last.content;
  return stream.reasoned ? { reasoning: first.reasoning + last.reasoning, content } : { content };
}

/** The parts of a streamed piece: its reasoning and its content (either may be empty). */
export interface ReasoningDelta {
  readonly reasoning: string;
  readonly content: string;
}

/** Where a reply is: before any tag, inside the reasoning (`<think>` seen), or in the answer (`</think>` seen). */
type Phase = 'before' | 'thinking' | 'answering';

/**
 * Splits a streamed reply piece by piece (see the module comment for the rules). A tail that may still become a tag
 * is held back until the next piece or {@link ReasoningStream.end} says what it is; everything else is given at once.
 */
export class ReasoningStream {
  private pending = '';
  private phase: Phase = 'before';

  /** @param parser - which model family's convention. */
  constructor(private readonly parser: ReasoningParserName) {}

  /** Whether the reply has a reasoning part so far (deepseek_r1 always; qwen3 once `<think>` opened it). */
  get reasoned(): boolean {
    return this.parser === 'deepseek_r1' || this.phase !== 'before';
  }

  /**
   * The next piece of the reply.
   *
   * @param text - the piece's text.
   * @returns what of it (and of earlier held text) is certain now.
   */
  push(text: string): ReasoningDelta {
    this.pending += text;
    return this.drain(false);
  }

  /** The end of the reply: what was held back, as what it turned out to be. */
  end(): ReasoningDelta {
    return this.drain(true);
  }

  /** Gives all of `pending` that is certain (all of it at the end), moving through the phases as tags pass. */
  private drain(final: boolean): ReasoningDelta {
    let reasoning = '';
    let content = '';
    for (;;) {
      const tags = this.awaited();
      const found = earliest(this.pending, tags);
      const upTo = found ? found.at : this.pending.length - (final ? 0 : Math.max(0, ...tags.map((t) => heldTail(this.pending, t))));
      const text = this.pending.slice(0, upTo);
      if (this.phase === 'answering' || (this.phase === 'before' && this.parser === 'qwen3')) content += text;
      else reasoning += text;
      if (!found) {
        this.pending = this.pending.slice(upTo);
        return { reasoning, content };
      }
      this.pending = this.pending.slice(upTo + found.tag.length);
      this.phase = found.tag === OPEN ? 'thinking' : 'answering';
    }
  }

  /** The tags that change the phase from here: `<think>` and (deepseek_r1) `</think>` before, `</think>` inside. */
  private awaited(): readonly string[] {
    if (this.phase === 'answering') return [];
    if (this.phase === 'thinking') return [CLOSE];
    return this.parser === 'qwen3' ? [OPEN] : [OPEN, CLOSE];
  }
}

/** The first of `tags` in `text`, and where. */
function earliest(text: string, tags: readonly string[]): { readonly tag: string; readonly at: number } | undefined {
  let best: { tag: string; at: number } | undefined;
  for (const tag of tags) {
    const at = text.indexOf(tag);
    if (at >= 0 && (best === undefined || at < best.at)) best = { tag, at };
  }
  return best;
}

/** How many characters at the end of `text` are the start of `tag` (and so may still become it). */
function heldTail(text: string, tag: string): number {
  for (let n = Math.min(tag.length - 1, text.length); n > 0; n--) if (tag.startsWith(text.slice(text.length - n))) return n;
  return 0;
}
