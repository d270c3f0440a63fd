/**
 * Models named by id, resolved in a Hugging Face cache laid out here from the tiny fixture exactly as
 * `huggingface_hub` lays one out (refs, snapshots linking into blobs); `huggingface_hub`'s own readers
 * (`scan_cache_dir`, `try_to_load_from_cache`) check the layout and agree with rxrl on every revision. The runs
 * here are offline (`HF_HUB_OFFLINE=1`); downloads are from hub servers on 127.0.0.1 written below: an honest one,
 * hostile ones that answer `../` names or bytes that are not what they listed, and one that never answers.
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { homedir, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { beforeAll, describe, expect, it, vi } from 'vitest';

import { RUN_LOCK_FILE } from '../../lib/checkpoint/runLock.js';
import { ConfigError, DecodeError, ForbiddenPathError, isAbortError } from '../../lib/core/errors.js';
import { cachedSnapshot, hubCacheDir, modelNameOf, parseModelId, resolveModelDir } from '../../lib/model/hubCache.js';
import { spawnServe } from '../../lib/serve/spawn.js';
import { expectHandledStop, stopWhenBlocked } from '../helpers/stopRun.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const FIXTURE = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');
const MAIN = 'a'.repeat(8) + '1234567890abcdef1234567890abcdef';
const DEV = 'b'.repeat(8) + '1234567890abcdef1234567890abcdef';

/** A hub cache holding `org/tiny` at two commits: `main` and tag `v1.0` at MAIN, branch `dev` at DEV. */
function layOutCache(): string {
  const cache = mkdtempSync(join(tmpdir(), 'rxrl-hub-'));
  const repo = join(cache, 'models--org--tiny');
  mkdirSync(join(repo, 'blobs'), { recursive: true });
  mkdirSync(join(repo, 'refs'), { recursive: true });
  const commit = (hash: string, change: (file: string, bytes: Buffer) => Buffer): void => {
    const snapshot = join(repo, 'snapshots', hash);
    mkdirSync(snapshot, { recursive: true });
    for (const file of readdirSync(FIXTURE)) {
      const bytes = change(file, readFileSync(join(FIXTURE, file)));
      const blob = createHash('sha256').update(bytes).digest('hex');
      writeFileSync(join(repo, 'blobs', blob), bytes);
      symlinkSync(join('..', '..', 'blobs', blob), join(snapshot, file));
    }
  };
  commit(MAIN, (_file, bytes) => bytes);
  // The dev commit has another rotary base: one file differs, the others share their blobs.
  commit(DEV, (file, bytes) =>
    file === 'config.json' ? Buffer.from(JSON.stringify({ ...JSON.parse(bytes.toString()), rope_theta: 5000 })) : bytes,
  );
  writeFileSync(join(repo, 'refs', 'main'), MAIN);
  writeFileSync(join(repo, 'refs', 'dev'), DEV);
  writeFileSync(join(repo, 'refs', 'v1.0'), MAIN);
  return cache;
}

let cache: string;
beforeAll(() => {
  cache = layOutCache();
});

describe('parseModelId and hubCacheDir', () => {
  it('reads org/name[@revision] and nothing else', () => {
    expect(parseModelId('Qwen/Qwen3-0.6B')).toEqual({ repo: 'Qwen/Qwen3-0.6B', revision: 'main' });
    expect(parseModelId('HuggingFaceTB/SmolLM2-135M-Instruct@v1.0')).toEqual({
      repo: 'HuggingFaceTB/SmolLM2-135M-Instruct',
      revision: 'v1.0',
    });
    for (const path of ['model', './m/x', '/abs/dir', '~/m', 'a/b/c', 'a/..', '../b', 'org/name@', 'org/name@a b', 'org/-x'])
      expect(parseModelId(path), path).toBeUndefined();
    // A path by its shape: a trailing slash, a backslash, a file name.
    for (const path of ['models/smollm2-135m/', 'models\\smol', 'org/model.safetensors', 'runs/config.json', 'data/r.yaml'])
      expect(parseModelId(path), path).toBeUndefined();
    expect(parseModelId('Qwen/Qwen2.5-0.5B-Instruct')).toEqual({ repo: 'Qwen/Qwen2.5-0.5B-Instruct', revision: 'main' });
  });

  it("finds the cache where huggingface_hub does: HF_HUB_CACHE, else HF_HOME/hub, else XDG's or the home's .cache", () => {
    expect(hubCacheDir({ HF_HUB_CACHE: '/c', HF_HOME: '/h' })).toBe('/c');
    expect(hubCacheDir({ HF_HOME: '/h' })).toBe('/h/hub');
    expect(hubCacheDir({ XDG_CACHE_HOME: '/x' })).toBe('/x/huggingface/hub');
    expect(hubCacheDir({})).toBe(join(homedir(), '.cache', 'huggingface', 'hub'));
  });
});

describe('resolveModelDir in a Hugging Face cache', () => {
  const env = (): NodeJS.ProcessEnv => ({ HF_HUB_CACHE: cache, HF_HUB_OFFLINE: '1' });

  it('resolves the id, a branch, a tag and a commit to their snapshots', async () => {
    const snapshots = join(cache, 'models--org--tiny', 'snapshots');
    expect(await resolveModelDir('org/tiny', { env: env() })).toBe(join(snapshots, MAIN));
    expect(await resolveModelDir('org/tiny@dev', { env: env() })).toBe(join(snapshots, DEV));
    expect(await resolveModelDir('org/tiny@v1.0', { env: env() })).toBe(join(snapshots, MAIN));
    expect(await resolveModelDir(`org/tiny@${DEV}`, { env: env() })).toBe(join(snapshots, DEV));
    expect(cachedSnapshot({ repo: 'org/tiny', revision: 'nope' }, cache)).toBeUndefined();
    expect(modelNameOf('org/tiny', join(snapshots, MAIN))).toBe('org/tiny');
  });

  it('a path that exists wins over an id; a missing id offline is a ConfigError naming both readings and the cache', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rxrl-local-'));
    mkdirSync(join(base, 'org', 'tiny'), { recursive: true });
    writeFileSync(join(base, 'org', 'tiny', 'config.json'), '{}');
    expect(await resolveModelDir('org/tiny', { baseDir: base, env: env() })).toBe(join(base, 'org', 'tiny'));
    const missing = resolveModelDir('org/absent@dev', { baseDir: base, env: env(), key: 'model.path' });
    await expect(missing).rejects.toThrow(ConfigError);
    await expect(missing).rejects.toThrow(
      `model.path: no local directory '${join(base, 'org', 'absent@dev')}' and no cached Hugging Face model 'org/absent@dev' ` +
        `(offline: HF_HUB_OFFLINE forbids downloading it into ${cache}; give a local model directory, or download it online)`,
    );
  });

  it("agrees with huggingface_hub's scan_cache_dir and try_to_load_from_cache on every revision", async () => {
    const script = [
      'import json, os, sys',
      'from huggingface_hub import scan_cache_dir, try_to_load_from_cache',
      'cache = sys.argv[1]',
      'info = scan_cache_dir(cache)',
      'repos = {r.repo_id: {rev.commit_hash: sorted(rev.refs) for rev in r.revisions} for r in info.repos}',
      "found = {str(rev): os.path.dirname(try_to_load_from_cache('org/tiny', 'config.json', cache_dir=cache, revision=rev)) for rev in [None, 'dev', 'v1.0', sys.argv[2]]}",
      "print(json.dumps({'repos': repos, 'warnings': [str(w) for w in info.warnings], 'found': found}))",
    ].join('\n');
    const python = spawnSync('python3', ['-c', script, cache, DEV], { encoding: 'utf8' });
    expect(python.status, python.stderr).toBe(0);
    const hub = JSON.parse(python.stdout) as {
      repos: Record<string, Record<string, string[]>>;
      warnings: string[];
      found: Record<string, string>;
    };
    expect(hub.warnings).toEqual([]);
    expect(hub.repos).toEqual({ 'org/tiny': { [MAIN]: ['main', 'v1.0'], [DEV]: ['dev'] } });
    expect(await resolveModelDir('org/tiny', { env: env() })).toBe(hub.found.None);
    for (const revision of ['dev', 'v1.0', DEV])
      expect(await resolveModelDir(`org/tiny@${revision}`, { env: env() })).toBe(hub.found[revision]);
  });
});

describe('a model id on the command line (built CLI, offline)', () => {
  it('rxrl run trains org/tiny@dev from the cache, and rxrl serve serves org/tiny under its id', async () => {
    const work = mkdtempSync(join(tmpdir(), 'rxrl-hub-run-'));
    const recipe = join(work, 'recipe.json');
    writeFileSync(
      recipe,
      JSON.stringify({
        model: { path: 'org/tiny@dev' },
        run: { dir: 'run', seed: 2, steps: 1, backend: 'cpu' },
        data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        rollout: { groupSize: 2 },
        sync: { batchSize: 2 },
        validation: { beforeTrain: false },
      }),
    );
    const env = { ...process.env, HF_HUB_CACHE: cache, HF_HUB_OFFLINE: '1', RXRL_LOG_LEVEL: 'silent' };
    const run = await new Promise<{ code: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = spawn(process.execPath, [cli, 'run', recipe], { env, stdio: ['ignore', 'pipe', 'pipe'] });
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (d: Buffer) => (stdout += d.toString()));
      child.stderr.on('data', (d: Buffer) => (stderr += d.toString()));
      child.on('close', (code) => resolve({ code, stdout, stderr }));
    });
    expect(run.code, run.stderr).toBe(0);
    expect(JSON.parse(run.stdout.trim().split('\n').at(-1) ?? '{}')).toMatchObject({ steps: 1 });
    // The run trained the dev revision; its checkpoint is a model directory of its own.
    const saved = join(work, 'run', 'global_step_1');
    expect(JSON.parse(readFileSync(join(saved, 'config.json'), 'utf8'))).toMatchObject({ rope_theta: 5000 });
    const server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', 'org/tiny'], { cliPath: cli, env, stderr: 'ignore' });
    try {
      expect(server.modelName).toBe('org/tiny');
    } finally {
      await server.close();
    }
  }, 120_000);
});

/** A hub on 127.0.0.1: `answer` handles each request; `requests` lists them (`METHOD path`). */
async function hubServer(answer: (req: IncomingMessage, res: ServerResponse) => void): Promise<{
  url: string;
  requests: string[];
  received: Promise<void>;
  close: () => Promise<void>;
}> {
  const requests: string[] = [];
  let seen: () => void = () => undefined;
  const received = new Promise<void>((resolve) => (seen = resolve));
  const server = createServer((req, res) => {
    requests.push(`${req.method} ${req.url}`);
    seen();
    req.resume();
    req.on('end', () => answer(req, res));
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    received,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

const sha256 = (bytes: Buffer): string => createHash('sha256').update(bytes).digest('hex');
const gitSha1 = (bytes: Buffer): string => createHash('sha1').update(`blob ${bytes.length}\0`).update(bytes).digest('hex');

/** The fixture's files as the hub lists them (`GET /api/models/{repo}/revision/{rev}?blobs=true`): safetensors in LFS. */
function siblingsOf(files: Record<string, Buffer>): object[] {
  return Object.entries(files).map(([rfilename, bytes]) =>
    rfilename.endsWith('.safetensors')
      ? { rfilename, size: bytes.length, blobId: gitSha1(Buffer.from('pointer')), lfs: { sha256: sha256(bytes), size: bytes.length } }
      : { rfilename, size: bytes.length, blobId: gitSha1(bytes) },
  );
}

/**
 * A hub serving `files` at `commit` to every client: the revision listing and resolve routes rxrl reads, and the tree
 * and paths-info routes other clients read (the hostile answers there planted `../` names through the
 * `@huggingface/hub` package rxrl used before); `change` alters the answers (a hostile server).
 */
function hubAnswers(
  files: Record<string, Buffer>,
  change: { listing?: (listing: { sha: string; siblings: object[] }) => object; pathsInfo?: object; body?: (bytes: Buffer) => Buffer } = {},
): (req: IncomingMessage, res: ServerResponse) => void {
  const commit = 'c'.repeat(40);
  return (req, res) => {
    const url = new URL(req.url ?? '/', 'http://hub');
    const json = (value: unknown): void => {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(value));
    };
    if (url.pathname.startsWith('/api/models/org/tiny/revision/')) {
      const listing = { sha: commit, siblings: siblingsOf(files) };
      return json(change.listing ? change.listing(listing) : listing);
    }
    if (url.pathname.startsWith('/api/models/org/tiny/tree/'))
      return json(Object.entries(files).map(([path, bytes]) => ({ type: 'file', path, size: bytes.length, oid: gitSha1(bytes) })));
    if (url.pathname.startsWith('/api/models/org/tiny/paths-info/')) return json(change.pathsInfo ?? []);
    const file = /^\/org\/tiny\/resolve\/[^/]+\/(.+)$/.exec(url.pathname)?.[1];
    const bytes = file === undefined ? undefined : files[file];
    if (bytes === undefined) {
      res.writeHead(404);
      return res.end();
    }
    const body = change.body ? change.body(bytes) : bytes;
    res.writeHead(200, {
      etag: `"${gitSha1(bytes)}"`,
      'content-range': `bytes 0-${body.length - 1}/${body.length}`,
      'content-length': body.length,
    });
    res.end(body);
  };
}

/** Every path under `dir` (files and links, not following them), relative to it. */
function everything(dir: string): string[] {
  return readdirSync(dir, { recursive: true, encoding: 'utf8' }).sort();
}

describe('a model that is not there: one line naming the key, where it looked and what to do', () => {
  const remedy = 'run `npm run model:smollm2` in a checkout, or give a local model directory or a Hugging Face id such as org/name';

  it('a local path (./, ../, /, ~, a trailing slash, a file name, a backslash) that is missing: never a download', async () => {
    const hub = await hubServer((_req, res) => res.writeHead(404).end());
    const base = mkdtempSync(join(tmpdir(), 'rxrl-no-model-'));
    const env = { HF_HUB_CACHE: join(base, 'cache'), HF_ENDPOINT: hub.url };
    try {
      const cases: [string, string][] = [
        ['./models/smol', join(base, 'models', 'smol')],
        ['../no-such-rxrl-model', join(dirname(base), 'no-such-rxrl-model')],
        ['models/smollm2-135m/', join(base, 'models', 'smollm2-135m')],
        [join(base, 'abs'), join(base, 'abs')],
        ['~/no-such-rxrl-model-dir', join(homedir(), 'no-such-rxrl-model-dir')],
        ['org/model.safetensors', join(base, 'org', 'model.safetensors')],
        ['models\\smol', join(base, 'models\\smol')],
        ['smollm2', join(base, 'smollm2')],
      ];
      for (const [path, where] of cases) {
        const error = await resolveModelDir(path, { baseDir: base, env, key: 'distill.teacher.path' }).catch((e: unknown) => e);
        expect(error, path).toBeInstanceOf(ConfigError);
        expect((error as Error).message, path).toBe(`distill.teacher.path: no model at '${where}' (${remedy})`);
      }
      expect(hub.requests).toEqual([]);
    } finally {
      await hub.close();
    }
  });

  it('a directory without config.json, or a file: no model there, and what is there', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rxrl-no-model-'));
    mkdirSync(join(base, 'half'));
    writeFileSync(join(base, 'half', 'tokenizer.json'), '{}');
    writeFileSync(join(base, 'weights'), '');
    const env = { HF_HUB_CACHE: join(base, 'cache'), HF_HUB_OFFLINE: '1' };
    await expect(resolveModelDir('half', { baseDir: base, env })).rejects.toThrow(
      `model.path: no model at '${join(base, 'half')}': the directory has no config.json (${remedy})`,
    );
    await expect(resolveModelDir('./weights', { baseDir: base, env })).rejects.toThrow(
      `model.path: no model at '${join(base, 'weights')}': it is a file, not a directory (${remedy})`,
    );
  });

  it('an org/name that is no local path and not on the hub: both readings, and why the download failed', async () => {
    const hub = await hubServer((_req, res) => res.writeHead(404).end('{"error":"Repository not found"}'));
    const base = mkdtempSync(join(tmpdir(), 'rxrl-no-model-'));
    const cacheDir = join(base, 'cache');
    try {
      const error = await resolveModelDir('model/smollm2', { baseDir: base, env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url } }).catch(
        (e: unknown) => e,
      );
      expect(error).toBeInstanceOf(ConfigError);
      expect((error as Error).message).toMatch(
        new RegExp(
          `^model\\.path: no local directory '${join(base, 'model', 'smollm2')}' and no cached Hugging Face model 'model/smollm2', ` +
            `and downloading it into ${cacheDir} failed: .*404`,
        ),
      );
      expect(hub.requests.length).toBeGreaterThan(0);
    } finally {
      await hub.close();
    }
  });
});

describe('downloading a model id from HF_ENDPOINT', () => {
  const fixture = (): Record<string, Buffer> => Object.fromEntries(readdirSync(FIXTURE).map((f) => [f, readFileSync(join(FIXTURE, f))]));

  it('an honest hub: the files land in the cache as huggingface_hub lays them out, and its reader finds them', async () => {
    const hub = await hubServer(hubAnswers(fixture()));
    const cacheDir = mkdtempSync(join(tmpdir(), 'rxrl-hub-dl-'));
    try {
      const dir = await resolveModelDir('org/tiny', { env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url } });
      const repo = join(cacheDir, 'models--org--tiny');
      expect(dir).toBe(join(repo, 'snapshots', 'c'.repeat(40)));
      expect(readFileSync(join(repo, 'refs', 'main'), 'utf8')).toBe('c'.repeat(40));
      for (const [file, bytes] of Object.entries(fixture())) expect(readFileSync(join(dir, file)).equals(bytes), file).toBe(true);
      expect(readdirSync(join(repo, 'blobs')).sort()).toEqual(Object.values(siblingsOf(fixture())).map(blobOf).sort());
      const python = spawnSync(
        'python3',
        [
          '-c',
          "import sys; from huggingface_hub import try_to_load_from_cache as t; print(t('org/tiny', 'model.safetensors', cache_dir=sys.argv[1]))",
          cacheDir,
        ],
        { encoding: 'utf8' },
      );
      expect(python.status, python.stderr).toBe(0);
      expect(python.stdout.trim()).toBe(join(dir, 'model.safetensors'));
    } finally {
      await hub.close();
    }
  });

  it.each([
    {
      what: 'a commit of ../ names',
      listing: (l: { sha: string; siblings: object[] }) => ({ ...l, sha: '../../../planted' }),
      sent: '"../../../planted"',
    },
    {
      what: 'a blob id of ../ names',
      listing: (l: { sha: string; siblings: object[] }) => ({
        ...l,
        siblings: l.siblings.map((s) => ({ ...s, blobId: '../../../planted' })),
      }),
      sent: '"../../../planted"',
    },
    {
      what: 'an LFS sha256 of ../ names',
      listing: (l: { sha: string; siblings: object[] }) => ({
        ...l,
        siblings: l.siblings.map((s) => ('lfs' in s ? { ...s, lfs: { sha256: '../../../planted', size: 1 } } : s)),
      }),
      sent: '"../../../planted"',
    },
    {
      what: 'a file name that climbs out',
      listing: (l: { sha: string; siblings: object[] }) => ({
        ...l,
        siblings: [...l.siblings, { rfilename: '../../planted.json', size: 2, blobId: 'a'.repeat(40) }],
      }),
      sent: '"../../planted.json"',
    },
  ])(
    'a hostile hub answering $what: a DecodeError naming it, no file requested, nothing written outside the cache',
    async ({ listing, sent }) => {
      const outer = mkdtempSync(join(tmpdir(), 'rxrl-hub-hostile-'));
      const cacheDir = join(outer, 'cache');
      mkdirSync(cacheDir);
      const lastCommit = { id: '../../../planted-commit', title: 'x', date: new Date(0).toISOString() };
      const pathsInfo = [{ path: 'config.json', type: 'file', size: 2, oid: '../../../planted-oid', lastCommit }];
      const hub = await hubServer(hubAnswers(fixture(), { listing, pathsInfo, body: () => Buffer.from('{}') }));
      try {
        const error = await resolveModelDir('org/tiny', { env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url } }).catch((e: unknown) => e);
        expect(everything(outer).filter((path) => !path.startsWith('cache'))).toEqual([]);
        expect(error).toBeInstanceOf(DecodeError);
        expect((error as DecodeError).message).toContain(sent);
        expect(hub.requests.filter((r) => r.includes('/resolve/'))).toEqual([]);
        expect(everything(cacheDir)).toEqual([]);
      } finally {
        await hub.close();
      }
    },
  );

  it('a snapshot that would lead outside the cache once links are followed: a ForbiddenPathError', async () => {
    const hub = await hubServer(hubAnswers(fixture()));
    const outer = mkdtempSync(join(tmpdir(), 'rxrl-hub-planted-'));
    const cacheDir = join(outer, 'cache');
    const blobs = join(cacheDir, 'models--org--tiny', 'blobs');
    mkdirSync(blobs, { recursive: true });
    writeFileSync(join(outer, 'elsewhere.json'), '{}');
    // A blob already "in the cache" is a link to a file outside it.
    symlinkSync(join(outer, 'elsewhere.json'), join(blobs, gitSha1(fixture()['config.json'])));
    try {
      const error = await resolveModelDir('org/tiny', { env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(ForbiddenPathError);
    } finally {
      await hub.close();
    }
  });

  it('a hub sending other bytes than it listed: a DecodeError, and no blob or partial file is kept', async () => {
    const hub = await hubServer(
      hubAnswers(fixture(), { body: (bytes) => Buffer.concat([bytes.subarray(0, bytes.length - 1), Buffer.from('x')]) }),
    );
    const cacheDir = mkdtempSync(join(tmpdir(), 'rxrl-hub-dl-'));
    try {
      const error = await resolveModelDir('org/tiny', { env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url } }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(DecodeError);
      expect(everything(join(cacheDir, 'models--org--tiny', 'blobs'))).toEqual([]);
    } finally {
      await hub.close();
    }
  });

  it('a hub that never answers: a retriable ConfigError at the deadline; the stop signal ends the wait with an AbortError', async () => {
    const hub = await hubServer(() => undefined);
    const cacheDir = mkdtempSync(join(tmpdir(), 'rxrl-hub-dl-'));
    const env = { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url };
    try {
      const late = await resolveModelDir('org/tiny', { env, timeoutMs: 200 }).catch((e: unknown) => e);
      expect(late).toBeInstanceOf(ConfigError);
      expect(late).toMatchObject({ retriable: true, context: { key: 'model.path', model: 'org/tiny@main' } });
      expect((late as ConfigError).cause).toMatchObject({ context: { timeoutMs: 200 } });
      const stop = new AbortController();
      const stopped = resolveModelDir('org/tiny', { env, timeoutMs: 300_000, signal: stop.signal }).catch((e: unknown) => e);
      await vi.waitFor(() => expect(hub.requests.length).toBe(2));
      stop.abort();
      expect(isAbortError(await stopped)).toBe(true);
      expect(everything(cacheDir)).toEqual([]);
    } finally {
      await hub.close();
    }
  });

  it('SIGTERM to rxrl run blocked on a hub that never answers: it exits as stopped, lock released, nothing partial', async () => {
    const hub = await hubServer(() => undefined);
    const work = mkdtempSync(join(tmpdir(), 'rxrl-hub-stop-'));
    const cacheDir = join(work, 'cache');
    const recipe = join(work, 'recipe.json');
    writeFileSync(
      recipe,
      JSON.stringify({
        model: { path: 'org/tiny', hubTimeoutMs: 300_000 },
        run: { dir: 'run', seed: 2, steps: 1, backend: 'cpu' },
        data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        rollout: { groupSize: 2 },
        sync: { batchSize: 2 },
      }),
    );
    try {
      const run = await stopWhenBlocked({
        args: ['run', recipe],
        what: 'hub that never answers',
        env: { HF_HUB_CACHE: cacheDir, HF_ENDPOINT: hub.url, RXRL_LOG_LEVEL: 'silent' },
        blocked: () => hub.received,
      });
      expect(run.code, run.stderr).toBe(143);
      expect(run.stderr).toContain('rxrl: stopped by SIGTERM');
      expectHandledStop(run);
      expect(existsSync(join(work, 'run', RUN_LOCK_FILE))).toBe(false);
      expect(existsSync(cacheDir) ? everything(cacheDir).filter((p) => p.endsWith('.incomplete')) : []).toEqual([]);
    } finally {
      await hub.close();
    }
  }, 120_000);
});

function blobOf(sibling: object): string {
  const s = sibling as { blobId: string; lfs?: { sha256: string } };
  return s.lfs?.sha256 ?? s.blobId;
}
