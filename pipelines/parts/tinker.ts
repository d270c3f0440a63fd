/**
 * A run trained on a Tinker-API service (`trainer.backend: tinker`): the pipeline keeps the rollouts, rewards and
 * advantages; the service's LoRA training client does forward, backward and Adam, and rollouts sample through its
 * sampling sessions. Checkpoints record the service's saved state (`tinker.json`); a resumed run makes its training
 * client from that state.
 *
 * @packageDocumentation
 */
import { saveCheckpoint } from '../../lib/checkpoint/checkpoint.js';
import { lossOf } from './settings.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import { ConfigError, RetriesExhaustedError } from '../../lib/core/errors.js';
import { retry } from '../../lib/core/retry.js';
import { TinkerClient, TinkerClientTrainer, TinkerEngine, TinkerError, tinkerHealthy, tinkerServiceLost } from '../../lib/tinker/client.js';
import type { RunParts, RunSetup, RunTrainingOptions, SavedCheckpoint } from './contracts.js';
import { openLedger } from './ledger.js';

/**
 * Connects to the service and builds the run's trainer and engine on it: a new LoRA training client of
 * `tinker.rank`, or one made from the checkpoint's saved state.
 *
 * @throws {@link ConfigError} for what such a run cannot do (Kafka workers, a caller's engine, a local checkpoint).
 */
export async function tinkerParts(
  config: Pick<RxrlConfig, 'checkpoint' | 'data' | 'logging' | 'run' | 'tinker' | 'trainer'>,
  options: RunTrainingOptions,
  setup: RunSetup,
  runDir: string | undefined,
  onSaved: SavedCheckpoint,
): Promise<RunParts> {
  const { checkpoint, tokenizer } = setup;
  const key = { context: { key: 'trainer.backend' } };
  if (options.kafka) throw new ConfigError("trainer.backend 'tinker': rollouts sample through the service, not through Kafka workers", key);
  if (options.createEngine)
    throw new ConfigError("trainer.backend 'tinker': rollouts sample through the service, not through createEngine", key);
  if (checkpoint !== undefined && checkpoint.tinker === undefined) {
    throw new ConfigError(
      `resume: checkpoint ${checkpoint.path} holds local weights, not a state on a Tinker service; set resume.mode to 'disable' to start over`,
      key,
    );
  }
  const baseModel = config.tinker.baseModel as string;
  if (checkpoint?.tinker !== undefined && checkpoint.tinker.baseModel !== baseModel) {
    throw new ConfigError(
      `resume: checkpoint ${checkpoint.path} adapts '${checkpoint.tinker.baseModel}', not tinker.baseModel '${baseModel}'`,
      { context: { key: 'tinker.baseModel' } },
    );
  }
  const client = await TinkerClient.connect({
    baseURL: config.tinker.baseUrl as string,
    apiKey: config.tinker.apiKey,
    futureTimeoutMs: config.tinker.futureTimeoutMs,
    pollTimeoutMs: config.tinker.pollTimeoutMs,
    ...(options.signal ? { signal: options.signal } : {}),
  });
  try {
    const unhonoured = client.capabilities.unhonoured;
    if (unhonoured.length > 0)
      options.log?.(`the Tinker service at ${config.tinker.baseUrl} does not take: ${unhonoured.join('; ')} — the run trains without them`);
    const t = config.trainer;
    const from = checkpoint?.tinker === undefined ? undefined : { path: checkpoint.tinker.path, step: checkpoint.state.step };
    const rank = checkpoint?.tinker?.rank ?? config.tinker.rank;
    const trainer = await TinkerClientTrainer.create(
      client,
      baseModel,
      rank,
      {
        loss: lossOf(t.algorithm),
        learningRate: t.learningRate,
        clipLow: t.clipLow,
        clipHigh: t.clipHigh,
        maxGradNorm: t.maxGradNorm,
        seed: config.run.seed,
      },
      from,
    );
    const ledger = await openLedger(config, { ...setup, warn: options.log }, async (pendingTasks, loader, buffered) => {
      if (!runDir) return;
      const step = trainer.step;
      const state = await trainer.saveState(`step-${step}`);
      const path = await saveCheckpoint(runDir, {
        state: { step, version: step, seed: config.run.seed, loader, pendingTasks },
        buffered,
        model: { tinker: { path: state, baseModel, rank } },
        ...(unhonoured.length > 0 ? { metadata: { 'rxrl.tinker.unhonoured': unhonoured.join('; ') } } : {}),
      });
      await onSaved(path, step, pendingTasks.length);
    });
    return {
      policy: undefined,
      lora: undefined,
      reference: undefined,
      engine: new TinkerEngine(trainer, tokenizer),
      trainer,
      ledger,
      serviceLost: tinkerServiceLost,
      dispose: async (failed) => {
        await ledger.close(failed);
        // Finishing the session frees its training client on the service.
        await client.close();
      },
    };
  } catch (error) {
    await client.close();
    throw error;
  }
}

/**
 * Waits until the run's Tinker service answers its health check again, for `tinker.recoverTimeoutMs` at most.
 *
 * @param lost - The error that lost it (the cause of the timeout's error).
 * @throws {@link TinkerError} when it does not answer in time; the signal's reason when the run is stopped.
 */
export async function waitForTinker(config: Pick<RxrlConfig, 'tinker'>, signal: AbortSignal, lost: unknown): Promise<void> {
  const target = { baseURL: config.tinker.baseUrl as string, apiKey: config.tinker.apiKey };
  const { recoverTimeoutMs } = config.tinker;
  try {
    await retry(
      async () => {
        if (!(await tinkerHealthy(target, signal))) throw new TinkerError(`the Tinker service at ${target.baseURL} is not healthy yet`);
      },
      {
        retries: Infinity,
        deadlineMs: recoverTimeoutMs,
        initialDelayMs: 100,
        maxDelayMs: 5_000,
        jitter: 0,
        isRetriable: (error) => error instanceof TinkerError,
        signal,
      },
    );
  } catch (error) {
    if (!(error instanceof RetriesExhaustedError)) throw error;
    throw new TinkerError(
      `the Tinker service at ${target.baseURL} did not answer within tinker.recoverTimeoutMs (${recoverTimeoutMs} ms)`,
      {
        cause: lost,
        context: { key: 'tinker.recoverTimeoutMs' },
      },
    );
  }
}
