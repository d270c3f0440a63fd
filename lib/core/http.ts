/**
 * Reading what an HTTP peer answers without trusting its size: the body is streamed and cut at a bound.
 *
 * @packageDocumentation
 */
import { DecodeError } from './errors.js';

/**
 * The body of `response` as text, read chunk by chunk and refused past `maxBytes` (the rest is never read).
 *
 * @param response - a `fetch` response (its body is consumed or cancelled).
 * @param maxBytes - the most bytes accepted.
 * @param what - names the answer in the error (`mlflow runs/log-batch`).
 * @returns the body, decoded as UTF-8.
 * @throws {@link DecodeError} with `context.limit` when the body is longer than `maxBytes`.
 */
export async function readBoundedText(response: Response, maxBytes: number, what: string): Promise<string> {
  const declared = Number(response.headers.get('content-length') ?? Number.NaN);
  if (declared > maxBytes) {
    await response.body?.cancel().catch(() => undefined);
    throw tooLarge(what, maxBytes);
  }
  if (response.body === null) return '';
  const chunks: Uint8Array[] = [];
  let bytes = 0;
  const reader = response.body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) break;
      bytes += value.byteLength;
      if (bytes > maxBytes) throw tooLarge(what, maxBytes);
      chunks.push(value);
    }
  } catch (error) {
    await reader.cancel().catch(() => undefined);
    throw error;
  }
  return Buffer.concat(chunks).toString('utf8');
}

function tooLarge(what: string, limit: number): DecodeError {
  return new DecodeError(`${what}: the answer is longer than ${limit} bytes`, { context: { limit } });
}
