/**
 * The futures of rxrl's Tinker service: every call that trains or samples answers a request id at once and runs
 * later, after the earlier requests of its queue (a training client's: the SDK pipelines `forward_backward` and
 * `optim_step`); `retrieve_future` long-polls the outcome. Both the requests in flight and the results waiting for
 * a poll are bounded.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import { ConfigError, DecodeError, RxrlError, ShapeError } from '../core/errors.js';
import { RequestError } from '../serve/protocol.js';
import { ProtoError } from './proto.js';

/** A future's outcome: a JSON value, protobuf bytes, or an error the SDK raises as `RequestFailedError`. */
export type Outcome =
  { readonly json: unknown } | { readonly proto: Uint8Array } | { readonly error: string; readonly category: 'user' | 'server' };

/** Requests that run one after another: the tail is the last one queued. */
export interface Queue {
  tail: Promise<unknown>;
}

/** A future: its outcome, once settled, and the session whose request it is (a poll keeps that session alive). */
export interface Future {
  readonly outcome: Promise<Outcome>;
  readonly session: string | undefined;
}

/** Bounds of a {@link FutureStore}. */
export interface FutureLimits {
  /** Requests queued or running at once; one more is refused with 429. */
  readonly maxInFlight: number;
  /** Settled results kept until polled; past this the oldest is dropped. */
  readonly maxFinished: number;
}

/**
 * Errors that are the client's (a bad request: a 4xx at once, or a user error the SDK raises from a future), not
 * the service's.
 */
export function isUserError(error: unknown): error is Error {
  return (
    error instanceof RequestError ||
    error instanceof ProtoError ||
    error instanceof ShapeError ||
    error instanceof ConfigError ||
    error instanceof DecodeError
  );
}

/**
 * The outcome of work that threw: the message of rxrl's own errors; a bare `internal error` for anything else (a
 * bug's text says nothing useful to a client and may say too much).
 */
export function failed(error: unknown): Outcome {
  const message = error instanceof RxrlError ? error.message : 'internal error';
  return { error: message, category: isUserError(error) ? 'user' : 'server' };
}

/** The futures of one service. */
export class FutureStore {
  private readonly futures = new Map<string, Future>();
  /** Requests whose future settled, oldest first (their results wait for a poll). */
  private readonly finished: string[] = [];
  /** The outcomes of the requests in flight. */
  private readonly running = new Set<Promise<Outcome>>();

  constructor(private readonly limits: FutureLimits) {}

  /**
   * Runs `work` after every request queued on `queue` before it (at once without a queue).
   *
   * @param session - The session the request belongs to (polls of the future touch it).
   * @returns The request id.
   * @throws {@link RequestError} 429 when `maxInFlight` requests are in flight.
   */
  submit(work: () => Outcome | Promise<Outcome>, queue?: Queue, session?: string): string {
    if (this.running.size >= this.limits.maxInFlight)
      throw new RequestError(429, `${this.limits.maxInFlight} requests are in flight; retry later`);
    const id = `req-${randomUUID()}`;
    const run = async (): Promise<Outcome> => {
      try {
        return await work();
      } catch (error) {
        return failed(error);
      }
    };
    const outcome: Promise<Outcome> = (queue === undefined ? run() : queue.tail.then(run)).finally(() => {
      this.running.delete(outcome);
      // Results nobody polls for are kept for the newest maxFinished requests only.
      this.finished.push(id);
      while (this.finished.length > this.limits.maxFinished) this.futures.delete(this.finished.shift() as string);
    });
    this.running.add(outcome);
    if (queue !== undefined) queue.tail = outcome;
    this.futures.set(id, { outcome, session });
    return id;
  }

  /** The future of `id`, if it is known (in flight, or settled and not yet delivered or dropped). */
  get(id: string): Future | undefined {
    return this.futures.get(id);
  }

  /** Resolves once every request in flight now has settled. */
  async settled(): Promise<void> {
    await Promise.all(this.running);
  }

  /** Forgets a future whose outcome was delivered. */
  delete(id: string): void {
    this.futures.delete(id);
  }
}
