/**
 * A real, local, single-node Apache Kafka broker (KRaft: broker and controller in one JVM) for tests, CI, the
 * benchmark and the examples. Development tooling: it runs from a repository checkout, where
 * `lib/kafka/broker/pom.xml` pins the Kafka version and `lib/kafka/broker/fetch.sh` downloads the jars from
 * Maven Central into a cache outside git (`~/.cache/rxrl-kafka/<version>`). Needs Java 17+ and Maven 3.
 *
 * `node dist/cli/broker.js start` runs one in the foreground.
 *
 * @packageDocumentation
 */
import { execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, openSync, closeSync } from 'node:fs';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { Kafka, logLevel } from 'kafkajs';

import { throwIfAborted } from '../core/errors.js';
import { freeLoopbackPort } from '../core/ports.js';
import { BrokerStartError } from './errors.js';

/** Where the pinned broker lives, relative to the repository root. */
const BROKER_DIR = join('lib', 'kafka', 'broker');

/** Options of {@link startKafkaBroker}. */
export interface KafkaBrokerOptions {
  /** Directory for the configuration, the logs and the data. Default: a fresh temporary directory. */
  readonly dir?: string | undefined;
  /** Client (PLAINTEXT) port on 127.0.0.1. Default: a free port. */
  readonly port?: number | undefined;
  /** Controller port on 127.0.0.1. Default: a free port. */
  readonly controllerPort?: number;
  /** JVM heap in MiB. Default 512. */
  readonly heapMb?: number;
  /** How long to wait for the broker to accept clients, in ms. Default 120 000. */
  readonly startTimeoutMs?: number;
  /** Keep the directory after `stop()`. Default false (true when `dir` is given). */
  readonly keepDir?: boolean;
  /** Cancels the start. */
  readonly signal?: AbortSignal;
}

/** A running broker. */
export interface KafkaBroker {
  /** `host:port` to give clients (`KAFKA_BROKERS`). */
  readonly brokers: string;
  /** Kafka version it runs. */
  readonly version: string;
  /** The broker's log file (stdout and stderr of the JVM). */
  readonly logFile: string;
  /** Directory holding its configuration and data. */
  readonly dir: string;
  /** Stops the broker (SIGTERM to its process group, SIGKILL after 15 s) and removes its directory. */
  stop(): Promise<void>;
}

/**
 * The repository root (the directory holding `lib/kafka/broker/pom.xml`), found from this module's location
 * whether it runs from `lib/` or from `dist/lib/`.
 *
 * @throws {@link BrokerStartError} outside a repository checkout.
 */
export function repositoryRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    if (existsSync(join(dir, BROKER_DIR, 'pom.xml'))) return dir;
    const parent = dirname(dir);
    if (parent === dir) {
      throw new BrokerStartError(`${BROKER_DIR}/pom.xml not found above ${fileURLToPath(import.meta.url)}; run from a checkout`);
    }
    dir = parent;
  }
}

/** The Kafka version pinned in `lib/kafka/broker/pom.xml`. */
export async function kafkaVersion(): Promise<string> {
  const pom = await readFile(join(repositoryRoot(), BROKER_DIR, 'pom.xml'), 'utf8');
  const version = /<kafka\.version>([^<]+)<\/kafka\.version>/.exec(pom)?.[1];
  if (version === undefined) throw new BrokerStartError('no <kafka.version> in lib/kafka/broker/pom.xml');
  return version.trim();
}

/**
 * Downloads the pinned broker jars once (Maven, into the cache) and returns the directory holding them.
 *
 * @param signal - cancels the download.
 * @throws {@link BrokerStartError} when Java or Maven is missing or the download fails.
 */
export async function fetchKafkaBroker(signal?: AbortSignal): Promise<string> {
  const script = join(repositoryRoot(), BROKER_DIR, 'fetch.sh');
  return new Promise<string>((resolve, reject) => {
    execFile('bash', [script], { signal, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      if (error) {
        reject(new BrokerStartError(`fetching the Kafka broker failed: ${stderr.trim() || error.message}`, { cause: error }));
        return;
      }
      resolve(stdout.trim().split('\n').at(-1) ?? '');
    });
  });
}

/**
 * Starts a single-node KRaft broker on 127.0.0.1 (fetching the jars first if needed): writes its
 * `server.properties`, formats the storage with a random cluster id, starts `kafka.Kafka` in its own process group
 * (which also dies when this process does), and waits until it serves clients.
 *
 * @example
 * ```ts
 * import { startKafkaBroker } from 'rxrl';
 * const broker = await startKafkaBroker();
 * process.env.KAFKA_BROKERS = broker.brokers;
 * // … run clients …
 * await broker.stop();
 * ```
 * @param options - directory, ports, heap and timeouts.
 * @throws {@link BrokerStartError} with the tail of the broker log when it does not come up.
 */
export async function startKafkaBroker(options: KafkaBrokerOptions = {}): Promise<KafkaBroker> {
  const { signal } = options;
  const [libs, version] = await Promise.all([fetchKafkaBroker(signal), kafkaVersion()]);
  throwIfAborted(signal);
  const dir = options.dir ?? (await mkdtemp(join(tmpdir(), 'rxrl-kafka-')));
  const keepDir = options.keepDir ?? options.dir !== undefined;
  const port = options.port ?? (await freeLoopbackPort());
  const controllerPort = options.controllerPort ?? (await freeLoopbackPort());
  const brokers = `127.0.0.1:${port}`;
  const properties = join(dir, 'server.properties');
  const log4j = join(dir, 'log4j.properties');
  const logFile = join(dir, 'broker.log');
  await writeFile(properties, serverProperties(port, controllerPort, join(dir, 'data')));
  await writeFile(log4j, LOG4J_PROPERTIES);
  const java = process.env.JAVA_HOME ? join(process.env.JAVA_HOME, 'bin', 'java') : 'java';
  const classpath = `${libs}/*`;
  const jvm = [
    `-Xms128m`,
    `-Xmx${options.heapMb ?? 512}m`,
    '-XX:+UseSerialGC',
    '-XX:+ExitOnOutOfMemoryError',
    '-Djava.awt.headless=true',
    `-Dlog4j.configuration=file:${log4j}`,
  ];

  // Format the storage (KRaft needs a cluster id; a Kafka Uuid is 16 bytes, URL-safe base64 without padding). One
  // starting with '-' would read as an option of the storage tool (1 in 64): the first character is kept a letter.
  const raw = randomBytes(16).toString('base64url');
  const clusterId = /^[A-Za-z]/.test(raw) ? raw : `A${raw.slice(1)}`;
  await new Promise<void>((resolve, reject) => {
    execFile(
      java,
      [...jvm, '-cp', classpath, 'kafka.tools.StorageTool', 'format', '-t', clusterId, '-c', properties],
      { signal },
      (error, _out, stderr) =>
        error
          ? reject(new BrokerStartError(`formatting Kafka storage failed: ${stderr.trim() || error.message}`, { cause: error }))
          : resolve(),
    );
  });

  // The JVM runs under a bash watchdog in its own process group: the group dies with `stop()`, and the watchdog
  // kills the JVM if this process goes away without stopping it.
  const watchdog = [
    '"$RXRL_JAVA" "$@" &',
    'jvm=$!',
    "trap 'kill -TERM $jvm 2>/dev/null; wait $jvm; exit 0' TERM INT",
    'while kill -0 "$RXRL_PARENT_PID" 2>/dev/null && kill -0 $jvm 2>/dev/null; do sleep 1; done',
    'kill -TERM $jvm 2>/dev/null; wait $jvm',
  ].join('\n');
  const out = openSync(logFile, 'a');
  const child = spawn('bash', ['-c', watchdog, 'kafka-broker', ...jvm, '-cp', classpath, 'kafka.Kafka', properties], {
    detached: true,
    stdio: ['ignore', out, out],
    env: { ...process.env, RXRL_JAVA: java, RXRL_PARENT_PID: String(process.pid) },
  });
  closeSync(out);
  let exited = false;
  const exit = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  void exit.then(() => (exited = true));
  child.unref();

  const stop = async (): Promise<void> => {
    if (!exited && child.pid !== undefined) {
      try {
        process.kill(-child.pid, 'SIGTERM');
      } catch {
        // already gone
      }
      const timer = setTimeout(() => {
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          // already gone
        }
      }, 15_000);
      await exit;
      clearTimeout(timer);
    }
    if (!keepDir) await rm(dir, { recursive: true, force: true });
  };

  try {
    await waitUntilServing(brokers, options.startTimeoutMs ?? 120_000, () => exited, signal);
  } catch (error) {
    const tail = await logTail(logFile);
    await stop();
    throw new BrokerStartError(`Kafka ${version} did not start on ${brokers}: ${String(error)}\n--- broker log (tail) ---\n${tail}`, {
      cause: error,
      context: { brokers, version },
    });
  }
  return { brokers, version, logFile, dir, stop };
}

/** Polls the broker with an admin client until it answers metadata requests and can create a topic. */
async function waitUntilServing(brokers: string, timeoutMs: number, exited: () => boolean, signal?: AbortSignal): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const kafka = new Kafka({ brokers: [brokers], clientId: 'rxrl-broker-probe', logLevel: logLevel.NOTHING, retry: { retries: 0 } });
  let last: unknown;
  while (Date.now() < deadline) {
    throwIfAborted(signal);
    if (exited()) throw new Error('the broker process exited');
    const admin = kafka.admin();
    try {
      await admin.connect();
      await admin.describeCluster();
      await admin.createTopics({ topics: [{ topic: '__rxrl_probe', numPartitions: 1 }], waitForLeaders: true });
      return;
    } catch (error) {
      last = error;
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
    await new Promise((resolve) => setTimeout(resolve, 250));
  }
  throw new Error(`not serving after ${timeoutMs} ms (last error: ${String(last)})`);
}

async function logTail(file: string, lines = 40): Promise<string> {
  try {
    return (await readFile(file, 'utf8')).trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

function serverProperties(port: number, controllerPort: number, dataDir: string): string {
  return `${[
    '# Single-node KRaft broker + controller for rxrl tests (written by lib/kafka/broker.ts).',
    'process.roles=broker,controller',
    'node.id=1',
    `controller.quorum.voters=1@127.0.0.1:${controllerPort}`,
    `listeners=PLAINTEXT://127.0.0.1:${port},CONTROLLER://127.0.0.1:${controllerPort}`,
    `advertised.listeners=PLAINTEXT://127.0.0.1:${port}`,
    'controller.listener.names=CONTROLLER',
    'listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT',
    'inter.broker.listener.name=PLAINTEXT',
    `log.dirs=${dataDir}`,
    'num.partitions=1',
    'num.network.threads=2',
    'num.io.threads=2',
    'background.threads=2',
    'log.segment.bytes=16777216',
    'log.retention.bytes=268435456',
    'log.retention.check.interval.ms=60000',
    'offsets.topic.replication.factor=1',
    'offsets.topic.num.partitions=1',
    'transaction.state.log.replication.factor=1',
    'transaction.state.log.min.isr=1',
    'transaction.state.log.num.partitions=1',
    'group.initial.rebalance.delay.ms=0',
    'group.min.session.timeout.ms=1000',
    'auto.create.topics.enable=true',
    'delete.topic.enable=true',
  ].join('\n')}\n`;
}

const LOG4J_PROPERTIES = `${[
  'log4j.rootLogger=INFO, stdout',
  'log4j.appender.stdout=org.apache.log4j.ConsoleAppender',
  'log4j.appender.stdout.layout=org.apache.log4j.PatternLayout',
  'log4j.appender.stdout.layout.ConversionPattern=[%d] %p %m (%c)%n',
  'log4j.logger.state.change.logger=WARN',
  'log4j.logger.kafka.request.logger=WARN',
  'log4j.logger.org.apache.kafka.clients=WARN',
].join('\n')}\n`;
