/**
 * The Prometheus text exposition format (version 0.0.4), as rxrl's two `/metrics` routes write it: `rxrl run
 * --status-port` ({@link prometheusText}) and `rxrl serve` (vLLM's metric names).
 *
 * @packageDocumentation
 */

/** Label values of one sample, by label name. */
export type PrometheusLabels = Readonly<Record<string, string>>;

/** Options of {@link PrometheusText}. */
export interface PrometheusTextOptions {
  /**
   * Most bytes of the exposition. Past it, the samples that do not fit are left out (a family none of whose
   * samples fit, with its `# HELP` and `# TYPE`) and a last comment counts them. Default: no bound.
   */
  readonly maxBytes?: number;
}

/** Room kept for the closing comment of a bounded exposition. */
const OMITTED_COMMENT_BYTES = 120;

/** Builds an exposition: families with their `# HELP` and `# TYPE` lines, then `toString()`. */
export class PrometheusText {
  private readonly lines: string[] = [];
  private readonly maxBytes: number;
  private bytes = 0;
  private omitted = 0;

  /** @param options - the size bound. */
  constructor(options: PrometheusTextOptions = {}) {
    this.maxBytes = options.maxBytes === undefined ? Infinity : options.maxBytes - OMITTED_COMMENT_BYTES;
  }

  /**
   * A gauge or counter family; nothing when it has no samples.
   *
   * @param samples - each sample's labels and value.
   */
  family(name: string, type: 'gauge' | 'counter', help: string, samples: readonly (readonly [PrometheusLabels, number])[]): this {
    if (samples.length === 0) return this;
    const head = [`# HELP ${name} ${help}`, `# TYPE ${name} ${type}`];
    let headBytes = lineBytes(head[0]) + lineBytes(head[1]);
    for (const [labels, value] of samples) {
      const line = `${name}${labelText(labels)} ${numberText(value)}`;
      const bytes = lineBytes(line);
      if (this.bytes + headBytes + bytes > this.maxBytes) {
        this.omitted += 1;
        continue;
      }
      if (headBytes > 0) this.lines.push(...head);
      this.bytes += headBytes + bytes;
      headBytes = 0;
      this.lines.push(line);
    }
    return this;
  }

  /**
   * A histogram: cumulative `_bucket{le}` counts (and `+Inf`), `_sum`, `_count`; whole, or left out when it does not
   * fit in the bound.
   *
   * @param histogram - its upper bounds, the observations at or below each, their sum and count.
   */
  histogram(
    name: string,
    help: string,
    labels: PrometheusLabels,
    histogram: { readonly buckets: readonly number[]; readonly counts: readonly number[]; readonly sum: number; readonly count: number },
  ): this {
    const samples = [
      ...histogram.buckets.map((bound, i) => `${name}_bucket${labelText({ ...labels, le: String(bound) })} ${histogram.counts[i]}`),
      `${name}_bucket${labelText({ ...labels, le: '+Inf' })} ${histogram.count}`,
      `${name}_sum${labelText(labels)} ${numberText(histogram.sum)}`,
      `${name}_count${labelText(labels)} ${histogram.count}`,
    ];
    const lines = [`# HELP ${name} ${help}`, `# TYPE ${name} histogram`, ...samples];
    // A histogram is whole or absent: its buckets mean nothing apart.
    const bytes = lines.reduce((sum, line) => sum + lineBytes(line), 0);
    if (this.bytes + bytes > this.maxBytes) this.omitted += samples.length;
    else {
      this.bytes += bytes;
      this.lines.push(...lines);
    }
    return this;
  }

  /** The exposition, ending in a newline; a bounded one that left samples out ends in a comment counting them. */
  toString(): string {
    const end =
      this.omitted === 0
        ? []
        : [`# rxrl: ${this.omitted} samples omitted to keep this answer within ${this.maxBytes + OMITTED_COMMENT_BYTES} bytes`];
    return `${[...this.lines, ...end].join('\n')}\n`;
  }
}

/** Bytes of `line` with its newline. */
function lineBytes(line: string): number {
  return Buffer.byteLength(line) + 1;
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
