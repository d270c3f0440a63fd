/**
 * Vitest global setup: a real Kafka broker for the Kafka, integration and example specs.
 *
 * Uses `KAFKA_BROKERS` when it is set; otherwise starts the pinned single-node KRaft broker
 * (`lib/kafka/broker.ts`) and stops it after the run. The address reaches the specs through
 * `inject('kafkaBrokers')`. When the selected spec files need no broker (`npx vitest run spec/operators`), none is
 * started. If the broker cannot start, this setup throws and the run fails: Kafka specs are never skipped.
 */
import type { TestProject } from 'vitest/node';

import { startKafkaBroker } from '../../lib/kafka/broker.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** `host:port[,host:port]` of the Kafka cluster for this run (empty when no selected spec needs one). */
    kafkaBrokers: string;
  }
}

/** Spec folders that talk to a real broker. */
const NEEDS_KAFKA = ['/spec/kafka/', '/spec/integration/', '/spec/examples/'];

export default async function setup(project: TestProject): Promise<(() => Promise<void>) | undefined> {
  const configured = process.env.KAFKA_BROKERS?.trim();
  if (configured) {
    project.provide('kafkaBrokers', configured);
    return undefined;
  }
  const { testFiles } = await project.globTestFiles(project.vitest.config.filters ?? []);
  if (!testFiles.some((file) => NEEDS_KAFKA.some((dir) => file.replaceAll('\\', '/').includes(dir)))) {
    project.provide('kafkaBrokers', '');
    return undefined;
  }
  const started = performance.now();
  const broker = await startKafkaBroker();
  process.stderr.write(
    `[kafka] Kafka ${broker.version} on ${broker.brokers} (started in ${((performance.now() - started) / 1000).toFixed(1)} s, log ${broker.logFile})\n`,
  );
  project.provide('kafkaBrokers', broker.brokers);
  return async () => {
    await broker.stop();
  };
}
