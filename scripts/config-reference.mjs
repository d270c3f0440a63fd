// Writes docs/configuration-reference.md from the configuration schema (lib/config/schema.ts, built into dist/ by
// `npm run docs:config` first). Usage: node scripts/config-reference.mjs [--check] [--file PATH]
//   --check      compare the file with the schema instead of writing it; exit 1 naming the first difference
//   --file PATH  the file, relative to the repository root (default docs/configuration-reference.md)
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const { writeConfigReference } = await import('../dist/lib/config/reference.js');

const args = process.argv.slice(2);
let check = false;
let file;
for (let i = 0; i < args.length; i++) {
  if (args[i] === '--check') check = true;
  else if (args[i] === '--file' && args[i + 1] !== undefined) file = args[++i];
  else {
    console.error(`config-reference: unknown argument '${args[i]}' (usage: npm run docs:config -- [--check] [--file PATH])`);
    process.exit(2);
  }
}
const outcome = writeConfigReference({ root, check, ...(file === undefined ? {} : { file }) });
(outcome.code === 0 ? console.log : console.error)(outcome.message);
process.exitCode = outcome.code;
