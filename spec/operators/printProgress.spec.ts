import { Subject, throwError, concat, of, take } from 'rxjs';
import { TestScheduler } from 'rxjs/testing';
import { describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import type { ProgressStream } from '../../lib/observe/progress.js';
import { printProgress } from '../../operators/index.js';

/** A stream that keeps what is written. */
function stream(isTTY = false): ProgressStream & { text: () => string } {
  const chunks: string[] = [];
  return { isTTY, write: (chunk: string) => chunks.push(chunk), text: () => chunks.join('') };
}

const step = (n: number, reward: number) => ({ step: n, metrics: { 'rollout/reward_mean': reward, 'actor/pg_loss': 0.01 } });

describe('printProgress', () => {
  it('passes every step through unchanged and prints a line per step, timed from the subscription', () => {
    const scheduler = new TestScheduler((actual, expected) => expect(actual).toEqual(expected));
    const out = stream();
    scheduler.run(({ cold, expectObservable }) => {
      const values = { a: step(0, 0.1), b: step(1, 0.2), c: step(2, 0.3) };
      const source = cold('--a--b--c--|', values);
      // The virtual clock: frames are milliseconds.
      const piped = source.pipe(printProgress({ total: 3, stream: out, now: () => scheduler.now() }));
      expectObservable(piped).toBe('--a--b--c--|', values);
    });
    expect(out.text().split('\n')).toEqual([
      'step 1/3 · 0.002 s/it · ETA 0:00 · reward 0.100 · loss 0.0100',
      'step 2/3 · 0.003 s/it · ETA 0:00 · reward 0.200 · loss 0.0100',
      'step 3/3 · 0.003 s/it · reward 0.300 · loss 0.0100',
      '',
    ]);
  });

  it('without a total prints no ETA; `every` thins the lines and the last step is printed when the stream ends', () => {
    const out = stream();
    let clock = 0;
    const steps = new Subject<ReturnType<typeof step>>();
    const seen: number[] = [];
    steps.pipe(printProgress({ every: 2, stream: out, now: () => clock })).subscribe((s) => seen.push(s.step));
    for (let n = 0; n < 3; n++) {
      clock += 1500;
      steps.next(step(n, 0.5));
    }
    expect(out.text()).toBe('step 2 · 1.5 s/it · reward 0.500 · loss 0.0100\n');
    steps.complete();
    expect(out.text().split('\n')).toEqual([
      'step 2 · 1.5 s/it · reward 0.500 · loss 0.0100',
      'step 3 · 1.5 s/it · reward 0.500 · loss 0.0100',
      '',
    ]);
    expect(seen).toEqual([0, 1, 2]);
  });

  it('on a terminal redraws the bar in place and ends its line on error and on unsubscription', () => {
    const failing = stream(true);
    const errors: unknown[] = [];
    concat(
      of(step(0, 0.5)),
      throwError(() => new Error('boom')),
    )
      .pipe(printProgress({ total: 4, stream: failing, now: () => 0 }))
      .subscribe({ error: (e: unknown) => errors.push(e) });
    expect(errors).toHaveLength(1);
    expect(failing.text()).toBe(`\r█████${'░'.repeat(15)} step 1/4 · 0.000 s/it · ETA 0:00 · reward 0.500 · loss 0.0100\x1b[K\n`);
    const cut = stream(true);
    of(step(0, 0.5), step(1, 0.5), step(2, 0.5))
      .pipe(printProgress({ total: 10, stream: cut, now: () => 0 }), take(2))
      .subscribe();
    expect(cut.text().split('\r')).toHaveLength(3);
    expect(cut.text().endsWith('\x1b[K\n')).toBe(true);
  });

  it('rejects a bad total at subscription with a ConfigError', () => {
    const errors: unknown[] = [];
    of(step(0, 1))
      .pipe(printProgress({ total: 1.5, stream: stream() }))
      .subscribe({ error: (e: unknown) => errors.push(e) });
    expect(errors[0]).toBeInstanceOf(ConfigError);
  });
});
