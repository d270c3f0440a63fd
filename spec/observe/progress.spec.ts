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
  it('formats the step line rxrl start prints', () => {
    expect(formatStepLine({ step: 1, metrics }, 3.44)).toBe('step    2  reward 0.500  loss 0.0123  entropy 1.200  staleness 1  3.4s');
    expect(formatStepLine({ step: 0, metrics: {} }, 0)).toBe('step    1  reward 0.000  loss 0.0000  entropy 0.000  staleness 0  0.0s');
  });

  it('without a TTY prints a plain line every N steps and the last one', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, total: 7, every: 3 });
    for (let step = 0; step < 7; step++) progress.update({ step, metrics }, step);
    progress.done();
    const lines = stream.text.trimEnd().split('\n');
    expect(lines.map((l) => l.slice(0, 9))).toEqual(['step    3', 'step    6', 'step    7']);
    expect(stream.text).not.toContain('\r');
  });

  it('shows the stalled modules at the end of the line (plain and bar), and nothing while none is', () => {
    let stalled: string[] = [];
    const plain = new FakeStream(false);
    const progress = new Progress({ stream: plain, stalls: () => stalled });
    progress.update({ step: 0, metrics }, 1);
    stalled = ['rollout', 'sync'];
    progress.update({ step: 1, metrics }, 2);
    expect(plain.text.trimEnd().split('\n')).toEqual([
      formatStepLine({ step: 0, metrics }, 1),
      `${formatStepLine({ step: 1, metrics }, 2)}  stalled: rollout, sync`,
    ]);
    const tty = new FakeStream(true, 400);
    const bar = new Progress({ stream: tty, total: 4, stalls: () => stalled });
    bar.update({ step: 0, metrics }, 1);
    bar.message('rxrl: warning: rollout stalled');
    expect(tty.chunks.at(-1)).toContain('staleness 1  1s  eta 3s  stalled: rollout, sync');
  });

  it('done() prints the last step when the cadence skipped it (no total)', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, every: 10 });
    for (let step = 0; step < 12; step++) progress.update({ step, metrics }, step);
    progress.done();
    progress.done();
    expect(
      stream.text
        .trimEnd()
        .split('\n')
        .map((l) => l.slice(0, 9)),
    ).toEqual(['step   10', 'step   12']);
  });

  it('on a TTY redraws one bar line in place with counter and ETA, then ends it', () => {
    const stream = new FakeStream(true);
    const progress = new Progress({ stream, total: 4, barWidth: 8 });
    progress.update({ step: 0, metrics }, 10);
    progress.update({ step: 1, metrics }, 20);
    expect(stream.chunks).toHaveLength(2);
    expect(stream.chunks[1]).toBe('\r████░░░░ 2/4  reward 0.500  loss 0.0123  entropy 1.200  staleness 1  20s  eta 20s\x1b[K');
    progress.update({ step: 3, metrics }, 125);
    expect(stream.chunks[2]).toContain('████████ 4/4');
    expect(stream.chunks[2]).toContain('2m05s');
    expect(stream.chunks[2]).not.toContain('eta');
    progress.done();
    expect(stream.text.split('\n')).toHaveLength(2);
    expect(stream.text.endsWith('\n')).toBe(true);
  });

  it('cuts the bar to the terminal width and prints messages above it', () => {
    const stream = new FakeStream(true, 30);
    const progress = new Progress({ stream, total: 10 });
    progress.update({ step: 0, metrics }, 1);
    expect(stream.chunks[0]).toBe(`\r${'██░░░░░░░░░░░░░░░░░░  1/10  re'.slice(0, 29)}\x1b[K`);
    progress.message('checkpoint saved');
    expect(stream.chunks[1]).toBe('\r\x1b[Kcheckpoint saved\n');
    expect(stream.chunks[2]).toBe(stream.chunks[0]);
  });

  it('without a total shows a counter, and tty can be forced', () => {
    const stream = new FakeStream(false);
    const progress = new Progress({ stream, tty: true });
    progress.update({ step: 4, metrics }, 3700);
    expect(stream.text).toBe('\rstep 5  reward 0.500  loss 0.0123  entropy 1.200  staleness 1  1h01m\x1b[K');
    expect(progress.tty).toBe(true);
  });

  it('rejects a bad cadence with a ConfigError', () => {
    expect(() => new Progress({ stream: new FakeStream(false), every: 0 })).toThrow(ConfigError);
    expect(() => new Progress({ stream: new FakeStream(false), total: 2.5 })).toThrow(/total/);
  });
});
