/**
 * The Prometheus text exposition format (version 0.0.4), as rxrl's two `/metrics` routes write it: `rxrl run
 * --status-port` ({@link prometheusText}) and `rxrl serve` (vLLM's metric names).
 *
 * @packageDocumentation
 */

/** Label values of one sample, by label name. */
export type PrometheusLabels = Readonly<Record<string, string>>;

/** Builds an exposition: families with their `# HELP` and `# TYPE` lines, then `toString()`. */
export class PrometheusText {
  private readonly lines: string[] = [];

  /**
   * A gauge or counter family; nothing when it has no samples.
   *
   * @param samples - each sample's labels and value.
   */
  family(name: string, type: 'gauge' | 'counter', help: string, samples: readonly (readonly [PrometheusLabels, number])[]): this {
    if (samples.length === 0) return this;
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`);
    for (const [labels, value] of samples) this.lines.push(`${name}${labelText(labels)} ${numberText(value)}`);
    return this;
  }

  /**
   * A histogram: cumulative `_bucket{le}` counts (and `+Inf`), `_sum`, `_count`.
   *
   * @param histogram - its upper bounds, the observations at or below each, their sum and count.
   */
  histogram(
    name: string,
    help: string,
    labels: PrometheusLabels,
    histogram: { readonly buckets: readonly number[]; readonly counts: readonly number[]; readonly sum: number; readonly count: number },
  ): this {
    this.lines.push(`# HELP ${name} ${help}`, `# TYPE ${name} histogram`);
    histogram.buckets.forEach((bound, i) =>
      this.lines.push(`${name}_bucket${labelText({ ...labels, le: String(bound) })} ${histogram.counts[i]}`),
    );
    this.lines.push(
      `${name}_bucket${labelText({ ...labels, le: '+Inf' })} ${histogram.count}`,
      `${name}_sum${labelText(labels)} ${numberText(histogram.sum)}`,
      `${name}_count${labelText(labels)} ${histogram.count}`,
    );
    return this;
  }

  /** The exposition, ending in a newline. */
  toString(): string {
    return `${this.lines.join('\n')}\n`;
  }
}

/** `{a="x",b="y"}` with values escaped (backslash, quote, newline); nothing for no labels. */
function labelText(labels: PrometheusLabels): string {
  const entries = Object.entries(labels);
  if (entries.length === 0) return '';
  const escape = (v: string): string => v.replaceAll('\\', '\\\\').replaceAll('"', '\\"').replaceAll('\n', '\\n');
  return `{${entries.map(([key, value]) => `${key}="${escape(value)}"`).join(',')}}`;
}

function numberText(value: number): string {
  if (Number.isNaN(value)) return 'NaN';
  if (value === Infinity) return '+Inf';
  if (value === -Infinity) return '-Inf';
  return String(value);
}
