/**
 * Reading an HTTP answer with a size bound: a peer decides how much it sends, so no answer is read whole before its
 * size is known to be acceptable.
 *
 * @packageDocumentation
 */
import { EngineError } from './errors.js';

/**
 * The body of `response` as UTF-8 text, read chunk by chunk and given up (the stream cancelled) as soon as it
 * exceeds `maxBytes`, or at once when its `content-length` says it will. Aborting the request's signal aborts the
 * read as well.
 *
 * @param response - a `fetch` answer whose body is unread.
 * @param maxBytes - most bytes accepted.
 * @returns the text (invalid UTF-8 replaced by U+FFFD).
 * @throws EngineError (not retriable) with `context.url` and `context.limit` when the body is larger.
 */
export async function readBoundedText(response: Response, maxBytes: number): Promise<string> {
  const tooLarge = (): EngineError =>
    new EngineError(`${response.url || 'the server'} answered more than ${maxBytes} bytes`, {
      context: { url: response.url, limit: maxBytes },
    });
  const declared = Number(response.headers.get('content-length') ?? NaN);
  if (declared > maxBytes) {
    await response.body?.cancel().catch(() => undefined);
    throw tooLarge();
  }
  if (response.body === null) return '';
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > maxBytes) {
      await reader.cancel().catch(() => undefined);
      throw tooLarge();
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks, total).toString('utf8');
}
