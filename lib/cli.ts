#!/usr/bin/env node
/**
 * The `rxrl` command line.
 *
 * @packageDocumentation
 */

const usage = `rxrl — reinforcement-learning post-training as a reactive stream

Usage:
  rxrl start        train the bundled task end to end on the embedded policy
  rxrl --help       this text
`;

async function main(argv: readonly string[]): Promise<number> {
  const [command] = argv;
  switch (command) {
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      process.stdout.write(usage);
      return 0;
    case 'start':
      process.stdout.write('rxrl: the embedded GRPO run lands with the reactive loop; for now see README.md\n');
      return 0;
    default:
      process.stderr.write(`rxrl: unknown command '${command}'\n\n${usage}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    process.stderr.write(`rxrl: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
    process.exitCode = 1;
  },
);
