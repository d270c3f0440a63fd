import { describe, expect, it } from 'vitest';

import { ConfigError, EngineError } from '../../lib/core/errors.js';
import { ActivityTracker, fetchStatus, formatStatus, prometheusText, serveStatus, type RunStatus } from '../../lib/observe/index.js';

/** A tracker at a fixed moment: a stalled rollout with a failure, a held store, a trainer, a worker up and one gone. */
function busyTracker(): ActivityTracker {
  let t = 0;
  const tracker = new ActivityTracker({ now: () => t, stallSeconds: 30, workerGoneMs: 15_000 });
  tracker.begin('rollout').fail(new Error('engine said "no"\nagain'));
  tracker.begin('rollout');
  tracker.hold('store', 4);
  tracker.begin('trainer').done();
  tracker.heartbeat({ worker: 'gone-1', run: 'run-a', inFlight: 3, done: 7, failed: 0 });
  t = 40_000;
  tracker.heartbeat({ worker: 'up-2', run: 'run-a', inFlight: 1, done: 2, failed: 1, version: 3 });
  return tracker;
}

describe('prometheusText', () => {
  it('writes each family once with HELP and TYPE, labels escaped, and the last step as rxrl_metric', () => {
    const status: RunStatus = {
      run: { step: 12, steps: 50, mode: 'sync', metrics: { 'rollout/reward_mean': 0.5, 'actor/pg_loss': Number.NaN } },
      activity: busyTracker().snapshot(),
    };
    const text = prometheusText(status);
    expect(text.endsWith('\n')).toBe(true);
    expect(text).toContain('# TYPE rxrl_module_in_flight gauge\nrxrl_module_in_flight{module="rollout"} 1\n');
    expect(text).toContain('rxrl_module_stalled{module="rollout"} 1');
    expect(text).toContain('rxrl_module_stalled{module="trainer"} 0');
    expect(text).toContain('rxrl_module_failed_total{module="rollout"} 1');
    expect(text).toContain('rxrl_module_held{module="store"} 4');
    expect(text).not.toContain('rxrl_module_held{module="rollout"}');
    expect(text).toContain('rxrl_module_idle_seconds{module="rollout"} 40');
    expect(text).toContain('rxrl_worker_up{worker="gone-1",run="run-a"} 0');
    expect(text).toContain('rxrl_worker_up{worker="up-2",run="run-a"} 1');
    expect(text).toContain('rxrl_worker_heartbeat_age_seconds{worker="gone-1",run="run-a"} 40');
    expect(text).toContain('rxrl_step 12');
    expect(text).toContain('rxrl_metric{name="rollout/reward_mean"} 0.5');
    expect(text).not.toContain('actor/pg_loss'); // not finite: left out
    for (const family of ['rxrl_module_in_flight', 'rxrl_worker_up', 'rxrl_metric'])
      expect(text.split('\n').filter((line) => line === `# TYPE ${family} gauge`)).toHaveLength(1);
    // Every sample line is NAME{labels} VALUE or NAME VALUE.
    for (const line of text
      .trim()
      .split('\n')
      .filter((l) => !l.startsWith('#')))
      expect(line).toMatch(/^[a-z_]+(\{[^}]*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$/);
    const escaped = prometheusText({ run: { metrics: { 'a"b\\c\nd': 1 } }, activity: new ActivityTracker().snapshot() });
    expect(escaped).toContain('rxrl_metric{name="a\\"b\\\\c\\nd"} 1');
  });
});

describe('formatStatus', () => {
  it('prints a row per module and per worker, with the stalls', () => {
    const text = formatStatus({
      run: { step: 12, steps: 50, mode: 'sync', metrics: { 'rollout/reward_mean': 0.5 } },
      activity: busyTracker().snapshot(),
    });
    const lines = text.trimEnd().split('\n');
    expect(lines[0]).toBe('step 12/50  sync  reward 0.500  stalled: rollout');
    const rollout = lines.find((line) => line.startsWith('rollout'));
    expect(rollout).toMatch(/^rollout\s+1\s+0\s+1\s+40\.0s\s+40\.0s\s+STALLED\s+Error: engine said "no" again$/);
    expect(lines.find((line) => line.startsWith('store'))).toMatch(/^store\s+0\s+4\s+0\s+0\s+idle$/);
    expect(lines.find((line) => line.startsWith('gone-1'))).toMatch(/run-a\s+3\s+7\s+0\s+40\.0s ago\s+gone$/);
    expect(lines.find((line) => line.startsWith('up-2'))).toMatch(/up$/);
  });
});

describe('serveStatus and fetchStatus', () => {
  it('serves /status and /metrics on loopback, 404 elsewhere, 405 for other methods', async () => {
    const tracker = busyTracker();
    const server = await serveStatus({ tracker, port: 0, info: () => ({ step: 3 }) });
    try {
      expect(server.url).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      const status = await fetchStatus(server.url);
      expect(status.run).toEqual({ step: 3 });
      expect(status.activity.stalled).toEqual(['rollout']);
      expect(await fetchStatus(`${server.url}/status`)).toEqual(status);
      const metrics = await fetch(`${server.url}/metrics`);
      expect(metrics.headers.get('content-type')).toContain('text/plain; version=0.0.4');
      expect(await metrics.text()).toContain('rxrl_step 3');
      expect((await fetch(`${server.url}/nope`)).status).toBe(404);
      expect((await fetch(`${server.url}/status`, { method: 'POST' })).status).toBe(405);
      // The port is taken: a ConfigError naming it.
      const port = Number(new URL(server.url).port);
      await expect(serveStatus({ tracker, port })).rejects.toThrow(ConfigError);
    } finally {
      await server.close();
    }
  });

  it('fetchStatus refuses a non-URL with a ConfigError and an unreachable server with an EngineError', async () => {
    await expect(fetchStatus('not a url')).rejects.toThrow(ConfigError);
    await expect(fetchStatus('ftp://127.0.0.1/')).rejects.toThrow(ConfigError);
    const server = await serveStatus({ tracker: new ActivityTracker(), port: 0 });
    const url = server.url;
    await server.close();
    await expect(fetchStatus(url)).rejects.toThrow(EngineError);
  });
});
