/**
 * Stand-ins shared by the pipeline benchmarks: a one-symbol tokenizer, an engine whose latency is a function of
 * each request, and a trainer whose step only waits. They isolate the cost of the pipeline itself.
 *
 * @packageDocumentation
 */
import type { RolloutEngine } from '../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse, NamedWeights, Tokenizer } from '../lib/model/types.js';
import type { Evaluator } from '../lib/core/evaluator.js';
import type { StepResult, Trainer } from '../lib/train/types.js';
import type { Batch } from '../lib/core/types.js';

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

/**
 * A policy that writes the given ids in turn up to each request's `maxTokens` and never samples a stop token, at
 * the speed of a loop: served by `serve({ model })`, it makes a stream exactly as long as the request asks, so a
 * benchmark measures the server, not a model. Rows whose signal fires stop.
 */
export class RunOnModel {
  readonly config: {
    readonly vocabSize: number;
    readonly maxSeqLen: number;
    readonly dModel: number;
    readonly nLayers: number;
    readonly nHeads: number;
    readonly dFF: number;
  };
  /** Tokens written so far, over every request. */
  produced = 0;
  /** Resolves as each generate call ends. */
  private ended: (() => void)[] = [];

  constructor(
    private readonly ids: readonly number[],
    vocabSize: number,
    maxSeqLen: number,
  ) {
    this.config = { vocabSize, maxSeqLen, dModel: 8, nLayers: 1, nHeads: 1, dFF: 8 };
  }

  async generate(
    requests: readonly GenerateRequest[],
    options: { readonly signal?: AbortSignal; readonly version?: number; readonly rowSignals?: readonly (AbortSignal | undefined)[] } = {},
  ): Promise<GenerateResponse[]> {
    const rows = requests.map(() => ({
      tokens: [] as number[],
      logprobs: [] as number[],
      finishReason: undefined as GenerateResponse['finishReason'] | undefined,
    }));
    for (let step = 0; rows.some((r) => r.finishReason === undefined); step++) {
      if (step % 512 === 511) await new Promise((resolve) => setImmediate(resolve));
      requests.forEach((request, i) => {
        const row = rows[i];
        if (row.finishReason !== undefined) return;
        if (options.rowSignals?.[i]?.aborted || options.signal?.aborted) {
          row.finishReason = 'abort';
          return;
        }
        const token = this.ids[step % this.ids.length];
        row.tokens.push(token);
        row.logprobs.push(-0.5);
        this.produced++;
        request.onToken?.(token, -0.5);
        if (row.tokens.length >= request.maxTokens) row.finishReason = 'length';
      });
    }
    for (const resolve of this.ended.splice(0)) resolve();
    return rows.map((r) => ({
      tokens: r.tokens,
      logprobs: r.logprobs,
      finishReason: r.finishReason!,
      policyVersion: options.version ?? 0,
    }));
  }

  /** Resolves when the next generate call has ended. */
  nextEnd(): Promise<void> {
    return new Promise((resolve) => this.ended.push(resolve));
  }

  setWeights(): void {}
}
