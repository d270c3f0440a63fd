/**
 * What a Kafka rollout worker's id may be. The id travels in every heartbeat, keys the trainer's table of workers and
 * is shown by `/status`, `/metrics` and `rxrl status`, so it is bounded: 1 to {@link WORKER_ID_MAX_LENGTH} characters
 * of `A-Z a-z 0-9 . _ : @ -`. A heartbeat whose id breaks this is a poison record (see `decodeHeartbeatMessage`).
 *
 * @packageDocumentation
 */

/** Most characters (= bytes: the id is ASCII) of a worker id. */
export const WORKER_ID_MAX_LENGTH = 255;

/** A character a worker id may not hold. */
const FORBIDDEN = /[^A-Za-z0-9._:@-]/;

/**
 * Why `id` is not a valid worker id, or `undefined` when it is one.
 *
 * @param id - a worker id, as configured or as a heartbeat carries it.
 * @returns the exact reason (length or the first forbidden character and its index), for an error or a DLQ header.
 */
export function workerIdProblem(id: string): string | undefined {
  if (id.length === 0) return 'empty worker id';
  if (id.length > WORKER_ID_MAX_LENGTH) return `worker id of ${id.length} characters, more than ${WORKER_ID_MAX_LENGTH}`;
  const forbidden = FORBIDDEN.exec(id);
  if (forbidden !== null) {
    const code = forbidden[0].codePointAt(0) ?? 0;
    return `worker id has U+${code.toString(16).toUpperCase().padStart(4, '0')} at index ${forbidden.index}, outside [A-Za-z0-9._:@-]`;
  }
  return undefined;
}

/**
 * `text` made into a worker id: every forbidden character replaced by `-`, cut to `maxLength` (a host name may
 * hold characters an id may not).
 *
 * @param text - e.g. the host name.
 * @param maxLength - most characters kept. Default {@link WORKER_ID_MAX_LENGTH}.
 */
export function workerIdOf(text: string, maxLength = WORKER_ID_MAX_LENGTH): string {
  return text.replace(new RegExp(FORBIDDEN.source, 'g'), '-').slice(0, maxLength) || 'worker';
}
