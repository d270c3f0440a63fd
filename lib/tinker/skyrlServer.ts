/**
 * SkyRL's Tinker server (PyPI `skyrl`, JAX backend) as a child of this process, for trying a run on a distributed
 * engine on one machine: `uv run … -m skyrl.tinker.api` (which starts its engine as a child of its own), and with
 * `processes: 2` one JAX worker (`python -m skyrl.backends.jax --process-id 1`) that the engine shards the model with
 * (fully-sharded data parallel over `jax.distributed`, as it would span GPUs or hosts). Each runs in a process group
 * of its own, found and ended as agent processes are (lib/agent/processTree.ts), so {@link SkyrlServer.stop} and this
 * process's exit end everything it started. `npm test` and `npm run bench -- engines` use it;
 * on a cluster, start the server as SkyRL documents and point `tinker.baseUrl` at it.
 *
 * @packageDocumentation
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { createWriteStream } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { join } from 'node:path';

import { SAMPLE_COOKIE_VARIABLE, endTree, trackTree } from '../agent/processTree.js';
import { RxrlError } from '../core/errors.js';
import { freeLoopbackPort } from '../core/ports.js';

/** A server that did not start: its process exited, or it did not answer in time (`context.log`: its output). */
export class SkyrlStartError extends RxrlError {
  override readonly name = 'SkyrlStartError';
}

/** Options of {@link startSkyrl}. */
export interface SkyrlServerOptions {
  /** The Python environment SkyRL is installed in, with `uv` in its `bin/` (`npm test` installs one). */
  readonly home: string;
  /** The base model's directory (float32 on a CPU: JAX there refuses float16 products). */
  readonly model: string;
  /** Where the server keeps its database, checkpoints and the processes' output (`server.log`, `worker.log`). */
  readonly dir: string;
  /** 1, or 2 for a server sharded over two JAX processes. Default 1. */
  readonly processes?: 1 | 2;
  /** Settings of its JAX backend over the defaults here (8 adapters of rank 16 at most, micro-batches of 8). */
  readonly backendConfig?: Readonly<Record<string, unknown>>;
  /** How long it may take to answer its health check, in ms. Default 600 000. */
  readonly readyTimeoutMs?: number;
  /** Ends the wait for it (the server is stopped). */
  readonly signal?: AbortSignal;
}

/** A running server. */
export interface SkyrlServer {
  /** Its base URL, `http://127.0.0.1:<port>` (the run's `tinker.baseUrl`). */
  readonly url: string;
  /** The base model name runs give as `tinker.baseModel` (the model's directory). */
  readonly baseModel: string;
  /** Its files (see {@link SkyrlServerOptions.dir}). */
  readonly dir: string;
  /** Ends every process of it (SIGTERM, SIGKILL after 10 s) and resolves once they are gone. */
  stop(): Promise<void>;
}

/**
 * Starts SkyRL's Tinker server on `model` with the JAX backend on loopback, and resolves once it answers its health
 * check (its engine may still be loading then: the first `create_model` waits for it).
 *
 * @throws {@link SkyrlStartError} when a process of it exits first, or it does not answer within `readyTimeoutMs`.
 */
export async function startSkyrl(options: SkyrlServerOptions): Promise<SkyrlServer> {
  const { home, model, dir } = options;
  await mkdir(dir, { recursive: true });
  const port = await freeLoopbackPort();
  const coordinator = options.processes === 2 ? `127.0.0.1:${await freeLoopbackPort()}` : undefined;
  const backend = {
    max_lora_rank: 16,
    max_lora_adapters: 8,
    sample_max_num_sequences: 16,
    train_micro_batch_size: 8,
    ...(coordinator === undefined ? {} : { coordinator_address: coordinator, num_processes: 2, fully_sharded_data_parallel_size: 2 }),
    ...options.backendConfig,
  };
  const python = join(home, 'bin', 'python');
  // Every process of the server carries one cookie, so it is found and ended even after it leaves its group.
  const cookie = randomUUID();
  const env = {
    ...process.env,
    [SAMPLE_COOKIE_VARIABLE]: cookie,
    PATH: `${join(home, 'bin')}:${process.env.PATH ?? ''}`,
    UV_NO_CACHE: '1',
    UV_OFFLINE: '1',
    // One device a process, as one GPU each would be; CPU unless the environment says otherwise.
    JAX_PLATFORMS: process.env.JAX_PLATFORMS ?? 'cpu',
    XLA_FLAGS: process.env.XLA_FLAGS ?? '--xla_force_host_platform_device_count=1',
  };
  const children: ChildProcess[] = [];
  const untrack: (() => void)[] = [];
  const start = (name: string, command: string, args: readonly string[]) => {
    const child = spawn(command, args, { cwd: dir, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const out = createWriteStream(join(dir, `${name}.log`));
    child.stdout?.pipe(out);
    child.stderr?.pipe(out);
    child.on('error', () => undefined); // a command that cannot start exits (code null): the wait below says so
    children.push(child);
    if (child.pid !== undefined) untrack.push(trackTree({ leader: child.pid, cookie }));
  };
  start('server', join(home, 'bin', 'uv'), [
    ...['run', '--no-project', '--python', python, '-m', 'skyrl.tinker.api'],
    ...['--host', '127.0.0.1', '--port', String(port)],
    ...['--base-model', model, '--backend', 'jax', '--backend-config', JSON.stringify(backend)],
    ...['--database-url', `sqlite:///${join(dir, 'tinker.db')}`, '--checkpoints-base', join(dir, 'checkpoints')],
    ...['--external-inference-lora-base', join(dir, 'lora')],
  ]);
  if (coordinator !== undefined)
    start('worker', python, [
      '-m',
      'skyrl.backends.jax',
      '--coordinator-address',
      coordinator,
      '--num-processes',
      '2',
      '--process-id',
      '1',
    ]);
  // SIGTERM to every process of it, SIGKILL to what is left after 10 s (the engine and uv's children included).
  const stop = async () => {
    for (const child of children) if (child.pid !== undefined) await endTree({ leader: child.pid, cookie }, 10_000);
    for (const done of untrack) done();
  };
  const url = `http://127.0.0.1:${port}`;
  try {
    await ready(url, children, dir, options);
  } catch (error) {
    await stop();
    throw error;
  }
  return { url, baseModel: model, dir, stop };
}

/** Polls the health check every 250 ms until it answers 200. */
async function ready(url: string, children: readonly ChildProcess[], dir: string, options: SkyrlServerOptions): Promise<void> {
  const timeoutMs = options.readyTimeoutMs ?? 600_000;
  const deadline = AbortSignal.timeout(timeoutMs);
  const wait = options.signal ? AbortSignal.any([deadline, options.signal]) : deadline;
  const context = { context: { url, log: join(dir, 'server.log') } };
  for (;;) {
    const exited = children.find((c) => c.exitCode !== null || c.signalCode !== null || c.pid === undefined);
    if (exited !== undefined)
      throw new SkyrlStartError(`SkyRL's server exited (${exited.exitCode ?? exited.signalCode ?? 'did not start'}); see ${dir}`, context);
    if (options.signal?.aborted) throw options.signal.reason;
    if (deadline.aborted)
      throw new SkyrlStartError(`SkyRL's server did not answer ${url}/api/v1/healthz within ${timeoutMs} ms; see ${dir}`, context);
    const probe = AbortSignal.any([wait, AbortSignal.timeout(2_000)]);
    const answer = await fetch(`${url}/api/v1/healthz`, { signal: probe }).catch(() => undefined);
    await answer?.body?.cancel();
    if (answer?.ok === true) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}
