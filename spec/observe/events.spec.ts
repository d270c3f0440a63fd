import { describe, expect, it } from 'vitest';
import { createLogger, Instrumentation, type AnyInstrumentationEvent } from '../../lib/observe/index.js';

function counterIds(): () => string {
  let n = 0;
  return () => `e${++n}`;
}

describe('Instrumentation', () => {
  it('wraps payloads in one envelope and delivers them in order', () => {
    const events = new Instrumentation({ now: () => 1000, newId: counterIds() });
    const seen: AnyInstrumentationEvent[] = [];
    events.events$.subscribe((event) => seen.push(event));
    const emitted = events.emit('checkpoint.saved', { step: 9, version: 10, path: 'runs/a/global_step_10' });
    events.emit('weights.published', { version: 10 });
    expect(emitted).toEqual({
      id: 'e1',
      type: 'checkpoint.saved',
      timestamp: 1000,
      payload: { step: 9, version: 10, path: 'runs/a/global_step_10' },
    });
    expect(seen.map((e) => [e.id, e.type])).toEqual([
      ['e1', 'checkpoint.saved'],
      ['e2', 'weights.published'],
    ]);
  });

  it('filters by type with ofType and on; on() returns an unsubscribe', () => {
    const events = new Instrumentation({ newId: counterIds() });
    const steps: number[] = [];
    const failures: string[] = [];
    events.ofType('trainer.step').subscribe((e) => steps.push(e.payload.step));
    const off = events.on('rollout.failure', (e) => failures.push(e.payload.taskId));
    events.emit('trainer.step', { step: 0, version: 1, skipped: false, metrics: { 'actor/pg_loss': 0.1 } });
    events.emit('rollout.failure', { taskId: 't1', error: { name: 'EngineError', message: 'down', retriable: true } });
    off();
    events.emit('rollout.failure', { taskId: 't2', error: { name: 'EngineError', message: 'down', retriable: true } });
    expect(steps).toEqual([0]);
    expect(failures).toEqual(['t1']);
  });

  it('keeps delivering when a listener throws, and logs the failure', () => {
    const lines: string[] = [];
    const events = new Instrumentation({ logger: createLogger({ destination: { write: (l: string) => void lines.push(l) } }) });
    const seen: number[] = [];
    events.on('weights.published', () => {
      throw new Error('listener bug');
    });
    events.on('weights.published', (e) => seen.push(e.payload.version));
    events.emit('weights.published', { version: 1 });
    events.emit('weights.published', { version: 2 });
    expect(seen).toEqual([1, 2]);
    expect(lines).toHaveLength(2);
    expect(JSON.parse(lines[0])).toMatchObject({ level: 40, eventType: 'weights.published', err: { message: 'listener bug' } });
  });

  it('completes events$ and ignores later emits', () => {
    const events = new Instrumentation();
    let completed = false;
    const seen: string[] = [];
    events.events$.subscribe({ next: (e) => seen.push(e.type), complete: () => (completed = true) });
    events.complete();
    events.emit('weights.published', { version: 1 });
    expect(completed).toBe(true);
    expect(seen).toEqual([]);
  });

  it('uses unique random ids by default', () => {
    const events = new Instrumentation();
    const a = events.emit('weights.published', { version: 1 });
    const b = events.emit('weights.published', { version: 2 });
    expect(a.id).not.toBe(b.id);
    expect(a.id).toMatch(/^[0-9a-f-]{36}$/);
  });
});
