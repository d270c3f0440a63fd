/**
 * The embedded GRPO run, with rollouts through an OpenAI-compatible server instead of the in-process engine:
 * `rxrl serve` started as a child process (or any server at `baseURL`), an {@link OpenAIEngine} sampling over
 * HTTP, and weight sync by safetensors checkpoints plus the server's update endpoint.
 *
 * @packageDocumentation
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import OpenAI from 'openai';
import { lastValueFrom, tap } from 'rxjs';

import { OpenAIEngine, type OpenAIEngineStats } from '../lib/engine/openai.js';
import { ConfigError } from '../lib/errors.js';
import { initBackend } from '../lib/model/backend.js';
import { savePolicy } from '../lib/model/policyFile.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../lib/model/transformer.js';
import { ALPHABET_METADATA_KEY } from '../lib/serve/command.js';
import { spawnServe, type SpawnedServer } from '../lib/serve/spawn.js';
import { GrpoTrainer } from '../lib/train/grpoTrainer.js';
import type { StepResult } from '../lib/train/types.js';
import type { Metrics } from '../lib/types.js';
import { stringTransformTask } from '../recipes/stringTransform.js';
import { EMBEDDED_MODEL, EMBEDDED_TRAINER, type EmbeddedRunOptions, type EmbeddedRunSummary } from './embedded.js';
import { grpoPipeline } from './grpoPipeline.js';
import { validate } from './validate.js';

/** Options of {@link runServed}: those of the embedded run, plus where the server is. */
export interface ServedRunOptions extends EmbeddedRunOptions {
  /**
   * Base URL of a running OpenAI-compatible server (e.g. `OPENAI_BASE_URL`). Its model must use the task's
   * character tokenizer and architecture; the initial weights are pushed to it before training. Default: start
   * `rxrl serve` as a child process on a free loopback port.
   */
  readonly baseURL?: string;
  /** Served model name. Default: the child's, or the first model the server lists. */
  readonly modelName?: string;
  /** API key for the server. Default `OPENAI_API_KEY` or `EMPTY`. */
  readonly apiKey?: string;
  /** Directory for weight checkpoints the server reads. Default: a fresh temporary directory, removed after. */
  readonly weightDirectory?: string;
  /** Path of the built CLI that runs `rxrl serve` (default: resolved next to the built library). */
  readonly cliPath?: string;
  /**
   * Batching wait of the spawned server, in ms (`--max-wait-ms`). Its batch size is one step's samples, so a
   * batch starts as soon as a step's requests have all arrived; the wait only caps the delay. Default 200.
   */
  readonly serverMaxWaitMs?: number;
}

/** What {@link runServed} reports: the embedded summary plus the engine's counters. */
export interface ServedRunSummary extends EmbeddedRunSummary {
  /** Always `openai`. */
  readonly engine: 'openai';
  /** Whether this run started its own `rxrl serve`. */
  readonly spawnedServer: boolean;
  /** Calls, attempts, retries, timeouts, failures and weight loads of the engine. */
  readonly engineStats: OpenAIEngineStats;
}

/**
 * Trains the bundled task like {@link runEmbedded} (same model, trainer, seeds and loop), sampling through an
 * OpenAI-compatible server.
 *
 * @example
 * ```ts
 * import { runServed } from 'rxrl/pipelines';
 * const summary = await runServed({ steps: 300, seed: 1 });            // starts rxrl serve itself
 * const remote = await runServed({ steps: 300, baseURL: process.env.OPENAI_BASE_URL });
 * ```
 * @param options - task, model, trainer and loop settings, and the server.
 * @returns the summary, with held-out reward before and after training.
 */
export async function runServed(options: ServedRunOptions = {}): Promise<ServedRunSummary> {
  const seed = options.seed ?? 1;
  const steps = options.steps ?? 300;
  const batchSize = options.batchSize ?? 32;
  const groupSize = options.groupSize ?? 8;
  const mode = options.mode ?? 'sync';
  if (!(Number.isInteger(steps) && steps >= 0)) throw new ConfigError(`steps must be an integer >= 0, got ${steps}`);
  const backend = await initBackend(options.backend ?? 'auto');
  const task = stringTransformTask({ seed, ...options.task });
  const tokenizer = new CharTokenizer(task.characters);
  const config: PolicyConfig = { ...EMBEDDED_MODEL, ...options.model, vocabSize: tokenizer.vocabSize };
  const maxTokens = task.maxAnswerLength + 1;
  const promptLength = task.maxAnswerLength + 2;
  if (promptLength + maxTokens > config.maxSeqLen) {
    throw new ConfigError(`model.maxSeqLen ${config.maxSeqLen} is shorter than prompt + response (${promptLength + maxTokens})`);
  }

  const trainerModel = PolicyModel.create(config, seed);
  const trainer = new GrpoTrainer(trainerModel, { ...EMBEDDED_TRAINER, seed, ...options.trainer });
  const workdir = await mkdtemp(join(tmpdir(), 'rxrl-served-'));
  let child: SpawnedServer | undefined;
  try {
    let baseURL = options.baseURL;
    let modelName = options.modelName;
    if (baseURL === undefined) {
      const initial = join(workdir, 'initial.safetensors');
      await savePolicy(initial, trainerModel, { [ALPHABET_METADATA_KEY]: task.characters });
      const args = ['--port', '0', '--checkpoint', initial, '--backend', backend];
      args.push('--max-batch-size', String(batchSize * groupSize), '--max-wait-ms', String(options.serverMaxWaitMs ?? 200));
      child = await spawnServe(args, { cliPath: options.cliPath, signal: options.signal });
      baseURL = child.baseURL;
      modelName ??= child.modelName;
    }
    const apiKey = options.apiKey ?? process.env.OPENAI_API_KEY ?? 'EMPTY';
    modelName ??= (await new OpenAI({ baseURL, apiKey }).models.list()).data[0]?.id;
    if (modelName === undefined) throw new ConfigError(`the server at ${baseURL} lists no model`);
    const sampler = new OpenAIEngine({
      baseURL,
      model: modelName,
      apiKey,
      tokenizer,
      concurrency: batchSize * groupSize,
      weightSync: { directory: options.weightDirectory ?? join(workdir, 'weights') },
    });
    if (child === undefined) await sampler.loadWeights(0, trainerModel.getWeights());

    const score = async (): Promise<Metrics> =>
      validate(sampler, task.validation, task.evaluator, { maxTokens, temperature: 0, signal: options.signal });
    const before = await score();
    const started = performance.now();
    let last: StepResult | undefined;
    await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: Infinity, shuffle: true, seed },
        engines: [sampler],
        trainer,
        evaluator: task.evaluator,
        mode,
        stalenessThreshold: options.stalenessThreshold,
        batchSize,
        groupSize,
        maxTokens,
        temperature: options.temperature ?? 1,
        steps,
        seed,
        signal: options.signal,
      }).pipe(
        tap((step) => {
          last = step;
          options.onStep?.(step, (performance.now() - started) / 1000);
        }),
      ),
      { defaultValue: undefined },
    );
    const seconds = (performance.now() - started) / 1000;
    const after = await score();
    return {
      recipe: task.name,
      mode,
      backend,
      steps: trainer.step,
      seconds: Number(seconds.toFixed(1)),
      seed,
      randomPolicyReward: Number(task.randomPolicyReward.toFixed(4)),
      valRewardInitial: Number(before['val/reward_mean'].toFixed(4)),
      valRewardFinal: Number(after['val/reward_mean'].toFixed(4)),
      valAccuracyInitial: Number((before['val/accuracy_mean'] ?? 0).toFixed(4)),
      valAccuracyFinal: Number((after['val/accuracy_mean'] ?? 0).toFixed(4)),
      lastStep: last?.metrics ?? {},
      engine: 'openai',
      spawnedServer: child !== undefined,
      engineStats: sampler.stats(),
    };
  } finally {
    trainer.dispose();
    trainerModel.dispose();
    await child?.close();
    await rm(workdir, { recursive: true, force: true });
  }
}
