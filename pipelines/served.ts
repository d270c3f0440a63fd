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

import { OpenAIEngine, type OpenAIEngineStats } from '../lib/engine/openai.js';
import { openaiClient } from '../lib/engine/openaiClient.js';
import { ConfigError } from '../lib/core/errors.js';
import { POLICY_VERSION_METADATA_KEY, saveModelDir, specialIdsOf } from '../lib/model/modelDir.js';
import { spawnServe, type SpawnedServer } from '../lib/serve/spawn.js';
import { embeddedConfig, embeddedSummary, type EmbeddedRunOptions, type EmbeddedRunSummary } from './embedded.js';
import { runTraining } from './run.js';

/** Deadline of asking a server which model it serves (`GET /models`, its body included), in ms. */
const MODEL_LIST_TIMEOUT_MS = 120_000;

/** Options of {@link runServed}: those of the embedded run, plus where the server is. */
export interface ServedRunOptions extends EmbeddedRunOptions {
  /**
   * Base URL of a running OpenAI-compatible server (e.g. `OPENAI_BASE_URL`). Its model must use the task's
   * character tokenizer and architecture; the initial weights are pushed to it before training. Default: start
   * `rxrl serve` as a child process on a free loopback port.
   */
  readonly baseURL?: string | undefined;
  /** Served model name. Default: the child's, or the first model the server lists. */
  readonly modelName?: string | undefined;
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
 * Trains the bundled task like {@link runEmbedded} — the same {@link runTraining} loop, model, trainer and seeds —
 * sampling through an OpenAI-compatible server instead of the in-process engine.
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
  const config = embeddedConfig(options);
  const workdir = await mkdtemp(join(tmpdir(), 'rxrl-served-'));
  let child: SpawnedServer | undefined;
  let sampler: OpenAIEngine | undefined;
  try {
    const summary = await runTraining(config, {
      signal: options.signal,
      onStep: options.onStep,
      createEngine: async ({ policy, tokenizer, version, backend, samplesPerStep }) => {
        let baseURL = options.baseURL;
        let modelName = options.modelName;
        if (baseURL === undefined) {
          const initial = join(workdir, 'initial');
          await saveModelDir(initial, policy, {
            tokenizerFiles: tokenizer.files(),
            special: specialIdsOf(tokenizer),
            metadata: { [POLICY_VERSION_METADATA_KEY]: String(version) },
          });
          const args = ['--port', '0', '--model', initial, '--served-model-name', 'rxrl-policy', '--backend', backend];
          args.push('--max-batch-size', String(samplesPerStep), '--max-wait-ms', String(options.serverMaxWaitMs ?? 200));
          child = await spawnServe(args, { cliPath: options.cliPath, signal: options.signal });
          baseURL = child.baseURL;
          modelName ??= child.modelName;
        }
        const apiKey = options.apiKey ?? process.env.OPENAI_API_KEY ?? 'EMPTY';
        if (modelName === undefined) {
          const client = openaiClient({ baseURL, apiKey, timeoutMs: MODEL_LIST_TIMEOUT_MS });
          const deadline = AbortSignal.timeout(MODEL_LIST_TIMEOUT_MS);
          const signal = options.signal ? AbortSignal.any([options.signal, deadline]) : deadline;
          modelName = (await client.models.list({ signal })).data[0]?.id;
        }
        if (modelName === undefined) throw new ConfigError(`the server at ${baseURL} lists no model`);
        sampler = new OpenAIEngine({
          baseURL,
          model: modelName,
          apiKey,
          tokenizer,
          concurrency: samplesPerStep,
          weightSync: {
            directory: options.weightDirectory ?? join(workdir, 'weights'),
            config: policy.config,
            // The initial push may take a server that served other weights back to this run's version.
            body: (modelPath, v) => ({ model_path: modelPath, weight_version: String(v), ...(v === version ? { force: true } : {}) }),
          },
        });
        // A server this run did not start gets the initial weights before the first rollout.
        if (child === undefined) await sampler.loadWeights(version, policy.getWeights());
        return sampler;
      },
    });
    return {
      ...embeddedSummary(summary),
      engine: 'openai',
      spawnedServer: child !== undefined,
      engineStats: sampler!.stats(),
    };
  } finally {
    await child?.close();
    await rm(workdir, { recursive: true, force: true });
  }
}
