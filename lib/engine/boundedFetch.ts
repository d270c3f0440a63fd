/**
 * A `fetch` whose response bodies are read up to a size bound, for the `openai` clients of the engines: a server
 * (hostile, or broken) that answers more than the bound gets its answer refused instead of read whole into memory.
 *
 * @packageDocumentation
 */
import { DecodeError } from '../core/errors.js';

/**
 * `fetch`, each response's body cut off with a {@link DecodeError} (`context.maxBytes`, `context.url`) once it
 * passes `maxBytes`: at once when its `content-length` says so, else as the bytes arrive.
 *
 * @param maxBytes - The largest body read, in bytes (≥ 1).
 * @param base - The `fetch` wrapped. Default the global one.
 * @returns A `fetch` for the `openai` client's `fetch` option.
 */
export function boundedFetch(maxBytes: number, base: typeof fetch = fetch): typeof fetch {
  return async (input, init) => {
    const response = await base(input, init);
    const url = response.url;
    const tooLarge = (): DecodeError =>
      new DecodeError(`the answer of ${url} is larger than ${maxBytes} bytes: refused`, { context: { maxBytes, url } });
    const declared = Number(response.headers.get('content-length') ?? NaN);
    if (declared > maxBytes) {
      await response.body?.cancel().catch(() => undefined);
      throw tooLarge();
    }
    if (response.body === null) return response;
    let seen = 0;
    const limit = new TransformStream<Uint8Array, Uint8Array>({
      transform(chunk, controller) {
        seen += chunk.byteLength;
        if (seen > maxBytes) controller.error(tooLarge());
        else controller.enqueue(chunk);
      },
    });
    const { status, statusText, headers } = response;
    return new Response(response.body.pipeThrough(limit), { status, statusText, headers });
  };
}
