import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['spec/**/*.spec.ts'],
    exclude: ['dist/**', 'node_modules/**'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // tfjs keeps one global engine per process; isolate each file in its own fork.
    pool: 'forks',
    // A real Kafka broker for spec/kafka, spec/integration and spec/examples (KAFKA_BROKERS overrides it).
    globalSetup: ['spec/kafka/globalSetup.ts'],
  },
});
