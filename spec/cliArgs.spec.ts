/** The shared strict parser of every rxrl command (`cli/args.ts`). */
import { describe, expect, it } from 'vitest';

import { parseCommand, type CommandSpec } from '../cli/args.js';
import { ConfigError, isUsageError, UsageError } from '../lib/core/errors.js';

const run: CommandSpec = {
  name: 'rxrl run',
  flags: { steps: { type: 'string' }, set: { type: 'string', multiple: true }, verbose: { type: 'boolean' } },
  positionals: ['<recipe>'],
};

function refusal(argv: string[]): UsageError {
  try {
    parseCommand(run, argv);
  } catch (error) {
    if (isUsageError(error)) return error;
    throw error;
  }
  throw new Error(`parsed: ${argv.join(' ')}`);
}

describe('parseCommand', () => {
  it('reads --flag VALUE and --flag=VALUE, switches and positionals', () => {
    expect(parseCommand(run, ['r.yaml', '--steps', '3', '--verbose'])).toEqual({
      help: false,
      values: { steps: '3', verbose: true },
      positionals: ['r.yaml'],
    });
    expect(parseCommand(run, ['--steps=-1', 'r.yaml']).values.steps).toBe('-1');
    expect(parseCommand(run, ['--', '--steps']).positionals).toEqual(['--steps']);
  });

  it('keeps the last value of a repeated flag; a multiple one (--set) collects every value in order', () => {
    expect(parseCommand(run, ['r.yaml', '--steps', '1', '--steps=2', '--steps', '3']).values.steps).toBe('3');
    expect(parseCommand(run, ['r.yaml', '--set', 'a=1', '--set=b=2', '--set', 'a=3']).values.set).toEqual(['a=1', 'b=2', 'a=3']);
  });

  it('takes an optional positional ([name]) when given and does without it, still refusing one too many', () => {
    const init: CommandSpec = { name: 'rxrl init', flags: { out: { type: 'string' } }, positionals: ['[name]'] };
    expect(parseCommand(init, []).positionals).toEqual([]);
    expect(parseCommand(init, ['reverse', '--out', 'r.yaml'])).toEqual({
      help: false,
      values: { out: 'r.yaml' },
      positionals: ['reverse'],
    });
    expect(() => parseCommand(init, ['a', 'b'])).toThrow("rxrl init: unexpected argument 'b' (see rxrl init --help)");
  });

  it('refuses an unknown flag, a missing or empty value, a value on a switch, and a wrong number of arguments, naming each', () => {
    const cases: [string[], string][] = [
      [['r.yaml', '--stpes', '3'], "rxrl run: unknown option '--stpes' (see rxrl run --help)"],
      [['r.yaml', '-x'], "rxrl run: unknown option '-x' (see rxrl run --help)"],
      [['r.yaml', '--steps'], "rxrl run: option '--steps' needs a value (see rxrl run --help)"],
      [['r.yaml', '--steps='], "rxrl run: option '--steps' needs a value (see rxrl run --help)"],
      [
        ['r.yaml', '--steps', '--verbose'],
        "rxrl run: option '--steps' needs a value, got the option '--verbose' (write --steps=VALUE for a value that starts with '-') (see rxrl run --help)",
      ],
      [['r.yaml', '--set'], "rxrl run: option '--set' needs a value (see rxrl run --help)"],
      [['r.yaml', '--verbose=yes'], "rxrl run: option '--verbose' takes no value (see rxrl run --help)"],
      [[], 'rxrl run: missing <recipe> (see rxrl run --help)'],
      [['a.yaml', 'b.yaml'], "rxrl run: unexpected argument 'b.yaml' (see rxrl run --help)"],
    ];
    for (const [argv, message] of cases) {
      const error = refusal(argv);
      expect(error).toBeInstanceOf(UsageError);
      expect(error).not.toBeInstanceOf(ConfigError);
      expect(error.context).toEqual({ command: 'rxrl run' });
      expect(error.message).toBe(message);
      expect(error.message).not.toContain('\n');
    }
  });

  it('-h and --help ask for the usage anywhere before --, even beside a malformed argument', () => {
    for (const argv of [['-h'], ['--help'], ['r.yaml', '--bogus', '-h'], ['--steps', '1', '--help', 'extra', 'args']]) {
      expect(parseCommand(run, argv)).toEqual({ help: true, values: {}, positionals: [] });
    }
    expect(parseCommand(run, ['--', '-h']).positionals).toEqual(['-h']);
    expect(parseCommand({ name: 'rxrl start', flags: {} }, ['-h']).help).toBe(true);
  });
});
