/**
 * Server-sent events of `rxrl serve` (`"stream": true`): OpenAI's chunk stream, one `data: {json}` event per
 * chunk and `data: [DONE]` at the end.
 *
 * Text is sent as the tokens are sampled, with two holds so that the streamed text always equals the text the same
 * request gets without streaming: the newest token waits for the next one (a token's text is settled only once
 * another follows it, or the response ends), and, when the request has stop strings, text that a stop string could
 * still begin in waits until it cannot.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../engine/types.js';
import { invalid, readBoolean, type JsonObject } from './protocol.js';
import { TextPieces, type Finished, type Sampling } from './sampling.js';

/** A response sent as server-sent events: the router answers with `text/event-stream` and runs `run`. */
export class EventStream {
  /**
   * @param run - Sends the chunks (each a JSON value) in order; resolves when the stream is complete (`[DONE]`
   *   follows). A rejection after the first chunk is sent as an `error` event.
   */
  constructor(readonly run: (send: (chunk: unknown) => void) => Promise<void>) {}
}

/** What a request asks of streaming: `stream` and `stream_options.include_usage`. */
export interface StreamRequest {
  readonly stream: boolean;
  readonly includeUsage: boolean;
}

/** Reads `stream` and `stream_options` (400 when `stream_options` comes without `stream: true`). */
export function readStream(body: JsonObject): StreamRequest {
  const stream = readBoolean(body, 'stream', false);
  const options = body.stream_options;
  if (options === undefined || options === null) return { stream, includeUsage: false };
  if (!stream) throw invalid('stream_options', "'stream_options' is only allowed when 'stream' is true");
  if (typeof options !== 'object' || Array.isArray(options)) throw invalid('stream_options', "'stream_options' must be an object");
  return { stream, includeUsage: readBoolean(options as JsonObject, 'include_usage', false) };
}

/** Consecutive tokens of one choice and the text they add. */
export interface StreamPiece {
  /** Index of the first token in the response. */
  readonly first: number;
  readonly tokens: readonly number[];
  readonly logprobs: readonly number[];
  readonly text: string;
  /** Character offset of each token in the response's text. */
  readonly offsets: readonly number[];
}

/**
 * The stream of one choice: {@link LiveChoice.push} each token as it is sampled, then {@link LiveChoice.end} with
 * the finished response; `emit` receives every token exactly once, in order, and the texts it receives add up to
 * the finished text.
 */
export class LiveChoice {
  private readonly pieces: TextPieces;
  private readonly tokens: number[] = [];
  private readonly logprobs: number[] = [];
  /** Settled text: every token's but the newest. */
  private text = '';
  private readonly ends: number[] = [];
  /** The newest token's text, not settled until another token follows. */
  private pending: string | undefined;
  private sent = 0;
  private stopSeen = false;
  private readonly longestStop: number;

  constructor(
    tokenizer: Tokenizer,
    private readonly stops: readonly string[],
    private readonly emit: (piece: StreamPiece) => void,
  ) {
    this.pieces = new TextPieces(tokenizer);
    this.longestStop = Math.max(0, ...stops.map((s) => s.length));
  }

  /** Tokens sent so far. */
  get sentTokens(): number {
    return this.sent;
  }

  /** A newly sampled token. */
  push(token: number, logprob: number): void {
    if (this.pending !== undefined) {
      this.text += this.pending;
      this.ends.push(this.text.length);
    }
    this.tokens.push(token);
    this.logprobs.push(logprob);
    this.pending = this.pieces.push(token, false);
    if (this.stopSeen) return;
    if (this.stops.some((s) => this.text.includes(s))) {
      this.stopSeen = true; // what follows is decided by the finished response
      return;
    }
    const limit = this.longestStop === 0 ? Infinity : this.text.length - this.longestStop + 1;
    let upTo = this.sent;
    while (upTo < this.ends.length && this.ends[upTo] <= limit) upTo++;
    if (upTo > this.sent) this.send(upTo, (j) => this.ends[j], this.tokens, this.logprobs);
  }

  /** Sends what is left of `finished` (the same response after stop strings). */
  end(finished: Finished): void {
    const ends = finished.offsets.map((_, j) => finished.offsets[j + 1] ?? finished.text.length);
    if (finished.tokens.length > this.sent) this.send(finished.tokens.length, (j) => ends[j], finished.tokens, finished.logprobs, finished.text);
  }

  private send(upTo: number, endOf: (j: number) => number, tokens: readonly number[], logprobs: readonly number[], text = this.text): void {
    for (let j = this.sent; j < upTo; j++) {
      const start = j === 0 ? 0 : endOf(j - 1);
      this.emit({ first: j, tokens: [tokens[j]], logprobs: [logprobs[j]], text: text.slice(start, endOf(j)), offsets: [start] });
    }
    this.sent = upTo;
  }
}

/** Whether a choice's stream should carry this piece: text, or token data the client asked for. */
export function worthSending(piece: StreamPiece, sampling: Sampling, wantLogprobs: boolean): boolean {
  return piece.text !== '' || wantLogprobs || sampling.returnTokenIds;
}
