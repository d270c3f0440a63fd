/**
 * `rxrl report <run-dir>`: one self-contained HTML page with the curves of a run, drawn from
 * `<run-dir>/metrics.jsonl` as inline SVG. No script, no stylesheet or font from elsewhere, and a content
 * security policy that forbids both, so the page opens offline, from an e-mail or an artifact store.
 *
 * The output is a pure function of the metrics file (no clock, no randomness): the same file gives the same
 * bytes. Where a resumed run repeats a step, the later line wins. A series with no values is listed as
 * "no data"; a plot with none at all says so instead of drawing axes. Every text from the file is escaped.
 *
 * @packageDocumentation
 */
import { rename, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { ConfigError } from '../core/errors.js';
import { readRunMetrics, type MetricsRecord, type SkippedLine } from './metricsFile.js';

/** One curve of a plot. */
export interface ReportSeries {
  /** Metric key in `metrics.jsonl`. */
  readonly key: string;
  /** Legend text. */
  readonly label: string;
}

/** One plot of the report. */
export interface ReportPlot {
  /** Stable id (`data-plot` attribute, element id `plot-<id>`). */
  readonly id: string;
  /** Caption. */
  readonly title: string;
  /** Curves, drawn in order with the report palette. */
  readonly series: readonly ReportSeries[];
  /** Mark every point (for sparse series such as validation). Default `false`: only isolated points. */
  readonly markers?: boolean;
}

/** The plots of `rxrl report`, in page order. */
export const REPORT_PLOTS: readonly ReportPlot[] = [
  { id: 'reward', title: 'Reward', series: [{ key: 'rollout/reward_mean', label: 'rollout/reward_mean' }] },
  {
    id: 'val_reward',
    title: 'Held-out reward',
    series: [{ key: 'val/reward_mean', label: 'val/reward_mean' }],
    markers: true,
  },
  {
    id: 'loss',
    title: 'Policy loss',
    series: [
      { key: 'actor/pg_loss', label: 'actor/pg_loss' },
      { key: 'actor/sft_loss', label: 'actor/sft_loss' },
    ],
  },
  {
    id: 'kl',
    title: 'KL',
    series: [
      { key: 'actor/ppo_kl', label: 'actor/ppo_kl' },
      { key: 'actor/kl_loss', label: 'actor/kl_loss' },
    ],
  },
  { id: 'clipfrac', title: 'Clip fraction', series: [{ key: 'actor/pg_clipfrac', label: 'actor/pg_clipfrac' }] },
  {
    id: 'staleness',
    title: 'Staleness (versions)',
    series: [
      { key: 'rollout/staleness_min', label: 'min' },
      { key: 'rollout/staleness_mean', label: 'mean' },
      { key: 'rollout/staleness_max', label: 'max' },
    ],
  },
  { id: 'throughput', title: 'Throughput (tokens/s)', series: [{ key: 'perf/tokens_per_s', label: 'perf/tokens_per_s' }] },
];

/**
 * The plots of a run's records: {@link REPORT_PLOTS}, with one plot per evaluator metric the run logged
 * (`reward/<name>/mean` and `reward/<name>/std`, after the held-out reward); for a multi-policy run (metrics
 * namespaced by policy, `writer/rollout/reward_mean`) the same plots with one curve per policy and series
 * (`writer max`, …).
 *
 * @param records - the run's records.
 * @returns the plots to draw.
 */
export function reportPlotsFor(records: readonly MetricsRecord[]): readonly ReportPlot[] {
  const tags = new Set<string>();
  const keys = new Set<string>();
  for (const { metrics } of records) {
    for (const key of Object.keys(metrics)) {
      keys.add(key);
      const match = /^([^/]+)\/(?:rollout\/reward_mean|actor\/pg_loss)$/.exec(key);
      if (match && !['rollout', 'actor', 'val'].includes(match[1])) tags.add(match[1]);
    }
  }
  const names = rewardMetricNames(keys, tags);
  const at = REPORT_PLOTS.findIndex((plot) => plot.id === 'val_reward') + 1;
  const plots =
    names.length === 0 ? REPORT_PLOTS : [...REPORT_PLOTS.slice(0, at), ...names.map(rewardMetricPlot), ...REPORT_PLOTS.slice(at)];
  if (tags.size === 0) return plots;
  const policies = [...tags].sort();
  return plots.map((plot) => ({
    ...plot,
    series: policies.flatMap((tag) =>
      plot.series.map((s) => ({ key: `${tag}/${s.key}`, label: plot.series.length === 1 ? tag : `${tag} ${s.label}` })),
    ),
  }));
}

/** The evaluator metrics among `keys` (`reward/<name>/mean`, under a policy's prefix when `tags` has any), sorted. */
function rewardMetricNames(keys: ReadonlySet<string>, tags: ReadonlySet<string>): string[] {
  const names = new Set<string>();
  for (const key of keys) {
    for (const prefix of tags.size === 0 ? [''] : [...tags].map((tag) => `${tag}/`)) {
      if (key.startsWith(`${prefix}reward/`) && key.endsWith('/mean') && key.length > `${prefix}reward//mean`.length)
        names.add(key.slice(`${prefix}reward/`.length, -'/mean'.length));
    }
  }
  return [...names].sort();
}

/** The plot of one evaluator metric: its mean and std per step. */
function rewardMetricPlot(name: string): ReportPlot {
  return {
    id: `reward-${name.replace(/[^A-Za-z0-9_-]/g, '_')}`,
    title: `Reward metric: ${name}`,
    series: [
      { key: `reward/${name}/mean`, label: 'mean' },
      { key: `reward/${name}/std`, label: 'std' },
    ],
  };
}

/** Line colours, by series index within a plot. */
export const REPORT_PALETTE: readonly string[] = ['#1f77b4', '#d62728', '#2ca02c', '#9467bd', '#ff7f0e'];

/** Options of {@link writeReport}. */
export interface WriteReportOptions {
  /** Output file. Default `<run-dir>/report.html`. */
  readonly out?: string;
  /** Page title. Default: the run directory's name. */
  readonly title?: string;
  /** Plots to draw. Default {@link reportPlotsFor} the run's records. */
  readonly plots?: readonly ReportPlot[];
}

/** What {@link renderReport} draws from. */
export interface ReportInput {
  /** Page title (escaped). */
  readonly title: string;
  /** Records in file order. */
  readonly records: readonly MetricsRecord[];
  /** Whether a metrics file was found. Default `true`. */
  readonly found?: boolean;
  /** Lines of the file that were skipped. Default none. */
  readonly skippedLines?: readonly SkippedLine[];
  /** Plots to draw. Default {@link reportPlotsFor} the records. */
  readonly plots?: readonly ReportPlot[];
}

/**
 * Renders the report of a run directory and writes it (atomically: a temporary file, then a rename).
 *
 * @example
 * ```ts
 * import { writeReport } from 'rxrl';
 * const path = await writeReport('runs/reverse');   // runs/reverse/report.html
 * ```
 * @param runDir - the run directory holding `metrics.jsonl`.
 * @param options - output path, title and plots.
 * @returns the absolute path of the written page.
 * @throws RunDirError when `runDir` is not a directory.
 * @throws {@link ConfigError} naming the output path when it cannot be written (its directory is missing, it is
 *   a directory, permission is denied); `context.path` holds it.
 */
export async function writeReport(runDir: string, options: WriteReportOptions = {}): Promise<string> {
  const out = resolve(options.out ?? join(runDir, 'report.html'));
  const read = await readRunMetrics(runDir);
  const html = renderReport({
    title: options.title ?? basename(resolve(runDir)),
    records: read.records,
    found: read.found,
    skippedLines: read.skippedLines,
    ...(options.plots === undefined ? {} : { plots: options.plots }),
  });
  const temporary = `${out}.${process.pid}.tmp`;
  try {
    await writeFile(temporary, html, 'utf8');
    await rename(temporary, out);
  } catch (error) {
    await rm(temporary, { force: true }).catch(() => undefined);
    throw unwritable(out, error);
  }
  return out;
}

/** The typed error for an output file that cannot be written; anything but a file-system error passes through. */
function unwritable(out: string, error: unknown): unknown {
  const code = (error as { code?: unknown } | null)?.code;
  if (!(error instanceof Error) || typeof code !== 'string') return error;
  return new ConfigError(`cannot write the report to ${out}: ${fileSystemReason(code, out)}`, {
    cause: error,
    context: { key: 'out', path: out, code },
  });
}

/** Words for the common file-system error codes of writing `path`; the code itself otherwise. */
function fileSystemReason(code: string, path: string): string {
  switch (code) {
    case 'ENOENT':
      return `directory ${dirname(path)} does not exist`;
    case 'ENOTDIR':
      return 'a component of its directory is not a directory';
    case 'EISDIR':
      return 'it is a directory';
    case 'EACCES':
    case 'EPERM':
      return 'permission denied';
    default:
      return code;
  }
}

// ── geometry ──────────────────────────────────────────────────────────────────
const WIDTH = 560;
const HEIGHT = 240;
const MARGIN = { left: 64, right: 14, top: 12, bottom: 38 } as const;
const PLOT_W = WIDTH - MARGIN.left - MARGIN.right;
const PLOT_H = HEIGHT - MARGIN.top - MARGIN.bottom;
/** Pixels between the frame and the data range, so lines on a bound stay visible. */
const INSET = 4;
/** Above this many points per pixel column pair, a series is decimated (first/min/max/last per column). */
const DECIMATE_ABOVE = 2 * PLOT_W;

interface Point {
  readonly x: number;
  readonly y: number;
}

interface Domain {
  readonly min: number;
  readonly max: number;
  readonly ticks: readonly number[];
  readonly step: number;
}

/**
 * Renders the report page.
 *
 * @param input - title, records and plots.
 * @returns the complete HTML document.
 */
export function renderReport(input: ReportInput): string {
  const plots = input.plots ?? reportPlotsFor(input.records);
  const skipped = input.skippedLines ?? [];
  const series = collectSeries(input.records);
  const steps = input.records.map((record) => record.step).filter(Number.isFinite);
  const xDomain = domain(steps.length === 0 ? [0, 1] : steps, true);
  const figures = plots.map((plot) => renderPlot(plot, series, xDomain)).join('\n');
  return [
    '<!DOCTYPE html>',
    '<html lang="en">',
    '<head>',
    '<meta charset="utf-8">',
    `<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">`,
    '<meta name="viewport" content="width=device-width, initial-scale=1">',
    `<title>${escapeHtml(`rxrl report: ${input.title}`)}</title>`,
    `<style>${STYLE}</style>`,
    '</head>',
    '<body>',
    `<h1>rxrl report: ${escapeHtml(input.title)}</h1>`,
    renderSummary(input.records, input.found ?? true, skipped),
    renderStalls(input.records),
    `<main class="plots">\n${figures}\n</main>`,
    renderLastValues(series),
    '</body>',
    '</html>',
    '',
  ].join('\n');
}

const STYLE = [
  'body{margin:24px;font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:#222;background:#fff}',
  'h1{font-size:20px;margin:0 0 4px}',
  'h2{font-size:16px;margin:24px 0 8px}',
  '.summary{color:#555;margin:0 0 16px}',
  '.warning{color:#a15c00}',
  '.plots{display:grid;grid-template-columns:repeat(auto-fill,578px);gap:16px}',
  '.plot{margin:0;padding:8px;border:1px solid #ddd;border-radius:4px}',
  'figcaption{font-weight:600}',
  '.legend{list-style:none;margin:4px 0;padding:0;display:flex;flex-wrap:wrap;gap:4px 16px;font-size:12px}',
  '.swatch{display:inline-block;width:14px;height:3px;margin-right:6px;vertical-align:middle}',
  '.missing{color:#999}',
  'svg text{font-size:11px;fill:#555}',
  'svg .nodata{font-size:16px;fill:#999}',
  '.grid line{stroke:#eee}',
  '.frame{fill:none;stroke:#bbb}',
  'table{border-collapse:collapse;font-size:12px}',
  'td,th{padding:2px 12px 2px 0;text-align:left}',
  'td.num{text-align:right;font-variant-numeric:tabular-nums}',
].join('');

/** Per metric key: its points by step (the last line of a step wins), in step order. */
function collectSeries(records: readonly MetricsRecord[]): ReadonlyMap<string, readonly Point[]> {
  const byKey = new Map<string, Map<number, number>>();
  for (const record of records) {
    if (!Number.isFinite(record.step)) continue;
    for (const [key, value] of Object.entries(record.metrics)) {
      let points = byKey.get(key);
      if (points === undefined) {
        points = new Map();
        byKey.set(key, points);
      }
      points.set(record.step, value);
    }
  }
  const series = new Map<string, readonly Point[]>();
  for (const key of [...byKey.keys()].sort()) {
    const points = [...byKey.get(key)!].map(([x, y]) => ({ x, y })).sort((a, b) => a.x - b.x);
    series.set(key, points);
  }
  return series;
}

function renderPlot(plot: ReportPlot, series: ReadonlyMap<string, readonly Point[]>, x: Domain): string {
  const drawn = plot.series.map((s, index) => {
    const points = series.get(s.key) ?? [];
    const finite = points.filter((p) => Number.isFinite(p.y));
    return { ...s, color: REPORT_PALETTE[index % REPORT_PALETTE.length], points, finite };
  });
  const values = drawn.flatMap((s) => s.finite.map((p) => p.y));
  const empty = values.length === 0;
  const legend = drawn
    .map((s) => {
      if (s.finite.length === 0) {
        return `<li class="missing" data-series="${escapeHtml(s.key)}">${escapeHtml(s.label)}: no data</li>`;
      }
      const last = s.finite[s.finite.length - 1];
      return (
        `<li data-series="${escapeHtml(s.key)}"><span class="swatch" style="background:${s.color}"></span>` +
        `${escapeHtml(s.label)} <span class="last">(last ${escapeHtml(formatValue(last.y))} at step ${last.x})</span></li>`
      );
    })
    .join('');
  const svg: string[] = [
    `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${WIDTH} ${HEIGHT}" width="${WIDTH}" height="${HEIGHT}"` +
      ` role="img" aria-label="${escapeHtml(plot.title)}">`,
  ];
  if (empty) {
    svg.push(
      `<rect class="frame" x="${MARGIN.left}" y="${MARGIN.top}" width="${PLOT_W}" height="${PLOT_H}"/>`,
      `<text class="nodata" x="${MARGIN.left + PLOT_W / 2}" y="${MARGIN.top + PLOT_H / 2}" text-anchor="middle"` +
        ` dominant-baseline="middle">no data</text>`,
    );
  } else {
    const y = domain(values, false);
    const sx = (v: number): number => MARGIN.left + INSET + ((v - x.min) / (x.max - x.min)) * (PLOT_W - 2 * INSET);
    const sy = (v: number): number => MARGIN.top + PLOT_H - INSET - ((v - y.min) / (y.max - y.min)) * (PLOT_H - 2 * INSET);
    svg.push(renderAxes(x, y, sx, sy));
    for (const s of drawn) {
      if (s.finite.length === 0) continue;
      const segments = splitAtGaps(s.points).map((segment) => (segment.length > DECIMATE_ABOVE ? decimate(segment, sx) : segment));
      const d = segments.map((segment) => segment.map((p, i) => `${i === 0 ? 'M' : 'L'}${num(sx(p.x))} ${num(sy(p.y))}`).join('')).join('');
      svg.push(
        `<path class="series" data-series="${escapeHtml(s.key)}" data-points="${s.finite.length}" fill="none"` +
          ` stroke="${s.color}" stroke-width="1.75" stroke-linejoin="round" d="${d}"/>`,
      );
      const marked = plot.markers === true ? s.finite : segments.filter((seg) => seg.length === 1).flat();
      if (marked.length > 0) {
        svg.push(
          `<g class="markers" data-series="${escapeHtml(s.key)}" fill="${s.color}">` +
            marked.map((p) => `<circle cx="${num(sx(p.x))}" cy="${num(sy(p.y))}" r="3"/>`).join('') +
            '</g>',
        );
      }
    }
  }
  svg.push('</svg>');
  return [
    `<figure class="plot" id="plot-${escapeHtml(plot.id)}" data-plot="${escapeHtml(plot.id)}" data-empty="${empty}">`,
    `<figcaption>${escapeHtml(plot.title)}</figcaption>`,
    `<ul class="legend">${legend}</ul>`,
    svg.join('\n'),
    '</figure>',
  ].join('\n');
}

function renderAxes(x: Domain, y: Domain, sx: (v: number) => number, sy: (v: number) => number): string {
  const left = MARGIN.left;
  const right = MARGIN.left + PLOT_W;
  const top = MARGIN.top;
  const bottom = MARGIN.top + PLOT_H;
  const parts: string[] = ['<g class="grid">'];
  for (const t of y.ticks) parts.push(`<line x1="${left}" x2="${right}" y1="${num(sy(t))}" y2="${num(sy(t))}"/>`);
  for (const t of x.ticks) parts.push(`<line x1="${num(sx(t))}" x2="${num(sx(t))}" y1="${top}" y2="${bottom}"/>`);
  parts.push('</g>', `<rect class="frame" x="${left}" y="${top}" width="${PLOT_W}" height="${PLOT_H}"/>`, '<g class="axes">');
  for (const t of y.ticks) {
    parts.push(`<text x="${left - 6}" y="${num(sy(t))}" text-anchor="end" dominant-baseline="middle">${tick(t, y.step)}</text>`);
  }
  for (const t of x.ticks) {
    parts.push(`<text x="${num(sx(t))}" y="${bottom + 14}" text-anchor="middle">${tick(t, x.step)}</text>`);
  }
  parts.push(`<text x="${left + PLOT_W / 2}" y="${HEIGHT - 4}" text-anchor="middle">step</text>`, '</g>');
  return parts.join('');
}

/** A "nice" axis over `values`: bounds on multiples of a 1-2-5 step, about five ticks. */
function domain(values: readonly number[], integer: boolean): Domain {
  let [min, max] = extent(values);
  if (min === max) {
    const pad = integer ? 1 : Math.abs(min) > 0 ? Math.abs(min) * 0.1 : 1;
    min -= pad;
    max += pad;
  }
  let step = niceStep((max - min) / 5);
  if (integer) step = Math.max(1, step);
  const lo = Math.floor(min / step) * step;
  const hi = Math.ceil(max / step) * step;
  const ticks: number[] = [];
  for (let i = 0; lo + i * step <= hi + step * 1e-9; i++) ticks.push(lo + i * step);
  return { min: lo, max: hi, ticks, step };
}

/** `[min, max]` of a non-empty array, without spreading it into arguments (long runs). */
function extent(values: readonly number[]): [number, number] {
  let min = Infinity;
  let max = -Infinity;
  for (const v of values) {
    if (v < min) min = v;
    if (v > max) max = v;
  }
  return [min, max];
}

function niceStep(raw: number): number {
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const normalized = raw / magnitude;
  const nice = normalized <= 1 ? 1 : normalized <= 2 ? 2 : normalized <= 5 ? 5 : 10;
  return nice * magnitude;
}

/** Consecutive runs of finite points; a non-finite value breaks the line. */
function splitAtGaps(points: readonly Point[]): Point[][] {
  const segments: Point[][] = [];
  let current: Point[] = [];
  for (const p of points) {
    if (Number.isFinite(p.y)) current.push(p);
    else if (current.length > 0) {
      segments.push(current);
      current = [];
    }
  }
  if (current.length > 0) segments.push(current);
  return segments;
}

/** Keeps the first, lowest, highest and last point of each pixel column: the drawn line looks the same. */
function decimate(points: readonly Point[], sx: (v: number) => number): Point[] {
  const kept: Point[] = [];
  let i = 0;
  while (i < points.length) {
    const column = Math.floor(sx(points[i].x));
    let j = i;
    let lowest = i;
    let highest = i;
    while (j < points.length && Math.floor(sx(points[j].x)) === column) {
      if (points[j].y < points[lowest].y) lowest = j;
      if (points[j].y > points[highest].y) highest = j;
      j++;
    }
    for (const index of [...new Set([i, lowest, highest, j - 1])].sort((a, b) => a - b)) kept.push(points[index]);
    i = j;
  }
  return kept;
}

function renderSummary(records: readonly MetricsRecord[], found: boolean, skipped: readonly SkippedLine[]): string {
  if (!found) return '<p class="summary warning">No metrics.jsonl in this run directory yet.</p>';
  const steps = records.map((r) => r.step).filter(Number.isFinite);
  const times = records.map((r) => r.time).filter(Number.isFinite);
  const parts = [`${records.length} records`];
  if (steps.length > 0) parts.push(`steps ${extent(steps).join('–')}`);
  if (times.length > 0) {
    const [first, last] = extent(times);
    parts.push(`from ${new Date(first).toISOString()}`, `${((last - first) / 1000).toFixed(1)} s of wall time`);
  }
  let html = `<p class="summary">metrics.jsonl: ${escapeHtml(parts.join(', '))}</p>`;
  if (skipped.length > 0) {
    const lines = skipped.map((s) => `${s.line} (${s.reason})`).join(', ');
    html += `\n<p class="summary warning">Skipped ${skipped.length} unreadable line(s): ${escapeHtml(lines)}</p>`;
  }
  return html;
}

/** Prefix of the metrics a stalled module leaves (`activity/stalled_s/<module>`: seconds idle when reported). */
const STALL_PREFIX = 'activity/stalled_s/';

/** The run's stalls, one row each (module, the step it followed, seconds idle when reported); nothing without any. */
function renderStalls(records: readonly MetricsRecord[]): string {
  const rows = records.flatMap((record) =>
    Object.entries(record.metrics)
      .filter(([key]) => key.startsWith(STALL_PREFIX))
      .map(([key, seconds]) => {
        const module = key.slice(STALL_PREFIX.length);
        const when = Number.isFinite(record.time) ? new Date(record.time).toISOString() : '';
        return `<tr><td>${escapeHtml(module)}</td><td class="num">${record.step + 1}</td><td class="num">${escapeHtml(formatValue(seconds))}</td><td>${escapeHtml(when)}</td></tr>`;
      }),
  );
  if (rows.length === 0) return '';
  return [
    `<h2 class="warning">Stalls (${rows.length})</h2>`,
    '<table class="stalls"><thead><tr><th>module</th><th>during step</th><th>idle s</th><th>reported</th></tr></thead><tbody>',
    ...rows,
    '</tbody></table>',
  ].join('\n');
}

function renderLastValues(series: ReadonlyMap<string, readonly Point[]>): string {
  if (series.size === 0) return '';
  const rows = [...series].map(([key, points]) => {
    const last = points[points.length - 1];
    return `<tr><td>${escapeHtml(key)}</td><td class="num">${escapeHtml(formatValue(last.y))}</td><td class="num">${last.x}</td></tr>`;
  });
  return [
    '<h2>Last values</h2>',
    '<table class="last-values"><thead><tr><th>metric</th><th>value</th><th>step</th></tr></thead><tbody>',
    ...rows,
    '</tbody></table>',
  ].join('\n');
}

/** A coordinate with one decimal (`-0` printed as `0`). */
function num(value: number): string {
  const rounded = Math.round(value * 10) / 10;
  return String(rounded === 0 ? 0 : rounded);
}

/** A tick label with as many decimals as the tick step needs. */
function tick(value: number, step: number): string {
  const decimals = Math.min(12, Math.max(0, -Math.floor(Math.log10(step) + 1e-9)));
  const text = value.toFixed(decimals);
  return Number(text) === 0 ? (0).toFixed(decimals) : text;
}

/** A metric value for people: four significant digits, exponent notation when very large or small. */
function formatValue(value: number): string {
  if (!Number.isFinite(value)) return String(value);
  if (value === 0) return '0';
  const magnitude = Math.abs(value);
  return magnitude >= 1e5 || magnitude < 1e-3 ? value.toExponential(3) : String(Number(value.toPrecision(4)));
}

/**
 * Escapes text for HTML element content and quoted attribute values.
 *
 * @param text - any text.
 */
export function escapeHtml(text: string): string {
  return text.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&#39;');
}
