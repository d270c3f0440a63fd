/**
 * Downloads a model's files from the Hugging Face hub (or the mirror `HF_ENDPOINT` names) into the local cache,
 * laid out as `huggingface_hub` lays it out (`refs/<revision>`, `snapshots/<commit>/<file>` linking to
 * `blobs/<etag>`).
 *
 * The server is not trusted with the names that become paths. Its answer is checked before any path is built or
 * any file requested: the commit must be 40 hex digits, each blob id a git sha1 (40 hex) or an LFS sha256 (64 hex),
 * each file name a relative path with no `..`, absolute, drive or backslash part. Each download must have the size
 * and hash its listing gave, and the snapshot must lie inside the cache once every link is followed. Every request
 * has a deadline (`timeoutMs`: no answer, or no byte of a download, for that long) and the caller's `AbortSignal`;
 * every answer's size is bounded (the listing by {@link MAX_LISTING_BYTES}, a download by the size listed for it).
 *
 * @packageDocumentation
 */
import { createHash, type Hash } from 'node:crypto';
import { mkdir, open, rename, rm, stat, symlink } from 'node:fs/promises';
import { dirname, join, relative } from 'node:path';

import { AbortError, ConfigError, DecodeError } from '../core/errors.js';
import { limitBody } from '../core/http.js';
import { resolveInside } from './files.js';
import { writeFileAtomic } from './safetensors.js';

/** The public hub, when `HF_ENDPOINT` names no mirror. */
export const DEFAULT_HUB_ENDPOINT = 'https://huggingface.co';

/** Default deadline of one request to the hub, in ms. */
export const DEFAULT_HUB_TIMEOUT_MS = 60_000;

/**
 * Largest repository listing read, in bytes: 16 MiB, some 80 000 files at about 200 bytes of JSON each (the largest
 * model repositories list a few thousand).
 */
export const MAX_LISTING_BYTES = 16 << 20;

const COMMIT = /^[0-9a-f]{40}$/;
const GIT_SHA1 = /^[0-9a-f]{40}$/;
const SHA256 = /^[0-9a-f]{64}$/;

/** One file of a repository at a commit, as its listing describes it, checked. */
export interface HubFile {
  /** Relative path in the repository (`/`-separated, no `..`). */
  readonly path: string;
  /** Size in bytes. */
  readonly size: number;
  /** The blob's name in the cache: the LFS sha256, else the git blob sha1. */
  readonly blob: string;
  /** Whether `blob` is an LFS sha256 (else a git blob sha1). */
  readonly lfs: boolean;
}

/** A repository at one commit: what `GET /api/models/{repo}/revision/{revision}?blobs=true` answers, checked. */
export interface HubListing {
  readonly commit: string;
  readonly files: readonly HubFile[];
}

/** Where the hub is and how long each request may take. */
export interface HubRequestOptions {
  /** The hub's base URL (`HF_ENDPOINT`). Default {@link DEFAULT_HUB_ENDPOINT}. */
  readonly endpoint?: string | undefined;
  /** `HF_TOKEN`, sent as a bearer token. */
  readonly token?: string | undefined;
  /** Deadline of each request: no answer (or no byte of a download) for this long fails it. Default 60 s. */
  readonly timeoutMs?: number | undefined;
  /** Stops every request. */
  readonly signal?: AbortSignal | undefined;
}

/** Options of {@link downloadSnapshot}. */
export interface DownloadSnapshotOptions extends HubRequestOptions {
  /** The hub cache the repository folder lies in: the snapshot must resolve inside it. */
  readonly cacheDir: string;
  /** The repository's folder in the cache (`<cacheDir>/models--org--name`). */
  readonly repoDir: string;
  /** Which files of the repository to download. */
  readonly wanted: (path: string) => boolean;
  /** Called before each wanted file is fetched or found in the cache, with its index among them. */
  readonly onFile?: ((file: HubFile, index: number, files: readonly HubFile[]) => void) | undefined;
}

/**
 * Checks a repository listing: its commit, and every sibling's name, size and blob id.
 *
 * @param json - the parsed answer.
 * @param source - the URL it came from, for messages.
 * @throws {@link DecodeError} naming what the server sent, when anything is malformed or unsafe as a path.
 */
export function checkListing(json: unknown, source: string): HubListing {
  const bad = (what: string, value: unknown): DecodeError =>
    new DecodeError(`${source}: ${what} ${shown(value)}`, { context: { url: source, value: shown(value) } });
  const answer = json as { sha?: unknown; siblings?: unknown } | null;
  if (typeof answer !== 'object' || answer === null) throw bad('answered', json);
  if (typeof answer.sha !== 'string' || !COMMIT.test(answer.sha)) throw bad('names a commit that is not 40 hex digits:', answer.sha);
  if (!Array.isArray(answer.siblings)) throw bad('lists no siblings:', answer.siblings);
  const files = answer.siblings.map((entry: unknown): HubFile => {
    const sibling = entry as { rfilename?: unknown; size?: unknown; blobId?: unknown; lfs?: { sha256?: unknown } | null } | null;
    const path = sibling?.rfilename;
    if (typeof path !== 'string' || !isSafeRepoPath(path))
      throw bad('names a file that is not a relative path inside the repository:', path);
    if (!Number.isSafeInteger(sibling?.size) || (sibling?.size as number) < 0) throw bad(`gives ${path} a size of`, sibling?.size);
    const lfs = sibling?.lfs !== undefined && sibling?.lfs !== null;
    const blob = lfs ? sibling?.lfs?.sha256 : sibling?.blobId;
    if (typeof blob !== 'string' || !(lfs ? SHA256 : GIT_SHA1).test(blob)) {
      throw bad(`gives ${path} a blob id that is not ${lfs ? 'a sha256 (64 hex digits)' : 'a git sha1 (40 hex digits)'}:`, blob);
    }
    return { path, size: sibling?.size as number, blob, lfs };
  });
  return { commit: answer.sha, files };
}

/**
 * True for a path relative to a repository's root with no empty, `.` or `..` part, no backslash, no drive or
 * absolute start and no control character: a name that stays inside any directory it is joined to.
 */
export function isSafeRepoPath(path: string): boolean {
  if (path === '' || path.length > 1024 || path.startsWith('/') || path.includes('\\') || /^[A-Za-z]:/.test(path)) return false;
  if ([...path].some((c) => c.charCodeAt(0) < 0x20 || c.charCodeAt(0) === 0x7f)) return false;
  return path.split('/').every((part) => part !== '' && part !== '.' && part !== '..');
}

/**
 * Reads the listing of `repo` at `revision` from the hub and checks it ({@link checkListing}).
 *
 * @throws {@link DecodeError} for a malformed or unsafe answer; {@link AbortError} when `signal` fires; a
 *   {@link ConfigError} when the hub does not answer in time or answers an HTTP error.
 */
export async function fetchListing(
  id: { readonly repo: string; readonly revision: string },
  options: HubRequestOptions,
): Promise<HubListing> {
  const url = `${endpointOf(options)}/api/models/${id.repo}/revision/${encodeURIComponent(id.revision)}?blobs=true`;
  const bytes = await request(url, options, { idle: false, maxBytes: MAX_LISTING_BYTES }, async (body) => {
    const chunks: Buffer[] = [];
    for await (const chunk of body) chunks.push(Buffer.from(chunk));
    return Buffer.concat(chunks);
  });
  let json: unknown;
  try {
    json = JSON.parse(bytes.toString('utf8'));
  } catch (cause) {
    throw new DecodeError(`${url}: answer is not JSON`, { cause, context: { url } });
  }
  const listing = checkListing(json, url);
  // Asked for a commit, the listing must be of that commit (its snapshot is where the cache looks for it).
  if (COMMIT.test(id.revision) && listing.commit !== id.revision) {
    throw new DecodeError(`${url}: answered commit ${listing.commit} for commit ${id.revision}`, {
      context: { url, commit: listing.commit },
    });
  }
  return listing;
}

/**
 * Downloads the wanted files of `id` into the cache (files already there are kept), records `revision`'s commit
 * in `refs/`, and checks that every file of the snapshot resolves inside the cache.
 *
 * @returns the snapshot directory (`<repoDir>/snapshots/<commit>`) and the files it holds.
 * @throws {@link DecodeError} for a malformed answer, or a download whose size or hash differs from its listing;
 *   `ForbiddenPathError` when the snapshot leads outside the cache (a link there planted); {@link AbortError} when `signal` fires;
 *   {@link ConfigError} for no answer in time or an HTTP error.
 */
export async function downloadSnapshot(
  id: { readonly repo: string; readonly revision: string },
  options: DownloadSnapshotOptions,
): Promise<{ readonly snapshot: string; readonly files: readonly HubFile[] }> {
  const { commit, files: listed } = await fetchListing(id, options);
  const files = listed.filter((file) => options.wanted(file.path));
  const snapshot = join(options.repoDir, 'snapshots', commit);
  for (const [i, file] of files.entries()) {
    options.onFile?.(file, i, files);
    const pointer = join(snapshot, file.path);
    if (await exists(pointer)) continue;
    const blob = join(options.repoDir, 'blobs', file.blob);
    const url = `${endpointOf(options)}/${id.repo}/resolve/${commit}/${file.path.split('/').map(encodeURIComponent).join('/')}`;
    if (!(await exists(blob))) await downloadBlob(url, file, blob, options);
    await mkdir(dirname(pointer), { recursive: true });
    await rm(pointer, { force: true });
    await symlink(relative(dirname(pointer), blob), pointer);
  }
  if (id.revision !== commit) {
    const ref = join(options.repoDir, 'refs', id.revision);
    await mkdir(dirname(ref), { recursive: true });
    await writeFileAtomic(ref, commit);
  }
  for (const file of files) await resolveInside(join(snapshot, file.path), options.cacheDir);
  return { snapshot, files };
}

/** Downloads one blob to `<blob>.incomplete`, checks its size and hash, and renames it into place. */
async function downloadBlob(url: string, file: HubFile, blob: string, options: DownloadSnapshotOptions): Promise<void> {
  await mkdir(dirname(blob), { recursive: true });
  const incomplete = `${blob}.incomplete`;
  await rm(incomplete, { force: true });
  const out = await open(incomplete, 'wx');
  let done = false;
  try {
    // A git blob's sha1 covers a header with its size; an LFS file's sha256 covers its bytes alone.
    const hash: Hash = file.lfs ? createHash('sha256') : createHash('sha1').update(`blob ${file.size}\0`);
    let size = 0;
    await request(url, options, { idle: true, maxBytes: file.size }, async (body) => {
      for await (const chunk of body) {
        size += chunk.length;
        hash.update(chunk);
        await out.write(chunk);
      }
    });
    const digest = hash.digest('hex');
    if (size !== file.size || digest !== file.blob) {
      throw new DecodeError(`${url}: ${size} bytes with hash ${digest}, the listing says ${file.size} bytes with ${file.blob}`, {
        context: { url, size, digest },
      });
    }
    await out.sync();
    done = true;
  } finally {
    await out.close();
    if (!done) await rm(incomplete, { force: true });
  }
  await rename(incomplete, blob);
}

/**
 * One GET with a deadline and the caller's signal; `read` consumes the body, cut at `maxBytes` (a
 * {@link DecodeError} with `context.limit`, at once when its `content-length` says more). With `idle`, the deadline
 * restarts at each chunk (a download may take long, but never stall); without, it bounds the whole exchange.
 */
async function request<T>(
  url: string,
  options: HubRequestOptions,
  { idle, maxBytes }: { readonly idle: boolean; readonly maxBytes: number },
  read: (body: AsyncIterable<Uint8Array>) => Promise<T>,
): Promise<T> {
  const timeoutMs = options.timeoutMs ?? DEFAULT_HUB_TIMEOUT_MS;
  const deadline = new AbortController();
  let timer = setTimeout(() => deadline.abort(), timeoutMs);
  const signal = options.signal ? AbortSignal.any([options.signal, deadline.signal]) : deadline.signal;
  try {
    options.signal?.throwIfAborted();
    const answer = await fetch(url, { signal, ...(options.token ? { headers: { authorization: `Bearer ${options.token}` } } : {}) });
    if (!answer.ok || answer.body === null) {
      await answer.body?.cancel();
      throw new ConfigError(`${url}: HTTP ${answer.status}`, {
        retriable: answer.status >= 500,
        context: { url, status: answer.status },
      });
    }
    const body = (await limitBody(answer, maxBytes, url)).body as ReadableStream<Uint8Array>;
    return await read({
      async *[Symbol.asyncIterator]() {
        for await (const chunk of body) {
          if (idle) {
            clearTimeout(timer);
            timer = setTimeout(() => deadline.abort(), timeoutMs);
          }
          yield chunk;
        }
      },
    });
  } catch (cause) {
    if (options.signal?.aborted) throw new AbortError(`${url}: stopped`, { cause: options.signal.reason, context: { url } });
    if (deadline.signal.aborted) {
      throw new ConfigError(`${url}: no answer within ${timeoutMs} ms`, { cause, retriable: true, context: { url, timeoutMs } });
    }
    throw cause;
  } finally {
    clearTimeout(timer);
  }
}

function endpointOf(options: HubRequestOptions): string {
  return (options.endpoint ?? DEFAULT_HUB_ENDPOINT).replace(/\/+$/, '');
}

/** True when `path` resolves (through links) to an entry. */
async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch {
    return false;
  }
}

/** A value the server sent, as JSON, cut short: safe to print. */
function shown(value: unknown): string {
  const text = JSON.stringify(value) ?? String(value);
  return text.length > 120 ? `${text.slice(0, 117)}...` : text;
}
