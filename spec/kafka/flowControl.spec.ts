/** The pause/resume decisions behind fromKafka, over recorded pause and resume actions (no broker). */
import { describe, expect, it } from 'vitest';

import { ConfigError } from '../../lib/core/errors.js';
import { checkFlowLimits, FlowController } from '../../lib/kafka/flowControl.js';
import type { KafkaEventType } from '../../lib/kafka/types.js';

function setup(capacity: number, resumeBelow: number, resume: () => void = () => undefined) {
  const actions: string[] = [];
  const events: { type: KafkaEventType; payload: Readonly<Record<string, unknown>> }[] = [];
  const flow = new FlowController({
    capacity,
    resumeBelow,
    pause: () => actions.push('pause'),
    resume: () => {
      actions.push('resume');
      resume();
    },
    emit: (type, payload) => events.push({ type, payload }),
  });
  return { flow, actions, events };
}

describe('FlowController', () => {
  it('is full at capacity; pausing twice pauses the source once', () => {
    const { flow, actions, events } = setup(3, 2);
    flow.admit();
    flow.admit();
    expect(flow.full).toBe(false);
    flow.admit();
    expect(flow.full).toBe(true);
    expect(flow.inFlight).toBe(3);
    flow.pause();
    flow.pause();
    expect(flow.isPaused).toBe(true);
    expect(actions).toEqual(['pause']);
    expect(events).toEqual([{ type: 'kafka.pause', payload: { inFlight: 3, capacity: 3 } }]);
  });

  it('resumes only once fewer than resumeBelow are in flight, and only once', () => {
    const { flow, actions, events } = setup(4, 2);
    for (let i = 0; i < 4; i++) flow.admit();
    flow.pause();
    flow.release(); // 3
    flow.release(); // 2: not below resumeBelow
    expect(actions).toEqual(['pause']);
    flow.release(); // 1
    expect(actions).toEqual(['pause', 'resume']);
    expect(flow.isPaused).toBe(false);
    flow.release(); // 0: already running
    expect(actions).toEqual(['pause', 'resume']);
    expect(events).toEqual([
      { type: 'kafka.pause', payload: { inFlight: 4, capacity: 4 } },
      { type: 'kafka.resume', payload: { inFlight: 1 } },
    ]);
  });

  it('never resumes a source that was not paused', () => {
    const { flow, actions, events } = setup(2, 2);
    flow.admit();
    flow.release();
    expect(actions).toEqual([]);
    expect(events).toEqual([]);
  });

  it('does not resume after close()', () => {
    const { flow, actions } = setup(1, 1);
    flow.admit();
    flow.pause();
    flow.close();
    flow.release();
    expect(actions).toEqual(['pause']);
    expect(flow.isPaused).toBe(true);
  });

  it('a resume that throws (the source stopped) is swallowed and not reported', () => {
    const { flow, actions, events } = setup(1, 1, () => {
      throw new Error('consumer not running');
    });
    flow.admit();
    flow.pause();
    expect(() => flow.release()).not.toThrow();
    expect(actions).toEqual(['pause', 'resume']);
    expect(events.map((e) => e.type)).toEqual(['kafka.pause']);
  });

  it('refuses limits out of range with a ConfigError', () => {
    const bad: [number, number][] = [
      [0, 1],
      [2.5, 1],
      [4, 0],
      [4, 5],
      [4, 1.5],
    ];
    for (const [capacity, resumeBelow] of bad) {
      expect(() => checkFlowLimits(capacity, resumeBelow, 'fromKafka')).toThrow(ConfigError);
      expect(() => setup(capacity, resumeBelow)).toThrow(ConfigError);
    }
    expect(() => checkFlowLimits(4, 4)).not.toThrow();
    expect(() => checkFlowLimits(1, 1)).not.toThrow();
  });
});
