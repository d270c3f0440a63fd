/**
 * Saved states of rxrl's Tinker service (`save_state`, `load_state`, a training client made from a state): the
 * adapter and Adam's state of a training client as `<state dir>/<model id>/<name>.safetensors`, addressed by
 * clients as `tinker://<model id>/weights/<name>`.
 *
 * Reading is confined to the state directory as `rxrl serve` confines its `--weights-root` (the one reader,
 * `readRegularFile`, with the state directory as its root: every path is checked once its links are followed),
 * and whatever keeps a state from being read — a name that leads outside, a link out of the directory, a missing
 * or unreadable file, a file too large — gets one and the same error, which names nothing but the client's path.
 *
 * @packageDocumentation
 */
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';

import { loadSafetensors, saveSafetensors } from '../model/safetensors.js';
import { RequestError, quote } from '../serve/protocol.js';
import type { TrainingClient } from './clients.js';

/** Most characters of a client's `tinker://` path that a message quotes. */
const MAX_QUOTED_PATH_CHARS = 256;

/** Most characters of a checkpoint name. */
export const MAX_NAME_CHARS = 200;

/** A saved state: tensors by name (the adapter's, and Adam's `m/…`, `v/…`, `step`) and its LoRA rank. */
export interface SavedState {
  readonly weights: ReadonlyMap<string, { shape: number[]; data: Float32Array }>;
  readonly rank: number;
}

/** A checkpoint name: non-empty, no `/`, at most {@link MAX_NAME_CHARS} characters; 400 otherwise. */
export function checkName(value: unknown): string {
  if (typeof value !== 'string' || value === '' || value.includes('/') || value.length > MAX_NAME_CHARS) {
    throw new RequestError(
      400,
      `a checkpoint name must be a non-empty string of at most ${MAX_NAME_CHARS} characters without '/', got ${quote(value)}`,
    );
  }
  return value;
}

/** The file of `tinker://<model>/weights/<name>` in `stateDir` (not yet checked to lie inside it); 400 for another form. */
export function stateFile(stateDir: string, path: unknown): string {
  const match = typeof path === 'string' ? /^tinker:\/\/([^/]+)\/weights\/([^/]+)$/.exec(path) : null;
  if (match === null)
    throw new RequestError(400, `path must be tinker://<model>/weights/<name>, got ${quote(path, MAX_QUOTED_PATH_CHARS)}`);
  return join(stateDir, encodeURIComponent(match[1]), `${encodeURIComponent(match[2])}.safetensors`);
}

/** Writes the state of `client` (with Adam's) as `name`; resolves with its `tinker://` path. */
export async function writeState(stateDir: string, client: TrainingClient, name: string): Promise<string> {
  const dir = join(stateDir, encodeURIComponent(client.id));
  await mkdir(dir, { recursive: true });
  const state = client.trainer.state(true);
  await saveSafetensors(join(dir, `${encodeURIComponent(name)}.safetensors`), state, {
    rank: String(client.trainer.rank),
    model_id: client.id,
  });
  return `tinker://${client.id}/weights/${name}`;
}

/**
 * Reads the state at `path` from `stateDir`, at most `maxBytes`.
 *
 * @throws {@link RequestError} 400 for a path of another form; 404, the same for every reason (see the module
 *   comment), when no state can be read there.
 */
export async function readState(stateDir: string, path: unknown, maxBytes: number): Promise<SavedState> {
  const file = stateFile(stateDir, path);
  try {
    const contents = await loadSafetensors(file, { root: stateDir, maxBytes });
    return { weights: contents.weights as SavedState['weights'], rank: Number(contents.metadata.rank) };
  } catch (cause) {
    throw new RequestError(404, `no saved state at ${quote(path, MAX_QUOTED_PATH_CHARS)}`, {}, { cause });
  }
}
