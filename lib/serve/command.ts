/**
 * The `rxrl serve` command: builds (or loads) a policy, serves it until the signal fires, and reports on stdout.
 *
 * @packageDocumentation
 */
import { REASONING_PARSERS, type ReasoningParserName } from './reasoning.js';
import { stat } from 'node:fs/promises';

import { loadChatTemplate } from '../chat/jinjaTemplate.js';
import type { ChatTemplate } from '../chat/template.js';
import type { Tokenizer } from '../model/types.js';
import { ConfigError } from '../core/errors.js';
import { initBackend, type BackendKind } from '../model/backend.js';
import { loadTokenizer } from '../model/hfTokenizer.js';
import { modelNameOf, resolveModelDir } from '../model/hubCache.js';
import { isModelDir, loadModelDir } from '../model/modelDir.js';
import { CharTokenizer } from '../model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../model/transformer.js';
import { POLICY_VERSION_METADATA_KEY } from '../model/modelDir.js';
import { serve, type RxrlServer } from './server.js';
import type { SessionLimits } from './sessions.js';

/** Options of {@link runServeCommand}. */
export interface ServeCommandOptions {
  /**
   * A Hugging Face model directory (config.json, safetensors, tokenizer files; an rxrl run checkpoint is one):
   * its weights, tokenizer and chat template are served. Otherwise a fresh tiny policy with the character
   * tokenizer of `alphabet` is initialized.
   */
  readonly model?: string | undefined;
  /** The flag that named `model`, for messages (`--model` or `--checkpoint`). Default `model`. */
  readonly modelFlag?: 'model' | 'checkpoint';
  /** Character alphabet of a fresh policy (without `model`). */
  readonly alphabet?: string | undefined;
  /** Alphabet when the flag names none. */
  readonly defaultAlphabet: string;
  /** Architecture of a fresh policy (the vocabulary comes from the alphabet). */
  readonly defaultModel: Omit<PolicyConfig, 'vocabSize'>;
  /** Seed of a fresh policy. Default 1. */
  readonly seed?: number;
  /** Interface. Default `127.0.0.1`. */
  readonly host?: string | undefined;
  /** Port; 0 picks a free one. Default 8000. */
  readonly port?: number;
  /** Served model name. Default: the model directory's name, else `rxrl-policy`. */
  readonly modelName?: string | undefined;
  /** TF.js backend. Default `auto`. */
  readonly backend?: BackendKind;
  /** Most samples per batched generation. */
  readonly maxBatchSize?: number;
  /** How long an idle server waits for more requests before starting a batch, in ms. */
  readonly maxWaitMs?: number;
  /** Only model directories below this one may be loaded by `update_weights_from_disk`. */
  readonly weightsRoot?: string | undefined;
  /**
   * Longest context served (`--max-model-len`): caps `max_position_embeddings`, and with it the cache that the
   * model's size is checked against before anything is allocated.
   */
  readonly maxModelLen?: number;
  /** Bearer token required on every route but `/health`. */
  readonly apiKey?: string | undefined;
  /** LoRA adapters to serve, model name → PEFT directory (`--lora-modules`). */
  readonly loraModules?: Readonly<Record<string, string>> | undefined;
  /** `--reasoning-parser`: one of {@link REASONING_PARSERS}. */
  readonly reasoningParser?: string | undefined;
  /** Limits of recorded sessions (`--max-sessions`, `--max-session-tokens`, `--session-idle-ms`). */
  readonly sessions?: SessionLimits;
  /** Log one JSON line per request on stderr. Default false. */
  readonly verbose?: boolean;
  /** Stops the server. */
  readonly signal: AbortSignal;
  /** Where the JSON status lines go (stdout). */
  readonly out: (line: string) => void;
  /** Where logs go (stderr). */
  readonly err: (line: string) => void;
  /** Called once the server listens (tests). */
  readonly onListening?: (server: RxrlServer) => void;
}

/**
 * Serves a policy until `signal` fires. Prints `{"event":"listening","url",…}` once listening and
 * `{"event":"closed",…}` after a graceful stop, one JSON object per line.
 *
 * @param options - the policy source, the address and the output sinks.
 * @returns the process exit code (0).
 * @throws {@link ConfigError} when `model` is not a model directory or its tokenizer does not fit its weights.
 */
export async function runServeCommand(options: ServeCommandOptions): Promise<number> {
  // The model directory and its tokenizer are checked before the backend starts (and logs a line), so a bad path
  // fails with its error alone.
  const reasoningParser = readReasoningParser(options.reasoningParser);
  const dir = options.model === undefined ? undefined : await checkedModelDir(options.model, options);
  const dirTokenizer = dir === undefined ? undefined : await loadTokenizer(dir);
  const backend = await initBackend(options.backend ?? 'auto', {
    logger: { info: (obj, msg) => options.err(`rxrl: ${msg} ${JSON.stringify(obj)}`) },
  });
  let model: PolicyModel;
  let tokenizer: Tokenizer;
  let chatTemplate: ChatTemplate | undefined;
  let version = 0;
  let modelName = options.modelName;
  if (dir !== undefined && dirTokenizer !== undefined) {
    tokenizer = dirTokenizer;
    const loaded = await loadModelDir(dir, options.maxModelLen === undefined ? {} : { maxModelLen: options.maxModelLen });
    model = loaded.model;
    if (tokenizer.vocabSize > model.config.vocabSize) {
      model.dispose();
      throw new ConfigError(
        `${dir}: the tokenizer has ${tokenizer.vocabSize} token ids but the model's vocabulary has ${model.config.vocabSize}`,
        { context: { key: 'model', path: dir } },
      );
    }
    chatTemplate = await loadChatTemplate(dir, tokenizer);
    const stored = Number(loaded.contents.metadata[POLICY_VERSION_METADATA_KEY] ?? 0);
    version = Number.isSafeInteger(stored) && stored >= 0 ? stored : 0;
    modelName ??= modelNameOf(options.model ?? dir, dir);
  } else {
    tokenizer = new CharTokenizer(options.alphabet ?? options.defaultAlphabet);
    model = PolicyModel.create({ ...options.defaultModel, vocabSize: tokenizer.vocabSize }, options.seed ?? 1);
  }
  try {
    const server = await serve({
      model,
      tokenizer,
      host: options.host,
      port: options.port ?? 8000,
      modelName,
      version,
      ...(chatTemplate ? { chatTemplate } : {}),
      maxBatchSize: options.maxBatchSize,
      maxWaitMs: options.maxWaitMs,
      ...(options.maxModelLen === undefined ? {} : { maxModelLen: options.maxModelLen }),
      ...(options.weightsRoot === undefined ? {} : { weightsRoot: options.weightsRoot }),
      ...(options.apiKey === undefined ? {} : { apiKey: options.apiKey }),
      ...(options.loraModules === undefined ? {} : { loraModules: options.loraModules }),
      ...(reasoningParser === undefined ? {} : { reasoningParser }),
      ...(options.sessions === undefined ? {} : { sessions: options.sessions }),
      log: options.verbose ? (record) => options.err(JSON.stringify(record)) : undefined,
    });
    options.out(
      JSON.stringify({
        event: 'listening',
        url: server.url,
        baseURL: server.baseURL,
        model: server.modelName,
        policy_version: server.version,
        backend,
        parameters: model.numParameters(),
      }),
    );
    options.onListening?.(server);
    await new Promise<void>((resolve) => {
      if (options.signal.aborted) resolve();
      else options.signal.addEventListener('abort', () => resolve(), { once: true });
    });
    await server.close();
    options.out(JSON.stringify({ event: 'closed', policy_version: server.version }));
    return 0;
  } finally {
    model.dispose();
  }
}

/** The absolute path of the `--model` directory, or a {@link ConfigError} naming the flag and the path. */
async function checkedModelDir(model: string, options: ServeCommandOptions): Promise<string> {
  const key = options.modelFlag ?? 'model';
  const dir = await resolveModelDir(model, { key: `--${key}`, log: (line) => options.err(`rxrl: ${line}`), signal: options.signal });
  if (!(await isModelDir(dir))) {
    const why = (await isDirectory(dir)) ? 'no config.json' : 'no such directory';
    throw new ConfigError(`--${key} ${model}: not a model directory (${why})`, { context: { key, path: dir } });
  }
  if (options.alphabet !== undefined) {
    throw new ConfigError('--alphabet applies to a fresh policy only: a model directory carries its tokenizer', {
      context: { key: 'alphabet' },
    });
  }
  return dir;
}

async function isDirectory(path: string): Promise<boolean> {
  return (await stat(path).catch(() => undefined))?.isDirectory() ?? false;
}

/** `--reasoning-parser`'s value, or a {@link ConfigError} listing the known ones. */
function readReasoningParser(name: string | undefined): ReasoningParserName | undefined {
  if (name === undefined) return undefined;
  if (!(REASONING_PARSERS as readonly string[]).includes(name)) {
    throw new ConfigError(`--reasoning-parser ${name}: not a known parser (${REASONING_PARSERS.join(', ')})`, {
      context: { key: 'reasoning-parser' },
    });
  }
  return name as ReasoningParserName;
}
