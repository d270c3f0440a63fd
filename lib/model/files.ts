/**
 * The one reader of every model, adapter and weights file rxrl opens, whoever named the path (an HTTP client, a
 * Kafka announcement, a recipe, a checkpoint): the path is resolved through its links, confined to a root when
 * one is given, opened without blocking and without following a link swapped in since, and read only if it is a
 * regular file no larger than the caller's bound. A FIFO, a device such as `/dev/zero`, a directory or a huge
 * file is refused before a byte of it is read.
 *
 * @packageDocumentation
 */
import { constants } from 'node:fs';
import { lstat, open, realpath } from 'node:fs/promises';
import { dirname, isAbsolute, relative, sep } from 'node:path';

import { DecodeError, ForbiddenPathError } from '../core/errors.js';

/** Where a file may be read from and how large it may be. */
export interface FileLimits {
  /** Largest file accepted, in bytes. */
  readonly maxBytes: number;
  /**
   * A directory the file must lie in once every link is followed. A path outside it, or a link that cannot be
   * resolved, is refused with one {@link ForbiddenPathError} whatever the reason, so a caller learns nothing
   * about what lies outside.
   */
  readonly root?: string;
}

/** Largest JSON file of a model or adapter directory read (configs, the shard index, generation settings). */
export const MAX_JSON_BYTES = 16 << 20;

/** Room over a weights file's float32 tensor data for its JSON header, when bounding it by an architecture. */
export const WEIGHTS_HEADER_SLACK_BYTES = 16 << 20;

/**
 * Resolves `path` through every link and, when `root` is given, checks that the result lies inside the real
 * path of `root`.
 *
 * @returns the real path.
 * @throws {@link ForbiddenPathError} when `root` is given and the path is outside it, or is a link that does
 *   not resolve, or leads through something outside; {@link DecodeError} naming the path when it does not exist
 *   (under a root: a name missing from a directory inside it).
 */
export async function resolveInside(path: string, root?: string): Promise<string> {
  let real: string;
  try {
    real = await realpath(path);
  } catch (cause) {
    // Under a root, only a name missing from a directory inside it is "not found"; a dangling link or a path
    // through something outside is refused like any other outside path.
    if (root !== undefined && !(await missingInside(path, root))) throw forbidden(path, root, cause);
    throw new DecodeError(`${path}: cannot be read (${errnoCode(cause)})`, { cause, context: { path } });
  }
  if (root !== undefined && !(await isInside(real, root))) throw forbidden(path, root);
  return real;
}

/** True when the real path `real` lies in the real path of `root`. */
async function isInside(real: string, root: string): Promise<boolean> {
  let realRoot: string;
  try {
    realRoot = await realpath(root);
  } catch {
    return false;
  }
  const inside = relative(realRoot, real);
  return !(inside === '..' || inside.startsWith(`..${sep}`) || isAbsolute(inside));
}

/** True when `path` names no entry at all, in a directory that lies inside `root`. */
async function missingInside(path: string, root: string): Promise<boolean> {
  try {
    await lstat(path);
    return false; // an entry that does not resolve: a dangling link
  } catch {
    // missing: where would it be?
  }
  try {
    return await isInside(await realpath(dirname(path)), root);
  } catch {
    return false;
  }
}

/**
 * Reads a whole regular file within {@link FileLimits}. The real path is opened with `O_NONBLOCK` (a FIFO
 * cannot hang the open) and `O_NOFOLLOW` (a link swapped in after the check is refused), the open file is
 * checked to be a regular file no larger than `maxBytes`, and no more than its size at that moment is read.
 *
 * @throws {@link ForbiddenPathError} outside `root`; {@link DecodeError} naming the path for anything else
 *   (missing, not a regular file, too large, unreadable). Messages never quote the file's contents.
 */
export async function readRegularFile(path: string, limits: FileLimits): Promise<Buffer> {
  const real = await resolveInside(path, limits.root);
  let handle: Awaited<ReturnType<typeof open>>;
  try {
    handle = await open(real, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW);
  } catch (cause) {
    throw new DecodeError(`${path}: cannot be read (${errnoCode(cause)})`, { cause, context: { path } });
  }
  try {
    const info = await handle.stat();
    if (!info.isFile()) throw new DecodeError(`${path}: not a regular file`, { context: { path } });
    if (info.size > limits.maxBytes) {
      throw new DecodeError(`${path}: ${info.size} bytes, more than the ${limits.maxBytes} allowed`, {
        context: { path, size: info.size, limit: limits.maxBytes },
      });
    }
    const bytes = Buffer.allocUnsafe(info.size);
    let filled = 0;
    while (filled < bytes.length) {
      const { bytesRead } = await handle.read(bytes, filled, bytes.length - filled, filled);
      if (bytesRead === 0) break; // shrunk while read: what is there is returned, and its checks fail it
      filled += bytesRead;
    }
    return bytes.subarray(0, filled);
  } catch (cause) {
    if (cause instanceof DecodeError) throw cause;
    throw new DecodeError(`${path}: cannot be read (${errnoCode(cause)})`, { cause, context: { path } });
  } finally {
    await handle.close();
  }
}

/**
 * Reads a JSON file of at most {@link MAX_JSON_BYTES} that must hold an object, through {@link readRegularFile}.
 *
 * @throws as {@link readRegularFile}; {@link DecodeError} naming the path when it is not a JSON object.
 */
export async function readJsonObject(path: string, root?: string): Promise<Record<string, unknown>> {
  const bytes = await readRegularFile(path, { maxBytes: MAX_JSON_BYTES, ...(root === undefined ? {} : { root }) });
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString('utf8'));
  } catch (cause) {
    // The parser's message quotes the text: keep it in the cause only.
    throw new DecodeError(`${path}: not valid JSON`, { cause, context: { path } });
  }
  // Every file of a model directory holds an object (a `null` config or index made the readers dereference null).
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new DecodeError(`${path}: not a JSON object`, { context: { path } });
  }
  return value as Record<string, unknown>;
}

/**
 * True when a directory entry exists at `path` (a link counts even when its target does not: reading it then
 * fails, inside or outside a root alike, rather than the entry being silently skipped).
 */
export async function entryExists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch {
    return false;
  }
}

function forbidden(path: string, root: string, cause?: unknown): ForbiddenPathError {
  return new ForbiddenPathError(`${path} is not readable inside ${root}`, { cause, context: { path, root } });
}

function errnoCode(cause: unknown): string {
  return (cause as NodeJS.ErrnoException).code ?? String(cause);
}
