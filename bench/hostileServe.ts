/**
 * `rxrl serve` under the hostile clients of issue 31, one JSON line per row:
 *
 * - `invalid-requests` (row 10): 2000 refused requests (405 and 400) to 2000 session ids, 64 at a time: their
 *   time, the sessions they left open, and whether an agent still gets a session afterwards;
 * - `concurrent-session` (row 11): 20 concurrent calls (`max_tokens` 16) in one session at
 *   `--max-session-tokens 100`: the tokens it recorded, the calls answered and refused;
 * - `huge-prompt` (row 12): a 3.9 MB prompt (completions, then chat) against a 200 000-token context, with the
 *   character tokenizer and with a byte-level BPE (the tiny Qwen2 fixture and its chat template): the time to
 *   refuse it, and the latency of `/health` polled every 5 ms meanwhile;
 * - `slow-reader` (row 13): a streamed completion (n = 16, 20 000 tokens each) read at 1 byte/s for `--seconds`:
 *   the server's RSS before, its peak (VmHWM) and what it holds at the end;
 * - `reward-overflow` (row 15): `1.7e308` posted twice as a session's reward: the statuses and the stored reward.
 *
 * Each row's server runs in a child process of its own (its RSS read from `/proc/<pid>/status`, its event loop
 * apart from the clients') over a policy that never samples its stop token ({@link RunOnModel}), so each stream is
 * exactly as long as its request and what is measured is the server; the slow reader is a paused raw socket that
 * reads one byte a second.
 *
 * Run: `npm run bench -- hostileServe [--seconds 40]` (after `npm run build`).
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { readFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { fileURLToPath } from 'node:url';

import { loadChatTemplate } from '../lib/chat/jinjaTemplate.js';
import type { ChatTemplate } from '../lib/chat/template.js';
import type { Tokenizer } from '../lib/model/types.js';
import { loadTokenizer } from '../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import type { PolicyModel } from '../lib/model/transformer.js';
import { serve } from '../lib/serve/server.js';
import { RunOnModel } from './_fakes.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const i = args.indexOf(`--${name}`);
  return i >= 0 && args[i + 1] !== undefined ? args[i + 1] : fallback;
}

const print = (line: Record<string, unknown>): void => void process.stdout.write(`${JSON.stringify(line)}\n`);
const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));
const round = (x: number, digits = 1): number => Number(x.toFixed(digits));

async function post(url: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const response = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  return { status: response.status, json: (await response.json()) as Record<string, unknown> };
}

/** Runs `count` jobs, `width` at a time. */
async function pool(count: number, width: number, job: (i: number) => Promise<unknown>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: width }, async () => {
      while (next < count) await job(next++);
    }),
  );
}

async function invalidRequests(server: Child): Promise<void> {
  const started = performance.now();
  const statuses: Record<number, number> = {};
  await pool(2000, 64, async (i) => {
    const url = `${server.url}/sessions/intruder-${i}/v1/completions`;
    const response =
      i % 2 === 0
        ? await fetch(url, { method: 'GET' })
        : await fetch(url, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: -1 }),
          });
    statuses[response.status] = (statuses[response.status] ?? 0) + 1;
    await response.arrayBuffer();
  });
  const seconds = (performance.now() - started) / 1000;
  let sessionsHeld = 0;
  await pool(2000, 64, async (i) => {
    const response = await fetch(`${server.url}/sessions/intruder-${i}`);
    if (response.status === 200) sessionsHeld++;
    await response.arrayBuffer();
  });
  const agent = await post(`${server.url}/sessions/agent-after/v1/completions`, { model: 'rxrl-policy', prompt: 'ab', max_tokens: 2 });
  print({
    bench: 'hostileServe',
    row: 10,
    case: 'invalid-requests',
    requests: 2000,
    statuses,
    seconds: round(seconds, 2),
    sessions_held: sessionsHeld,
    max_sessions: 1024,
    agent_status: agent.status,
  });
}

async function concurrentSession(server: Child): Promise<void> {
  const results = await Promise.all(
    Array.from({ length: 20 }, () =>
      post(`${server.url}/sessions/agent/v1/completions`, { model: 'rxrl-policy', prompt: 'ab', max_tokens: 16 }),
    ),
  );
  const session = await fetch(`${server.url}/sessions/agent`);
  const recorded = session.status === 200 ? ((await session.json()) as { tokens: number }).tokens : null;
  print({
    bench: 'hostileServe',
    row: 11,
    case: 'concurrent-session',
    calls: 20,
    max_session_tokens: 100,
    answered: results.filter((r) => r.status === 200).length,
    refused: results.filter((r) => r.status !== 200).length,
    recorded_tokens: recorded,
  });
}

async function hugePrompt(server: Child, tokenizerName: string): Promise<void> {
  const huge = 'ab'.repeat(1_950_000);
  for (const [route, body] of [
    ['completions', { model: 'rxrl-policy', prompt: huge, max_tokens: 4 }],
    ['chat', { model: 'rxrl-policy', messages: [{ role: 'user', content: huge }] }],
  ] as const) {
    const latencies: number[] = [];
    let done = false;
    const poll = (async () => {
      while (!done) {
        const at = performance.now();
        await (await fetch(`${server.url}/health`)).arrayBuffer();
        latencies.push(performance.now() - at);
        await sleep(5);
      }
    })();
    const started = performance.now();
    const answer = await post(`${server.url}/v1/${route === 'chat' ? 'chat/completions' : 'completions'}`, body);
    const ms = performance.now() - started;
    done = true;
    await poll;
    print({
      bench: 'hostileServe',
      row: 12,
      case: 'huge-prompt',
      route,
      tokenizer: tokenizerName,
      prompt_mb: round(Buffer.byteLength(huge) / 1e6, 2),
      max_model_len: 200_000,
      status: answer.status,
      code: (answer.json.error as { code?: string } | undefined)?.code ?? null,
      ms_to_answer: round(ms),
      health_polls: latencies.length,
      health_max_ms: round(Math.max(0, ...latencies)),
    });
  }
}

/** Resident and peak resident memory of a process, in MiB (Linux `/proc/<pid>/status`). */
async function memoryOf(pid: number): Promise<{ rss: number; peak: number }> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kib = (key: string): number => Number(new RegExp(`^${key}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? Number.NaN);
  return { rss: kib('VmRSS') / 1024, peak: kib('VmHWM') / 1024 };
}

async function slowReader(server: Child, seconds: number): Promise<void> {
  const n = 16;
  const maxTokens = 20_000;
  const before = await memoryOf(server.pid);
  const body = JSON.stringify({ model: 'rxrl-policy', prompt: 'ab', max_tokens: maxTokens, n, stream: true });
  const socket = connect(server.port, '127.0.0.1');
  socket.pause();
  socket.write(
    `POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
  );
  let read = 0;
  for (let s = 0; s < seconds; s++) {
    await sleep(1000);
    if (socket.read(1) !== null) read++;
  }
  const held = await memoryOf(server.pid);
  socket.destroy();
  print({
    bench: 'hostileServe',
    row: 13,
    case: 'slow-reader',
    n,
    max_tokens: maxTokens,
    seconds,
    bytes_read: read,
    rss_before_mb: round(before.rss),
    rss_peak_mb: round(held.peak),
    rss_growth_mb: round(held.peak - before.rss),
    rss_held_mb: round(held.rss),
  });
}

async function rewardOverflow(server: Child): Promise<void> {
  await post(`${server.url}/sessions/greedy/v1/completions`, { model: 'rxrl-policy', prompt: 'ab', max_tokens: 2 });
  const first = await post(`${server.url}/sessions/greedy/reward`, { reward: 1.7e308 });
  const second = await post(`${server.url}/sessions/greedy/reward`, { reward: 1.7e308 });
  const stored = (await (await fetch(`${server.url}/sessions/greedy`)).json()) as { reward: number | null };
  print({
    bench: 'hostileServe',
    row: 15,
    case: 'reward-overflow',
    first_status: first.status,
    second_status: second.status,
    second_code: (second.json.error as { code?: string } | undefined)?.code ?? null,
    stored_reward: stored.reward === null ? null : String(stored.reward),
  });
}

/** The server of one row: a child process (`--serve <tokenizer>`), so that its memory and event loop are its own. */
interface Child {
  readonly url: string;
  readonly port: number;
  readonly pid: number;
  close(): Promise<void>;
}

/** The tokenizers a child server can run with. */
type ChildTokenizer = 'char' | 'tiny-qwen2';

/** Starts `node dist/bench/run.js hostileServe --serve <tokenizer>` and waits for its address. */
function startChild(tokenizer: ChildTokenizer): Promise<Child> {
  const child = spawn(process.execPath, [fileURLToPath(new URL('./run.js', import.meta.url)), 'hostileServe', '--serve', tokenizer], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const close = (): Promise<void> =>
    new Promise((resolve) => {
      if (child.exitCode !== null) return resolve();
      child.once('exit', () => resolve());
      child.kill('SIGTERM');
    });
  return new Promise((resolve, reject) => {
    let text = '';
    child.stdout.on('data', (chunk: Buffer) => {
      text += chunk.toString('utf8');
      const newline = text.indexOf('\n');
      if (newline >= 0) {
        const { url, port } = JSON.parse(text.slice(0, newline)) as { url: string; port: number };
        resolve({ url, port, pid: child.pid!, close });
      }
    });
    child.once('exit', (code) => reject(new Error(`the server child exited (${code}) before listening`)));
  });
}

/** The child's side: a server over a {@link RunOnModel} with a 100-token session limit, until SIGTERM. */
async function serveChild(name: string): Promise<void> {
  let tokenizer: Tokenizer = new CharTokenizer();
  let chatTemplate: ChatTemplate | undefined;
  if (name === 'tiny-qwen2') {
    const dir = fileURLToPath(new URL('../../spec/fixtures/hf/tiny-qwen2/', import.meta.url));
    tokenizer = await loadTokenizer(dir);
    chatTemplate = await loadChatTemplate(dir, tokenizer);
  }
  const model = new RunOnModel(tokenizer.encode('ab'), tokenizer.vocabSize, 200_000);
  const server = await serve({
    model: model as unknown as PolicyModel,
    tokenizer,
    ...(chatTemplate ? { chatTemplate } : {}),
    sessions: { maxTokens: 100 },
  });
  process.stdout.write(`${JSON.stringify({ url: server.url, port: server.port })}\n`);
  await new Promise<void>((resolve) => process.once('SIGTERM', () => resolve()));
  await server.close();
}

/** Runs the benchmark: each row against a server process of its own. */
export async function main(args: readonly string[]): Promise<void> {
  if (args[0] === '--serve') return serveChild(args[1]);
  const seconds = Number(flag(args, 'seconds', '40'));
  const rows: [ChildTokenizer, (server: Child) => Promise<void>][] = [
    ['char', invalidRequests],
    ['char', concurrentSession],
    ['char', (server) => hugePrompt(server, 'char')],
    ['tiny-qwen2', (server) => hugePrompt(server, 'tiny-qwen2 (byte-level BPE, NFC)')],
    ['char', rewardOverflow],
    ['char', (server) => slowReader(server, seconds)],
  ];
  for (const [tokenizer, row] of rows) {
    const server = await startChild(tokenizer);
    try {
      await row(server);
    } finally {
      await server.close();
    }
  }
}
