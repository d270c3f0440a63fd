/**
 * The MLflow tracker against hostile tracking servers: real node `http` servers on loopback that redirect elsewhere,
 * never answer, answer 500 to everything, or answer without end. Secrets never leave as params.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError, DecodeError, EngineError } from '../../lib/core/errors.js';
import { MlflowTracker } from '../../lib/observe/mlflow.js';
import { openTrackers } from '../../pipelines/parts/trackers.js';

/** One request a server received. */
interface Received {
  readonly route: string;
  readonly body: string;
}

/** How a server answers a metrics `log-batch` (the other calls get a well-formed answer). */
type MetricsAnswer = (req: IncomingMessage, res: ServerResponse, body: string) => void;

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** A tracking server on 127.0.0.1 that records every request and answers metrics with `metrics`. */
async function trackingServer(metrics: MetricsAnswer = (_req, res) => res.end('{}')): Promise<{ url: string; received: Received[] }> {
  const received: Received[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const route = (req.url ?? '').replace(/^.*\/api\/2\.0\/mlflow\//, '').split('?')[0];
      received.push({ route, body });
      res.setHeader('content-type', 'application/json');
      if (route === 'experiments/get-by-name') res.end(JSON.stringify({ experiment: { experiment_id: '1' } }));
      else if (route === 'runs/create') res.end(JSON.stringify({ run: { info: { run_id: 'r1' } } }));
      else if (route === 'runs/log-batch' && body.includes('"metrics"')) metrics(req, res, body);
      else res.end('{}');
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return { url: `http://127.0.0.1:${port}`, received };
}

/** A metrics line of `n` values at `version`. */
function line(version: number, n = 40): { step: number; version: number; metrics: Record<string, number> } {
  return {
    step: version - 1,
    version,
    metrics: Object.fromEntries(Array.from({ length: n }, (_, i) => [`group/metric_${i}`, version + i / 100])),
  };
}

describe('MlflowTracker params', () => {
  it('never sends a secret: every env map, every key that names one, a URL password', async () => {
    const server = await trackingServer();
    const config = loadConfig({
      env: {},
      values: {
        rollout: { agent: { env: { HF_TOKEN: 'hf_aaaaSECRET1', PLAIN_NAME: 'SECRET2-under-env' } } },
        distill: { teacher: { apiKey: 'sk-SECRET3' } },
        openai: { apiKey: 'sk-SECRET4' },
        model: { path: 'http://user:SECRET5@127.0.0.1:1/model' },
        logging: { mlflow: { trackingUri: server.url } },
      },
    });
    const sinks = await openTrackers(config, undefined);
    const direct = await MlflowTracker.open({
      trackingUri: server.url,
      experiment: 'x',
      params: { 'a.password': 'SECRET6', 'b.dbAuth': 'SECRET7' },
    });
    await direct.close();
    for (const sink of sinks) await sink.close();
    const sent = server.received.map((r) => r.body).join('\n');
    for (let i = 1; i <= 7; i++) expect(sent).not.toContain(`SECRET${i}`);
    const params = server.received
      .filter((r) => r.body.includes('"params"'))
      .flatMap((r) => (JSON.parse(r.body) as { params: { key: string; value: string }[] }).params);
    const value = (key: string): string | undefined => params.find((p) => p.key === key)?.value;
    expect(value('rollout.agent.env.HF_TOKEN')).toBe('[redacted]');
    expect(value('rollout.agent.env.PLAIN_NAME')).toBe('[redacted]');
    expect(value('distill.teacher.apiKey')).toBe('[redacted]');
    expect(value('model.path')).toBe('http://user:[redacted]@127.0.0.1:1/model');
    expect(value('rollout.maxTokens')).toMatch(/^\d+$/); // a key with "tokens" in it is no secret
  });
});

describe('MlflowTracker redirects', () => {
  it('refuses a redirect to another origin at the start (a ConfigError), and the other host gets nothing', async () => {
    const elsewhere = await trackingServer();
    const redirecting = createServer((req, res) => {
      res.writeHead(307, { location: `${elsewhere.url}${req.url ?? '/'}` });
      res.end();
    });
    servers.push(redirecting);
    await new Promise<void>((resolve) => redirecting.listen(0, '127.0.0.1', resolve));
    const { port } = redirecting.address() as { port: number };
    const error = await MlflowTracker.open({ trackingUri: `http://127.0.0.1:${port}`, experiment: 'x', params: { a: '1' } }).catch(
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).cause).toBeInstanceOf(EngineError);
    expect(((error as ConfigError).cause as EngineError).context).toMatchObject({ status: 307, location: elsewhere.url });
    expect(elsewhere.received).toEqual([]);
  });

  it('refuses a 308 of log-batch to another origin during the run (a warning); a same-origin one is followed', async () => {
    const elsewhere = await trackingServer();
    let hops = 0;
    const server = await trackingServer((req, res) => {
      if (hops++ === 0)
        res.writeHead(308, { location: `/proxy${req.url ?? ''}` }).end(); // same origin: followed
      else res.writeHead(308, { location: `${elsewhere.url}${req.url ?? ''}` }).end();
    });
    const errors: Error[] = [];
    const tracker = await MlflowTracker.open({ trackingUri: server.url, experiment: 'x', onError: (e) => errors.push(e) });
    tracker.write(line(1));
    await tracker.close();
    expect(hops).toBe(3); // the flush: same origin, then elsewhere (refused); the close: elsewhere (refused)
    expect(errors).toHaveLength(2); // the flush, then the last one at close
    for (const e of errors) expect(e).toBeInstanceOf(EngineError);
    expect((errors[0] as EngineError).context).toMatchObject({ status: 308, location: elsewhere.url });
    expect(elsewhere.received).toEqual([]);
  });
});

describe('MlflowTracker flushes', () => {
  it('a log-batch that never answers costs one deadline per flush, not one per queued line', async () => {
    const server = await trackingServer(() => undefined); // never answers
    const errors: Error[] = [];
    const tracker = await MlflowTracker.open({ trackingUri: server.url, experiment: 'x', timeoutMs: 500, onError: (e) => errors.push(e) });
    for (let v = 1; v <= 8; v++) tracker.write(line(v, 5));
    await tracker.close();
    // The first line's flush (it timed out), then the close's last flush of all eight lines: two calls, not nine.
    const batches = server.received.filter((r) => r.route === 'runs/log-batch' && r.body.includes('"metrics"'));
    expect(batches).toHaveLength(2);
    expect(errors.length).toBeGreaterThan(0);
  }, 30_000);

  it('the run stop signal ends a flush in flight and leaves the close seconds', async () => {
    let arrived: () => void = () => undefined;
    const blocked = new Promise<void>((resolve) => (arrived = resolve));
    const server = await trackingServer(() => arrived()); // never answers
    const stop = new AbortController();
    const tracker = await MlflowTracker.open({ trackingUri: server.url, experiment: 'x', timeoutMs: 300_000, signal: stop.signal });
    tracker.write(line(1));
    await blocked;
    const stoppedAt = performance.now();
    stop.abort();
    await tracker.close();
    console.log(`mlflow close after the stop signal: ${((performance.now() - stoppedAt) / 1000).toFixed(2)} s (deadline 300 s)`);
  }, 60_000);

  it('with 500s, queued lines are sent again once per flush, not once per line (bytes bounded)', async () => {
    let bytes = 0;
    const server = await trackingServer((_req, res, body) => {
      bytes += body.length;
      res.writeHead(500).end(JSON.stringify({ error_code: 'INTERNAL_ERROR', message: 'no' }));
    });
    const errors: Error[] = [];
    const tracker = await MlflowTracker.open({ trackingUri: server.url, experiment: 'x', onError: (e) => errors.push(e) });
    for (let v = 1; v <= 60; v++) tracker.write(line(v));
    await tracker.close();
    const metrics = Array.from({ length: 60 }, (_, i) => line(i + 1)).flatMap((l) =>
      Object.entries(l.metrics).map(([key, value]) => ({ key, value, timestamp: Date.now(), step: l.version })),
    );
    const once = JSON.stringify({ run_id: 'r1', metrics }).length;
    console.log(`60 lines against 500s: ${bytes} bytes sent (all the lines once: ~${once})`);
    expect(bytes).toBeLessThan(2 * once);
    expect(errors.every((e) => e instanceof EngineError && e.retriable)).toBe(true);
  });

  it('keeps at most maxQueued values, dropping the oldest with a counted warning', async () => {
    const bodies: string[] = [];
    const server = await trackingServer((_req, res, body) => {
      bodies.push(body);
      res.writeHead(503).end('{}');
    });
    const drops: number[] = [];
    const tracker = await MlflowTracker.open({
      trackingUri: server.url,
      experiment: 'x',
      maxQueued: 100,
      onDropped: (_n, total) => drops.push(total),
      onError: () => undefined,
    });
    for (let v = 1; v <= 10; v++) tracker.write(line(v)); // 400 values
    await tracker.close();
    const last = JSON.parse(bodies.at(-1) ?? '{}') as { metrics: { step: number }[] };
    expect(last.metrics).toHaveLength(100);
    expect(new Set(last.metrics.map((m) => m.step))).toEqual(new Set([8, 9, 10])); // the newest lines
    expect(drops).toContain(300); // the full queue's oldest
    expect(drops.at(-1)).toBe(400); // and, at the end, the 100 the server never took
  });

  it('reads an answer only up to a bound: an endless one is a DecodeError, not memory', async () => {
    let sent = 0;
    const chunk = Buffer.alloc(1 << 16, 0x20);
    const server = createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' });
      const pump = (): void => {
        while (sent < 256 * 2 ** 20 && !res.destroyed) {
          sent += chunk.length;
          if (!res.write(chunk)) return void res.once('drain', pump);
        }
        res.end();
      };
      req.resume();
      pump();
    });
    servers.push(server);
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const rssBefore = process.memoryUsage().rss;
    const error = await MlflowTracker.open({ trackingUri: `http://127.0.0.1:${port}`, experiment: 'x' }).catch((e: unknown) => e);
    const rssAfter = process.memoryUsage().rss;
    console.log(`endless answer: ${(sent / 2 ** 20).toFixed(1)} MiB sent before the cut; RSS ${rssBefore >> 20} -> ${rssAfter >> 20} MiB`);
    expect(error).toBeInstanceOf(ConfigError);
    expect((error as ConfigError).cause).toBeInstanceOf(DecodeError);
    expect(sent).toBeLessThan(256 * 2 ** 20);
  }, 60_000);
});

describe('MlflowTracker resume state', () => {
  it('records the last version whose metrics all reached the server', async () => {
    const server = await trackingServer();
    const stateFile = join(mkdtempSync(join(tmpdir(), 'rxrl-mlflow-')), 'mlflow.json');
    const tracker = await MlflowTracker.open({ trackingUri: server.url, experiment: 'x', stateFile });
    for (let v = 1; v <= 30; v++) tracker.write(line(v)); // 1,200 values: two batches
    await tracker.close();
    const { readFileSync } = await import('node:fs');
    expect(JSON.parse(readFileSync(stateFile, 'utf8'))).toMatchObject({ runId: 'r1', lastVersion: 30 });
  });
});
