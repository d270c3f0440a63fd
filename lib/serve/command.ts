/**
 * The `rxrl serve` command: builds (or loads) a policy, serves it until the signal fires, and reports on stdout.
 *
 * @packageDocumentation
 */
import type { Tokenizer } from '../engine/types.js';
import { ConfigError } from '../errors.js';
import { initBackend, type BackendKind } from '../model/backend.js';
import { loadPolicy } from '../model/policyFile.js';
import { CHAR_SPECIAL_TOKENS, CharTokenizer } from '../model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../model/transformer.js';
import { POLICY_VERSION_METADATA_KEY, serve, type RxrlServer } from './server.js';

/** Metadata key under which a checkpoint may name its tokenizer alphabet. */
export const ALPHABET_METADATA_KEY = 'rxrl.alphabet';

/** Options of {@link runServeCommand}. */
export interface ServeCommandOptions {
  /** A policy file (`savePolicy`: weights plus architecture); otherwise a fresh policy is initialized. */
  readonly checkpoint?: string;
  /** Tokenizer alphabet. Default: the checkpoint's `rxrl.alphabet` metadata, else `defaultAlphabet`. */
  readonly alphabet?: string;
  /** Alphabet when neither the flag nor the checkpoint names one. */
  readonly defaultAlphabet: string;
  /** Architecture of a fresh policy (the vocabulary comes from the alphabet). */
  readonly defaultModel: Omit<PolicyConfig, 'vocabSize'>;
  /** Seed of a fresh policy. Default 1. */
  readonly seed?: number;
  /** Interface. Default `127.0.0.1`. */
  readonly host?: string;
  /** Port; 0 picks a free one. Default 8000. */
  readonly port?: number;
  /** Served model name. */
  readonly modelName?: string;
  /** TF.js backend. Default `auto`. */
  readonly backend?: BackendKind;
  /** Most samples per batched generation. */
  readonly maxBatchSize?: number;
  /** How long an idle server waits for more requests before starting a batch, in ms. */
  readonly maxWaitMs?: number;
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
 * @throws {@link ConfigError} when the alphabet does not fit the checkpoint's vocabulary.
 */
export async function runServeCommand(options: ServeCommandOptions): Promise<number> {
  const backend = await initBackend(options.backend ?? 'auto', {
    logger: { info: (obj, msg) => options.err(`rxrl: ${msg} ${JSON.stringify(obj)}`) },
  });
  let model: PolicyModel;
  let tokenizer: Tokenizer;
  let version = 0;
  if (options.checkpoint !== undefined) {
    const loaded = await loadPolicy(options.checkpoint);
    model = loaded.model;
    const alphabet = options.alphabet ?? loaded.metadata[ALPHABET_METADATA_KEY] ?? options.defaultAlphabet;
    tokenizer = new CharTokenizer(alphabet);
    if (tokenizer.vocabSize !== model.config.vocabSize) {
      model.dispose();
      throw new ConfigError(
        `alphabet '${alphabet}' gives ${tokenizer.vocabSize} token ids but the checkpoint's vocabulary has ${model.config.vocabSize} ` +
          `(${model.config.vocabSize - CHAR_SPECIAL_TOKENS} characters); pass --alphabet`,
      );
    }
    const stored = Number(loaded.metadata[POLICY_VERSION_METADATA_KEY] ?? 0);
    version = Number.isSafeInteger(stored) && stored >= 0 ? stored : 0;
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
      modelName: options.modelName,
      version,
      maxBatchSize: options.maxBatchSize,
      maxWaitMs: options.maxWaitMs,
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
