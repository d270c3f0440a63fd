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

import { ConfigError, DecodeError, ForbiddenPathError, isAbortError, isRetriable } from '../core/errors.js';
import { downloadSnapshot } from './hubDownload.js';

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
 * File names a model id never ends with: a value such as `models/config.json` or `out/model.safetensors` is a path.
 */
const FILE_EXTENSION = /\.(json|jsonl|ya?ml|safetensors|bin|pt|pth|gguf|onnx|txt|parquet|model|tar|gz|zip)$/i;

/**
 * Reads `org/name[@revision]`; `undefined` for anything else: a path such as `./model`, `../m`, `~/m`, `/abs`,
 * `a\b`, `a/b/c`, `models/m/` (a trailing slash) or `org/model.safetensors` (a file name).
 *
 * @param text - what the recipe or the command line says.
 */
export function parseModelId(text: string): ModelId | undefined {
  const at = text.indexOf('@');
  const repo = at < 0 ? text : text.slice(0, at);
  const revision = at < 0 ? 'main' : text.slice(at + 1);
  const parts = repo.split('/');
  if (parts.length !== 2 || !parts.every((part) => ID_PART.test(part) && !part.includes('..'))) return undefined;
  if (FILE_EXTENSION.test(repo)) return undefined;
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
  const repoDir = repoDirOf(id, cacheDir);
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
  /**
   * Deadline of each request to the hub (`model.hubTimeoutMs`): no answer, or no byte of a download, for this long
   * fails the download. Default 60 s.
   */
  readonly timeoutMs?: number | undefined;
  /** Stops a download (the run's stop signal): an `AbortError`, and no partial file is left. */
  readonly signal?: AbortSignal | undefined;
}

/** What to do about a model that is not there: the remedy every "no model" message ends with. */
export const NO_MODEL_REMEDY =
  'run `npm run model:smollm2` in a checkout, or give a local model directory or a Hugging Face id such as org/name';

/**
 * The directory of a model named by a path or an id. The text is read as a Hugging Face id only when it looks like
 * one ({@link parseModelId}: `org/name[@revision]`, no `./`, `../`, `/`, `~`, backslash, file name or second slash)
 * and no local path of that name exists (relative to `baseDir`; `~/` is the home directory); anything else is a
 * local path, and a local path is never downloaded. An id is looked up in the Hugging Face cache and, when missing
 * and not offline, downloaded into it (the files a model directory needs).
 *
 * @param path - `model.path`, `--model`, a teacher's path.
 * @param options - base directory, environment, progress lines.
 * @returns the model directory (it has a `config.json`).
 * @throws ConfigError `<key>: no model at '<dir>' (…)` when a local path is no model directory; naming both
 *   readings (`no local directory '<dir>' and no cached Hugging Face model 'org/name'`) when the text is an id that
 *   is neither here nor in the cache and the hub may not or cannot be reached, or does not answer within `timeoutMs`.
 * @throws DecodeError when the hub answers names that are not a commit, a blob id or a relative file path, or a
 *   file whose size or hash is not what it listed; ForbiddenPathError when the snapshot leads outside the cache.
 * @throws AbortError when `signal` fires.
 */
export async function resolveModelDir(path: string, options: ResolveModelOptions = {}): Promise<string> {
  const local = resolve(options.baseDir ?? process.cwd(), expandHome(path));
  const key = options.key ?? 'model.path';
  const id = parseModelId(path);
  if (existsSync(local) || id === undefined) return checkedLocalModel(local, key);
  const env = options.env ?? process.env;
  const cacheDir = hubCacheDir(env);
  const cached = cachedSnapshot(id, cacheDir);
  if (cached !== undefined && existsSync(join(cached, 'config.json'))) return cached;
  const named = id.revision === 'main' ? id.repo : `${id.repo}@${id.revision}`;
  const neither = `${key}: no local directory '${local}' and no cached Hugging Face model '${named}'`;
  if (isOn(env.HF_HUB_OFFLINE) || isOn(env.TRANSFORMERS_OFFLINE)) {
    throw new ConfigError(
      `${neither} (offline: HF_HUB_OFFLINE forbids downloading it into ${cacheDir}; give a local model directory, or download it online)`,
      { context: { key, path: local, model: named, cacheDir } },
    );
  }
  return downloadModel(id, { cacheDir, env, key, neither, log: options.log, timeoutMs: options.timeoutMs, signal: options.signal });
}

/** `dir` when it is a model directory (it has a `config.json`), else a ConfigError saying what is there and what to do. */
function checkedLocalModel(dir: string, key: string): string {
  if (existsSync(join(dir, 'config.json'))) return dir;
  const what = !existsSync(dir) ? '' : isDirectory(dir) ? ': the directory has no config.json' : ': it is a file, not a directory';
  throw new ConfigError(`${key}: no model at '${dir}'${what} (${NO_MODEL_REMEDY})`, { context: { key, path: dir } });
}

const NOT_A_MODEL = 'the repository has no config.json: not a model';

/** Downloads the files of a model directory into the cache, with a line per file; returns the snapshot directory. */
async function downloadModel(id: ModelId, options: DownloadModelOptions): Promise<string> {
  const named = `${id.repo}@${id.revision}`;
  const { cacheDir, env, key } = options;
  try {
    let total = 0;
    let done = 0;
    const { snapshot, files } = await downloadSnapshot(id, {
      cacheDir,
      repoDir: repoDirOf(id, cacheDir),
      wanted: (path) => MODEL_FILES.test(path),
      endpoint: env.HF_ENDPOINT || undefined,
      token: env.HF_TOKEN || undefined,
      timeoutMs: options.timeoutMs,
      signal: options.signal,
      onFile: (file, i, all) => {
        if (i === 0) {
          if (!all.some((f) => f.path === 'config.json')) throw new Error(NOT_A_MODEL);
          total = all.reduce((sum, f) => sum + f.size, 0);
        }
        options.log?.(`downloading ${named}: ${file.path} (${i + 1}/${all.length}, ${megabytes(done)} of ${megabytes(total)} MB)`);
        done += file.size;
      },
    });
    if (!files.some((file) => file.path === 'config.json')) throw new Error(NOT_A_MODEL);
    options.log?.(`downloaded ${named} into ${cacheDir} (${megabytes(total)} MB)`);
    return snapshot;
  } catch (cause) {
    // What the server sent that cannot be trusted, a snapshot leading outside the cache and a stop are what they are.
    if (cause instanceof DecodeError || cause instanceof ForbiddenPathError || isAbortError(cause)) throw cause;
    throw new ConfigError(`${options.neither}, and downloading it into ${cacheDir} failed: ${String(cause)}`, {
      cause,
      retriable: isRetriable(cause),
      context: { key, model: named, cacheDir },
    });
  }
}

/** What {@link downloadModel} needs besides the id. */
interface DownloadModelOptions {
  readonly cacheDir: string;
  readonly env: NodeJS.ProcessEnv;
  readonly key: string;
  /** The message's start: `<key>: no local directory '<dir>' and no cached Hugging Face model '<id>'`. */
  readonly neither: string;
  readonly log: ((line: string) => void) | undefined;
  readonly timeoutMs: number | undefined;
  readonly signal: AbortSignal | undefined;
}

/** The folder of a repository in the cache: `models--org--name`. */
function repoDirOf(id: ModelId, cacheDir: string): string {
  return join(cacheDir, `models--${id.repo.replace('/', '--')}`);
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
