import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import {
  escapeHtml,
  REPORT_PLOTS,
  renderReport,
  reportPlotsFor,
  RunDirError,
  writeReport,
  type MetricsRecord,
} from '../../lib/observe/index.js';

function record(step: number, metrics: Record<string, number>): MetricsRecord {
  return { step, version: step + 1, time: 1_700_000_000_000 + step * 1000, metrics };
}

/** `<path class="series" …>` attributes per series key. */
function seriesPaths(html: string): Map<string, { points: number; d: string }> {
  const found = new Map<string, { points: number; d: string }>();
  for (const match of html.matchAll(/<path class="series" data-series="([^"]*)" data-points="(\d+)"[^>]* d="([^"]*)"/g)) {
    found.set(match[1], { points: Number(match[2]), d: match[3] });
  }
  return found;
}

describe('renderReport', () => {
  it('draws one path per present series with one vertex per step', () => {
    const records = Array.from({ length: 10 }, (_, s) =>
      record(s, { 'rollout/reward_mean': s / 10, 'actor/pg_loss': 1 - s / 10, 'rollout/staleness_max': s % 2 }),
    );
    const html = renderReport({ title: 'run', records });
    const paths = seriesPaths(html);
    expect([...paths.keys()].sort()).toEqual(['actor/pg_loss', 'rollout/reward_mean', 'rollout/staleness_max']);
    for (const { points, d } of paths.values()) {
      expect(points).toBe(10);
      expect(d.match(/[ML]/g)).toHaveLength(10);
    }
    expect(html.match(/<figure class="plot"/g)).toHaveLength(REPORT_PLOTS.length);
    expect(html).toContain('<li class="missing" data-series="actor/kl_loss">actor/kl_loss: no data</li>');
    expect(html).toContain('data-plot="throughput" data-empty="true"');
  });

  it('lists the stalls of the run (activity/stalled_s/<module> lines), and no such table without any', () => {
    const records = [
      record(0, { 'rollout/reward_mean': 0.1 }),
      record(0, { 'activity/stalled_s/rollout': 300.5 }),
      record(3, { 'activity/stalled_s/sync<x>': 301 }),
    ];
    const html = renderReport({ title: 'run', records });
    expect(html).toContain('<h2 class="warning">Stalls (2)</h2>');
    expect(html).toContain('<tr><td>rollout</td><td class="num">1</td><td class="num">300.5</td><td>2023-11-14T22:13:20.000Z</td></tr>');
    expect(html).toContain('<td>sync&lt;x&gt;</td><td class="num">4</td>');
    expect(renderReport({ title: 'run', records: records.slice(0, 1) })).not.toContain('Stalls');
  });

  it('a multi-policy run (metrics under <policy>/) gets one curve per policy in each plot', () => {
    const records = Array.from({ length: 4 }, (_, s) =>
      record(s, {
        'writer/rollout/reward_mean': s / 4,
        'editor/rollout/reward_mean': s / 8,
        'editor/rollout/staleness_max': 1,
        'val/writer/reward_mean': 0.5,
      }),
    );
    const html = renderReport({ title: 'agents', records });
    expect([...seriesPaths(html).keys()].sort()).toEqual([
      'editor/rollout/reward_mean',
      'editor/rollout/staleness_max',
      'writer/rollout/reward_mean',
    ]);
    const plots = reportPlotsFor(records);
    expect(plots.find((p) => p.id === 'reward')?.series.map((s) => s.label)).toEqual(['editor', 'writer']);
    expect(plots.find((p) => p.id === 'staleness')?.series.map((s) => s.label)).toEqual([
      'editor min',
      'editor mean',
      'editor max',
      'writer min',
      'writer mean',
      'writer max',
    ]);
    expect(reportPlotsFor([record(0, { 'rollout/reward_mean': 1 })])).toBe(REPORT_PLOTS);
  });

  it("draws each evaluator metric's mean and std (reward/<name>/mean, /std) in a plot of its own", () => {
    const records = Array.from({ length: 3 }, (_, s) =>
      record(s, {
        'rollout/reward_mean': s / 3,
        'reward/mean': s / 3,
        'reward/std': 0.1,
        'reward/accuracy/mean': s / 4,
        'reward/accuracy/std': 0.2,
        'reward/length_match/mean': 1,
      }),
    );
    const plots = reportPlotsFor(records);
    expect(plots.map((p) => p.id).slice(0, 4)).toEqual(['reward', 'val_reward', 'reward-accuracy', 'reward-length_match']);
    expect(plots).toHaveLength(REPORT_PLOTS.length + 2);
    const html = renderReport({ title: 'run', records });
    expect(html).toContain('<figcaption>Reward metric: accuracy</figcaption>');
    const paths = seriesPaths(html);
    expect(paths.get('reward/accuracy/mean')?.points).toBe(3);
    expect(paths.get('reward/accuracy/std')?.points).toBe(3);
    expect(paths.get('reward/length_match/mean')?.points).toBe(3);
    expect(html).toContain('<li class="missing" data-series="reward/length_match/std">std: no data</li>');
    // Per policy in a multi-policy run.
    const agents = reportPlotsFor([record(0, { 'writer/rollout/reward_mean': 1, 'writer/reward/accuracy/mean': 1 })]);
    expect(agents.find((p) => p.id === 'reward-accuracy')?.series.map((s) => s.key)).toEqual([
      'writer/reward/accuracy/mean',
      'writer/reward/accuracy/std',
    ]);
  });

  it('is deterministic and self-contained: no script, no external reference, a CSP that forbids both', () => {
    const records = [record(0, { 'rollout/reward_mean': 0.1 }), record(1, { 'rollout/reward_mean': 0.2 })];
    const html = renderReport({ title: 'run', records });
    expect(renderReport({ title: 'run', records })).toBe(html);
    expect(html).not.toMatch(/<script|<link|<img|src=|url\(|@import/i);
    expect(new Set(html.match(/https?:\/\/[^"]*/g))).toEqual(new Set(['http://www.w3.org/2000/svg']));
    expect(html).toContain(`content="default-src 'none'; style-src 'unsafe-inline'"`);
  });

  it('escapes every text that comes from the run', () => {
    const evil = '<img src=x onerror="alert(1)">&';
    const html = renderReport({ title: `<script>alert('t')</script>`, records: [record(0, { [evil]: 1, 'rollout/reward_mean': 1 })] });
    expect(html).not.toContain('<script>');
    expect(html).not.toContain('<img');
    expect(html).toContain('&lt;script&gt;alert(&#39;t&#39;)&lt;/script&gt;');
    expect(html).toContain(escapeHtml(evil));
    expect(escapeHtml(`<a href="x">'&'</a>`)).toBe('&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;');
  });

  it('shows "no data" everywhere for an empty or missing file, without throwing', () => {
    for (const found of [true, false]) {
      const html = renderReport({ title: 'empty', records: [], found });
      expect(html.match(/data-empty="true"/g)).toHaveLength(REPORT_PLOTS.length);
      expect(html.match(/>no data<\/text>/g)).toHaveLength(REPORT_PLOTS.length);
      expect(seriesPaths(html).size).toBe(0);
    }
    expect(renderReport({ title: 'empty', records: [], found: false })).toContain('No metrics.jsonl');
  });

  it('keeps the last line of a repeated step (resume), breaks lines at non-finite values, marks isolated points', () => {
    const records = [
      record(0, { 'rollout/reward_mean': 0 }),
      record(1, { 'rollout/reward_mean': 9 }),
      record(2, { 'rollout/reward_mean': 9 }),
      record(1, { 'rollout/reward_mean': 0.5 }), // resumed from step 0: these lines win
      record(2, { 'rollout/reward_mean': Number.NaN }),
      record(3, { 'rollout/reward_mean': 1 }),
      record(4, { 'actor/pg_loss': 2 }),
    ];
    const html = renderReport({ title: 'resumed', records });
    const reward = seriesPaths(html).get('rollout/reward_mean')!;
    expect(reward.points).toBe(3);
    expect(reward.d.match(/M/g)).toHaveLength(2);
    expect(html).toMatch(/<g class="markers" data-series="rollout\/reward_mean"[^>]*><circle [^>]*\/><\/g>/);
    expect(html).toMatch(/<g class="markers" data-series="actor\/pg_loss"[^>]*><circle /);
    expect(html).toContain('(last 1 at step 3)');
    expect(html).not.toMatch(/>9<\/td>/);
  });

  it('marks every validation point and decimates very long series without losing the count', () => {
    const records = Array.from({ length: 20_000 }, (_, s) =>
      record(s, { 'rollout/reward_mean': Math.sin(s / 50), ...(s % 5000 === 0 ? { 'val/reward_mean': s / 20_000 } : {}) }),
    );
    const html = renderReport({ title: 'long', records });
    const reward = seriesPaths(html).get('rollout/reward_mean')!;
    expect(reward.points).toBe(20_000);
    const vertices = reward.d.match(/[ML]/g)!.length;
    expect(vertices).toBeGreaterThan(400);
    expect(vertices).toBeLessThanOrEqual(4 * 560);
    expect(seriesPaths(html).get('val/reward_mean')!.points).toBe(4);
    expect(
      html.match(/<g class="markers" data-series="val\/reward_mean"[^>]*>((?:<circle [^>]*\/>)*)<\/g>/)![1].match(/<circle/g),
    ).toHaveLength(4);
  });
});

describe('writeReport', () => {
  it('writes <run-dir>/report.html (or --out) and returns its path; the same input gives the same bytes', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-report-'));
    writeFileSync(join(dir, 'metrics.jsonl'), '{"step":0,"version":1,"time":1,"rollout/reward_mean":0.5}\n{"step":1,"vers');
    const path = await writeReport(dir);
    expect(path).toBe(join(dir, 'report.html'));
    const first = readFileSync(path, 'utf8');
    expect(first).toContain('Skipped 1 unreadable line(s): 2 (truncated)');
    const out = join(dir, 'elsewhere.html');
    expect(await writeReport(dir, { out })).toBe(out);
    expect(readFileSync(out, 'utf8')).toBe(first);
    expect(existsSync(`${out}.${process.pid}.tmp`)).toBe(false);
  });

  it('renders a run directory without metrics and rejects a missing directory with a RunDirError', async () => {
    const dir = join(mkdtempSync(join(tmpdir(), 'rxrl-report-')), 'fresh');
    mkdirSync(dir);
    expect(readFileSync(await writeReport(dir, { title: 'fresh run' }), 'utf8')).toContain('rxrl report: fresh run');
    await expect(writeReport(join(dir, 'missing'))).rejects.toBeInstanceOf(RunDirError);
  });
});
