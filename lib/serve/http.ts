/**
 * What rxrl's HTTP servers (`rxrl serve`, `rxrl tinker`) share on node's `http`: bounded request bodies, JSON
 * answers, and key comparison in constant time.
 *
 * @packageDocumentation
 */
import { timingSafeEqual } from 'node:crypto';
import type { IncomingMessage, Server, ServerResponse } from 'node:http';

import { RequestError } from './protocol.js';

/**
 * The request body, at most `limit` bytes: {@link RequestError} 413 past it (the rest is not kept), 400 when the
 * client goes away mid-body (a client error, not a server one: nobody is left to read the answer).
 */
export function readBody(req: IncomingMessage, limit: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let over = false;
    req.on('data', (chunk: Buffer) => {
      if (over) return;
      size += chunk.length;
      if (size > limit) {
        over = true;
        chunks.length = 0;
        reject(new RequestError(413, `request body is larger than ${limit} bytes`, { code: 'request_too_large' }));
        return;
      }
      chunks.push(chunk);
    });
    req.on('end', () => {
      if (!over) resolve(Buffer.concat(chunks));
    });
    req.on('error', (cause) => {
      chunks.length = 0;
      reject(new RequestError(400, 'the request body was cut off', { code: 'incomplete_body' }, { cause }));
    });
  });
}

/** Compares two strings in time independent of where they differ. */
export function sameSecret(given: string, expected: string): boolean {
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

/** Answers with `body` as JSON (nothing when the answer has begun or the client is gone). */
export function sendJson(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  sendEncoded(res, status, [Buffer.from(JSON.stringify(body))], headers);
}

/** Answers with JSON already encoded (by `encodeJson`), chunk by chunk. */
export function sendEncoded(res: ServerResponse, status: number, chunks: readonly Buffer[], headers: Record<string, string> = {}): void {
  if (res.headersSent || res.destroyed) return;
  const length = chunks.reduce((sum, chunk) => sum + chunk.length, 0);
  res.writeHead(status, { 'content-type': 'application/json', 'content-length': length, ...headers });
  for (const chunk of chunks) res.write(chunk);
  res.end();
}

/** Starts `server` listening on `host:port`; rejects with the listen error (a port in use, say). */
export function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}
