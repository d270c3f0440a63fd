/**
 * Reading what an HTTP peer answers without trusting its size: the body is streamed and cut at a bound, at once
 * when its `content-length` already says it is too long. One mechanism for every client rxrl has (the engines'
 * `openai` clients, MLflow, `rxrl status`).
 *
 * @packageDocumentation
 */
import { DecodeError } from './errors.js';

/**
 * `response` with its body limited to `maxBytes`: refused before reading when its `content-length` is larger,
 * otherwise the body stream errors with the same {@link DecodeError} (and the rest is never read) as soon as it
 * passes the bound.
 *
 * @param response - a `fetch` response whose body is unread.
 * @param maxBytes - the most bytes accepted (≥ 1).
 * @param what - names the answer in the error (`mlflow runs/log-batch`); default the response's URL.
 * @returns a response with the same status and headers, whose body is bounded.
 * @throws {@link DecodeError} with `context.limit` and `context.url` when the body is declared larger.
 */
export async function limitBody(response: Response, maxBytes: number, what?: string): Promise<Response> {
  const tooLarge = (): DecodeError =>
    new DecodeError(`${what ?? (response.url || 'the server')}: the answer is longer than ${maxBytes} bytes`, {
      context: { limit: maxBytes, url: response.url },
    });
  const declared = Number(response.headers.get('content-length') ?? Number.NaN);
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
}

/**
 * The body of `response` as UTF-8 text, read up to `maxBytes` ({@link limitBody}).
 *
 * @param response - a `fetch` response (its body is consumed or cancelled).
 * @param maxBytes - the most bytes accepted.
 * @param what - names the answer in the error; default the response's URL.
 * @throws {@link DecodeError} with `context.limit` when the body is longer than `maxBytes`.
 */
export async function readBoundedText(response: Response, maxBytes: number, what?: string): Promise<string> {
  return (await limitBody(response, maxBytes, what)).text();
}

/**
 * `fetch` whose answers are each limited to `maxBytes` ({@link limitBody}): for clients that take a `fetch` option
 * (the `openai` client). An answer whose `content-length` is already too long is not read: it comes back with a body
 * that fails at its first read with the {@link DecodeError}, since such a client reports an error thrown by `fetch`
 * itself as a failed connection (and retries it).
 *
 * @param maxBytes - the largest body read, in bytes (≥ 1).
 * @param base - the `fetch` wrapped. Default the global one.
 */
export function boundedFetch(maxBytes: number, base: typeof fetch = fetch): typeof fetch {
  return async (input, init) => {
    const response = await base(input, init);
    try {
      return await limitBody(response, maxBytes);
    } catch (error) {
      if (!(error instanceof DecodeError)) throw error;
      const headers = new Headers(response.headers);
      headers.delete('content-length');
      const refused = new ReadableStream<Uint8Array>({ start: (controller) => controller.error(error) });
      return new Response(refused, { status: response.status, statusText: response.statusText, headers });
    }
  };
}
