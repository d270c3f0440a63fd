/**
 * Models named by id, resolved in a Hugging Face cache laid out here from the tiny fixture exactly as
 * `huggingface_hub` lays one out (refs, snapshots linking into blobs); `huggingface_hub`'s own readers
 * (`scan_cache_dir`, `try_to_load_from_cache`) check the layout and agree with rxrl on every revision. Nothing is
 * downloaded: the runs are offline (`HF_HUB_OFFLINE=1`).
 */
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { beforeAll, describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { cachedSnapshot, hubCacheDir, modelNameOf, parseModelId, resolveModelDir } from '../../lib/model/hubCache.js';
import { spawnServe } from '../../lib/serve/spawn.js';

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

  it('a path that exists wins over an id; a missing id offline is a ConfigError naming it and the cache', async () => {
    const base = mkdtempSync(join(tmpdir(), 'rxrl-local-'));
    mkdirSync(join(base, 'org', 'tiny'), { recursive: true });
    expect(await resolveModelDir('org/tiny', { baseDir: base, env: env() })).toBe(join(base, 'org', 'tiny'));
    const missing = resolveModelDir('org/absent@dev', { env: env(), key: 'model.path' });
    await expect(missing).rejects.toThrow(ConfigError);
    await expect(missing).rejects.toThrow(
      `model.path: org/absent@dev is not in the Hugging Face cache ${cache}, and HF_HUB_OFFLINE forbids`,
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
