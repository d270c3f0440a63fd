/**
 * The report as a browser draws it: rendered in headless Chromium (Debian's `chromium`), checked through the DOM
 * after layout and through the pixels of a screenshot. `npm test` installs Chromium where it can (as root); a missing
 * Chromium fails these tests, unless the setup said it could not install it here (no root), which skips them.
 */
import { mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { REPORT_PALETTE, REPORT_PLOTS, writeReport } from '../../lib/observe/index.js';
import { unavailable } from '../helpers/testSetup.js';
import { chromiumPath, renderInChromium } from './chromium.js';
import { countColor, countNonWhite, decodePng, type DecodedPng, type PixelRect } from './png.js';

const STEPS = 20;
const VAL_STEPS = [0, 5, 10, 15, 19];

/** A run with known values: every plotted series but `actor/kl_loss`, and a line cut off by a kill. */
function knownRun(dir: string): void {
  const lines: string[] = [];
  for (let s = 0; s < STEPS; s++) {
    lines.push(
      JSON.stringify({
        step: s,
        version: s + 1,
        time: 1_700_000_000_000 + s * 2000,
        'rollout/reward_mean': s / (STEPS - 1),
        'actor/pg_loss': 0.5 - s / 40,
        'actor/ppo_kl': 0.001 * s,
        'actor/pg_clipfrac': 0.1 + 0.01 * (s % 4),
        'rollout/staleness_min': 0,
        'rollout/staleness_mean': (s % 2) * 0.5,
        'rollout/staleness_max': s % 2,
        'perf/tokens_per_s': 1000 + 10 * s,
        '<b>odd key</b>': 1,
        ...(VAL_STEPS.includes(s) ? { 'val/reward_mean': s / STEPS } : {}),
      }),
    );
  }
  writeFileSync(join(dir, 'metrics.jsonl'), `${lines.join('\n')}\n{"step":20,"version":21,"rollout/rew`);
}

/** The series each plot must draw, with their point counts (`actor/kl_loss` has none). */
const EXPECTED: Readonly<Record<string, Readonly<Record<string, number>>>> = {
  reward: { 'rollout/reward_mean': STEPS },
  val_reward: { 'val/reward_mean': VAL_STEPS.length },
  loss: { 'actor/pg_loss': STEPS },
  kl: { 'actor/ppo_kl': STEPS },
  clipfrac: { 'actor/pg_clipfrac': STEPS },
  staleness: { 'rollout/staleness_min': STEPS, 'rollout/staleness_mean': STEPS, 'rollout/staleness_max': STEPS },
  throughput: { 'perf/tokens_per_s': STEPS },
};

/**
 * A copy of the report that measures itself: the CSP is dropped and a script records, for each series path,
 * its rendered length (`getTotalLength`), and for each plot the on-screen rectangle of its SVG. Layout is the
 * same as the real page's (checked by comparing screenshots).
 */
function probeCopy(reportPath: string): string {
  const html = readFileSync(reportPath, 'utf8');
  const probe = `<script>
for (const path of document.querySelectorAll('path.series')) path.setAttribute('data-length', path.getTotalLength().toFixed(1));
for (const svg of document.querySelectorAll('figure.plot svg')) {
  const r = svg.getBoundingClientRect();
  svg.setAttribute('data-rect', [r.x, r.y, r.width, r.height].map((v) => v.toFixed(1)).join(','));
}
document.body.setAttribute('data-probed', 'yes');
</script>`;
  const withoutCsp = html.replace(/<meta http-equiv="Content-Security-Policy"[^>]*>/, '');
  expect(withoutCsp).not.toBe(html);
  const path = reportPath.replace(/\.html$/, '.probe.html');
  writeFileSync(path, withoutCsp.replace('</body>', `${probe}\n</body>`));
  return path;
}

function attributes(tag: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const match of tag.matchAll(/([\w-]+)="([^"]*)"/g)) out[match[1]] = match[2];
  return out;
}

interface DrawnPlot {
  readonly attrs: Record<string, string>;
  readonly rect: PixelRect;
  readonly paths: ReadonlyArray<Record<string, string>>;
  readonly circles: number;
  readonly html: string;
}

/** The plots of a dumped DOM, in page order. */
function plotsOf(dom: string): DrawnPlot[] {
  return [...dom.matchAll(/<figure class="plot"[^>]*>[\s\S]*?<\/figure>/g)].map(([html]) => {
    const svg = attributes(html.match(/<svg [^>]*>/)![0]);
    const [x, y, width, height] = svg['data-rect'].split(',').map(Number);
    return {
      attrs: attributes(html.match(/<figure [^>]*>/)![0]),
      rect: { x, y, width, height },
      paths: [...html.matchAll(/<path class="series"[^>]*>/g)].map(([tag]) => attributes(tag)),
      circles: (html.match(/<circle /g) ?? []).length,
      html,
    };
  });
}

function samePixels(a: DecodedPng, b: DecodedPng): boolean {
  return a.width === b.width && a.height === b.height && Buffer.from(a.rgba).equals(Buffer.from(b.rgba));
}

describe.skipIf(unavailable('chromium') !== undefined)('rxrl report in headless Chromium', () => {
  it('finds Chromium (install it: apt-get install -y chromium)', () => {
    expect(chromiumPath()).toMatch(/chromium/);
  });

  it('draws every series of a known run, with the right number of points, in its own colour', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-report-chromium-'));
    knownRun(dir);
    const report = await writeReport(dir);
    const [page, real] = [await renderInChromium(probeCopy(report)), await renderInChromium(report)];
    expect(page.dom).toContain('data-probed="yes"');

    // The DOM after layout: one plot per entry, one rendered path per series with one vertex per point.
    const plots = plotsOf(page.dom);
    expect(plots.map((p) => p.attrs['data-plot'])).toEqual(REPORT_PLOTS.map((p) => p.id));
    for (const plot of plots) {
      const expected = EXPECTED[plot.attrs['data-plot']];
      expect(plot.attrs['data-empty']).toBe('false');
      expect(Object.fromEntries(plot.paths.map((p) => [p['data-series'], Number(p['data-points'])]))).toEqual(expected);
      for (const path of plot.paths) {
        expect(path.d.match(/[ML]/g)).toHaveLength(Number(path['data-points']));
        expect(Number(path['data-length'])).toBeGreaterThan(100); // spans most of the 470 px wide axis
      }
      expect(plot.rect.width).toBe(560);
      expect(plot.rect.height).toBe(240);
    }
    const byId = new Map(plots.map((p) => [p.attrs['data-plot'], p]));
    expect(byId.get('val_reward')!.circles).toBe(VAL_STEPS.length);
    expect(byId.get('kl')!.html).toContain('actor/kl_loss: no data');
    expect(page.dom).toContain('Skipped 1 unreadable line(s): 21 (truncated)');
    expect(page.dom).toContain('&lt;b&gt;odd key&lt;/b&gt;');
    expect(page.dom).not.toContain('<b>odd key');

    // The pixels: the probe lays out exactly like the real page, and every series is drawn in its colour
    // inside its plot's rectangle.
    const image = decodePng(page.png);
    expect([image.width, image.height]).toEqual([1280, 1700]);
    expect(samePixels(image, decodePng(real.png))).toBe(true);
    expect(countNonWhite(image)).toBeGreaterThan(20_000);
    for (const plot of plots) {
      const series = Object.keys(EXPECTED[plot.attrs['data-plot']]);
      for (const [index, color] of REPORT_PALETTE.slice(0, 3).entries()) {
        const ink = countColor(image, color, plot.rect);
        if (index < series.length) expect(ink, `${plot.attrs['data-plot']}: ${series[index]} in ${color}`).toBeGreaterThan(150);
        else expect(ink, `${plot.attrs['data-plot']}: nothing in ${color}`).toBe(0);
      }
    }
  }, 60_000);

  it('shows "no data" in every plot of a run without metrics, and draws no curve', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'rxrl-report-chromium-')), 'fresh');
    mkdirSync(dir);
    writeFileSync(join(dir, 'metrics.jsonl'), '');
    const page = await renderInChromium(probeCopy(await writeReport(dir)));
    const plots = plotsOf(page.dom);
    expect(plots).toHaveLength(REPORT_PLOTS.length);
    const image = decodePng(page.png);
    for (const plot of plots) {
      expect(plot.attrs['data-empty']).toBe('true');
      expect(plot.paths).toHaveLength(0);
      expect(plot.html).toMatch(/>no data<\/text>/);
      expect(countNonWhite(image, plot.rect)).toBeGreaterThan(100); // the frame and the text are drawn
      for (const color of REPORT_PALETTE) expect(countColor(image, color, plot.rect)).toBe(0);
    }
  }, 60_000);
});
