/**
 * Progress of a run for people watching it: on a terminal one bar line redrawn in place (`\r`), elsewhere (a
 * pipe, a CI log) one plain line every `every` steps. The caller passes the elapsed time, so this module has
 * no clock and no timer.
 *
 * @packageDocumentation
 */
import { ConfigError } from '../core/errors.js';
import type { Metrics } from '../core/types.js';

/** What {@link Progress} writes to; `process.stderr` fits, and so does a test double. */
export interface ProgressStream {
  /** Receives text. */
  write(chunk: string): unknown;
  /** True on a terminal: the bar is redrawn in place. */
  readonly isTTY?: boolean;
  /** Terminal width; bar lines are cut to fit. */
  readonly columns?: number | undefined;
}

/** One step as {@link Progress.update} takes it; a `StepResult` fits. */
export interface ProgressStep {
  /** 0-based step just taken. */
  readonly step: number;
  /** Namespaced metrics of the step. */
  readonly metrics: Readonly<Metrics>;
}

/** Options of {@link Progress}. */
export interface ProgressOptions {
  /** Where to write. Default `process.stderr`. */
  readonly stream?: ProgressStream;
  /** The step budget, for the bar and the ETA; omit when unknown. */
  readonly total?: number;
  /** Plain mode: a line every this many steps (the last step always gets one). Default 1. */
  readonly every?: number;
  /** Bar width in characters. Default 20. */
  readonly barWidth?: number;
  /** Force the bar on (`true`) or off (`false`). Default: `stream.isTTY`. */
  readonly tty?: boolean;
  /** The run's stalled modules (`ActivityTracker.snapshot().stalled`), shown at the end of each line while any is. */
  readonly stalls?: () => readonly string[];
}

/** ANSI "erase to end of line". */
const CLEAR_LINE = '\x1b[K';

/**
 * The plain progress line of one step, as `rxrl start` has always printed it:
 * `step   12  reward 0.512  loss 0.0123  entropy 1.204  staleness 0  3.4s`.
 *
 * @param step - the step (0-based; printed 1-based).
 * @param elapsedSeconds - time since the run started.
 */
export function formatStepLine(step: ProgressStep, elapsedSeconds: number): string {
  return `step ${String(step.step + 1).padStart(4)}  ${formatMetrics(step.metrics)}  ${elapsedSeconds.toFixed(1)}s`;
}

function formatMetrics(m: Readonly<Metrics>): string {
  return (
    `reward ${(m['rollout/reward_mean'] ?? 0).toFixed(3)}  loss ${(m['actor/pg_loss'] ?? m['actor/sft_loss'] ?? 0).toFixed(4)}` +
    `  entropy ${(m['actor/entropy'] ?? 0).toFixed(3)}  staleness ${m['rollout/staleness_max'] ?? 0}`
  );
}

/** `73s` → `1m13s`, `3700s` → `1h01m`. */
function formatDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}m`;
}

/**
 * A progress display.
 *
 * @example
 * ```ts
 * import { Progress } from 'rxrl';
 * const progress = new Progress({ total: 300, every: 10 });
 * const started = Date.now();
 * pipeline.subscribe({
 *   next: (result) => progress.update(result, (Date.now() - started) / 1000),
 *   complete: () => progress.done(),
 * });
 * ```
 */
export class Progress {
  private readonly stream: ProgressStream;
  private readonly total: number | undefined;
  private readonly every: number;
  private readonly barWidth: number;
  private readonly stalls: () => readonly string[];
  /** Whether the bar is drawn in place. */
  readonly tty: boolean;
  private last: { step: ProgressStep; elapsed: number; printed: boolean } | undefined;
  private barShown = false;

  /** @param options - stream, step budget and cadence. */
  constructor(options: ProgressOptions = {}) {
    this.stream = options.stream ?? process.stderr;
    this.total = options.total;
    this.every = options.every ?? 1;
    this.barWidth = options.barWidth ?? 20;
    this.stalls = options.stalls ?? (() => []);
    this.tty = options.tty ?? this.stream.isTTY === true;
    for (const [key, value, min] of [
      ['every', this.every, 1],
      ['barWidth', this.barWidth, 1],
      ['total', this.total ?? 0, 0],
    ] as const) {
      if (!Number.isInteger(value) || value < min) {
        throw new ConfigError(`progress ${key} must be an integer ≥ ${min}, got ${value}`, { context: { key, value } });
      }
    }
  }

  /**
   * Shows one step: redraws the bar on a terminal; otherwise prints a line when the step is a multiple of
   * `every` or the last one.
   *
   * @param step - the step just taken.
   * @param elapsedSeconds - time since the run started.
   */
  update(step: ProgressStep, elapsedSeconds: number): void {
    const n = step.step + 1;
    if (this.tty) {
      this.stream.write(`\r${this.fit(this.barLine(step, elapsedSeconds))}${CLEAR_LINE}`);
      this.barShown = true;
      this.last = { step, elapsed: elapsedSeconds, printed: true };
      return;
    }
    const printed = n % this.every === 0 || n === this.total;
    if (printed) this.stream.write(`${formatStepLine(step, elapsedSeconds)}${this.stallNote()}\n`);
    this.last = { step, elapsed: elapsedSeconds, printed };
  }

  /**
   * Prints a line of text without tearing the bar: clears the bar, writes `text`, and redraws the bar below.
   *
   * @param text - one line (a trailing newline is added).
   */
  message(text: string): void {
    if (this.tty && this.barShown && this.last !== undefined) {
      this.stream.write(`\r${CLEAR_LINE}${text}\n`);
      this.stream.write(`\r${this.fit(this.barLine(this.last.step, this.last.elapsed))}${CLEAR_LINE}`);
      return;
    }
    this.stream.write(`${text}\n`);
  }

  /** Ends the display: moves past the bar on a terminal; otherwise prints the last step if it was not printed. */
  done(): void {
    if (this.tty) {
      if (this.barShown) this.stream.write('\n');
      this.barShown = false;
      return;
    }
    if (this.last !== undefined && !this.last.printed) {
      this.stream.write(`${formatStepLine(this.last.step, this.last.elapsed)}\n`);
      this.last = { ...this.last, printed: true };
    }
  }

  /** `  stalled: rollout, …` while a module is stalled, else nothing. */
  private stallNote(): string {
    const stalled = this.stalls();
    return stalled.length > 0 ? `  stalled: ${stalled.join(', ')}` : '';
  }

  private barLine(step: ProgressStep, elapsed: number): string {
    return this.bar(step, elapsed) + this.stallNote();
  }

  private bar(step: ProgressStep, elapsed: number): string {
    const n = step.step + 1;
    const timing = `${formatDuration(elapsed)}`;
    if (this.total === undefined || this.total === 0) return `step ${n}  ${formatMetrics(step.metrics)}  ${timing}`;
    const fraction = Math.min(1, n / this.total);
    const filled = Math.round(fraction * this.barWidth);
    const bar = `${'█'.repeat(filled)}${'░'.repeat(this.barWidth - filled)}`;
    const eta = n < this.total && n > 0 ? `  eta ${formatDuration((elapsed / n) * (this.total - n))}` : '';
    const counter = `${String(n).padStart(String(this.total).length)}/${this.total}`;
    return `${bar} ${counter}  ${formatMetrics(step.metrics)}  ${timing}${eta}`;
  }

  private fit(line: string): string {
    const columns = this.stream.columns;
    return columns !== undefined && columns > 1 && line.length > columns - 1 ? line.slice(0, columns - 1) : line;
  }
}
