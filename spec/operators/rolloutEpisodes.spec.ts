import { from, lastValueFrom, toArray } from 'rxjs';
import { describe, expect, it } from 'vitest';
import type { AgentSpec, EpisodeStep, MultiAgentEnvironment } from '../../lib/agent/environment.js';
import { ConfigError, EngineError, EvaluationError } from '../../lib/core/errors.js';
import { isSampleFailure, type RolloutOutput, type SampleFailure, type Task, type Trajectory } from '../../lib/core/types.js';
import { rolloutEpisodes, type RolloutEpisodesOptions } from '../../operators/rolloutEpisodes.js';
import { ScriptedEngine, task } from '../helpers/fixtures.js';

/** Answers every request with the last prompt letter, then the stop token. */
const echo = (): ScriptedEngine =>
  new ScriptedEngine((request) => ({
    tokens: [request.promptTokens[request.promptTokens.length - 1], 2],
    logprobs: [-0.5, -0.25],
    finishReason: 'stop',
    policyVersion: 0,
  }));

/** writer, editor, writer; the writer is rewarded 1 at turn 0 and 2 at turn 2, the editor 0.5 at turn 1. */
function env(
  overrides: Partial<{
    step: (agent: string, response: string, turn: number) => EpisodeStep;
    observe: (agent: string, turn: number) => string;
    maxTurns: number;
  }> = {},
): MultiAgentEnvironment {
  return {
    turnOrder: ['writer', 'editor'],
    maxTurns: overrides.maxTurns ?? 3,
    reset: (t: Task) => ({
      observe: overrides.observe ?? ((agent, turn) => `${t.prompt}${agent === 'writer' ? 'w' : 'e'}${'abc'[turn]}`),
      step: overrides.step ?? ((agent, _response, turn) => ({ rewards: { [agent]: [1, 0.5, 2][turn] }, done: false, metrics: { turn } })),
    }),
  };
}

const AGENTS: AgentSpec[] = [
  { name: 'writer', policy: 'w' },
  { name: 'editor', policy: 'e', prompt: 'z' },
];

async function play(
  tasks: readonly Task[],
  options: Partial<RolloutEpisodesOptions> = {},
  engines = new Map([
    ['w', echo()],
    ['e', echo()],
  ]),
): Promise<RolloutOutput[]> {
  return lastValueFrom(
    from(tasks).pipe(
      rolloutEpisodes(engines, { environment: env(), agents: AGENTS, samplesPerTask: 2, concurrency: 4, maxTokens: 4, ...options }),
      toArray(),
    ),
  );
}

const byId = (out: readonly RolloutOutput[]): Map<string, RolloutOutput> => new Map(out.map((o) => [o.id, o]));

describe('rolloutEpisodes', () => {
  it('per turn: one trajectory per (agent, turn), tagged with its policy, rewarded with the return from that turn', async () => {
    const engines = new Map([
      ['w', echo()],
      ['e', echo()],
    ]);
    const out = byId(await play([task('t1')], {}, engines));
    expect([...out.keys()].sort()).toEqual([
      't1@0/editor/1/0',
      't1@0/editor/1/1',
      't1@0/writer/0/0',
      't1@0/writer/0/1',
      't1@0/writer/2/0',
      't1@0/writer/2/1',
    ]);
    const w0 = out.get('t1@0/writer/0/1') as Trajectory;
    expect(w0).toMatchObject({
      groupId: 't1@0/writer/0',
      runId: 1,
      taskId: 't1',
      modelTag: 'w',
      reward: 3,
      lossMask: [1, 1],
      logprobs: [-0.5, -0.25],
    });
    expect(w0.metrics).toEqual({ 'agent/turns': 3, turn: 0 });
    expect((out.get('t1@0/writer/2/0') as Trajectory).reward).toBe(2);
    // The editor's prompt starts with its specialization text 'z'; the writer's has none.
    const e1 = out.get('t1@0/editor/1/0') as Trajectory;
    expect(e1).toMatchObject({ modelTag: 'e', reward: 0.5 });
    expect(e1.promptTokens).toEqual([1, ...'zabeb'].map((c) => (typeof c === 'number' ? c : 3 + c.charCodeAt(0) - 97)));
    // Each policy's engine sampled only its agents' turns: 2 episodes × 2 writer turns, 2 × 1 editor turn.
    expect(engines.get('w')?.calls).toBe(4);
    expect(engines.get('e')?.calls).toBe(2);
  });

  it('a slot the episode never reached is a skipped failure; its group shrinks', async () => {
    const out = byId(
      await play([task('t1')], { environment: env({ step: (agent, _r, turn) => ({ rewards: { [agent]: 1 }, done: turn === 1 }) }) }),
    );
    const skipped = out.get('t1@0/writer/2/0') as SampleFailure;
    expect(isSampleFailure(skipped)).toBe(true);
    expect(skipped).toMatchObject({ skipped: true, groupId: 't1@0/writer/2', modelTag: 'w' });
    expect((out.get('t1@0/editor/1/0') as Trajectory).reward).toBe(1);
  });

  it("per agent: an agent's turns are joined into one sequence, what the environment added masked out", async () => {
    // A transcript environment: each observation extends the previous one with the response and a marker.
    const transcript = (): MultiAgentEnvironment => ({
      turnOrder: ['writer', 'editor'],
      maxTurns: 3,
      reset: (t) => {
        const seen: Record<string, string> = { writer: t.prompt, editor: t.prompt };
        return {
          observe: (agent) => seen[agent],
          step: (agent, response, turn) => {
            seen[agent] += `${response}${'xyz'[turn]}`;
            return { rewards: { [agent]: 1 }, done: false };
          },
        };
      },
    });
    const out = byId(await play([task('t1', 'ab')], { environment: transcript(), granularity: 'agent' }));
    expect([...out.keys()].sort()).toEqual(['t1@0/editor/0', 't1@0/editor/1', 't1@0/writer/0', 't1@0/writer/1']);
    const writer = out.get('t1@0/writer/0') as Trajectory;
    const id = (c: string): number => 3 + c.charCodeAt(0) - 97;
    // Prompt 'ab' → 'b' <eos>; the next observation 'abbx' extends the text (the stop token is not text), so
    // the environment added 'x' (masked), → 'x' <eos>.
    expect(writer.promptTokens).toEqual([1, id('a'), id('b')]);
    expect(writer.responseTokens).toEqual([id('b'), 2, id('x'), id('x'), 2]);
    expect(writer.lossMask).toEqual([1, 1, 0, 1, 1]);
    expect(writer.logprobs).toEqual([-0.5, -0.25, 0, -0.5, -0.25]);
    expect(writer.reward).toBe(2);
    // Observations that do not extend the transcript cannot be joined: the episode fails, typed.
    const broken = await play([task('t1')], { granularity: 'agent' });
    expect(broken.every((o) => isSampleFailure(o) && o.error instanceof EvaluationError && /does not extend/.test(o.error.message))).toBe(
      true,
    );
  });

  it('an environment that throws, rewards a stranger or gives NaN fails that episode alone, every slot, typed', async () => {
    const bad = (t: Task): MultiAgentEnvironment =>
      env({
        step: (agent, _r, turn) => {
          if (t.id === 'throws' && turn === 1) throw new Error('judge crashed');
          if (t.id === 'stranger') return { rewards: { nobody: 1 }, done: false };
          if (t.id === 'nan') return { rewards: { [agent]: Number.NaN }, done: false };
          return { rewards: { [agent]: 1 }, done: false };
        },
      });
    const environment: MultiAgentEnvironment = { turnOrder: ['writer', 'editor'], maxTurns: 3, reset: (t, seed) => bad(t).reset(t, seed) };
    const out = await play([task('throws'), task('stranger'), task('nan'), task('fine')], { environment });
    const failures = out.filter(isSampleFailure);
    expect(failures).toHaveLength(3 * 2 * 3);
    expect(failures.every((f) => f.error instanceof EvaluationError && f.skipped === undefined)).toBe(true);
    expect(failures.find((f) => f.taskId === 'throws')?.error.message).toMatch(/step failed in episode throws@0\/\d at turn 1/);
    expect(failures.find((f) => f.taskId === 'stranger')?.error.message).toMatch(/rewarded 'nobody', who is not an agent/);
    expect(failures.find((f) => f.taskId === 'nan')?.error.message).toMatch(/non-finite reward/);
    expect(out.filter((o) => !isSampleFailure(o))).toHaveLength(6);
  });

  it('an episode over its time limit fails every slot with an EngineError', async () => {
    const slow = new ScriptedEngine(undefined, 200);
    const out = await play(
      [task('t1')],
      { episodeTimeoutMs: 20, samplesPerTask: 1 },
      new Map([
        ['w', slow],
        ['e', slow],
      ]),
    );
    expect(out).toHaveLength(3);
    expect(
      out.every(
        (o) => isSampleFailure(o) && o.error instanceof EngineError && /episode t1@0\/0 did not finish within 20 ms/.test(o.error.message),
      ),
    ).toBe(true);
  });

  it('concurrency bounds the episodes in flight', async () => {
    const engine = new ScriptedEngine(undefined, 3);
    const tasks = Array.from({ length: 6 }, (_, i) => task(`t${i}`));
    const out = await play(
      tasks,
      { concurrency: 3, samplesPerTask: 2 },
      new Map([
        ['w', engine],
        ['e', engine],
      ]),
    );
    expect(out).toHaveLength(6 * 2 * 3);
    expect(engine.maxInFlight).toBe(3);
  });

  it("asks each turn to stop at the tokenizer's stop ids, or, with ignoreEos, at none (each turn runs to maxTokens)", async () => {
    for (const ignoreEos of [undefined, false, true]) {
      const stops: (readonly number[] | undefined)[] = [];
      const engine = new ScriptedEngine((request) => {
        stops.push(request.stopTokens);
        return { tokens: [3, 2], logprobs: [-1, -1], finishReason: 'stop', policyVersion: 0 };
      });
      await play(
        [task('t1')],
        { ignoreEos },
        new Map([
          ['w', engine],
          ['e', engine],
        ]),
      );
      expect(stops).toHaveLength(2 * 3);
      for (const stop of stops) expect(stop).toEqual(ignoreEos === true ? [] : engine.tokenizer.stopIds);
    }
  });

  it('rejects an agent without an engine, a duplicate agent and an unknown granularity', () => {
    const engines = new Map([['w', echo()]]);
    const base = { environment: env(), samplesPerTask: 1, concurrency: 1, maxTokens: 2 };
    expect(() => rolloutEpisodes(engines, { ...base, agents: AGENTS })).toThrow(
      /agent 'editor' samples from policy 'e', which has no engine/,
    );
    expect(() => rolloutEpisodes(engines, { ...base, agents: [AGENTS[0], AGENTS[0]] })).toThrow(ConfigError);
    expect(() =>
      rolloutEpisodes(
        new Map([
          ['w', echo()],
          ['e', echo()],
        ]),
        { ...base, agents: AGENTS, granularity: 'episode' as never },
      ),
    ).toThrow(/unknown trajectory granularity 'episode'; valid: turn, agent/);
  });
});
