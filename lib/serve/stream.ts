/**
 * Server-sent events of `rxrl serve` (`"stream": true`): OpenAI's chunk stream, one `data: {json}` event per
 * chunk and `data: [DONE]` at the end.
 *
 * Text is sent as the tokens are sampled, with two holds so that the streamed text always equals the text the same
 * request gets without streaming: the newest token waits for the next one (a token's text is settled only once
 * another follows it, or the response ends), and, when the request has stop strings, text that a stop string could
 * still begin in waits until it cannot.
 *
 * Backpressure: a chunk is written only while the client's connection has room (`res.write` returned true, or
 * `'drain'` came since). A slow reader does not make the server pile up encoded chunks: each choice keeps its
 * sampled tokens, which the generation holds anyway, and its pieces are encoded and written as the connection
 * drains. Memory per stream is bounded by the request (prompts × `n` × `max_tokens` tokens), not by how slowly the
 * client reads; a client that goes away cancels the generation (see the server).
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../model/types.js';
import { invalid, readBoolean, type JsonObject } from './protocol.js';
import { TextPieces, type Finished, type Sampling } from './sampling.js';

/** Where a stream's chunks go: the client's connection, with its backpressure. */
export interface EventSink {
  /** Writes one chunk as `data: <json>`. It is always written: callers keep to {@link EventSink.room} for anything sizable. */
  send(chunk: unknown): void;
  /** Whether the connection has room: its buffer is below its high-water mark. */
  readonly room: boolean;
  /** Resolves once the connection has room (at once when it has); rejects with an `AbortError` once the client is gone. */
  drained(): Promise<void>;
  /** Calls `listener` each time the connection drains, while the stream runs. */
  onDrain(listener: () => void): void;
}

/** A response sent as server-sent events: the router answers with `text/event-stream` and runs `run`. */
export class EventStream {
  /**
   * @param run - Sends the chunks (each a JSON value) in order into the sink, keeping to its room; resolves when the
   *   stream is complete (`[DONE]` follows). A rejection after the first chunk is sent as an `error` event.
   */
  constructor(readonly run: (sink: EventSink) => Promise<void>) {}
}

/** Sends what `choice` holds as the connection drains; resolves once it has sent everything (after its `end`). */
export async function drainChoice(choice: LiveChoice, sink: EventSink): Promise<void> {
  while (!choice.flush()) await sink.drained();
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
 * the finished text. Pieces are emitted only while `room()` says the client can take them; the others wait, as
 * token ids, for {@link LiveChoice.flush}.
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
  /** Tokens emitted so far. */
  private sent = 0;
  /** Tokens whose pieces are settled (emitted or waiting for room). */
  private ready = 0;
  /** The finished response, once {@link LiveChoice.end} gave it, with each kept token's end in its text. */
  private finished: { readonly response: Finished; readonly ends: readonly number[] } | undefined;
  private stopSeen = false;
  private readonly longestStop: number;

  constructor(
    tokenizer: Tokenizer,
    private readonly stops: readonly string[],
    private readonly emit: (piece: StreamPiece) => void,
    private readonly room: () => boolean = () => true,
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
    let upTo = this.ready;
    while (upTo < this.ends.length && this.ends[upTo] <= limit) upTo++;
    this.ready = upTo;
    this.flush();
  }

  /** Settles what is left of `finished` (the same response after stop strings) and sends what the client has room for. */
  end(finished: Finished): void {
    this.finished = { response: finished, ends: finished.offsets.map((_, j) => finished.offsets[j + 1] ?? finished.text.length) };
    this.ready = Math.max(this.sent, finished.tokens.length);
    this.flush();
  }

  /** Emits settled pieces while the client has room; true once the choice has ended and nothing is left to emit. */
  flush(): boolean {
    while (this.sent < this.ready && this.room()) this.emitPiece(this.sent++);
    return this.finished !== undefined && this.sent >= this.ready;
  }

  /** Emits token `j`'s piece, from the finished response once there is one (the pieces agree up to what was settled). */
  private emitPiece(j: number): void {
    const done = this.finished;
    const endOf = (k: number): number => (done === undefined ? this.ends[k] : done.ends[k]);
    const start = j === 0 ? 0 : endOf(j - 1);
    const text = done === undefined ? this.text : done.response.text;
    const tokens = done === undefined ? this.tokens : done.response.tokens;
    const logprobs = done === undefined ? this.logprobs : done.response.logprobs;
    this.emit({ first: j, tokens: [tokens[j]], logprobs: [logprobs[j]], text: text.slice(start, endOf(j)), offsets: [start] });
  }
}

/** Whether a choice's stream should carry this piece: text, or token data the client asked for. */
export function worthSending(piece: StreamPiece, sampling: Sampling, wantLogprobs: boolean): boolean {
  return piece.text !== '' || wantLogprobs || sampling.returnTokenIds;
}
