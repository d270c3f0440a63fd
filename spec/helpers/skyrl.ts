/**
 * SkyRL's Tinker server (PyPI `skyrl` 0.4.0, JAX backend), started for a spec on loopback from the environment
 * `npm test`'s setup installed (its path in `.cache/skyrl-home`): `uv run … -m skyrl.tinker.api`, which starts its
 * engine as a child (`uv run … -m skyrl.tinker.engine`), and with `processes: 2` one JAX worker
 * (`python -m skyrl.backends.jax --process-id 1`) that the engine shards the model with (fully-sharded data
 * parallel over `jax.distributed`). Each runs in a process group of its own; {@link SkyrlServer.stop} ends the groups.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createWriteStream, existsSync, readFileSync, statSync } from 'node:fs';
import { mkdir } from 'node:fs/promises';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { waitFor } from './waitFor.js';

/** The float32 Qwen3 fixture SkyRL trains here (JAX on a CPU refuses float16 products). */
export const SKYRL_MODEL = fileURLToPath(new URL('../fixtures/hf/tiny-qwen3-f32', import.meta.url));

/** Where the setup installed SkyRL, or undefined when it could not (the specs then skip, as the setup said). */
export function skyrlHome(): string | undefined {
  try {
    const home = readFileSync(fileURLToPath(new URL('../../.cache/skyrl-home', import.meta.url)), 'utf8').trim();
    return existsSync(join(home, 'bin', 'uv')) ? home : undefined;
  } catch {
    return undefined;
  }
}

/** A running server. */
export interface SkyrlServer {
  /** Its base URL, `http://127.0.0.1:<port>`. */
  readonly url: string;
  /** The base model name runs must use (the fixture's path). */
  readonly baseModel: string;
  /** Its files: the database, checkpoints, the processes' output (`server.log`, `worker.log`). */
  readonly dir: string;
  /** Ends every process of it (SIGTERM to each group, SIGKILL after 10 s) and resolves once they are gone. */
  stop(): Promise<void>;
}

/** A TCP port free on loopback now. */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

function started(child: ChildProcess, log: string): ChildProcess {
  const out = createWriteStream(log);
  child.stdout?.pipe(out);
  child.stderr?.pipe(out);
  return child;
}

async function stopGroup(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null || child.pid === undefined) return;
  const gone = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const signal = (name: NodeJS.Signals) => {
    try {
      process.kill(-(child.pid as number), name);
    } catch {
      // the group is gone
    }
  };
  signal('SIGTERM');
  const timer = setTimeout(() => signal('SIGKILL'), 10_000);
  await gone;
  clearTimeout(timer);
  signal('SIGKILL'); // what the group's leader left behind (the engine, uv's children)
}

/**
 * Starts SkyRL's Tinker server on the fixture model with the JAX backend, and resolves once it answers its health
 * check (its engine is still loading then: the first `create_model` waits for it).
 *
 * @param dir - A directory of the spec's own for the server's database, checkpoints and logs.
 * @param processes - 1, or 2 for a server sharded over two JAX processes.
 * @param backendConfig - Settings of its JAX backend over the specs' defaults (8 adapters of rank 16 at most).
 */
export async function startSkyrl(dir: string, processes: 1 | 2 = 1, backendConfig: Record<string, unknown> = {}): Promise<SkyrlServer> {
  const home = skyrlHome();
  if (home === undefined) throw new Error('SkyRL is not installed: npm test installs it (scripts/test-setup.sh, step 5)');
  await mkdir(dir, { recursive: true });
  const port = await freePort();
  const coordinator = processes === 2 ? `127.0.0.1:${await freePort()}` : undefined;
  const backend = {
    max_lora_rank: 16,
    max_lora_adapters: 8,
    sample_max_num_sequences: 16,
    train_micro_batch_size: 8,
    ...(coordinator === undefined ? {} : { coordinator_address: coordinator, num_processes: 2, fully_sharded_data_parallel_size: 2 }),
    ...backendConfig,
  };
  const python = join(home, 'bin', 'python');
  const env = {
    ...process.env,
    PATH: `${join(home, 'bin')}:${process.env.PATH ?? ''}`,
    UV_NO_CACHE: '1',
    UV_OFFLINE: '1',
    JAX_PLATFORMS: 'cpu',
    // each JAX process one CPU device, as one GPU each would be
    XLA_FLAGS: '--xla_force_host_platform_device_count=1',
  };
  const children: ChildProcess[] = [];
  const stop = async () => {
    await Promise.all(children.map(stopGroup));
  };
  const uvRun = ['run', '--no-project', '--python', python];
  const server = spawn(
    join(home, 'bin', 'uv'),
    [
      ...uvRun,
      '-m',
      'skyrl.tinker.api',
      ...['--host', '127.0.0.1', '--port', String(port)],
      ...['--base-model', SKYRL_MODEL, '--backend', 'jax', '--backend-config', JSON.stringify(backend)],
      ...['--database-url', `sqlite:///${join(dir, 'tinker.db')}`, '--checkpoints-base', join(dir, 'checkpoints')],
      ...['--external-inference-lora-base', join(dir, 'lora')],
    ],
    { cwd: dir, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] },
  );
  children.push(started(server, join(dir, 'server.log')));
  if (coordinator !== undefined) {
    const worker = spawn(
      python,
      ['-m', 'skyrl.backends.jax', '--coordinator-address', coordinator, '--num-processes', '2', '--process-id', '1'],
      { cwd: dir, env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    children.push(started(worker, join(dir, 'worker.log')));
  }
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitFor(
      async () => {
        const exited = children.find((c) => c.exitCode !== null || c.signalCode !== null);
        if (exited !== undefined) throw new Error(`SkyRL exited (${exited.exitCode ?? exited.signalCode}); see ${dir}/*.log`);
        const answer = await fetch(`${url}/api/v1/healthz`, { signal: AbortSignal.timeout(2_000) }).catch(() => undefined);
        return answer?.ok === true;
      },
      {
        what: `SkyRL's server on ${url} to answer /api/v1/healthz`,
        progress: () => statSync(join(dir, 'server.log'), { throwIfNoEntry: false })?.size,
        timeoutMs: 300_000,
        intervalMs: 250,
      },
    );
  } catch (error) {
    await stop();
    throw error;
  }
  return { url, baseModel: SKYRL_MODEL, dir, stop };
}
