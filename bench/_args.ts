/**
 * Command-line flags of the benchmarks: `--name value` pairs and bare `--flag`s.
 *
 * @packageDocumentation
 */

import { ConfigError } from '../lib/core/errors.js';

/** Readers over one argument list. */
export interface BenchArgs {
  /** The value after `--name`, or undefined when absent. */
  value(name: string): string | undefined;
  /** `--name` as an integer ≥ 1, else `fallback`; a {@link ConfigError} naming the flag and its value when it is not one. */
  int(name: string, fallback: number): number;
  /** Whether the bare `--name` is present. */
  flag(name: string): boolean;
}

export function benchArgs(args: readonly string[]): BenchArgs {
  const value = (name: string): string | undefined => {
    const i = args.indexOf(`--${name}`);
    return i >= 0 ? args[i + 1] : undefined;
  };
  return {
    value,
    int: (name, fallback) => {
      const text = value(name) ?? String(fallback);
      const v = Number(text);
      if (!Number.isInteger(v) || v < 1)
        throw new ConfigError(`--${name} must be an integer >= 1, got ${text}`, { context: { key: name } });
      return v;
    },
    flag: (name) => args.includes(`--${name}`),
  };
}
