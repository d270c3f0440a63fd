import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../lib/core/errors.js';
import { formatStepLine, Progress, type ProgressStream } from '../../lib/observe/index.js';

class FakeStream implements ProgressStream {
  readonly chunks: string[] = [];
  constructor(
    readonly isTTY: boolean,
    readonly columns?: number,
  ) {}
  write(chunk: string): boolean {
    this.chunks.push(chunk);
    return true;
  }
  get text(): string {
    return this.chunks.join('');
  }
}

const metrics = { 'rollout/reward_mean': 0.5, 'actor/pg_loss': 0.0123, 'actor/entropy': 1.2, 'rollout/staleness_max': 1 };

describe('Progress', () => {
  it('formats the step line: step/total, s/it, ETA, then the metrics, joined by " · "', () => {
    expect(formatStepLine({ step: 29, metrics: { ...metrics, 'rollout/reward_mean': 0.512 } }, { total: 800, secondsPerStep: 12.4 })).toBe(
      'step 30/800 · 12.4 s/it · ETA 2:39:08 · reward 0.512 · loss 0.0123 · entropy 1.200 · staleness 1',
    );
    expect(formatStepLine({ step: 29, metrics }, { total: 43, secondsPerStep: 12.4 })).toBe(
      'step 30/43 · 12.4 s/it · ETA 2:41 · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1',
    );
    // No total: no "/N", no ETA; no pace yet: neither; the last step: no ETA; a metric the step lacks: left out.
    expect(formatStepLine({ step: 1, metrics }, { secondsPerStep: 0.534 })).toBe(
      'step 2 · 0.53 s/it · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1',
    );
    expect(formatStepLine({ step: 0, metrics: {} })).toBe('step 1');
    expect(formatStepLine({ step: 9, metrics: { 'actor/sft_loss': 0.25 } }, { total: 10, secondsPerStep: 0.0123 })).toBe(
      'step 10/10 · 0.012 s/it · loss 0.2500',
    );
    // A multi-policy run: the policy's own metrics, and its name first.
    expect(
      formatStepLine({ step: 2, metrics: { 'writer/rollout/reward_mean': 0.25, 'rollout/reward_mean': 9 } }, { policy: 'writer' }),
    ).toBe('writer step 3 · reward 0.250');
  });

  it('without a TTY prints a plain line every N steps and the last one, with the moving pace and the ETA', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, total: 7, every: 3 });
    // The first step takes 10 s (loading included), then 2 s each.
    for (let step = 0; step < 7; step++) progress.update({ step, metrics }, 10 + 2 * step);
    progress.done();
    expect(stream.text.trimEnd().split('\n')).toEqual([
      'step 3/7 · 2.0 s/it · ETA 0:08 · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1',
      'step 6/7 · 2.0 s/it · ETA 0:02 · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1',
      'step 7/7 · 2.0 s/it · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1',
    ]);
    expect(stream.text).not.toContain('\r');
  });

  it('the pace is the first step alone, then the average of the last ten steps (a resumed run counts from where it began)', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, total: 100 });
    progress.update({ step: 49, metrics: {} }, 30); // resumed at step 50: 30 s to load and take one step
    progress.update({ step: 50, metrics: {} }, 31);
    for (let step = 51; step < 70; step++) progress.update({ step, metrics: {} }, 31 + 4 * (step - 50));
    const lines = stream.text.trimEnd().split('\n');
    expect(lines[0]).toBe('step 50/100 · 30.0 s/it · ETA 25:00');
    expect(lines[1]).toBe('step 51/100 · 1.0 s/it · ETA 0:49');
    expect(lines.at(-1)).toBe('step 70/100 · 4.0 s/it · ETA 2:00');
  });

  it('shows the stalled modules at the end of the line (plain and bar), and nothing while none is', () => {
    let stalled: string[] = [];
    const plain = new FakeStream(false);
    const progress = new Progress({ stream: plain, stalls: () => stalled });
    progress.update({ step: 0, metrics }, 1);
    stalled = ['rollout', 'sync'];
    progress.update({ step: 1, metrics }, 2);
    expect(plain.text.trimEnd().split('\n')).toEqual([
      formatStepLine({ step: 0, metrics }, { secondsPerStep: 1 }),
      `${formatStepLine({ step: 1, metrics }, { secondsPerStep: 1 })} · stalled: rollout, sync`,
    ]);
    const tty = new FakeStream(true, 400);
    const bar = new Progress({ stream: tty, total: 4, stalls: () => stalled });
    bar.update({ step: 0, metrics }, 1);
    bar.message('rxrl: warning: rollout stalled');
    expect(tty.chunks.at(-1)).toContain('staleness 1 · stalled: rollout, sync');
  });

  it('done() prints the last step when the cadence skipped it (no total)', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, every: 10 });
    for (let step = 0; step < 12; step++) progress.update({ step, metrics }, step + 1);
    progress.done();
    progress.done();
    expect(
      stream.text
        .trimEnd()
        .split('\n')
        .map((l) => l.slice(0, 10)),
    ).toEqual(['step 10 · ', 'step 12 · ']);
  });

  it('on a TTY redraws one bar line in place with counter and ETA, then ends it', () => {
    const stream = new FakeStream(true);
    const progress = new Progress({ stream, total: 4, barWidth: 8 });
    progress.update({ step: 0, metrics }, 10);
    progress.update({ step: 1, metrics }, 20);
    expect(stream.chunks).toHaveLength(2);
    expect(stream.chunks[1]).toBe(
      '\r████░░░░ step 2/4 · 10.0 s/it · ETA 0:20 · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1\x1b[K',
    );
    progress.update({ step: 3, metrics }, 125);
    expect(stream.chunks[2]).toContain('████████ step 4/4 · 38.3 s/it · reward');
    expect(stream.chunks[2]).not.toContain('ETA');
    progress.done();
    expect(stream.text.split('\n')).toHaveLength(2);
    expect(stream.text.endsWith('\n')).toBe(true);
  });

  it('cuts the bar to the terminal width and prints messages above it', () => {
    const stream = new FakeStream(true, 30);
    const progress = new Progress({ stream, total: 10 });
    progress.update({ step: 0, metrics }, 1);
    expect(stream.chunks[0]).toBe(`\r${'██░░░░░░░░░░░░░░░░░░ step 1/10 · 1.0'.slice(0, 29)}\x1b[K`);
    progress.message('checkpoint saved');
    expect(stream.chunks[1]).toBe('\r\x1b[Kcheckpoint saved\n');
    expect(stream.chunks[2]).toBe(stream.chunks[0]);
  });

  it('without a total shows a counter and no bar, and tty can be forced', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, tty: true });
    progress.update({ step: 4, metrics }, 3700);
    expect(stream.text).toBe('\rstep 5 · 3700 s/it · reward 0.500 · loss 0.0123 · entropy 1.200 · staleness 1\x1b[K');
    expect(progress.tty).toBe(true);
  });

  it('per policy: each line names its policy, reads its metrics, and keeps its own pace', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, total: 10, perPolicy: true });
    const step = (modelTag: string, n: number, reward: number) => ({
      step: n,
      modelTag,
      metrics: { [`${modelTag}/rollout/reward_mean`]: reward },
    });
    progress.update(step('writer', 0, 0.1), 2);
    progress.update(step('editor', 0, 0.2), 3);
    progress.update(step('writer', 1, 0.3), 4);
    expect(stream.text.trimEnd().split('\n')).toEqual([
      'writer step 1/10 · 2.0 s/it · ETA 0:18 · reward 0.100',
      'editor step 1/10 · 3.0 s/it · ETA 0:27 · reward 0.200',
      'writer step 2/10 · 2.0 s/it · ETA 0:16 · reward 0.300',
    ]);
  });

  it('rejects a bad cadence with a ConfigError', () => {
    expect(() => new Progress({ stream: new FakeStream(false), every: 0 })).toThrow(ConfigError);
    expect(() => new Progress({ stream: new FakeStream(false), total: 2.5 })).toThrow(/total/);
  });
});
