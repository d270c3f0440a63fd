/**
 * Stand-ins shared by the pipeline benchmarks: a one-symbol tokenizer, an engine whose latency is a function of
 * each request, and a trainer whose step only waits. They isolate the cost of the pipeline itself.
 *
 * @packageDocumentation
 */
import type { GenerateRequest, GenerateResponse, NamedWeights, RolloutEngine, Tokenizer } from '../lib/engine/types.js';
import type { Evaluator } from '../lib/evaluator.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Batch } from '../lib/types.js';

/** Waits `ms` milliseconds (0: a macrotask turn). */
export const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

/** A tokenizer with one symbol: every prompt is `[bos, 3]`. */
export const stubTokenizer: Tokenizer = {
  vocabSize: 4,
  padId: 0,
  bosId: 1,
  eosId: 2,
  encode: (_: string, options?: { addBos?: boolean }): number[] => (options?.addBos ? [1, 3] : [3]),
  decode: (): string => 'x',
  stopIds: [2],
  isSpecial: (id: number): boolean => id < 3,
  tokenLabel: (id: number): string => ['<pad>', '<bos>', '<eos>', 'x'][id],
  files: () => ({}),
};

/** Rewards every response with 1. */
export const constantEvaluator: Evaluator = { evaluate: () => ({ reward: 1 }) };

/** An engine answering after `latencyMs(request)` ms (no wait when it returns undefined), tagged with its version. */
export class LatencyEngine implements RolloutEngine {
  readonly modelTag = 'policy';
  readonly tokenizer = stubTokenizer;
  version = 0;
  constructor(private readonly latencyMs: (request: GenerateRequest) => number | undefined = () => undefined) {}
  async generate(requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> {
    const version = this.version;
    const waits = requests.map(this.latencyMs).filter((ms): ms is number => ms !== undefined);
    if (waits.length > 0) await sleep(Math.max(...waits));
    return requests.map(() => ({ tokens: [3, 2], logprobs: [-1, -1], finishReason: 'stop', policyVersion: version }));
  }
  async loadWeights(version: number): Promise<void> {
    this.version = version;
  }
}

/** A trainer whose step waits `ms` and changes nothing. */
export class SleepTrainer implements Trainer {
  readonly modelTag = 'policy';
  step = 0;
  constructor(private readonly ms: number) {}
  async trainStep(batch: Batch): Promise<StepResult> {
    const step = this.step;
    await sleep(this.ms);
    this.step++;
    const weights: NamedWeights = new Map();
    return { step, version: step + 1, metrics: { ...batch.metrics }, skipped: false, trajectoryIds: [], weights: () => weights };
  }
}
