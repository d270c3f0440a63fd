#!/usr/bin/env node
/**
 * Runs the pinned local Kafka broker from a repository checkout:
 *
 * ```sh
 * npm run build
 * node dist/cli/broker.js start      # prints KAFKA_BROKERS=127.0.0.1:<port>, runs until Ctrl-C
 * node dist/cli/broker.js fetch      # only downloads the jars (prints their directory)
 * node dist/cli/broker.js version    # the pinned Kafka version
 * ```
 *
 * `start --port 9092` picks the client port; `--dir <path>` keeps configuration, logs and data there.
 *
 * @packageDocumentation
 */
import { parseCommand, usageError, type CommandSpec } from './args.js';
import { isUsageError } from '../lib/core/errors.js';
import { fetchKafkaBroker, kafkaVersion, startKafkaBroker } from '../lib/kafka/broker.js';

const PROGRAM = 'node dist/cli/broker.js';
const USAGE = `usage: ${PROGRAM} start [--port N] [--dir PATH] | fetch | version\n`;
const COMMANDS: Readonly<Record<string, CommandSpec>> = {
  start: { name: `${PROGRAM} start`, flags: { port: { type: 'string' }, dir: { type: 'string' } } },
  fetch: { name: `${PROGRAM} fetch`, flags: {} },
  version: { name: `${PROGRAM} version`, flags: {} },
};

async function main(args: readonly string[]): Promise<number> {
  const [command, ...rest] = args;
  if (command === undefined || command === '-h' || command === '--help') {
    process.stdout.write(USAGE);
    return 0;
  }
  const spec = Object.hasOwn(COMMANDS, command) ? COMMANDS[command] : undefined;
  if (spec === undefined) throw usageError({ name: PROGRAM }, `unknown command '${command}'`);
  const parsed = parseCommand(spec, rest);
  if (parsed.help) {
    process.stdout.write(USAGE);
    return 0;
  }
  switch (command) {
    case 'fetch':
      console.log(await fetchKafkaBroker());
      return 0;
    case 'version':
      console.log(await kafkaVersion());
      return 0;
    default:
      return start(parsed.values.port as string | undefined, parsed.values.dir as string | undefined);
  }
}

/** Runs the broker until SIGINT or SIGTERM. */
async function start(port: string | undefined, dir: string | undefined): Promise<number> {
  const portNumber = port === undefined ? undefined : Number(port);
  if (portNumber !== undefined && !(Number.isInteger(portNumber) && portNumber >= 0 && portNumber < 65536)) {
    throw usageError(COMMANDS.start, `--port must be a port number, got '${port}'`);
  }
  const broker = await startKafkaBroker({ port: portNumber, dir });
  console.log(`KAFKA_BROKERS=${broker.brokers}`);
  process.stderr.write(`Kafka ${broker.version} running (log: ${broker.logFile}); Ctrl-C stops it\n`);
  // The broker's watchdog stops it when this process exits, so stay alive until asked to stop.
  const keepAlive = setInterval(() => undefined, 1 << 30);
  await new Promise<void>((resolve) => {
    process.once('SIGINT', resolve);
    process.once('SIGTERM', resolve);
  });
  clearInterval(keepAlive);
  await broker.stop();
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`kafka broker: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exitCode = isUsageError(error) ? 2 : 1;
  },
);
