/**
 * Starts `rxrl serve` as a child process and waits until it listens: what an example or a benchmark does to
 * train through a real HTTP server in a separate process.
 *
 * @packageDocumentation
 */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';

import { AbortError, EngineError } from '../core/errors.js';

/** Options of {@link spawnServe}. */
export interface SpawnServeOptions {
  /** Path of the built CLI. Default: `../../cli/main.js` from this module in `dist/`. */
  readonly cliPath?: string | undefined;
  /** Environment of the child. Default `process.env`. */
  readonly env?: NodeJS.ProcessEnv;
  /** How long to wait for the listening line, in ms. Default 120 000. */
  readonly startTimeoutMs?: number;
  /** Where the child's stderr goes. Default: this process's stderr. */
  readonly stderr?: 'inherit' | 'ignore';
  /** Kills the child (and rejects while it starts). */
  readonly signal?: AbortSignal | undefined;
}

/** A running `rxrl serve` child process. */
export interface SpawnedServer {
  /** Origin, e.g. `http://127.0.0.1:41234`. */
  readonly url: string;
  /** Base URL of the OpenAI API. */
  readonly baseURL: string;
  /** Served model name. */
  readonly modelName: string;
  /** Process id of the child. */
  readonly pid: number;
  /** Stops the child (SIGTERM, then SIGKILL after 5 s) and resolves when it has exited. Idempotent. */
  close(): Promise<void>;
}

/** The JSON line `rxrl serve` prints once it listens. */
interface ListeningLine {
  readonly event: 'listening';
  readonly url: string;
  readonly baseURL: string;
  readonly model: string;
}

/**
 * Spawns `node <cli> serve …args` and resolves once it printed its listening line.
 *
 * @example
 * ```ts
 * import { spawnServe } from 'rxrl';
 * const server = await spawnServe(['--port', '0', '--model', 'runs/reverse/global_step_300']);
 * // … new OpenAIEngine({ baseURL: server.baseURL, model: server.modelName, … })
 * await server.close();
 * ```
 * @param args - arguments after `serve` (use `--port 0` for a free port).
 * @param options - the CLI path, environment and start deadline.
 * @returns the running server.
 * @throws {@link EngineError} when the child exits or stays silent before listening.
 */
export function spawnServe(args: readonly string[], options: SpawnServeOptions = {}): Promise<SpawnedServer> {
  const cli = options.cliPath ?? fileURLToPath(new URL('../../cli/main.js', import.meta.url));
  const child = spawn(process.execPath, [cli, 'serve', ...args], {
    env: options.env ?? process.env,
    stdio: ['ignore', 'pipe', options.stderr ?? 'inherit'],
  });
  const killOnExit = (): void => void child.kill('SIGKILL');
  process.once('exit', killOnExit);
  let closing: Promise<void> | undefined;
  const close = (): Promise<void> => {
    closing ??= new Promise<void>((resolve) => {
      process.off('exit', killOnExit);
      if (child.exitCode !== null || child.signalCode !== null) {
        resolve();
        return;
      }
      const force = setTimeout(() => child.kill('SIGKILL'), 5_000);
      child.once('exit', () => {
        clearTimeout(force);
        resolve();
      });
      child.kill('SIGTERM');
    });
    return closing;
  };
  return new Promise<SpawnedServer>((resolve, reject) => {
    let buffer = '';
    const fail = (error: Error): void => {
      cleanup();
      void close().then(() => reject(error));
    };
    const onData = (chunk: Buffer): void => {
      buffer += chunk.toString('utf8');
      let newline: number;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline).trim();
        buffer = buffer.slice(newline + 1);
        const parsed = parseListening(line);
        if (parsed) {
          cleanup();
          child.stdout?.resume(); // keep draining later status lines
          options.signal?.addEventListener('abort', () => void close(), { once: true });
          resolve({ url: parsed.url, baseURL: parsed.baseURL, modelName: parsed.model, pid: child.pid ?? -1, close });
          return;
        }
      }
    };
    const onExit = (code: number | null, signal: string | null): void =>
      fail(new EngineError(`rxrl serve exited before listening (code ${code}, signal ${signal})`, { context: { code, signal } }));
    const onAbort = (): void => fail(new AbortError('spawnServe aborted', { cause: options.signal?.reason }));
    const timer = setTimeout(
      () => fail(new EngineError(`rxrl serve did not listen within ${options.startTimeoutMs ?? 120_000} ms`, { retriable: true })),
      options.startTimeoutMs ?? 120_000,
    );
    const cleanup = (): void => {
      clearTimeout(timer);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
      child.off('error', fail);
      options.signal?.removeEventListener('abort', onAbort);
    };
    child.stdout?.on('data', onData);
    child.once('exit', onExit);
    child.once('error', fail);
    if (options.signal?.aborted) onAbort();
    else options.signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function parseListening(line: string): ListeningLine | undefined {
  if (!line.startsWith('{')) return undefined;
  try {
    const value = JSON.parse(line) as Partial<ListeningLine>;
    const valid = typeof value.url === 'string' && typeof value.baseURL === 'string' && typeof value.model === 'string';
    return value.event === 'listening' && valid ? (value as ListeningLine) : undefined;
  } catch {
    return undefined;
  }
}
