import type { RolloutEngine } from '../../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../../lib/model/types.js';
import type { Group, SampleFailure, Task, Trajectory } from '../../lib/core/types.js';
import type { Evaluator } from '../../lib/core/evaluator.js';

/**
 * Rewards for dynamic-sampling specs: every sample of a task `flat` picks scores 1 (a group with no signal); the
 * samples of any other task score 0, 1, 0, … in the order they are scored.
 */
export function flatOrAlternating(flat: (taskId: string) => boolean): Evaluator {
  const scored = new Map<string, number>();
  return {
    evaluate: (task) => {
      const n = scored.get(task.id) ?? 0;
      scored.set(task.id, n + 1);
      return { reward: flat(task.id) ? 1 : n % 2 };
    },
  };
}

/** A task with a prompt and answer. */
export function task(id: string, prompt = 'ab', answer = 'ba'): Task {
  return { id, prompt, answer };
}

/** A group `id` of the policy's trajectories, one a reward. */
export function groupOf(id: string, rewards: readonly number[]): Group {
  return { key: [id], modelTag: 'policy', trajectories: rewards.map((reward, runId) => traj(id, runId, { reward })) };
}

/** A trajectory of group `groupId`, sample `runId`. */
export function traj(groupId: string, runId: number, overrides: Partial<Trajectory> = {}): Trajectory {
  const taskId = groupId.split('@')[0];
  return {
    id: `${groupId}/${runId}`,
    taskId,
    groupId,
    runId,
    modelTag: 'policy',
    policyVersion: 0,
    promptTokens: [1, 3, 4],
    responseTokens: [5, 2],
    logprobs: [-0.5, -0.25],
    lossMask: [1, 1],
    reward: runId,
    finishReason: 'stop',
    metrics: {},
    task: { id: taskId, prompt: 'ab' },
    ...overrides,
  };
}

/** A failed sample of group `groupId`, sample `runId`. */
export function failure(groupId: string, runId: number): SampleFailure {
  return {
    kind: 'sample-failure',
    id: `${groupId}/${runId}`,
    taskId: groupId.split('@')[0],
    groupId,
    runId,
    modelTag: 'policy',
    error: new Error('boom'),
  };
}

/** Character tokenizer over a tiny alphabet, for operator tests (0 pad, 1 bos, 2 eos, then 'a'…). */
export const tinyTokenizer: Tokenizer = {
  vocabSize: 3 + 26,
  padId: 0,
  bosId: 1,
  eosId: 2,
  stopIds: [2],
  encode(text, options) {
    const ids = [...text].map((c) => 3 + c.charCodeAt(0) - 97);
    return options?.addBos ? [1, ...ids] : ids;
  },
  decode(ids) {
    return ids
      .filter((id) => id >= 3)
      .map((id) => String.fromCharCode(97 + id - 3))
      .join('');
  },
  isSpecial: (id) => id < 3,
  tokenLabel: (id) => (id < 3 ? ['<pad>', '<bos>', '<eos>'][id] : String.fromCharCode(97 + id - 3)),
  files: () => ({}),
};

/**
 * A scripted engine for operator tests: answers each request with `respond(request, call)` after `delayMs`,
 * records every call, and tracks how many requests are in flight.
 */
export class ScriptedEngine implements RolloutEngine {
  readonly modelTag = 'policy';
  readonly tokenizer = tinyTokenizer;
  version = 0;
  inFlight = 0;
  maxInFlight = 0;
  calls = 0;
  loads: { version: number; names: string[] }[] = [];

  constructor(
    private readonly respond: (request: GenerateRequest, call: number) => GenerateResponse | Error = () => ({
      tokens: [3, 2],
      logprobs: [-1, -1],
      finishReason: 'stop',
      policyVersion: 0,
    }),
    private readonly delayMs = 1,
  ) {}

  async generate(requests: readonly GenerateRequest[], signal?: AbortSignal): Promise<GenerateResponse[]> {
    this.inFlight += requests.length;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      await new Promise<void>((resolve, reject) => {
        const timer = setTimeout(resolve, this.delayMs);
        signal?.addEventListener('abort', () => {
          clearTimeout(timer);
          reject(new DOMException('aborted', 'AbortError'));
        });
      });
      return requests.map((request) => {
        const out = this.respond(request, this.calls++);
        if (out instanceof Error) throw out;
        return { ...out, policyVersion: this.version };
      });
    } finally {
      this.inFlight -= requests.length;
    }
  }

  async loadWeights(version: number, weights: NamedWeights): Promise<void> {
    await new Promise((resolve) => setTimeout(resolve, 1));
    this.version = version;
    this.loads.push({ version, names: [...weights.keys()] });
  }
}
