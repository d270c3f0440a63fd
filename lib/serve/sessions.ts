/**
 * Sessions of `rxrl serve`: every route under `/sessions/{id}/v1/…` answers as `/v1/…` and records the call —
 * prompt ids, completion ids, per-token log-probs, policy version, finish reason, messages — so that an agent
 * written with any OpenAI client, which never sees token ids, can be trained on exactly what was sampled.
 *
 * Token in, token out: when a chat call's messages are an earlier call's messages plus that call's reply (and
 * then tool results or user turns), its prompt is the earlier call's exact prompt and completion ids followed by
 * the newly templated turns. What was sampled is never re-encoded. Where rendering the whole conversation again
 * would give other tokens (a template that drops `<think>` from past turns, say), the call counts as drift and
 * records where the two differ.
 *
 * A session's calls become trajectories: in `trajectory` mode a call whose prompt extends an earlier call's
 * prompt and completion continues that sequence (the tokens between are the environment's: masked from the
 * loss); in `transition` mode each call's completion is a sample of its own.
 *
 * @packageDocumentation
 */
import type { ChatTemplate } from '../chat/template.js';
import type { ChatMessage, ChatTool } from '../chat/types.js';
import { ConfigError } from '../core/errors.js';
import { hashSeed } from '../core/random.js';
import type { FinishReason, PolicyVersion } from '../core/types.js';
import { RequestError, excerpt, invalid, quote, type JsonObject } from './protocol.js';

/** Limits of a {@link SessionStore}. */
export interface SessionLimits {
  /** Most sessions held at once. Default 1024. */
  readonly maxSessions?: number;
  /** Most tokens one session records (prompts and completions of every call). Default 1 048 576. */
  readonly maxTokens?: number;
  /** A session unused this long (ms) is freed. Default 600 000 (10 minutes). */
  readonly idleMs?: number;
}

/** One choice of a recorded call: what the client received. */
export interface RecordedChoice {
  /** Completion ids (after stop strings), as `return_token_ids` gives them. */
  readonly tokens: readonly number[];
  readonly logprobs: readonly number[];
  readonly finishReason: FinishReason | 'tool_calls';
  /** The assistant message the client was given (chat calls). */
  readonly message?: ChatMessage;
  /** The text the client was given. */
  readonly text: string;
}

/** Where re-rendering a chat call's messages gives other prompt tokens than the exact continuation. */
export interface Drift {
  /** First position that differs. */
  readonly at: number;
  /** Up to 16 exact prompt ids from `at` (what was sampled and is trained on). */
  readonly exact: readonly number[];
  /** Up to 16 re-templated ids from `at` (what re-encoding the messages would give). */
  readonly retemplated: readonly number[];
}

/** One recorded call. */
export interface RecordedCall {
  /** The response's id (`chatcmpl-…`, `cmpl-…`; `#k` for the k-th prompt of a completions request). */
  readonly id: string;
  readonly route: 'chat' | 'completions';
  readonly promptIds: readonly number[];
  readonly choices: readonly RecordedChoice[];
  /** Version of the weights that produced the completions. */
  readonly version: PolicyVersion;
  /** The request's messages (chat calls). */
  readonly messages?: readonly ChatMessage[];
  /** The earlier call and choice whose exact tokens this prompt continues. */
  readonly continues?: { readonly call: string; readonly choice: number };
  readonly drift?: Drift;
}

/** What a session's calls sample with when a request does not say. */
export interface SessionDefaults {
  readonly maxTokens?: number;
  readonly temperature?: number;
  readonly topP?: number;
  /** Seed of the session: call `k` without a seed samples with one derived from it and `k`. */
  readonly seed?: number;
}

/** One session's state. */
export class Session {
  readonly calls: RecordedCall[] = [];
  /** Rewards posted for the whole session (summed). */
  reward: number | undefined;
  /** Rewards posted for single calls, by call id (summed per call). */
  readonly callRewards = new Map<string, number>();
  ended = false;
  tokens = 0;
  lastUsed = Date.now();

  constructor(
    readonly id: string,
    /** What calls sample with when they do not say: a run's settings for its agents. */
    readonly defaults: SessionDefaults = {},
  ) {}

  /**
   * The request as this session runs it: the session's `temperature` and `top_p` where the request has none, and
   * a seed derived from the session's seed and the call's index. (A missing `max_tokens` becomes the session's,
   * cut to the room the prompt leaves: the routes do that.)
   */
  withDefaults(body: JsonObject): JsonObject {
    const d = this.defaults;
    const out: Record<string, unknown> = { ...body };
    const fill = (name: string, value: number | undefined): void => {
      if (value !== undefined && (out[name] === undefined || out[name] === null)) out[name] = value;
    };
    fill('temperature', d.temperature);
    fill('top_p', d.topP);
    fill('seed', d.seed === undefined ? undefined : hashSeed(d.seed, 'session-call', String(this.calls.length)));
    return out;
  }

  /**
   * The prompt a chat call samples from: the exact continuation of the earlier call whose messages and reply
   * begin `messages`, or `rendered` (the template's rendering) when none does.
   */
  chatPrompt(
    template: ChatTemplate,
    stopIds: readonly number[],
    messages: readonly ChatMessage[],
    tools: readonly ChatTool[],
    rendered: readonly number[],
  ): { prompt: number[]; continues?: { call: string; choice: number }; drift?: Drift | undefined } {
    for (let c = this.calls.length - 1; c >= 0; c--) {
      const call = this.calls[c];
      const before = call.messages;
      if (before === undefined || messages.length <= before.length + 1) continue;
      if (!before.every((m, i) => sameMessage(m, messages[i]))) continue;
      const choice = call.choices.findIndex((x) => x.message !== undefined && sameMessage(x.message, messages[before.length]));
      if (choice < 0) continue;
      const turns = appendedTurns(template, stopIds, messages.slice(before.length + 1), tools);
      if (turns === undefined) break; // this template's turns cannot be appended token-exactly: render it all
      const sampled = call.choices[choice].tokens;
      const closed = sampled.length > 0 && stopIds.includes(sampled[sampled.length - 1]);
      const prompt = [...call.promptIds, ...sampled, ...(closed ? [] : [turns.closing]), ...turns.trailer, ...turns.tokens];
      return { prompt, continues: { call: call.id, choice }, drift: driftOf(prompt, rendered) };
    }
    return { prompt: [...rendered] };
  }

  /** Tokens reserved by calls in flight (prompts plus `n × max_tokens` each), released as they end. */
  private reservedTokens = 0;

  /** Tokens that calls in flight have reserved. */
  get reserved(): number {
    return this.reservedTokens;
  }

  /** Tokens a new call may still reserve: the session's `limit` less what it recorded and what calls in flight hold. */
  room(limit: number): number {
    return limit - this.tokens - this.reservedTokens;
  }

  /**
   * Reserves `count` tokens for a call (409 once the session has ended; 400 when they would pass `limit`), so that
   * concurrent calls cannot together record past the limit. {@link SessionStore.admit} reserves; the call releases.
   */
  reserve(count: number, limit: number): void {
    if (this.ended) throw new RequestError(409, `session '${this.id}' has ended`, { code: 'session_ended' });
    if (count > this.room(limit)) {
      throw new RequestError(
        400,
        `session '${this.id}' holds ${this.tokens} tokens and calls in flight reserve ${this.reservedTokens}; this call needs ${count} (its prompt and n × max_tokens) and would pass its limit of ${limit}`,
        { code: 'session_too_large' },
      );
    }
    this.reservedTokens += count;
    this.lastUsed = Date.now();
  }

  /** Gives back tokens reserved by {@link Session.reserve} (what the call recorded counts in `tokens` instead). */
  release(count: number): void {
    this.reservedTokens = Math.max(0, this.reservedTokens - count);
    this.lastUsed = Date.now();
  }

  /** Whether nothing was recorded, reserved, rewarded or ended in the session (a call that opened it and failed). */
  get untouched(): boolean {
    return this.calls.length === 0 && this.reservedTokens === 0 && this.reward === undefined && this.callRewards.size === 0 && !this.ended;
  }

  /** Records a call (its tokens count towards the session's limit from now on). */
  record(call: RecordedCall): void {
    this.tokens += call.promptIds.length + call.choices.reduce((sum, x) => sum + x.tokens.length, 0);
    this.calls.push(call);
    this.lastUsed = Date.now();
  }
}

/** Turns appended after an assistant reply, as the template renders them. */
interface AppendedTurns {
  /** The stop token that closes an assistant turn. */
  readonly closing: number;
  /** What the template puts after that stop token (a newline, say). */
  readonly trailer: readonly number[];
  /** The appended messages and the generation prompt. */
  readonly tokens: readonly number[];
}

/**
 * How the template renders `messages` after an assistant reply, found by rendering them after a stand-in
 * conversation (an empty user turn and an empty reply) and cutting at the end of the stand-in reply's turn.
 * `undefined` when the template does not render that way (no stop token closes the reply, or the appended turns
 * change the turns before them).
 */
function appendedTurns(
  template: ChatTemplate,
  stopIds: readonly number[],
  messages: readonly ChatMessage[],
  tools: readonly ChatTool[],
): AppendedTurns | undefined {
  const user: ChatMessage = { role: 'user', content: '' };
  const reply: ChatMessage = { role: 'assistant', content: '' };
  let asked: number[];
  let replied: number[];
  let next: number[];
  try {
    asked = template.render([user], tools, { addGenerationPrompt: true });
    replied = template.render([user, reply], tools, { addGenerationPrompt: false });
    next = template.render([user, reply, ...messages], tools, { addGenerationPrompt: true });
  } catch {
    return undefined;
  }
  const closeAt = (ids: readonly number[]): number => {
    if (!startsWith(ids, asked)) return -1;
    for (let k = asked.length; k < ids.length; k++) if (stopIds.includes(ids[k])) return k;
    return -1;
  };
  const close = closeAt(replied);
  const nextClose = closeAt(next);
  if (close < 0 || nextClose < 0) return undefined;
  const trailer = replied.slice(close + 1);
  if (!startsWith(next.slice(nextClose + 1), trailer)) return undefined;
  return { closing: replied[close], trailer, tokens: next.slice(nextClose + 1 + trailer.length) };
}

function startsWith(ids: readonly number[], prefix: readonly number[]): boolean {
  if (prefix.length > ids.length) return false;
  for (let i = 0; i < prefix.length; i++) if (ids[i] !== prefix[i]) return false;
  return true;
}

function driftOf(exact: readonly number[], rendered: readonly number[]): Drift | undefined {
  let at = 0;
  while (at < exact.length && at < rendered.length && exact[at] === rendered[at]) at++;
  if (at === exact.length && at === rendered.length) return undefined;
  return { at, exact: exact.slice(at, at + 16), retemplated: rendered.slice(at, at + 16) };
}

/** Messages are the same turn: role, content and the tools called (names and arguments; ids are the client's). */
function sameMessage(a: ChatMessage, b: ChatMessage): boolean {
  const calls = (m: ChatMessage): string => JSON.stringify((m.toolCalls ?? []).map((c) => [c.name, c.arguments]));
  return a.role === b.role && a.content === b.content && calls(a) === calls(b);
}

/** A call admitted to a session ({@link SessionStore.admit}): its reservation, held until {@link Admission.end}. */
export interface Admission {
  readonly session: Session;
  /** Ends the call: its reservation is given back (after it recorded, if it did). Idempotent. */
  end(): void;
}

/** Session ids: 1 to 128 characters of letters, digits and `._:-`. */
const SESSION_ID = /^[A-Za-z0-9._:-]{1,128}$/;

/** The sessions of one server, bounded in number, size and idle time. */
export class SessionStore {
  private readonly sessions = new Map<string, Session>();
  readonly maxSessions: number;
  readonly maxTokens: number;
  readonly idleMs: number;

  constructor(limits: SessionLimits = {}) {
    this.maxSessions = limits.maxSessions ?? 1024;
    this.maxTokens = limits.maxTokens ?? 1 << 20;
    this.idleMs = limits.idleMs ?? 600_000;
    for (const [key, value] of [
      ['maxSessions', this.maxSessions],
      ['maxTokens', this.maxTokens],
      ['idleMs', this.idleMs],
    ] as const) {
      if (!Number.isInteger(value) || value < 1)
        throw new ConfigError(`sessions.${key} must be an integer >= 1, got ${value}`, { context: { key: `sessions.${key}` } });
    }
  }

  /** Sessions held now. */
  get size(): number {
    return this.sessions.size;
  }

  /**
   * The session `id`, opened when absent. 400 for a malformed id; 429 when `maxSessions` are open (after freeing
   * idle ones, and the oldest ended one).
   */
  open(id: string, defaults?: SessionDefaults): Session {
    checkId(id);
    this.sweep();
    const found = this.sessions.get(id);
    if (found !== undefined) {
      found.lastUsed = Date.now();
      return found;
    }
    const session = new Session(id, defaults);
    this.hold(session);
    return session;
  }

  /**
   * The session a call to `/sessions/{id}/v1/…` runs in: the open one, or a new one that is not held yet. Nothing
   * is opened here: a call validates its request against this session and opens it with {@link SessionStore.admit},
   * so that an invalid call costs no slot. 400 for a malformed id.
   */
  find(id: string): Session {
    checkId(id);
    this.sweep();
    return this.sessions.get(id) ?? new Session(id);
  }

  /**
   * Admits a valid call to `session` (from {@link SessionStore.find}): reserves its `tokens` (prompt and
   * `n × max_tokens`; 400 past `maxTokens`, 409 once ended) and opens the session if it is new (429 when
   * `maxSessions` are open). The call ends with {@link Admission.end}, which gives back the reservation and
   * closes a session that the call opened and left untouched.
   */
  admit(session: Session, tokens: number): Admission {
    const opens = this.sessions.get(session.id) !== session;
    session.reserve(tokens, this.maxTokens);
    if (opens) {
      try {
        this.hold(session);
      } catch (error) {
        session.release(tokens);
        throw error;
      }
    }
    let ended = false;
    return {
      session,
      end: () => {
        if (ended) return;
        ended = true;
        session.release(tokens);
        if (opens && session.untouched && this.sessions.get(session.id) === session) this.sessions.delete(session.id);
      },
    };
  }

  /** Holds a new session: 429 when `maxSessions` are open (after freeing the oldest ended one). */
  private hold(session: Session): void {
    if (this.sessions.size >= this.maxSessions) {
      const ended = [...this.sessions.values()].filter((s) => s.ended).sort((a, b) => a.lastUsed - b.lastUsed)[0];
      if (ended === undefined) {
        throw new RequestError(429, `${this.maxSessions} sessions are open; end or delete one first`, {
          type: 'rate_limit_error',
          code: 'too_many_sessions',
        });
      }
      this.sessions.delete(ended.id);
    }
    this.sessions.set(session.id, session);
  }

  /** The session `id` (404 when there is none). */
  get(id: string): Session {
    checkId(id);
    this.sweep();
    const session = this.sessions.get(id);
    if (session === undefined) throw new RequestError(404, `no session '${excerpt(id)}'`, { code: 'session_not_found' });
    return session;
  }

  /** Frees a session; whether it was there. */
  delete(id: string): boolean {
    return this.sessions.delete(id);
  }

  /** Frees the sessions idle for longer than `idleMs` (none with a call in flight). */
  sweep(now = Date.now()): void {
    // A session with a call in flight is in use, however long the call runs.
    for (const [id, session] of this.sessions) if (session.reserved === 0 && now - session.lastUsed > this.idleMs) this.sessions.delete(id);
  }
}

function checkId(id: string): void {
  if (!SESSION_ID.test(id)) {
    throw new RequestError(400, `session ids are 1 to 128 characters of letters, digits and ._:- (got '${excerpt(id)}')`, {
      code: 'invalid_session_id',
    });
  }
}

/** How a session's calls become samples. */
export type ExportMode = 'trajectory' | 'transition';

/** One sample of a session, in the JSON of `GET /sessions/{id}`. */
export interface SessionTrajectory {
  readonly prompt_ids: number[];
  readonly response_ids: number[];
  /** 1 where the policy sampled the token, 0 where the environment (tools, users, the template) added it. */
  readonly response_mask: number[];
  /** The sampling log-prob of each response token (0 where masked). */
  readonly logprobs: number[];
  /** The reward given (summed along the sequence, or discounted back per call); `null` when none was posted. */
  readonly reward: number | null;
  /** Policy version of each call in the sample. */
  readonly versions: number[];
  /** Ids of the calls in the sample. */
  readonly calls: string[];
  /** Why the last completion in the sample ended. */
  readonly finish_reason: string;
  /** The text of the last completion. */
  readonly last_text: string;
}

interface Node {
  readonly call: RecordedCall;
  readonly index: number;
  readonly choice: number;
  readonly parent: Node | undefined;
  /** Prompt ids beyond the parent's sequence (the whole prompt for a root). */
  readonly added: readonly number[];
  readonly full: readonly number[];
  children: number;
}

/**
 * A session's samples. `trajectory`: each sequence of calls whose prompts extend the one before (a tree's
 * leaves, when two calls continue the same one), reward = the session's reward plus the rewards of its calls.
 * `transition`: one per call and choice, reward = its call's reward plus `discount` × the next call's (the
 * session's reward counted on the last call).
 */
export function sessionSamples(session: Session, mode: ExportMode, discount = 1): SessionTrajectory[] {
  const nodes: Node[] = [];
  session.calls.forEach((call, index) => {
    call.choices.forEach((choice, c) => {
      let parent: Node | undefined;
      if (mode === 'trajectory') {
        for (const node of nodes) {
          if (node.index === index) continue;
          if (startsWith(call.promptIds, node.full) && (parent === undefined || node.full.length > parent.full.length)) parent = node;
        }
      }
      const node: Node = {
        call,
        index,
        choice: c,
        parent,
        added: call.promptIds.slice(parent?.full.length ?? 0),
        full: [...call.promptIds, ...choice.tokens],
        children: 0,
      };
      if (parent !== undefined) parent.children++;
      nodes.push(node);
    });
  });
  const posted = session.reward !== undefined || session.callRewards.size > 0;
  const callReward = (call: RecordedCall): number => session.callRewards.get(call.id) ?? 0;
  const returns = new Map<string, number>();
  let later = 0;
  for (let k = session.calls.length - 1; k >= 0; k--) {
    const call = session.calls[k];
    later = callReward(call) + (k === session.calls.length - 1 ? (session.reward ?? 0) : discount * later);
    returns.set(call.id, later);
  }
  return nodes
    .filter((node) => mode === 'transition' || node.children === 0)
    .map((leaf) => {
      const path: Node[] = [];
      for (let n: Node | undefined = leaf; n !== undefined; n = n.parent) path.unshift(n);
      const root = path[0];
      const out: SessionTrajectory = {
        prompt_ids: [...root.call.promptIds],
        response_ids: [],
        response_mask: [],
        logprobs: [],
        reward: null,
        versions: path.map((n) => n.call.version),
        calls: path.map((n) => n.call.id),
        finish_reason: leaf.call.choices[leaf.choice].finishReason,
        last_text: leaf.call.choices[leaf.choice].text,
      };
      path.forEach((n, i) => {
        if (i > 0) {
          out.response_ids.push(...n.added);
          for (const _ of n.added) {
            out.response_mask.push(0);
            out.logprobs.push(0);
          }
        }
        const choice = n.call.choices[n.choice];
        out.response_ids.push(...choice.tokens);
        out.logprobs.push(...choice.logprobs);
        for (const _ of choice.tokens) out.response_mask.push(1);
      });
      const reward =
        mode === 'transition'
          ? (returns.get(leaf.call.id) ?? 0)
          : (session.reward ?? 0) + path.reduce((sum, n) => sum + callReward(n.call), 0);
      return { ...out, reward: posted ? reward : null };
    });
}

/** `GET /sessions/{id}`: the calls, the samples (`?mode=`, `?discount=`), the drift count. */
export function sessionJson(session: Session, query: URLSearchParams): Record<string, unknown> {
  const mode = query.get('mode') ?? 'trajectory';
  if (mode !== 'trajectory' && mode !== 'transition') throw invalid('mode', `mode must be trajectory or transition, got ${quote(mode)}`);
  const discountText = query.get('discount');
  const discount = discountText === null ? 1 : Number(discountText);
  if (!(discount >= 0 && discount <= 1)) throw invalid('discount', `discount must be a number in [0, 1], got ${quote(discountText)}`);
  return {
    id: session.id,
    object: 'session',
    ended: session.ended,
    reward: session.reward ?? null,
    tokens: session.tokens,
    drift: session.calls.filter((c) => c.drift !== undefined).length,
    calls: session.calls.map((call) => ({
      id: call.id,
      route: call.route,
      prompt_ids: call.promptIds,
      version: call.version,
      continues: call.continues ?? null,
      drift: call.drift ?? null,
      reward: session.callRewards.get(call.id) ?? null,
      ...(call.messages ? { messages: call.messages } : {}),
      choices: call.choices.map((x) => ({
        token_ids: x.tokens,
        logprobs: x.logprobs,
        finish_reason: x.finishReason,
        text: x.text,
        ...(x.message ? { message: x.message } : {}),
      })),
    })),
    mode,
    trajectories: sessionSamples(session, mode, discount),
  };
}

/**
 * `POST /sessions/{id}/reward`: `{ reward }` for the session, or `{ reward, call }` for one call; rewards add up.
 * 400, with the stored rewards unchanged, when the reward is not a finite number or when the rewards would no
 * longer sum to one (`1.7e308` posted twice): every sample's reward is a sum of them, and must stay finite.
 */
export function postReward(session: Session, body: JsonObject): Record<string, unknown> {
  const reward = body.reward;
  if (typeof reward !== 'number' || !Number.isFinite(reward))
    throw invalid('reward', `'reward' must be a finite number, got ${quote(reward)}`);
  const call = body.call;
  if (call !== undefined && call !== null && (typeof call !== 'string' || !session.calls.some((c) => c.id === call))) {
    throw invalid('call', `'call' must be the id of a call of this session, got ${quote(call)}`);
  }
  const forCall = typeof call === 'string' ? call : undefined;
  const before = forCall === undefined ? session.reward : session.callRewards.get(forCall);
  const after = (before ?? 0) + reward;
  // A sample's reward sums the session's reward and some calls' (discounted by at most 1): bounded by this.
  let magnitude = Math.abs(forCall === undefined ? after : (session.reward ?? 0));
  for (const [id, value] of session.callRewards) if (id !== forCall) magnitude += Math.abs(value);
  if (forCall !== undefined) magnitude += Math.abs(after);
  if (!Number.isFinite(magnitude)) {
    throw invalid(
      'reward',
      `with ${reward} the session's rewards would no longer sum to a finite number; a reward must stay finite`,
      'reward_overflow',
    );
  }
  if (forCall === undefined) session.reward = after;
  else session.callRewards.set(forCall, after);
  session.lastUsed = Date.now();
  return { id: session.id, reward: session.reward ?? null, call_rewards: Object.fromEntries(session.callRewards) };
}
