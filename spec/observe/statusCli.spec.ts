/**
 * Issue 53 row 7 (part): `rxrl status URL` against hostile servers — one that never answers, one that answers
 * escape sequences in its names, one that answers without end, one that answers a malformed document — and
 * `printable`, which strips what a terminal would act on.
 */
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

import { afterEach, describe, expect, it } from 'vitest';

import { AbortError, ConfigError, DecodeError, EngineError } from '../../lib/core/errors.js';
import { ActivityTracker, fetchStatus, formatStatus, printable, type RunStatus, type WorkerActivity } from '../../lib/observe/index.js';
import { CLI, stopWhenBlocked } from '../helpers/stopRun.js';

/** What a terminal acts on: C0 but tab and newline, DEL, C1, bidi formatting. */
// eslint-disable-next-line no-control-regex -- finding control characters is what this expression is for
const CONTROL = new RegExp('[\\u0000-\\u0008\\u000b-\\u001f\\u007f-\\u009f\\u202a-\\u202e\\u2066-\\u2069]');

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** A real HTTP server on 127.0.0.1 that answers with `handler`; resolves `requested` on its first request. */
async function hostile(
  handler: (request: IncomingMessage, response: ServerResponse) => void,
): Promise<{ url: string; requested: Promise<void> }> {
  let heard!: () => void;
  const requested = new Promise<void>((resolve) => (heard = resolve));
  const server = createServer((request, response) => {
    heard();
    handler(request, response);
  });
  servers.push(server);
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, requested };
}

/** The built CLI run to its end. */
async function rxrl(args: readonly string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const child = spawn(process.execPath, [CLI, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString()));
  child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, stdout, stderr };
}

/** A valid status document whose every name a hostile server chose. */
function escapingStatus(): RunStatus {
  const evil = '\u001b[2J\u001b[H\u001b]0;owned\u0007\u009b31m\r\u202e';
  const activity = new ActivityTracker().snapshot();
  return {
    run: { step: 1, mode: `sync${evil}`, metrics: { 'rollout/reward_mean': 0.5 } },
    activity: {
      ...activity,
      modules: {
        [`rollout${evil}`]: {
          inFlight: 1,
          started: 1,
          completed: 0,
          failed: 1,
          idleSeconds: 0,
          stalled: false,
          lastError: { name: `Error${evil}`, message: `boom${evil}\nnext line`, at: 0 },
        },
      },
      workers: {
        [`w-1${evil}\nfake-worker  run-a  0  0  0  0.0s ago  up`]: {
          run: `run${evil}`,
          inFlight: 0,
          done: 0,
          failed: 0,
          lastBeatAt: 0,
          beatAgeSeconds: 1,
          state: `up${evil}` as WorkerActivity['state'],
        },
      },
      stalled: [`rollout${evil}`],
    },
  };
}

describe('printable', () => {
  it('removes escape sequences whole and control characters, keeps newlines, tabs and other text', () => {
    expect(printable('w-1\u001b[2J\u001b[1;31mred\u001b[0m')).toBe('w-1red');
    expect(printable('a\u001b]0;title\u0007b\u001b]8;;http://x\u001b\\c')).toBe('abc');
    expect(printable('a\u009b2Jb\u009d0;t\u009cc')).toBe('abc');
    expect(printable('a\u001bPq#0\u001b\\b\u001b7c\u001b(Bd')).toBe('abcd');
    expect(printable('a\rb\u0000c\u0008d\u007fe\u0085f')).toBe('abcdef');
    expect(printable('x\u202eevil\u2066y')).toBe('xevily');
    expect(printable('line 1\n\tline 2 — é ✓ 日本')).toBe('line 1\n\tline 2 — é ✓ 日本');
    expect(printable('a\u001b]0;unterminated')).toBe('a0;unterminated');
    expect(CONTROL.test(printable(String.fromCharCode(...Array.from({ length: 0xa0 }, (_, i) => i))))).toBe(false);
  });
});

describe('fetchStatus against hostile servers', () => {
  it('a server that never answers: an EngineError naming the deadline', async () => {
    const { url } = await hostile(() => undefined);
    const error = await fetchStatus(url, { timeoutMs: 300 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EngineError);
    expect((error as EngineError).context).toMatchObject({ timeoutMs: 300 });
    expect((error as EngineError).retriable).toBe(true);
  });

  it('a stop signal ends the wait with an AbortError', async () => {
    const { url, requested } = await hostile(() => undefined);
    const controller = new AbortController();
    const pending = fetchStatus(url, { signal: controller.signal, timeoutMs: 300_000 }).catch((e: unknown) => e);
    await requested;
    controller.abort();
    expect(await pending).toBeInstanceOf(AbortError);
  });

  it('an answer without end, or one that says it is too large, is refused at the bound', async () => {
    const endless = await hostile((_request, response) => {
      response.writeHead(200, { 'content-type': 'application/json' });
      const chunk = Buffer.alloc(64 * 1024, 0x20);
      const write = (): void => {
        while (response.write(chunk));
        response.once('drain', write);
      };
      response.write('{"a":"');
      write();
    });
    const error = await fetchStatus(endless.url, { maxBytes: 1 << 20 }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DecodeError);
    expect((error as DecodeError).context).toMatchObject({ limit: 1 << 20 });
    const declared = await hostile((_request, response) => {
      response.writeHead(200, { 'content-length': String(1 << 30) });
      response.write('{');
    });
    expect(await fetchStatus(declared.url, { maxBytes: 1 << 20 }).catch((e: unknown) => e)).toBeInstanceOf(DecodeError);
    await expect(fetchStatus(declared.url, { timeoutMs: 0 })).rejects.toThrow(ConfigError);
  });

  it('a document of the wrong shape is an EngineError, not a TypeError when printed', async () => {
    for (const body of [
      '{"run":{},"activity":{"at":0,"inFlight":0,"modules":{"m":{"lastError":{"message":5}}},"workers":{},"stalled":[]}}',
      '{"run":{"metrics":{"rollout/reward_mean":"x"}},"activity":{"at":0,"inFlight":0,"modules":{},"workers":{},"stalled":[]}}',
      '{"run":{},"activity":{"at":0,"inFlight":0,"modules":{},"workers":{"w":{"run":"r"}},"stalled":[]}}',
      '{"run":{},"activity":{"at":0,"inFlight":0,"modules":{},"workers":{},"stalled":"x"}}',
      '[]',
    ]) {
      const { url } = await hostile((_request, response) => response.writeHead(200).end(body));
      expect(await fetchStatus(url).catch((e: unknown) => e)).toBeInstanceOf(EngineError);
    }
    // A NaN reward is null in JSON: shown without it.
    const nan = { run: { metrics: { 'rollout/reward_mean': null } }, activity: new ActivityTracker().snapshot() };
    const { url } = await hostile((_request, response) => response.writeHead(200).end(JSON.stringify(nan)));
    expect(formatStatus(await fetchStatus(url))).toMatch(/^no stall\n/);
  });
});

describe('rxrl status against hostile servers', () => {
  it('ends with a typed error within --timeout-ms when the server never answers', async () => {
    const { url } = await hostile(() => undefined);
    const { code, stdout, stderr } = await rxrl(['status', url, '--timeout-ms', '500']);
    expect(code).toBe(1);
    expect(stdout).toBe('');
    expect(stderr).toMatch(/^rxrl: EngineError: http:\/\/127\.0\.0\.1:\d+\/status did not answer within 500 ms\n$/);
  });

  it('prints no escape sequence or control character a server put in names, ids, errors (tables and --json)', async () => {
    const { url } = await hostile((_request, response) => response.writeHead(200).end(JSON.stringify(escapingStatus())));
    const tables = await rxrl(['status', url]);
    expect(tables.code).toBe(0);
    expect(tables.stdout).not.toMatch(CONTROL);
    expect(tables.stdout).toMatch(/^step 1 {2}sync {2}reward 0\.500 {2}stalled: rollout\n/);
    expect(tables.stdout).toMatch(/\nrollout +1 +0 +1 .*busy +Error ?: boom next line\n/);
    expect(tables.stdout.split('\n').filter((line) => line.includes('fake-worker'))).toHaveLength(1); // no injected row
    expect(tables.stdout.split('\n').some((line) => line.startsWith('fake-worker'))).toBe(false);
    const json = await rxrl(['status', url, '--json']);
    expect(json.code).toBe(0);
    expect(json.stdout).not.toMatch(CONTROL);
    expect(Object.keys((JSON.parse(json.stdout) as RunStatus).activity.modules)).toHaveLength(1);
  });

  it('SIGTERM and SIGINT end a wait on a server that never answers', async () => {
    for (const signal of ['SIGTERM', 'SIGINT'] as const) {
      const { url, requested } = await hostile(() => undefined);
      const stopped = await stopWhenBlocked({
        args: ['status', url, '--timeout-ms', '300000'],
        what: 'rxrl status on a server that never answers',
        blocked: () => requested,
        signal,
      });
      expect(stopped.code).toBe(signal === 'SIGINT' ? 130 : 143);
      expect(stopped.stderr).toBe(`rxrl: stopped by ${signal}\n`);
    }
  });
});
