/**
 * A real Confluent-compatible schema registry for the specs: Apicurio Registry, as `npm test`'s setup fetched it
 * (scripts/schema-registry/fetch.sh, into `.cache/registry`), with in-memory storage, on a free loopback port. Its
 * JVM is ended as agent processes are (lib/agent/processTree.ts): by `stop()`, or when the test process exits.
 */
import { execFile, spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { closeSync, openSync, readdirSync } from 'node:fs';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { SAMPLE_COOKIE_VARIABLE, endTree, trackTree } from '../../lib/agent/processTree.js';
import { freeLoopbackPort } from '../../lib/core/ports.js';

/** A running registry. */
export interface SchemaRegistryServer {
  /** Base URL of its Confluent Schema Registry API, e.g. `http://127.0.0.1:PORT/apis/ccompat/v7`. */
  readonly url: string;
  /** The JVM's log (stdout and stderr); removed by `stop()`. */
  readonly logFile: string;
  /** Ends the JVM (SIGTERM, SIGKILL after 5 s) and removes its directory; storage is in memory, so all is lost. */
  stop(): Promise<void>;
}

const FETCH_SCRIPT = fileURLToPath(new URL('../../scripts/schema-registry/fetch.sh', import.meta.url));

/** Where the Confluent API is served, below the registry's root. */
const CCOMPAT_PATH = '/apis/ccompat/v7';

/**
 * Starts Apicurio Registry on 127.0.0.1 (fetching it first if the setup did not) and resolves once its Confluent API
 * answers. About 7 s on two cores; the JVM gets a 256 MiB heap.
 *
 * @param startTimeoutMs - How long to wait for the API to answer.
 * @throws When the JVM exits first or does not answer in time, with the tail of its log.
 */
export async function startSchemaRegistry(startTimeoutMs = 120_000): Promise<SchemaRegistryServer> {
  const app = await fetchRegistry();
  const runner = readdirSync(app).find((name) => name.endsWith('-runner.jar'));
  if (runner === undefined) throw new Error(`no *-runner.jar in ${app}; delete it and run scripts/schema-registry/fetch.sh`);
  const dir = await mkdtemp(join(tmpdir(), 'rxrl-registry-'));
  const logFile = join(dir, 'registry.log');
  const port = await freeLoopbackPort();
  const java = process.env.JAVA_HOME ? join(process.env.JAVA_HOME, 'bin', 'java') : 'java';
  const jvm = [
    ...['-Xms64m', '-Xmx256m', '-XX:+UseSerialGC', '-XX:TieredStopAtLevel=1', '-XX:+ExitOnOutOfMemoryError'],
    ...['-Dquarkus.http.host=127.0.0.1', `-Dquarkus.http.port=${port}`],
    // In memory: every registry starts empty, and nothing is left behind.
    ...['-Dquarkus.datasource.jdbc.url=jdbc:h2:mem:registry', '-Dquarkus.datasource.jdbc.initial-size=2'],
    ...['-Dquarkus.datasource.jdbc.min-size=2', '-Dquarkus.datasource.jdbc.max-size=8'],
  ];
  const cookie = randomUUID();
  const out = openSync(logFile, 'a');
  const child = spawn(java, [...jvm, '-jar', join(app, runner)], {
    cwd: dir,
    detached: true,
    stdio: ['ignore', out, out],
    env: { ...process.env, [SAMPLE_COOKIE_VARIABLE]: cookie },
  });
  closeSync(out);
  child.on('error', () => undefined); // a JVM that cannot start exits (code null): the wait below says so
  const tree = { leader: child.pid ?? -1, cookie };
  const untrack = child.pid === undefined ? () => undefined : trackTree(tree);
  const stop = async (): Promise<void> => {
    if (child.pid !== undefined) await endTree(tree, 5_000);
    untrack();
    await rm(dir, { recursive: true, force: true });
  };
  const url = `http://127.0.0.1:${port}${CCOMPAT_PATH}`;
  try {
    await answering(url, startTimeoutMs, () => child.exitCode !== null || child.signalCode !== null || child.pid === undefined);
  } catch (error) {
    const log = (await readFile(logFile, 'utf8').catch(() => '')).trimEnd().split('\n').slice(-30).join('\n');
    await stop();
    throw new Error(`${(error as Error).message}\n--- registry log (tail) ---\n${log}`, { cause: error });
  }
  return { url, logFile, stop };
}

/** Runs fetch.sh (a no-op once the cache is complete) and returns the directory holding the runner jar. */
function fetchRegistry(): Promise<string> {
  return new Promise<string>((resolve, reject) => {
    execFile('bash', [FETCH_SCRIPT], (error, stdout, stderr) => {
      if (error) reject(new Error(`fetching the schema registry failed: ${stderr.trim() || error.message}`, { cause: error }));
      else resolve(stdout.trim().split('\n').at(-1) ?? '');
    });
  });
}

/** Polls `GET {url}/subjects` every 250 ms until it answers 200, the JVM exits, or `timeoutMs` passes. */
async function answering(url: string, timeoutMs: number, exited: () => boolean): Promise<void> {
  const deadline = AbortSignal.timeout(timeoutMs);
  for (;;) {
    if (exited()) throw new Error(`the schema registry's JVM exited before ${url} answered`);
    if (deadline.aborted) throw new Error(`the schema registry did not answer ${url}/subjects within ${timeoutMs} ms`);
    const probe = AbortSignal.any([deadline, AbortSignal.timeout(2_000)]);
    const answer = await fetch(`${url}/subjects`, { signal: probe }).catch(() => undefined);
    await answer?.body?.cancel();
    if (answer?.ok === true) return;
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
}
