/**
 * `rxrl tinker` under the hostile requests of issue 31: starts the built CLI (a child process, on the tiny Qwen3
 * fixture, default limits) and sends each request, one JSON line per case: its answer (status, or the future's
 * outcome), the time to that answer, the service's RSS before and after (`/proc/<pid>/status`), and the largest
 * `/api/v1/healthz` latency seen by a prober that asks one request at a time while the case runs.
 *
 * Usage: `npm run bench -- hostileTinker [--backend auto|wasm|cpu|tensorflow] [--datums 64] [--names 1000]
 * [--long-datum 2048] [--rows 2,3,4,5,6,7,8,9]` (`--datums`: the legitimate long `forward_backward` of row 4, datums of
 * 127 tokens; `--long-datum`: the tokens of row 4's datum past the context, 0 for none;
 * `--names`: row 6's `save_weights_for_sampler` names; `--rows`: which rows to run). Run
 * `npm run build` first.
 *
 * @packageDocumentation
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { copyFile, mkdtemp, readFile, readdir } from 'node:fs/promises';
import { cpus, loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { encodeForwardBackwardRequest, type WireDatum } from '../lib/tinker/proto.js';
import { sparseBomb } from './_protobuf.js';

const root = fileURLToPath(new URL('../..', import.meta.url));
const cli = join(root, 'dist', 'cli', 'main.js');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen3');
const KEY = 'bench-key';

function flag(args: readonly string[], name: string, fallback: string): string {
  const at = args.indexOf(`--${name}`);
  return at >= 0 && args[at + 1] !== undefined ? args[at + 1] : fallback;
}

/** The child's resident set in MB, from `/proc`. */
async function rssMb(pid: number): Promise<number> {
  const status = await readFile(`/proc/${pid}/status`, 'utf8');
  const kb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? NaN);
  return Math.round(kb / 102.4) / 10;
}

interface Answer {
  readonly status: number;
  readonly json: Record<string, unknown>;
  readonly proto: boolean;
}

/** A client of the service at `url`. */
function clientOf(url: string) {
  const post = async (path: string, body: unknown): Promise<Answer> => {
    const binary = body instanceof Uint8Array;
    const response = await fetch(`${url}${path}`, {
      method: 'POST',
      headers: { 'content-type': binary ? 'application/x-protobuf' : 'application/json', 'x-api-key': KEY },
      body: binary ? body : JSON.stringify(body),
    });
    const type = response.headers.get('content-type') ?? '';
    const bytes = Buffer.from(await response.arrayBuffer());
    return {
      status: response.status,
      json: type.includes('json') ? (JSON.parse(bytes.toString('utf8')) as Record<string, unknown>) : {},
      proto: type.includes('protobuf'),
    };
  };
  const result = async (future: Answer): Promise<Answer> => {
    if (future.status !== 200) return future;
    for (;;) {
      const answer = await post('/api/v1/retrieve_future', { request_id: future.json.request_id });
      if (answer.json.type !== 'try_again') return answer;
    }
  };
  const session = async (): Promise<string> => (await post('/api/v1/create_session', {})).json.session_id as string;
  const model = async (sessionId: string, seq: number, rank = 2): Promise<Answer> =>
    result(
      await post('/api/v1/create_model', { session_id: sessionId, model_seq_id: seq, base_model: 'tiny-qwen3', lora_config: { rank } }),
    );
  return { post, result, session, model };
}

/** Asks `/api/v1/healthz` one request at a time until stopped; the latencies' median, 99th percentile and largest, in ms. */
function probe(url: string): { stop(): Promise<{ p50Ms: number; p99Ms: number; maxMs: number; probes: number }> } {
  let running = true;
  const latencies: number[] = [];
  const loop = (async () => {
    while (running) {
      const started = performance.now();
      const response = await fetch(`${url}/api/v1/healthz`, { headers: { 'x-api-key': KEY } });
      await response.arrayBuffer();
      latencies.push(performance.now() - started);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
  })();
  const at = (sorted: readonly number[], q: number): number =>
    Math.round(sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] * 10) / 10;
  return {
    stop: async () => {
      running = false;
      await loop;
      const sorted = [...latencies].sort((a, b) => a - b);
      return { p50Ms: at(sorted, 0.5), p99Ms: at(sorted, 0.99), maxMs: at(sorted, 1), probes: sorted.length };
    },
  };
}

/** Runs one case with the prober on and prints its line. */
async function measure(
  child: ChildProcess,
  url: string,
  row: number,
  name: string,
  work: () => Promise<Record<string, unknown>>,
): Promise<void> {
  const pid = child.pid as number;
  const rssBeforeMb = await rssMb(pid);
  const prober = probe(url);
  const started = performance.now();
  const out = await work();
  const ms = Math.round((performance.now() - started) * 10) / 10;
  const healthz = await prober.stop();
  const rssAfterMb = await rssMb(pid);
  process.stdout.write(
    `${JSON.stringify({ row, case: name, ...out, ms, rssBeforeMb, rssAfterMb, healthzP50Ms: healthz.p50Ms, healthzP99Ms: healthz.p99Ms, healthzMaxMs: healthz.maxMs, healthzProbes: healthz.probes })}\n`,
  );
}

function datum(n: number, shift: number): WireDatum {
  const tokens = Array.from({ length: n + 1 }, (_, i) => (i * 7 + shift) % 480);
  return {
    tokens: tokens.slice(0, n),
    lossFnInputs: {
      target_tokens: { dtype: 'int64', data: tokens.slice(1), shape: [n] },
      weights: { dtype: 'float32', data: new Float32Array(n).fill(1), shape: [n] },
    },
  };
}

/** Starts `rxrl tinker` with `args`; resolves with the child and its listening line. */
async function startService(args: readonly string[]): Promise<{ child: ChildProcess; url: string; backend: string }> {
  const child = spawn(process.execPath, [cli, 'tinker', '--model', fixture, '--port', '0', ...args], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const [line] = (await once(createInterface({ input: child.stdout! }), 'line')) as [string];
  const listening = JSON.parse(line) as { url: string; backend: string };
  return { child, url: listening.url, backend: listening.backend };
}

/** Runs every case; see the module comment for arguments. */
export async function main(args: readonly string[]): Promise<void> {
  const backend = flag(args, 'backend', 'auto');
  const stateDir = join(await mkdtemp(join(tmpdir(), 'rxrl-bench-hostile-')), 'state');
  const { child, url, backend: chosen } = await startService(['--api-key', KEY, '--backend', backend, '--state-dir', stateDir]);
  try {
    process.stdout.write(
      `${JSON.stringify({ event: 'service', backend: chosen, url, loadAverage: loadavg().map((x) => Math.round(x * 100) / 100), cpus: cpus().length })}\n`,
    );
    const api = clientOf(url);
    const rows = new Set(flag(args, 'rows', '2,3,4,5,6,7,8,9').split(',').map(Number));
    if (rows.has(2)) await rowTwo(child, url, api);
    if (rows.has(4)) await rowFour(child, url, api, Number(flag(args, 'datums', '64')), Number(flag(args, 'long-datum', '2048')));
    if (rows.has(3)) await rowThree(child, url, api, stateDir);
    if (rows.has(5)) await rowFive(child, url, api);
    if (rows.has(6) || rows.has(7) || rows.has(8)) await rowsSixToEight(child, url, api, Number(flag(args, 'names', '1000')));
    if (rows.has(9)) await rowNine(child, url, api, backend);
  } finally {
    child.kill('SIGTERM');
    await once(child, 'exit');
  }
}

type Api = ReturnType<typeof clientOf>;

async function rowTwo(child: ChildProcess, url: string, api: Api): Promise<void> {
  const s = await api.session();
  const modelId = (await api.model(s, 0)).json.model_id as string;
  await measure(child, url, 2, 'sparse 1x2^26 for an unknown model', async () => ({
    status: (await api.post('/api/v1/forward_backward', sparseBomb('sess-none:train:0', 1, 2 ** 26))).status,
    bytes: sparseBomb('sess-none:train:0', 1, 2 ** 26).length,
  }));
  await measure(child, url, 2, 'sparse 1x2^26 for a real model', async () => ({
    status: (await api.post('/api/v1/forward_backward', sparseBomb(modelId, 1, 2 ** 26))).status,
  }));
  await api.post(`/api/v1/sessions/${s}/finish`, {});
}

async function rowFour(child: ChildProcess, url: string, api: Api, datums: number, longDatum: number): Promise<void> {
  const s = await api.session();
  const modelId = (await api.model(s, 0)).json.model_id as string;
  if (longDatum > 0) {
    const long = encodeForwardBackwardRequest({
      modelId,
      seqId: 1,
      data: [datum(longDatum, 3)],
      lossFn: 'cross_entropy',
      lossFnConfig: {},
      forwardOnly: false,
    });
    await measure(child, url, 4, `${longDatum}-token datum on a 128-context model`, async () => ({
      status: (await api.post('/api/v1/forward_backward', long)).status,
    }));
  }
  // The first forward pass after start (the service warms its backend up at start): measured apart from the long one.
  const warm = encodeForwardBackwardRequest({
    modelId,
    seqId: 2,
    data: [datum(127, 1)],
    lossFn: 'cross_entropy',
    lossFnConfig: {},
    forwardOnly: false,
  });
  await measure(child, url, 4, 'first forward_backward after start: 1 datum x 127 tokens', async () => ({
    status: (await api.result(await api.post('/api/v1/forward_backward', warm))).status,
  }));
  const heavy = encodeForwardBackwardRequest({
    modelId,
    seqId: 3,
    data: Array.from({ length: datums }, (_, i) => datum(127, i)),
    lossFn: 'cross_entropy',
    lossFnConfig: {},
    forwardOnly: false,
  });
  await measure(child, url, 4, `legit forward_backward: ${datums} datums x 127 tokens`, async () => {
    const answer = await api.result(await api.post('/api/v1/forward_backward', heavy));
    return { status: answer.status, protobuf: answer.proto };
  });
  await api.post(`/api/v1/sessions/${s}/finish`, {});
}

async function rowThree(child: ChildProcess, url: string, api: Api, stateDir: string): Promise<void> {
  const s = await api.session();
  const modelId = (await api.model(s, 0)).json.model_id as string;
  await api.result(await api.post('/api/v1/save_weights', { model_id: modelId, path: 'ckpt' }));
  const [dir] = await readdir(stateDir);
  await copyFile(join(stateDir, dir, 'ckpt.safetensors'), join(stateDir, '..', 'x.safetensors'));
  for (const path of ['tinker://../weights/x', 'tinker://../weights/missing']) {
    await measure(child, url, 3, `load_weights ${path}`, async () => {
      const answer = await api.result(await api.post('/api/v1/load_weights', { model_id: modelId, path }));
      return { status: answer.status, error: answer.json.error ?? null };
    });
    await measure(child, url, 3, `client from state ${path}`, async () => {
      const answer = await api.post('/api/v1/load_weights', { session_id: s, path });
      return { status: answer.status, detail: answer.json.detail ?? null };
    });
  }
  await api.post(`/api/v1/sessions/${s}/finish`, {});
}

async function rowFive(child: ChildProcess, url: string, api: Api): Promise<void> {
  await measure(child, url, 5, '8 clients, session finished, 8 more in another (default maxModels 8)', async () => {
    const a = await api.session();
    const first = await Promise.all(Array.from({ length: 8 }, (_, i) => api.model(a, i)));
    await api.post(`/api/v1/sessions/${a}/finish`, {});
    const b = await api.session();
    const second = await Promise.all(Array.from({ length: 8 }, (_, i) => api.model(b, i)));
    const unloaded = await api.result(await api.post('/api/v1/unload_model', { model_id: `${b}:train:0` }));
    const again = await api.model(b, 8);
    await api.post(`/api/v1/sessions/${b}/finish`, {});
    const ok = (answers: Answer[]): number => answers.filter((x) => x.status === 200 && x.json.model_id !== undefined).length;
    return { created: ok(first), createdAfterFinish: ok(second), unloadType: unloaded.json.type ?? null, createdAfterUnload: ok([again]) };
  });
}

async function rowsSixToEight(child: ChildProcess, url: string, api: Api, names: number): Promise<void> {
  const s = await api.session();
  // Rank 32, the SDK's default: each name holds about half a megabyte of this model's adapter.
  const modelId = (await api.model(s, 0, 32)).json.model_id as string;
  await measure(child, url, 6, `${names} save_weights_for_sampler names (rank 32)`, async () => {
    for (let i = 0; i < names; i++)
      await api.result(await api.post('/api/v1/save_weights_for_sampler', { model_id: modelId, path: `w${i}` }));
    const open = async (i: number): Promise<number> =>
      (await api.post('/api/v1/create_sampling_session', { session_id: s, model_path: `tinker://${modelId}/sampler_weights/w${i}` }))
        .status;
    return { oldestStatus: await open(0), newestStatus: await open(names - 1) };
  });
  const base = (await api.post('/api/v1/create_sampling_session', { session_id: s, base_model: 'tiny-qwen3' })).json.sampling_session_id;
  const sample = (sampler: unknown, maxTokens: number, n: number, seed: number): Promise<Answer> =>
    api.post('/api/v1/asample', {
      sampling_session_id: sampler,
      num_samples: n,
      prompt: { chunks: [{ type: 'encoded_text', tokens: [5, 17, 42, 8] }] },
      sampling_params: { max_tokens: maxTokens, seed },
    });
  await measure(child, url, 7, 'asample max_tokens 1e9 batched with two valid ones', async () => {
    const [a, bad, b] = await Promise.all([sample(base, 8, 2, 1), sample(base, 1e9, 2, 2), sample(base, 8, 2, 3)]);
    const done = await Promise.all([api.result(a), api.result(b)]);
    return { badStatus: bad.status, validOk: done.filter((x) => x.proto).length };
  });
  await measure(child, url, 8, 'sampler evicted with 4 x 128 sequences queued', async () => {
    const sampler = (await api.result(await api.post('/api/v1/save_weights_for_sampler', { model_id: modelId }))).json.sampling_session_id;
    const futures = await Promise.all([0, 1, 2, 3].map((i) => sample(sampler, 24, 128, i)));
    // 64 more sampling sessions (the default maxSamplers) push it out.
    for (let i = 0; i < 64; i++) await api.post('/api/v1/create_sampling_session', { session_id: s, base_model: 'tiny-qwen3' });
    const done = await Promise.all(futures.map((f) => api.result(f)));
    return { accepted: futures.filter((f) => f.status === 200).length, served: done.filter((x) => x.proto).length };
  });
}

async function rowNine(child: ChildProcess, url: string, api: Api, backend: string): Promise<void> {
  await measure(child, url, 9, 'malformed: chunks [null], /sessions/%zz/finish', async () => {
    const sampler = (await api.post('/api/v1/create_sampling_session', { base_model: 'tiny-qwen3' })).json.sampling_session_id;
    const nulls = await api.post('/api/v1/asample', { sampling_session_id: sampler, prompt: { chunks: [null] } });
    const escape = await api.post('/api/v1/sessions/%zz/finish', {});
    return { chunksNull: nulls.status, badEscape: escape.status };
  });
  const started = performance.now();
  const empty = spawn(process.execPath, [cli, 'tinker', '--model', fixture, '--port', '0', '--api-key', '', '--backend', backend], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const [code] = (await once(empty, 'exit')) as [number];
  process.stdout.write(
    `${JSON.stringify({ row: 9, case: 'rxrl tinker --api-key ""', exitCode: code, ms: Math.round(performance.now() - started) })}\n`,
  );
}
