/**
 * Models named by a Hugging Face id (`Qwen/Qwen3-0.6B`, `org/name@revision`), read from the local Hugging Face cache
 * as `huggingface_hub` lays it out, and downloaded into it when online, as transformers, vLLM and TRL do:
 *
 * ```
 * $HF_HUB_CACHE (default $HF_HOME/hub, $HF_HOME default ~/.cache/huggingface)
 * └── models--Qwen--Qwen3-0.6B/
 *     ├── refs/main                 the commit a branch or tag stands at (a text file)
 *     ├── snapshots/<commit>/…      the files of that commit (links into blobs/)
 *     └── blobs/<etag>              the contents
 * ```
 *
 * A revision is a branch or tag (read from `refs/`), or a 40-hex commit (a snapshot directory). `HF_HUB_OFFLINE=1`
 * (or `TRANSFORMERS_OFFLINE=1`) forbids the download: a model missing from the cache is then a `ConfigError`.
 *
 * @packageDocumentation
 */
import { existsSync, readFileSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, join, resolve, sep } from 'node:path';

import { ConfigError } from '../core/errors.js';

/** A model id and the revision asked for. */
export interface ModelId {
  /** `org/name`. */
  readonly repo: string;
  /** A branch, a tag or a commit. Default `main`. */
  readonly revision: string;
}

/** The files a model directory needs; the rest of a repository (other formats, docs, images) is not downloaded. */
const MODEL_FILES =
  /^(config\.json|generation_config\.json|tokenizer(_config)?\.json|special_tokens_map\.json|chat_template\.(jinja|json)|vocab\.json|merges\.txt|tokenizer\.model|added_tokens\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json)$/;
const ID_PART = /^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?$/;
const COMMIT = /^[0-9a-f]{40}$/;

/**
 * Reads `org/name[@revision]`; `undefined` for anything else (a path such as `./model` or `~/m`, an absolute path).
 *
 * @param text - what the recipe or the command line says.
 */
export function parseModelId(text: string): ModelId | undefined {
  const at = text.indexOf('@');
  const repo = at < 0 ? text : text.slice(0, at);
  const revision = at < 0 ? 'main' : text.slice(at + 1);
  const parts = repo.split('/');
  if (parts.length !== 2 || !parts.every((part) => ID_PART.test(part) && !part.includes('..'))) return undefined;
  if (revision === '' || /\s/.test(revision) || revision.includes('..')) return undefined;
  return { repo, revision };
}

/**
 * The cache directory `huggingface_hub` uses: `HF_HUB_CACHE`, else `HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`
 * (`HF_HOME` default `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`).
 *
 * @param env - the environment. Default `process.env`.
 */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  const explicit = env.HF_HUB_CACHE ?? env.HUGGINGFACE_HUB_CACHE;
  if (explicit) return expandHome(explicit);
  const home = env.HF_HOME
    ? expandHome(env.HF_HOME)
    : join(env.XDG_CACHE_HOME ? expandHome(env.XDG_CACHE_HOME) : join(homedir(), '.cache'), 'huggingface');
  return join(home, 'hub');
}

/**
 * The snapshot directory of `id` in the cache, when the cache has its revision (a ref naming a commit whose snapshot
 * exists, or a commit's snapshot); `undefined` otherwise.
 *
 * @param id - model id and revision.
 * @param cacheDir - the hub cache. Default {@link hubCacheDir}.
 */
export function cachedSnapshot(id: ModelId, cacheDir: string = hubCacheDir()): string | undefined {
  const repoDir = join(cacheDir, `models--${id.repo.replace('/', '--')}`);
  const snapshot = (commit: string): string | undefined => {
    const dir = join(repoDir, 'snapshots', commit);
    return COMMIT.test(commit) && isDirectory(dir) ? dir : undefined;
  };
  const ref = join(repoDir, 'refs', id.revision);
  if (existsSync(ref)) {
    const found = snapshot(readFileSync(ref, 'utf8').trim());
    if (found) return found;
  }
  return snapshot(id.revision);
}

/** Options of {@link resolveModelDir}. */
export interface ResolveModelOptions {
  /** What a relative path is relative to (a recipe's directory). Default the working directory. */
  readonly baseDir?: string | undefined;
  /** The environment (`HF_HUB_CACHE`, `HF_HOME`, `HF_HUB_OFFLINE`, `HF_TOKEN`, `HF_ENDPOINT`). Default `process.env`. */
  readonly env?: NodeJS.ProcessEnv | undefined;
  /** Progress lines of a download. */
  readonly log?: ((line: string) => void) | undefined;
  /** Which setting named the model, for messages. Default `model.path`. */
  readonly key?: string | undefined;
}

/**
 * The directory of a model named by a path or an id: a path that exists (relative to `baseDir`, `~/` the home
 * directory) is itself; otherwise `org/name[@revision]` is looked up in the Hugging Face cache and, when missing
 * and not offline, downloaded into it (the files a model directory needs). Anything else is returned resolved, for
 * the loader to refuse with its own message.
 *
 * @param path - `model.path`, `--model`, a teacher's path.
 * @param options - base directory, environment, progress lines.
 * @returns the model directory.
 * @throws ConfigError when the id is not in the cache and the hub may not or cannot be reached.
 */
export async function resolveModelDir(path: string, options: ResolveModelOptions = {}): Promise<string> {
  const local = resolve(options.baseDir ?? process.cwd(), expandHome(path));
  const id = parseModelId(path);
  if (existsSync(local) || id === undefined) return local;
  const env = options.env ?? process.env;
  const cacheDir = hubCacheDir(env);
  const cached = cachedSnapshot(id, cacheDir);
  if (cached !== undefined && existsSync(join(cached, 'config.json'))) return cached;
  const key = options.key ?? 'model.path';
  const named = id.revision === 'main' ? id.repo : `${id.repo}@${id.revision}`;
  if (isOn(env.HF_HUB_OFFLINE) || isOn(env.TRANSFORMERS_OFFLINE)) {
    throw new ConfigError(`${key}: ${named} is not in the Hugging Face cache ${cacheDir}, and HF_HUB_OFFLINE forbids downloading it`, {
      context: { key, model: named, cacheDir },
    });
  }
  return downloadModel(id, { cacheDir, env, key, log: options.log });
}

/** Downloads the files of a model directory into the cache, with a line per file; returns the snapshot directory. */
async function downloadModel(
  id: ModelId,
  options: { cacheDir: string; env: NodeJS.ProcessEnv; key: string; log: ((line: string) => void) | undefined },
): Promise<string> {
  const { listFiles, downloadFileToCacheDir } = await import('@huggingface/hub');
  const hub = {
    repo: { type: 'model' as const, name: id.repo },
    revision: id.revision,
    ...(options.env.HF_ENDPOINT ? { hubUrl: options.env.HF_ENDPOINT } : {}),
    ...(options.env.HF_TOKEN ? { accessToken: options.env.HF_TOKEN } : {}),
  };
  const named = `${id.repo}@${id.revision}`;
  try {
    const files: { path: string; size: number }[] = [];
    for await (const entry of listFiles(hub)) if (entry.type === 'file' && MODEL_FILES.test(entry.path)) files.push(entry);
    if (!files.some((file) => file.path === 'config.json')) throw new Error('the repository has no config.json: not a model');
    const total = files.reduce((sum, file) => sum + file.size, 0);
    let done = 0;
    let snapshotFile = '';
    for (const [i, file] of files.entries()) {
      options.log?.(`downloading ${named}: ${file.path} (${i + 1}/${files.length}, ${megabytes(done)} of ${megabytes(total)} MB)`);
      snapshotFile = await downloadFileToCacheDir({ ...hub, path: file.path, cacheDir: options.cacheDir });
      done += file.size;
    }
    options.log?.(`downloaded ${named} into ${options.cacheDir} (${megabytes(total)} MB)`);
    const snapshot = cachedSnapshot(id, options.cacheDir);
    return snapshot ?? resolve(snapshotFile, '..');
  } catch (cause) {
    throw new ConfigError(
      `${options.key}: ${named} is not in the Hugging Face cache ${options.cacheDir} and downloading it failed: ${String(cause)}`,
      {
        cause,
        context: { key: options.key, model: named, cacheDir: options.cacheDir },
      },
    );
  }
}

/**
 * The name a model goes by when served: its id's repository when it was resolved from the cache (as vLLM names a
 * model by its id), else its directory's name.
 *
 * @param path - what named the model.
 * @param dir - the directory it resolved to.
 */
export function modelNameOf(path: string, dir: string): string {
  const id = parseModelId(path);
  return id !== undefined && dir.includes(`${sep}models--`) ? id.repo : basename(dir);
}

function megabytes(bytes: number): string {
  return (bytes / 1e6).toFixed(1);
}

function isOn(value: string | undefined): boolean {
  return value !== undefined && ['1', 'true', 'yes', 'on'].includes(value.toLowerCase());
}

/** `path` with a leading `~` (alone or before `/`) replaced by the home directory. */
export function expandHome(path: string): string {
  return path === '~' || path.startsWith('~/') ? join(homedir(), path.slice(1)) : path;
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}
