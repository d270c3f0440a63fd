/**
 * The session gateway's cost: the same multi-turn chats (three calls each, the conversation growing by the reply
 * and a new user turn) sampled three ways, interleaved round by round so the machine's noise falls on all alike:
 *
 * - `engine`: the chat rendered by the template and sampled by the server's engine in process (no HTTP);
 * - `v1`: `POST /v1/chat/completions` (HTTP, JSON, the chat template, tool parsing);
 * - `session`: `POST /sessions/{id}/v1/chat/completions` (the same, plus the token-exact prompt and the record),
 *   then `GET /sessions/{id}` (the trajectory export) and `DELETE`.
 *
 * Equal seeds give equal samples on every path. Then sessions per second: `--agents` concurrent clients run chats
 * for `--seconds` through sessions and through plain `/v1`. Prints one JSON line per measurement and a summary
 * (`bench: "gateway-summary"`) with the per-call overhead in ms and the ratios.
 *
 * Run: `npm run bench -- gateway [--chats 40] [--agents 16] [--seconds 10] [--backend auto]`.
 *
 * @packageDocumentation
 */
import { createChatTemplate } from '../lib/chat/template.js';
import type { ChatMessage } from '../lib/chat/types.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel } from '../lib/model/transformer.js';
import { serve } from '../lib/serve/server.js';
import { median } from './_stats.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

const TURNS = 3;
const MAX_TOKENS = 8;

function mean(xs: readonly number[]): number {
  return xs.reduce((a, b) => a + b, 0) / xs.length;
}

const round3 = (x: number): number => Number(x.toFixed(3));

/** The three ways one chat call can go, each timed by {@link Paths.chat}, over one running server. */
interface Paths {
  /** One chat of TURNS calls through `call`; returns each call's milliseconds. */
  chat(chatId: number, call: Call): Promise<number[]>;
  /** The template and the server's engine, in process. */
  readonly viaEngine: Call;
  /** `POST url` with the chat, the reply's text. */
  viaUrl(url: string): Call;
  /** One chat through a session, then its export and `DELETE`: the calls' milliseconds, then the export's. */
  viaSession(chatId: number, tag: string): Promise<number[]>;
  /** Calls whose recorded tokens drifted from their re-encoded text, over every session so far. */
  drifted(): number;
}

type Call = (messages: ChatMessage[], seed: number) => Promise<string>;
type Server = Awaited<ReturnType<typeof serve>>;

/** The three paths over `server`; every session's drift is counted as its chat ends. */
function paths(server: Server, tokenizer: CharTokenizer): Paths {
  const template = createChatTemplate(tokenizer);
  const post = async (url: string, body: unknown): Promise<{ choices: { message: { content: string } }[] }> => {
    const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    if (!response.ok) throw new Error(`${url}: ${response.status} ${await response.text()}`);
    return (await response.json()) as { choices: { message: { content: string } }[] };
  };
  const chat = async (chatId: number, call: Call): Promise<number[]> => {
    const messages: ChatMessage[] = [{ role: 'user', content: `what is ${chatId % 10}+${(chatId * 7) % 10}?` }];
    const times: number[] = [];
    for (let turn = 0; turn < TURNS; turn++) {
      const started = performance.now();
      const reply = await call(messages, chatId * 100 + turn);
      times.push(performance.now() - started);
      messages.push({ role: 'assistant', content: reply }, { role: 'user', content: 'and once more?' });
    }
    return times;
  };
  const viaEngine: Call = async (messages, seed) => {
    const promptTokens = template.render(messages, [], { addGenerationPrompt: true });
    const [response] = await server.engine.generate([
      { promptTokens, maxTokens: MAX_TOKENS, temperature: 1, seed, stopTokens: tokenizer.stopIds },
    ]);
    return tokenizer.decode(response.tokens);
  };
  const viaUrl =
    (url: string): Call =>
    async (messages, seed) =>
      (await post(url, { model: server.modelName, messages, max_tokens: MAX_TOKENS, temperature: 1, seed })).choices[0].message.content;
  let drifted = 0;
  const viaSession = async (chatId: number, tag: string): Promise<number[]> => {
    const base = `${server.url}/sessions/${tag}-${chatId}`;
    const times = await chat(chatId, viaUrl(`${base}/v1/chat/completions`));
    const started = performance.now();
    const exported = (await (await fetch(base)).json()) as { trajectories: unknown[]; drift: number };
    await fetch(base, { method: 'DELETE' });
    if (exported.trajectories.length !== 1)
      throw new Error(`session ${tag}-${chatId}: ${exported.trajectories.length} trajectories, not one`);
    drifted += exported.drift; // a reply with special tokens decodes to text that re-encodes otherwise
    return [...times, performance.now() - started];
  };
  return { chat, viaEngine, viaUrl, viaSession, drifted: () => drifted };
}

/** Each call's milliseconds on every path, `chats` chats each, interleaved chat by chat after a warm-up. */
async function callTimes(p: Paths, v1: string, chats: number): Promise<Record<'engine' | 'v1' | 'session' | 'export', number[]>> {
  // Warm up every path (first calls compile kernels), then interleave.
  for (let i = 0; i < 3; i++) {
    await p.chat(i, p.viaEngine);
    await p.chat(i, p.viaUrl(v1));
    await p.viaSession(i, 'warm');
  }
  const times = { engine: [] as number[], v1: [] as number[], session: [] as number[], export: [] as number[] };
  for (let c = 0; c < chats; c++) {
    times.engine.push(...(await p.chat(c, p.viaEngine)));
    times.v1.push(...(await p.chat(c, p.viaUrl(v1))));
    const s = await p.viaSession(c, 'call');
    times.session.push(...s.slice(0, TURNS));
    times.export.push(s[TURNS]);
  }
  for (const [path, xs] of Object.entries(times)) {
    console.log(
      JSON.stringify({ bench: 'gateway', measure: 'call', path, calls: xs.length, p50_ms: round3(median(xs)), mean_ms: round3(mean(xs)) }),
    );
  }
  return times;
}

/** Chats per second: `agents` concurrent clients, each running chats back to back for `seconds`. */
async function throughput(label: string, agents: number, seconds: number, one: (chatId: number) => Promise<unknown>): Promise<number> {
  const deadline = performance.now() + seconds * 1000;
  let done = 0;
  let next = 0;
  await Promise.all(
    Array.from({ length: agents }, async () => {
      while (performance.now() < deadline) {
        await one(next++);
        done++;
      }
    }),
  );
  const rate = done / seconds;
  console.log(
    JSON.stringify({ bench: 'gateway', measure: 'throughput', path: label, agents, seconds, chats: done, chats_per_s: round3(rate) }),
  );
  return rate;
}

/** Runs the benchmark. */
export async function main(args: readonly string[]): Promise<void> {
  const chats = Number(flag(args, 'chats', '40'));
  const agents = Number(flag(args, 'agents', '16'));
  const seconds = Number(flag(args, 'seconds', '10'));
  const backend = await initBackend(flag(args, 'backend', 'auto') as BackendName, { logger: { info: () => undefined } });
  const tokenizer = new CharTokenizer();
  const config = { vocabSize: tokenizer.vocabSize, dModel: 64, nLayers: 2, nHeads: 4, dFF: 256, maxSeqLen: 128 };
  const model = PolicyModel.create(config, 1);
  const server = await serve({ model, tokenizer, maxWaitMs: 0 });
  try {
    const p = paths(server, tokenizer);
    const v1 = `${server.baseURL}/chat/completions`;
    const times = await callTimes(p, v1, chats);
    const sessionsPerS = await throughput('session', agents, seconds, (i) => p.viaSession(i, 'rate'));
    const v1PerS = await throughput('v1', agents, seconds, (i) => p.chat(i, p.viaUrl(v1)));
    const [session, viaV1, engine] = [median(times.session), median(times.v1), median(times.engine)];
    console.log(
      JSON.stringify({
        bench: 'gateway-summary',
        backend,
        turns_per_chat: TURNS,
        max_tokens: MAX_TOKENS,
        session_call_p50_ms: round3(session),
        v1_call_p50_ms: round3(viaV1),
        engine_call_p50_ms: round3(engine),
        session_overhead_vs_v1_ms: round3(session - viaV1),
        session_over_v1: round3(session / viaV1),
        session_overhead_vs_engine_ms: round3(session - engine),
        session_over_engine: round3(session / engine),
        export_p50_ms: round3(median(times.export)),
        calls_with_drift: p.drifted(),
        sessions_per_s: round3(sessionsPerS),
        v1_chats_per_s: round3(v1PerS),
        sessions_over_v1_chats: round3(sessionsPerS / v1PerS),
      }),
    );
  } finally {
    await server.close();
    model.dispose();
  }
}
