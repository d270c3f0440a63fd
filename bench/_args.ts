/**
 * Command-line flags of the benchmarks: `--name value` pairs and bare `--flag`s.
 *
 * @packageDocumentation
 */

/** Readers over one argument list. */
export interface BenchArgs {
  /** The value after `--name`, or undefined when absent. */
  value(name: string): string | undefined;
  /** `--name` as an integer ≥ 1, else `fallback`; throws naming the flag when it is not one. */
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
      const v = Number(value(name) ?? fallback);
      if (!Number.isInteger(v) || v < 1) throw new Error(`--${name} must be an integer >= 1`);
      return v;
    },
    flag: (name) => args.includes(`--${name}`),
  };
}
