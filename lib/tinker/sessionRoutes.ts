/**
 * The bootstrap and future routes of rxrl's Tinker service: sessions (`create_session`, `session_heartbeat`,
 * `sessions/{id}/finish`) and `retrieve_future`.
 *
 * @packageDocumentation
 */
import { RequestError, quote, readString, type JsonObject } from '../serve/protocol.js';
import type { Reply, TinkerContext } from './context.js';

/** `POST create_session`. */
export function createSession(ctx: TinkerContext): unknown {
  return { session_id: ctx.clients.openSession(), type: 'create_session' };
}

/** `POST session_heartbeat`: keeps the session alive; 410 once it ended (the SDK then stops heartbeating). */
export function sessionHeartbeat(ctx: TinkerContext, body: JsonObject): unknown {
  if (typeof body.session_id !== 'string' || !ctx.clients.touch(body.session_id)) {
    throw new RequestError(410, `session ${quote(body.session_id)} has ended or never existed`);
  }
  return { type: 'session_heartbeat' };
}

/** `POST sessions/{id}/finish` (the SDK's `close`): ends the session and frees its training clients. */
export function finishSession(ctx: TinkerContext, id: string): unknown {
  ctx.clients.finish(id);
  return {};
}

/**
 * `POST retrieve_future`: the future's result once it settles (protobuf for forward/backward and samples, JSON
 * else, `{ error, category }` for a failure), or `try_again` after `pollMs`. A delivered result is forgotten.
 */
export async function retrieveFuture(ctx: TinkerContext, body: JsonObject): Promise<Reply> {
  const id = readString(body, 'request_id');
  const future = ctx.futures.get(id);
  if (future === undefined) throw new RequestError(404, `no request ${quote(id)}`);
  if (future.session !== undefined) ctx.clients.touch(future.session);
  let timer: ReturnType<typeof setTimeout> | undefined;
  const waited = await Promise.race([
    future.outcome,
    new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), ctx.limits.pollMs))),
  ]);
  clearTimeout(timer);
  if (waited === undefined) return { json: { type: 'try_again', request_id: id, queue_state: 'active' } };
  ctx.futures.delete(id);
  if ('error' in waited) return { json: { error: waited.error, category: waited.category } };
  return waited;
}
