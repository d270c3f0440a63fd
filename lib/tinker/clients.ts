/**
 * Sessions and training clients of rxrl's Tinker service, and their lifetimes: a training client lives until it is
 * unloaded (`unload_model`), its session finishes (`sessions/{id}/finish`, which the SDK sends on `close`) or its
 * session goes silent — no heartbeat (the SDK sends one every 10 s) and no request for `sessionTimeoutMs`. A freed
 * client answers 404 at once; its trainer is disposed once the requests queued before are done, and until then it
 * still counts against `maxModels`.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import { RequestError, quote } from '../serve/protocol.js';
import type { Queue } from './futures.js';
import type { TinkerTrainer } from './training.js';

/** A LoRA training client: id `{session}:train:{seq}`, its trainer and the queue its requests run in. */
export interface TrainingClient {
  readonly id: string;
  readonly session: string;
  readonly trainer: TinkerTrainer;
  readonly queue: Queue;
}

/** Bounds and lifetimes of {@link TrainingClients}. */
export interface ClientLimits {
  /** Training clients at once (those being freed included). */
  readonly maxModels: number;
  /** Sessions at once. */
  readonly maxSessions: number;
  /** A session with no heartbeat and no request for this long ends, and its clients are freed. */
  readonly sessionTimeoutMs: number;
}

interface SessionState {
  lastSeen: number;
  readonly clients: Set<string>;
  /** Training clients made in the session so far (the default number of the next). */
  made: number;
}

/** The sessions and training clients of one service. */
export class TrainingClients {
  private readonly sessions = new Map<string, SessionState>();
  private readonly clients = new Map<string, TrainingClient>();
  /** Clients freed whose trainers are not disposed yet (their queued requests run first). */
  private retiring = 0;
  private readonly sweep: ReturnType<typeof setInterval>;

  /**
   * @param limits - Room and lifetimes.
   * @param now - The clock sessions are timed with (ms). Default `Date.now`.
   */
  constructor(
    private readonly limits: ClientLimits,
    private readonly now: () => number = Date.now,
  ) {
    this.sweep = setInterval(() => this.expire(), Math.max(50, Math.min(limits.sessionTimeoutMs / 4, 10_000)));
    this.sweep.unref();
  }

  /** Opens a session; 429 when `maxSessions` are open (after the silent ones are ended). */
  openSession(): string {
    this.expire();
    if (this.sessions.size >= this.limits.maxSessions)
      throw new RequestError(429, `${this.limits.maxSessions} sessions are open; retry later`);
    const id = `sess-${randomUUID()}`;
    this.sessions.set(id, { lastSeen: this.now(), clients: new Set(), made: 0 });
    return id;
  }

  /** Marks `session` alive (a heartbeat, or any request of it); false when it does not exist (or ended). */
  touch(session: string): boolean {
    const state = this.sessions.get(session);
    if (state === undefined) return false;
    state.lastSeen = this.now();
    return true;
  }

  /** Ends `session` (known or not) and frees its training clients. */
  finish(session: string): void {
    const state = this.sessions.get(session);
    if (state === undefined) return;
    this.sessions.delete(session);
    for (const id of state.clients) {
      const client = this.clients.get(id);
      if (client !== undefined) void this.free(client);
    }
  }

  /** Ends every session silent for longer than `sessionTimeoutMs`. */
  expire(): void {
    const cutoff = this.now() - this.limits.sessionTimeoutMs;
    for (const [id, state] of this.sessions) if (state.lastSeen < cutoff) this.finish(id);
  }

  /** The training client `id` (its session is touched); 404 when there is none. */
  get(id: unknown): TrainingClient {
    const client = typeof id === 'string' ? this.clients.get(id) : undefined;
    if (client === undefined) throw new RequestError(404, `no training client ${quote(id)}`);
    this.touch(client.session);
    return client;
  }

  /**
   * Checks that `session` may open a training client numbered `seq` (default: the number of clients it made so far)
   * — the session exists, there is room, the id is free — and returns its id `{session}:train:{seq}`.
   *
   * @throws {@link RequestError} 404 (no session), 429 (`maxModels` clients), 409 (the id exists).
   */
  reserve(session: string, seq: number | undefined): string {
    this.expire();
    const state = this.sessions.get(session);
    if (state === undefined) throw new RequestError(404, `no session ${quote(session)}`);
    state.lastSeen = this.now();
    if (this.clients.size + this.retiring >= this.limits.maxModels)
      throw new RequestError(429, `${this.limits.maxModels} training clients are open`);
    const id = `${session}:train:${seq ?? state.made}`;
    if (this.clients.has(id)) throw new RequestError(409, `training client '${id}' exists`);
    return id;
  }

  /** Registers a training client made for an id {@link TrainingClients.reserve} returned (checked again). */
  add(id: string, session: string, trainer: TinkerTrainer): TrainingClient {
    const state = this.sessions.get(session);
    if (state === undefined || this.clients.has(id) || this.clients.size + this.retiring >= this.limits.maxModels) {
      trainer.dispose();
      throw new RequestError(409, `training client '${id}' cannot be added any more (its session ended, or the service filled up)`);
    }
    const client: TrainingClient = { id, session, trainer, queue: { tail: Promise.resolve() } };
    this.clients.set(id, client);
    state.clients.add(id);
    state.made++;
    return client;
  }

  /**
   * Frees a training client: from now on it is unknown (404); its trainer is disposed once the requests queued
   * before are done. Resolves then.
   */
  async free(client: TrainingClient): Promise<void> {
    if (this.clients.get(client.id) !== client) return;
    this.clients.delete(client.id);
    this.sessions.get(client.session)?.clients.delete(client.id);
    this.retiring++;
    try {
      await client.queue.tail.catch(() => undefined);
    } finally {
      client.trainer.dispose();
      this.retiring--;
    }
  }

  /** Number of training clients held (those being freed included). */
  get size(): number {
    return this.clients.size + this.retiring;
  }

  /** Ends every session and frees every client, once their queued requests are done. */
  async close(): Promise<void> {
    clearInterval(this.sweep);
    const clients = [...this.clients.values()];
    this.sessions.clear();
    await Promise.all(clients.map((client) => this.free(client)));
  }
}
