#!/usr/bin/env node
/**
 * Runs the pinned local Kafka broker from a repository checkout:
 *
 * ```sh
 * npm run build
 * node dist/lib/kafka/brokerCli.js start      # prints KAFKA_BROKERS=127.0.0.1:<port>, runs until Ctrl-C
 * node dist/lib/kafka/brokerCli.js fetch      # only downloads the jars (prints their directory)
 * node dist/lib/kafka/brokerCli.js version    # the pinned Kafka version
 * ```
 *
 * `start --port 9092` picks the client port; `--dir <path>` keeps configuration, logs and data there.
 *
 * @packageDocumentation
 */
import { fetchKafkaBroker, kafkaVersion, startKafkaBroker } from './broker.js';

function flag(args: readonly string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : undefined;
}

async function main(args: readonly string[]): Promise<number> {
  const [command, ...rest] = args;
  switch (command) {
    case 'fetch':
      console.log(await fetchKafkaBroker());
      return 0;
    case 'version':
      console.log(await kafkaVersion());
      return 0;
    case 'start': {
      const port = flag(rest, '--port');
      const broker = await startKafkaBroker({ port: port === undefined ? undefined : Number(port), dir: flag(rest, '--dir') });
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
    default:
      process.stderr.write('usage: node dist/lib/kafka/brokerCli.js start [--port N] [--dir PATH] | fetch | version\n');
      return command === undefined ? 0 : 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`kafka broker: ${error instanceof Error ? error.message : String(error)}\n`);
    process.exitCode = 1;
  },
);
