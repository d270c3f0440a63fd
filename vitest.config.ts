import { existsSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { defineConfig } from 'vitest/config';

// What `npm test`'s setup (scripts/test-setup.sh) brought, under .cache/: the Python environment with the packages
// the specs drive comes first on the PATH (so `python3` in a spec or an agent command is that one), and the Kafka
// broker's jars and the schema registry are read from there. Set here, in the main process, so the global setup and every fork see them.
const root = fileURLToPath(new URL('.', import.meta.url));
const python = join(root, '.cache', 'python', 'bin');
if (existsSync(python) && !(process.env.PATH ?? '').split(delimiter).includes(python)) {
  process.env.PATH = `${python}${delimiter}${process.env.PATH ?? ''}`;
}
process.env.RXRL_KAFKA_CACHE ??= join(root, '.cache', 'kafka');
process.env.RXRL_REGISTRY_CACHE ??= join(root, '.cache', 'registry');

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
    // TF.js's console warnings (its "Hi, looks like you are running TensorFlow.js in Node.js" banner) off.
    setupFiles: ['spec/helpers/quietTfjs.ts'],
  },
});
