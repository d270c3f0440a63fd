/**
 * `rxrl tinker`: rxrl's Tinker-API service for a Hugging Face model directory (see {@link tinkerService}).
 *
 * @packageDocumentation
 */
import { resolve } from 'node:path';

import { ConfigError } from '../core/errors.js';
import { initBackend, type BackendKind } from '../model/backend.js';
import { loadTokenizer } from '../model/hfTokenizer.js';
import { modelNameOf, resolveModelDir } from '../model/hubCache.js';
import { isModelDir, loadModelDir } from '../model/modelDir.js';
import { tinkerService, type TinkerService } from './service.js';

/** Options of {@link runTinkerCommand}. */
export interface TinkerCommandOptions {
  /** The base model's directory. */
  readonly model: string | undefined;
  /** The name clients give as `base_model`. Default: the directory's name. */
  readonly modelName?: string | undefined;
  readonly host?: string | undefined;
  /** Default 8000; 0 picks a free port. */
  readonly port?: number;
  readonly apiKey?: string | undefined;
  readonly stateDir?: string | undefined;
  readonly maxModels?: number;
  readonly maxRank?: number;
  readonly backend?: BackendKind;
  /** Stops the service. */
  readonly signal: AbortSignal;
  readonly out: (line: string) => void;
  /** Called once the service listens (tests). */
  readonly onListening?: (service: TinkerService) => void;
}

/**
 * Loads the model directory, starts the service, prints `{"event":"listening","url":…}` and serves until the
 * signal fires.
 *
 * @returns The process exit code.
 * @throws {@link ConfigError} for a missing or invalid model directory, or an empty `--api-key`.
 */
export async function runTinkerCommand(options: TinkerCommandOptions): Promise<number> {
  if (options.model === undefined)
    throw new ConfigError('rxrl tinker needs --model DIR (a Hugging Face model directory)', { context: { key: 'model' } });
  // Checked before anything loads: an empty key would otherwise serve every request without one.
  if (options.apiKey !== undefined && options.apiKey.trim() === '')
    throw new ConfigError('--api-key must not be empty', { context: { key: 'api-key' } });
  const dir = await resolveModelDir(options.model, {
    key: '--model',
    log: (line) => process.stderr.write(`rxrl: ${line}\n`),
    signal: options.signal,
  });
  if (!(await isModelDir(dir)))
    throw new ConfigError(`--model ${options.model}: not a model directory`, { context: { key: 'model', path: dir } });
  const backend = await initBackend(options.backend ?? 'auto', { logger: { info: () => undefined } });
  const tokenizer = await loadTokenizer(dir);
  const { model } = await loadModelDir(dir);
  try {
    const baseModel = options.modelName ?? modelNameOf(options.model, dir);
    const service = await tinkerService({
      model,
      tokenizer,
      baseModel,
      tokenizerId: dir,
      host: options.host,
      port: options.port ?? 8000,
      ...(options.apiKey === undefined ? {} : { apiKey: options.apiKey }),
      ...(options.stateDir === undefined ? {} : { stateDir: resolve(options.stateDir) }),
      ...(options.maxModels === undefined ? {} : { maxModels: options.maxModels }),
      ...(options.maxRank === undefined ? {} : { maxRank: options.maxRank }),
    });
    options.out(
      JSON.stringify({ event: 'listening', url: service.url, base_model: baseModel, backend, parameters: model.numParameters() }),
    );
    options.onListening?.(service);
    await new Promise<void>((done) => {
      if (options.signal.aborted) done();
      else options.signal.addEventListener('abort', () => done(), { once: true });
    });
    await service.close();
    options.out(JSON.stringify({ event: 'closed' }));
    return 0;
  } finally {
    model.dispose();
  }
}
