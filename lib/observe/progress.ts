/**
 * Progress of a run for people watching it, on stderr: on a terminal one bar line redrawn in place (`\r`),
 * elsewhere (a pipe, a CI log) one plain line every `every` steps:
 *
 * ```
 * step 30/800 · 12.4 s/it · ETA 2:41 · reward 0.512 · loss 0.0123 · entropy 1.204 · staleness 0
 * ```
 *
 * The caller passes the elapsed time, so this module has no clock and no timer.
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
  /** The policy that took the step (a `PolicyStepResult` has it); shown with {@link ProgressOptions.perPolicy}. */
  readonly modelTag?: string | undefined;
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
  /**
   * A multi-policy run (metrics namespaced by policy): each line starts with the step's `modelTag`, reads the metrics
   * under it (`writer/rollout/reward_mean`), and each policy has its own pace. Default false.
   */
  readonly perPolicy?: boolean;
}

/** ANSI "erase to end of line". */
const CLEAR_LINE = '\x1b[K';

/** Steps the pace (seconds per step) is averaged over. */
const PACE_WINDOW = 10;

/** What {@link formatStepLine} says of the run's pace, beside the step. */
export interface StepLineTiming {
  /** The step budget: the line reads `step 30/800` and, with a pace, carries an ETA. Omit when unknown. */
  readonly total?: number | undefined;
  /** Seconds per step (a moving average); omit before it is known. */
  readonly secondsPerStep?: number | undefined;
  /** The policy of a multi-policy run: the line starts with it, and the metrics are read under it. */
  readonly policy?: string | undefined;
}

/**
 * The progress line of one step, as `rxrl start` and `rxrl run` print it:
 * `step 30/800 · 12.4 s/it · ETA 2:41 · reward 0.512 · loss 0.0123 · entropy 1.204 · staleness 0`.
 * Without a total it reads `step 30 · 12.4 s/it · reward …` (no ETA); the ETA is left out at the last step, and a
 * metric the step does not have is left out. With a `policy`, the line starts with it and the metrics are read under
 * it (`writer step 3/20 · …` from `writer/rollout/reward_mean`, …).
 *
 * @param step - the step (0-based; printed 1-based).
 * @param timing - the step budget and the pace.
 * @returns the line, without a newline.
 */
export function formatStepLine(step: ProgressStep, timing: StepLineTiming = {}): string {
  const n = step.step + 1;
  const { total, secondsPerStep } = timing;
  const parts = [total === undefined || total === 0 ? `step ${n}` : `step ${n}/${total}`];
  if (secondsPerStep !== undefined && Number.isFinite(secondsPerStep)) {
    parts.push(`${formatPace(secondsPerStep)} s/it`);
    if (total !== undefined && total > n) parts.push(`ETA ${formatClock(secondsPerStep * (total - n))}`);
  }
  parts.push(...formatMetrics(step.metrics, timing.policy));
  return `${timing.policy === undefined ? '' : `${timing.policy} `}${parts.join(' · ')}`;
}

/** `reward 0.512`, `loss 0.0123`, `entropy 1.204`, `staleness 0`: those the step has (under `policy/` when given). */
function formatMetrics(m: Readonly<Metrics>, policy: string | undefined): string[] {
  const read = (key: string): number | undefined => m[policy === undefined ? key : `${policy}/${key}`];
  const shown: [string, number | undefined, number][] = [
    ['reward', read('rollout/reward_mean'), 3],
    ['loss', read('actor/pg_loss') ?? read('actor/sft_loss'), 4],
    ['entropy', read('actor/entropy'), 3],
    ['staleness', read('rollout/staleness_max'), 0],
  ];
  return shown.flatMap(([label, value, digits]) => (value === undefined ? [] : [`${label} ${value.toFixed(digits)}`]));
}

/** Seconds per step with three significant figures at most: `12.4`, `0.53`, `0.012`. */
function formatPace(seconds: number): string {
  if (seconds >= 100) return seconds.toFixed(0);
  if (seconds >= 1) return seconds.toFixed(1);
  if (seconds >= 0.1) return seconds.toFixed(2);
  return seconds.toFixed(3);
}

/** A duration as a clock: `2:41` (m:ss), `1:01:40` (h:mm:ss). */
function formatClock(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const ss = String(s % 60).padStart(2, '0');
  if (s < 3600) return `${Math.floor(s / 60)}:${ss}`;
  return `${Math.floor(s / 3600)}:${String(Math.floor((s % 3600) / 60)).padStart(2, '0')}:${ss}`;
}

/** The last steps of one policy and when they ended: the pace's window. */
class Pace {
  private readonly seen: { n: number; elapsed: number }[] = [];

  /** Records step `n` (1-based) ended at `elapsed`; returns the seconds per step over the window. */
  add(n: number, elapsed: number): number {
    this.seen.push({ n, elapsed });
    if (this.seen.length > PACE_WINDOW + 1) this.seen.shift();
    const first = this.seen[0];
    // The first step this display saw took the time since the run started (loading included).
    if (this.seen.length === 1 || n <= first.n) return elapsed;
    return (elapsed - first.elapsed) / (n - first.n);
  }
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
  private readonly perPolicy: boolean;
  /** Whether the bar is drawn in place. */
  readonly tty: boolean;
  private readonly paces = new Map<string, Pace>();
  private last: { step: ProgressStep; timing: StepLineTiming; printed: boolean } | undefined;
  private barShown = false;

  /** @param options - stream, step budget and cadence. */
  constructor(options: ProgressOptions = {}) {
    this.stream = options.stream ?? process.stderr;
    this.total = options.total === 0 ? undefined : options.total;
    this.every = options.every ?? 1;
    this.barWidth = options.barWidth ?? 20;
    this.stalls = options.stalls ?? (() => []);
    this.perPolicy = options.perPolicy ?? false;
    this.tty = options.tty ?? this.stream.isTTY === true;
    for (const [key, value, min] of [
      ['every', this.every, 1],
      ['barWidth', this.barWidth, 1],
      ['total', options.total ?? 0, 0],
    ] as const) {
      if (!Number.isInteger(value) || value < min) {
        throw new ConfigError(`progress ${key} must be an integer ≥ ${min}, got ${value}`, { context: { key, value } });
      }
    }
  }

  /**
   * Shows one step: redraws the bar on a terminal; otherwise prints a line when the step is a multiple of
   * `every` or the last one. Call it for every step: the pace is the moving average of the last ten.
   *
   * @param step - the step just taken.
   * @param elapsedSeconds - time since the run started.
   */
  update(step: ProgressStep, elapsedSeconds: number): void {
    const n = step.step + 1;
    const policy = this.perPolicy ? step.modelTag : undefined;
    const pace = this.paces.get(policy ?? '') ?? new Pace();
    this.paces.set(policy ?? '', pace);
    const timing: StepLineTiming = { total: this.total, secondsPerStep: pace.add(n, elapsedSeconds), policy };
    if (this.tty) {
      this.stream.write(`\r${this.fit(this.barLine(step, timing))}${CLEAR_LINE}`);
      this.barShown = true;
      this.last = { step, timing, printed: true };
      return;
    }
    const printed = n % this.every === 0 || n === this.total;
    if (printed) this.stream.write(`${formatStepLine(step, timing)}${this.stallNote()}\n`);
    this.last = { step, timing, printed };
  }

  /**
   * Prints a line of text without tearing the bar: clears the bar, writes `text`, and redraws the bar below.
   *
   * @param text - one line (a trailing newline is added).
   */
  message(text: string): void {
    if (this.tty && this.barShown && this.last !== undefined) {
      this.stream.write(`\r${CLEAR_LINE}${text}\n`);
      this.stream.write(`\r${this.fit(this.barLine(this.last.step, this.last.timing))}${CLEAR_LINE}`);
      return;
    }
    this.stream.write(`${text}\n`);
  }

  /**
   * Ends the display: moves past the bar on a terminal; otherwise prints the last step if it was not printed.
   * Calling it again does nothing.
   */
  done(): void {
    if (this.tty) {
      if (this.barShown) this.stream.write('\n');
      this.barShown = false;
      return;
    }
    if (this.last !== undefined && !this.last.printed) {
      this.stream.write(`${formatStepLine(this.last.step, this.last.timing)}\n`);
      this.last = { ...this.last, printed: true };
    }
  }

  /** ` · stalled: rollout, …` while a module is stalled, else nothing. */
  private stallNote(): string {
    const stalled = this.stalls();
    return stalled.length > 0 ? ` · stalled: ${stalled.join(', ')}` : '';
  }

  /** The bar (with a total) and the step line. */
  private barLine(step: ProgressStep, timing: StepLineTiming): string {
    const line = formatStepLine(step, timing) + this.stallNote();
    if (this.total === undefined) return line;
    const filled = Math.round(Math.min(1, (step.step + 1) / this.total) * this.barWidth);
    return `${'█'.repeat(filled)}${'░'.repeat(this.barWidth - filled)} ${line}`;
  }

  private fit(line: string): string {
    const columns = this.stream.columns;
    return columns !== undefined && columns > 1 && line.length > columns - 1 ? line.slice(0, columns - 1) : line;
  }
}
