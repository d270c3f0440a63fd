/**
 * Strict command-line parsing for every rxrl command (`rxrl start`, `rxrl serve`, … and the Kafka broker script),
 * on `node:util`'s `parseArgs`: an unknown flag, a flag without its value (or with an empty one), a value given to
 * a switch, or a wrong number of arguments is a {@link UsageError} (one line; the CLI exits 2); a flag given twice
 * keeps its last value, except a `multiple` one (`--set k=v`), which collects them all; `-h` and `--help` ask for
 * the command's usage.
 *
 * @packageDocumentation
 */
import { parseArgs } from 'node:util';

import { UsageError } from '../lib/core/errors.js';

/** One flag of a command: `--name VALUE` (`string`) or `--name` (`boolean`). */
export interface FlagSpec {
  readonly type: 'string' | 'boolean';
  /** Collect every occurrence (`--set a=1 --set b=2`) instead of keeping the last. */
  readonly multiple?: boolean;
}

/** What a command accepts. */
export interface CommandSpec {
  /** The command as typed, for messages: `rxrl start`. */
  readonly name: string;
  /** Its flags by long name, without the dashes (`--help`/`-h` is added to every command). */
  readonly flags: Readonly<Record<string, FlagSpec>>;
  /**
   * Its positional arguments, as named in its usage: `<recipe.json|yaml>` is required, `[name]` optional (optional
   * ones come last). Default none.
   */
  readonly positionals?: readonly string[];
}

/** A parsed command line: flag values by name (`undefined` when absent), positionals, and whether help was asked. */
export interface ParsedCommand {
  readonly help: boolean;
  readonly values: Readonly<Record<string, string | boolean | string[] | undefined>>;
  readonly positionals: readonly string[];
}

type ParseOptions = Record<string, { type: 'string' | 'boolean'; multiple?: boolean; short?: string }>;

/**
 * Parses `argv` (the arguments after the command's name) against `spec`. Asking for help (`-h`, `--help`
 * anywhere before `--`) wins over any other problem, so a half-typed command line still shows its usage.
 *
 * @example
 * ```ts
 * const args = parseCommand({ name: 'rxrl run', flags: { set: { type: 'string', multiple: true } }, positionals: ['<recipe>'] }, ['r.yaml', '--set', 'run.steps=2']);
 * // args.positionals → ['r.yaml'], args.values.set → ['run.steps=2']
 * ```
 * @param spec - The command's flags and positionals.
 * @param argv - Its arguments.
 * @returns The values.
 * @throws {@link UsageError} naming the first malformed argument.
 */
export function parseCommand(spec: CommandSpec, argv: readonly string[]): ParsedCommand {
  const options: ParseOptions = { ...spec.flags, help: { type: 'boolean', short: 'h' } };
  const lenient = parseArgs({ args: [...argv], options, strict: false, allowPositionals: true, tokens: true });
  if (lenient.tokens.some((t) => t.kind === 'option' && t.name === 'help')) return { help: true, values: {}, positionals: [] };
  let parsed: { values: Record<string, string | boolean | (string | boolean)[] | undefined>; positionals: string[] };
  try {
    parsed = parseArgs({ args: [...argv], options, strict: true, allowPositionals: true });
  } catch (cause) {
    throw usageError(spec, problemIn(lenient.tokens, options) ?? firstLine(cause), cause);
  }
  const empty = lenient.tokens.find((t) => t.kind === 'option' && options[t.name]?.type === 'string' && t.value === '');
  if (empty !== undefined && empty.kind === 'option') throw usageError(spec, `option '${empty.rawName}' needs a value`);
  const expected = spec.positionals ?? [];
  if (parsed.positionals.length > expected.length) {
    throw usageError(spec, `unexpected argument '${parsed.positionals[expected.length]}'`);
  }
  const required = expected.filter((name) => !name.startsWith('['));
  if (parsed.positionals.length < required.length) {
    throw usageError(spec, `missing ${required.slice(parsed.positionals.length).join(' ')}`);
  }
  return { help: false, values: parsed.values as ParsedCommand['values'], positionals: parsed.positionals };
}

/** A {@link UsageError} of `spec`: `rxrl start: <problem> (see rxrl start --help)`. */
export function usageError(spec: Pick<CommandSpec, 'name'>, problem: string, cause?: unknown): UsageError {
  return new UsageError(`${spec.name}: ${problem} (see ${spec.name} --help)`, { cause, context: { command: spec.name } });
}

type Token = ReturnType<typeof parseArgs>['tokens'] extends (infer T)[] | undefined ? T : never;

/** What strict parsing refused, read from the lenient tokens: the first unknown flag or malformed value. */
function problemIn(tokens: readonly Token[], options: ParseOptions): string | undefined {
  for (const token of tokens) {
    if (token.kind !== 'option') continue;
    const option = Object.hasOwn(options, token.name) ? options[token.name] : undefined;
    if (option === undefined) return `unknown option '${token.rawName}'`;
    if (option.type === 'boolean' && token.value !== undefined) return `option '${token.rawName}' takes no value`;
    if (option.type === 'string' && token.value === undefined) return `option '${token.rawName}' needs a value`;
    if (option.type === 'string' && !token.inlineValue && token.value?.startsWith('-')) {
      return `option '${token.rawName}' needs a value, got the option '${token.value}' (write ${token.rawName}=VALUE for a value that starts with '-')`;
    }
  }
  return undefined;
}

function firstLine(error: unknown): string {
  return (error instanceof Error ? error.message : String(error)).split('\n')[0];
}
