/**
 * Benchmark runner: `npm run bench -- <name> [args…]` loads `bench/<name>.ts` (built to `dist/bench/<name>.js`)
 * and calls its exported `main(args)`. Every benchmark prints one JSON object per line on stdout.
 *
 * @packageDocumentation
 */
import { readdir } from 'node:fs/promises';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';

/** What a benchmark module exports. */
export interface BenchModule {
  main(args: readonly string[]): Promise<void>;
}

async function available(): Promise<string[]> {
  const here = dirname(fileURLToPath(import.meta.url));
  const files = await readdir(here);
  return files
    .filter((f) => f.endsWith('.js') && f !== 'run.js' && !f.startsWith('_'))
    .map((f) => f.slice(0, -3))
    .sort();
}

async function run(argv: readonly string[]): Promise<number> {
  const [name, ...rest] = argv;
  const names = await available();
  if (name === undefined || !names.includes(name)) {
    process.stderr.write(`usage: npm run bench -- <name> [args…]\nbenchmarks: ${names.join(', ')}\n`);
    return name === undefined ? 0 : 2;
  }
  const module = (await import(`./${name}.js`)) as BenchModule;
  await module.main(rest);
  return 0;
}

run(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`bench: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exitCode = 1;
  },
);
