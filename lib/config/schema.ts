/**
 * One configuration schema for the whole pipeline, validated once at the edge with convict; plain typed values
 * flow inward. Recipes are JSON or YAML files; `--set key=value` and environment variables override them.
 *
 * @packageDocumentation
 */
import { readFileSync } from 'node:fs';
import { extname } from 'node:path';
import convict from 'convict';
import { parse as parseYaml } from 'yaml';
import { ConfigError, UsageError } from '../core/errors.js';
import { parseShardSize } from '../core/sizes.js';
import { unknownKeyProblem, unknownKeys } from './keys.js';
import { resolveSetPath } from './paths.js';
import { redactSecrets } from './redact.js';
import { DEFAULT_POLICY_LORA, validateLoraConfig, type LoraConfig } from '../model/lora.js';
import { generationBatchProblem } from '../sync/gate.js';

/** One agent of a multi-agent run (`agents.roles[i]`). */
export interface AgentRoleConfig {
  /** The agent's name in the environment's turn order. */
  name: string;
  /** Name of the policy (`policies[j].name`) it samples from and trains. */
  policy: string;
  /** Prompt specialization: text put before each observation. */
  prompt?: string;
}

/** How a policy is specialized (PettingLLMs' levels; a single-agent run uses `full` or `lora`). */
export type Specialization = 'prompt' | 'lora' | 'full';

/** Valid {@link Specialization} names. */
export const SPECIALIZATIONS: readonly Specialization[] = ['prompt', 'lora', 'full'];

/** One policy of a run (`policies[j]`): each agent's in a multi-agent run, or a single-agent run's only one. */
export interface PolicyEntryConfig {
  /** The policy's name: its `modelTag`, its metrics namespace and its checkpoint folder. */
  name: string;
  /**
   * `prompt`: a full model its agents share, told apart by their prompts (L0/L1); `lora`: an adapter on the one
   * frozen base every `lora` policy shares (L2); `full`: a full model of its own (L3).
   */
  specialization: Specialization;
  /** `lora` only: the adapter. Default rank 8, alpha 16, every target module. */
  lora?: LoraConfig;
  /**
   * `lora` only: a PEFT adapter directory (relative to the recipe) the adapter starts from instead of a fresh one,
   * e.g. an SFT run's checkpoint; it must be the adapter `lora` describes.
   */
  adapterPath?: string;
}

const KL_ESTIMATORS = ['k1', 'abs', 'mse', 'k3', 'low_var_kl'] as const;

function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`must be ${what}`);
}

/**
 * The TypeScript type of a value each registered format accepts: the table {@link RxrlConfig} is typed by.
 * {@link FORMATS} must register exactly these names (it `satisfies` a record over them), so a format cannot be
 * added, renamed or removed on one side only.
 */
interface FormatValues {
  'positive-int': number;
  'non-negative-int': number;
  'positive-number': number;
  'non-negative-number': number;
  'finite-number': number;
  'unit-interval': number;
  'clip-range': number;
  'optional-positive-number': number | null;
  'optional-positive-int': number | null;
  'optional-non-negative-int': number | null;
  'optional-string': string | null;
  flag: boolean;
  'string-map': Record<string, string>;
  'non-empty-string': string;
  'shard-size': string | number;
  'agent-roles': AgentRoleConfig[];
  'policy-entries': PolicyEntryConfig[];
}

/** A format name registered with convict (a key of {@link FORMATS}). */
type FormatName = keyof FormatValues;

/** Text that is a decimal integer (`42`, `-3`): nothing else (not empty, not `0x10`, `1e3` or ` 7 `). */
const DECIMAL_INTEGER = /^[+-]?\d+$/;
/** Text that is a decimal number (`0.5`, `-2`, `1e-3`). */
const DECIMAL_NUMBER = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;

/**
 * convict's coercion of text (environment variables, `--set`, quoted recipe values) to a number: only text that
 * `pattern` accepts becomes one; any other text stays text and fails the format's validation, naming the key
 * (`Number` would read `''` as 0 and `0x10` as 16).
 */
function decimal(pattern: RegExp): (v: unknown) => unknown {
  return (v) => (typeof v === 'string' && pattern.test(v) ? Number(v) : v);
}
const integerText = decimal(DECIMAL_INTEGER);
const numberText = decimal(DECIMAL_NUMBER);

/** The formats of {@link SCHEMA}'s leaves, registered with convict once, below. */
const FORMATS = {
  'positive-int': { validate: (v: unknown) => check(Number.isInteger(v) && (v as number) >= 1, 'an integer >= 1'), coerce: integerText },
  'non-negative-int': {
    validate: (v: unknown) => check(Number.isInteger(v) && (v as number) >= 0, 'an integer >= 0'),
    coerce: integerText,
  },
  'positive-number': {
    validate: (v: unknown) => check(typeof v === 'number' && Number.isFinite(v) && v > 0, 'a finite number > 0'),
    coerce: numberText,
  },
  'finite-number': {
    validate: (v: unknown) => check(typeof v === 'number' && Number.isFinite(v), 'a finite number'),
    coerce: numberText,
  },
  'non-negative-number': {
    validate: (v: unknown) => check(typeof v === 'number' && Number.isFinite(v) && v >= 0, 'a finite number >= 0'),
    coerce: numberText,
  },
  'unit-interval': {
    validate: (v: unknown) => check(typeof v === 'number' && v > 0 && v <= 1, 'a number in (0, 1]'),
    coerce: numberText,
  },
  'clip-range': {
    validate: (v: unknown) => check(typeof v === 'number' && v >= 0 && v < 1, 'a number in [0, 1)'),
    coerce: numberText,
  },
  'optional-positive-number': {
    validate: (v: unknown) => check(v === null || (typeof v === 'number' && Number.isFinite(v) && v > 0), 'null or a finite number > 0'),
    coerce: (v: unknown) => (v === 'null' ? null : numberText(v)),
  },
  'optional-positive-int': {
    validate: (v: unknown) => check(v === null || (Number.isInteger(v) && (v as number) >= 1), 'null or an integer >= 1'),
    coerce: (v: unknown) => (v === 'null' ? null : integerText(v)),
  },
  'optional-non-negative-int': {
    validate: (v: unknown) => check(v === null || (Number.isInteger(v) && (v as number) >= 0), 'null or an integer >= 0'),
    coerce: (v: unknown) => (v === 'null' ? null : integerText(v)),
  },
  'optional-string': {
    validate: (v: unknown) => check(v === null || (typeof v === 'string' && v.length > 0), 'null or a non-empty string'),
  },
  flag: {
    validate: (v: unknown) => check(typeof v === 'boolean', 'true or false'),
    coerce: (v: unknown) => (v === 'true' ? true : v === 'false' ? false : v),
  },
  'string-map': {
    validate: (v: unknown) =>
      check(
        typeof v === 'object' && v !== null && !Array.isArray(v) && Object.values(v).every((x) => typeof x === 'string'),
        'an object of strings',
      ),
  },
  'non-empty-string': { validate: (v: unknown) => check(typeof v === 'string' && v.length > 0, 'a non-empty string') },
  'shard-size': {
    // What the text or number means is checked once the configuration is whole (parseShardSize, in requireWhen).
    validate: (v: unknown) =>
      check((typeof v === 'string' && v.length > 0) || typeof v === 'number', 'a size ("50GB", "500MB", "2GiB") or a number of bytes'),
    coerce: numberText,
  },
  'agent-roles': {
    validate: (v: unknown) => checkEntries(v, ['name', 'policy'], ['prompt'], { name: 'string', policy: 'string', prompt: 'string' }),
  },
  'policy-entries': {
    validate: (v: unknown) =>
      checkEntries(v, ['name', 'specialization'], ['lora', 'adapterPath'], {
        name: 'string',
        specialization: SPECIALIZATIONS,
        lora: 'object',
        adapterPath: 'string',
      }),
  },
} satisfies { readonly [F in FormatName]: convict.Format };

convict.addFormats(FORMATS);

/** Checks a list of plain objects: required and optional fields, each a non-empty string, one of a list, or an object. */
function checkEntries(
  value: unknown,
  required: readonly string[],
  optional: readonly string[],
  kinds: Readonly<Record<string, 'string' | 'object' | readonly string[]>>,
): void {
  if (!Array.isArray(value)) throw new Error('must be a list');
  value.forEach((entry: unknown, i) => {
    if (typeof entry !== 'object' || entry === null || Array.isArray(entry)) throw new Error(`[${i}] must be an object`);
    const fields = entry as Record<string, unknown>;
    for (const key of required) if (!(key in fields)) throw new Error(`[${i}].${key} is required`);
    for (const [key, field] of Object.entries(fields)) {
      const kind = kinds[key];
      if (kind === undefined || !(required.includes(key) || optional.includes(key))) {
        throw new Error(`[${i}].${key} is not a field; fields: ${[...required, ...optional].join(', ')}`);
      }
      if (kind === 'string' && !(typeof field === 'string' && field.length > 0))
        throw new Error(`[${i}].${key} must be a non-empty string`);
      if (kind === 'object' && (typeof field !== 'object' || field === null || Array.isArray(field)))
        throw new Error(`[${i}].${key} must be an object`);
      if (Array.isArray(kind) && !kind.includes(field as string)) throw new Error(`[${i}].${key} must be one of ${kind.join(', ')}`);
    }
  });
}
convict.addParser([
  { extension: 'json', parse: JSON.parse },
  { extension: ['yml', 'yaml'], parse: parseYaml },
]);

/**
 * A leaf of {@link SCHEMA}: a documented key with a registered format, a list of allowed values or `String`
 * (any string, empty too), and a default: its type is checked against the format's where {@link loadConfig} hands
 * SCHEMA to convict, its value by convict's validation of every load.
 */
export interface SchemaLeaf {
  readonly doc: string;
  readonly format: FormatName | readonly string[] | StringConstructor;
  readonly default: unknown;
  readonly env?: string;
  readonly sensitive?: boolean;
}

/** A group of {@link SCHEMA}: named leaves and groups. */
interface SchemaGroup {
  readonly [key: string]: SchemaLeaf | SchemaGroup;
}

/** The schema: every key with `doc`, `format`, `default` and, where useful, `env`. */
export const SCHEMA = {
  run: {
    dir: {
      doc: 'Run directory: checkpoints, metrics.jsonl, trained.jsonl. Default runs/<recipe name>.',
      format: 'optional-string',
      default: null,
      env: 'RXRL_RUN_DIR',
    },
    seed: {
      doc: 'Seed of the model init, the shuffle and the sampling streams.',
      format: 'non-negative-int',
      default: 1,
      env: 'RXRL_SEED',
    },
    steps: { doc: 'Train steps (0 = until the data is exhausted).', format: 'non-negative-int', default: 300, env: 'RXRL_STEPS' },
    backend: { doc: 'TF.js backend.', format: ['auto', 'wasm', 'cpu', 'tensorflow'], default: 'auto', env: 'RXRL_BACKEND' },
    errorPolicy: {
      doc: 'A failed sample (engine or evaluator error): continue with its group shrunk (counted), or stop the run gracefully.',
      format: ['stop_on_error', 'continue'],
      default: 'continue',
    },
  },
  data: {
    source: {
      doc: "Tasks: the generated string task ('bundled'), generated arithmetic questions for a chat model ('arithmetic'), bare expressions for a calculator agent on the character tokenizer ('calculator'), or task files ('jsonl': JSONL, Parquet, or a directory of Parquet shards; prompts as text or chat messages, TRL's and verl's columns).",
      format: ['bundled', 'arithmetic', 'calculator', 'jsonl'],
      default: 'bundled',
    },
    task: {
      transform: { doc: 'Bundled task: transformation to learn.', format: ['copy', 'reverse', 'shift'], default: 'reverse' },
      alphabet: { doc: 'Bundled task: letters of the strings.', format: 'non-empty-string', default: 'abcde' },
      minLength: { doc: 'Bundled task: shortest string.', format: 'positive-int', default: 4 },
      maxLength: { doc: 'Bundled task: longest string.', format: 'positive-int', default: 4 },
      validationSize: { doc: 'Bundled task: held-out tasks.', format: 'positive-int', default: 100 },
    },
    arithmetic: {
      operators: { doc: "Arithmetic task: operators, a string of '+', '-', '*'.", format: 'non-empty-string', default: '+*' },
      maxOperand: { doc: 'Arithmetic task: largest operand (operands run from 1).', format: 'positive-int', default: 12 },
      validationSize: { doc: 'Arithmetic task: held-out questions.', format: 'positive-int', default: 64 },
    },
    calculator: {
      operators: { doc: "Calculator task: operators, a string of '+', '-', '*'.", format: 'non-empty-string', default: '+*' },
      maxOperand: { doc: 'Calculator task: largest operand (operands run from 0).', format: 'positive-int', default: 20 },
      validationSize: { doc: 'Calculator task: held-out expressions.', format: 'positive-int', default: 64 },
    },
    trainFile: {
      doc: "Training tasks (required when data.source is 'jsonl'): a .jsonl or .parquet file, or a directory of .parquet shards; relative to the recipe.",
      format: 'optional-string',
      default: null,
    },
    validationFile: {
      doc: 'Held-out tasks: a .jsonl or .parquet file, or a directory of .parquet shards; relative to the recipe.',
      format: 'optional-string',
      default: null,
    },
    alphabet: { doc: "Characters of the char tokenizer for 'jsonl' data (required then).", format: 'optional-string', default: null },
    epochs: { doc: 'Passes over the training data (0 = forever).', format: 'non-negative-int', default: 0 },
    shuffle: { doc: 'Shuffle each epoch with the run seed.', format: 'flag', default: true },
  },
  model: {
    path: {
      doc:
        'Hugging Face model directory (config.json, safetensors, tokenizer.json) to train, relative to the recipe; or a model id ' +
        "'org/name[@revision]' read from the Hugging Face cache (HF_HUB_CACHE, HF_HOME), downloaded into it when missing unless HF_HUB_OFFLINE=1. " +
        'Unset: a seeded tiny Llama-family model with the character tokenizer, shaped by the keys below.',
      format: 'optional-string',
      default: null,
    },
    hubTimeoutMs: {
      doc:
        'model.path (and distill.teacher.path) as a model id: deadline of each request to the Hugging Face hub (HF_ENDPOINT) ' +
        'while downloading it; no answer, or no byte of a file, for this long fails the run.',
      format: 'positive-int',
      default: 60_000,
    },
    maxModelLen: {
      doc:
        "Longest context used (as vLLM's --max-model-len): caps model.path's max_position_embeddings and the tiny model's maxSeqLen, " +
        "and with them the cache a model is checked against the backend's memory with (null = no cap).",
      format: 'optional-positive-int',
      default: null,
    },
    type: {
      doc:
        "Tiny model: architecture (model_type). 'qwen2' (q/k/v biases) learns position-dependent attention, such as " +
        "reversing a string, much sooner than 'llama' (no biases), whose rotary attention must find positions by content.",
      format: ['qwen2', 'llama', 'qwen3'],
      default: 'qwen2',
    },
    dModel: { doc: 'Tiny model: residual width (hidden_size).', format: 'positive-int', default: 64 },
    nLayers: { doc: 'Tiny model: decoder blocks.', format: 'positive-int', default: 2 },
    nHeads: { doc: 'Tiny model: query heads (divides dModel).', format: 'positive-int', default: 4 },
    nKvHeads: { doc: 'Tiny model: key/value heads (divides nHeads; 0 = nHeads).', format: 'non-negative-int', default: 0 },
    dFF: { doc: 'Tiny model: SwiGLU hidden width (intermediate_size).', format: 'positive-int', default: 256 },
    maxSeqLen: {
      doc: 'Tiny model: longest sequence (max_position_embeddings); prompt + response must fit.',
      format: 'positive-int',
      default: 24,
    },
    ropeTheta: { doc: 'Tiny model: rotary base θ.', format: 'positive-number', default: 10000 },
  },
  rollout: {
    groupSize: { doc: 'Samples per task (GRPO group size).', format: 'positive-int', default: 8 },
    concurrency: { doc: 'Most samples in flight (0 = every sample the mode may admit).', format: 'non-negative-int', default: 0 },
    maxTokens: {
      doc: 'Longest response (0 = longest answer + 1 for the bundled task, 16 for arithmetic).',
      format: 'non-negative-int',
      default: 0,
    },
    chatTemplate: {
      doc: "Prompts as text ('none': the prompt's tokens after bos), or as the user's message in model.path's chat template ('model').",
      format: ['none', 'model'],
      default: 'none',
    },
    system: {
      doc: "A system message put first when rollout.chatTemplate is 'model' (null = none).",
      format: 'optional-string',
      default: null,
    },
    temperature: { doc: 'Sampling temperature.', format: 'non-negative-number', default: 1 },
    topP: { doc: 'Nucleus sampling mass.', format: 'unit-interval', default: 1 },
    ignoreEos: {
      doc: "Stop tokens end no training sample: each runs to rollout.maxTokens (finish reason 'length'), as vLLM's ignore_eos; not with rollout.agent.",
      format: 'flag',
      default: false,
    },
    weightSync: {
      doc: 'In-flight generations on a new version: continue, or interrupt and resume.',
      format: ['continue', 'interrupt'],
      default: 'continue',
    },
    sampleTimeoutMs: {
      doc: 'A sample running this long is cancelled and counted as failed (null = no limit; rxrl run and rxrl worker).',
      format: 'optional-positive-number',
      default: null,
    },
    worker: {
      module: { doc: 'Module of a custom rollout worker; relative to the recipe.', format: 'optional-string', default: null },
      export: { doc: 'Export name of the custom rollout worker.', format: 'non-empty-string', default: 'default' },
    },
    agent: {
      command: {
        doc: 'An agent program run per sample (/bin/sh -c, in a session and process group of its own: every process it starts is ended with its sample) against a session of rxrl\'s gateway: OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL and RXRL_TASK are set; a last stdout line {"reward": r} is its reward.',
        format: 'optional-string',
        default: null,
      },
      cwd: {
        doc: "The agent command's working directory; relative to the recipe (null = the recipe's directory).",
        format: 'optional-string',
        default: null,
      },
      env: { doc: 'Extra environment variables of the agent command.', format: 'string-map', default: {} },
      inheritEnv: {
        doc: "Give the agent command this process's whole environment. Default false: only PATH, HOME, USER, LOGNAME, SHELL, LANG, LANGUAGE, LC_*, TZ, TERM, TMPDIR, TMP and TEMP are passed on (plus rollout.agent.env and the OPENAI_*/RXRL_* variables), so the trainer's secrets stay out of agents.",
        format: 'flag',
        default: false,
      },
      module: {
        doc: 'Module of an agent function (task, { baseURL, apiKey, model, signal }) => reward | { reward } | void; relative to the recipe.',
        format: 'optional-string',
        default: null,
      },
      export: { doc: 'Export name of the agent function.', format: 'non-empty-string', default: 'default' },
    },
    evaluator: {
      module: {
        doc: "Module of a custom evaluator (required for 'jsonl' data): a file relative to the recipe, or a package's export path ('rxrl/recipes' for the bundled evaluators).",
        format: 'optional-string',
        default: null,
      },
      export: { doc: 'Export name of the custom evaluator.', format: 'non-empty-string', default: 'default' },
    },
  },
  store: {
    groupTimeoutMs: {
      doc: 'Close a group this long after its first sample (null = wait).',
      format: 'optional-positive-number',
      default: null,
    },
    onGroupTimeout: { doc: 'A timed-out group is released partial or dropped (counted).', format: ['release', 'drop'], default: 'release' },
  },
  algorithm: {
    normalizeByStd: { doc: 'Divide advantages by the group std (false = Dr.GRPO).', format: 'flag', default: true },
    std: { doc: 'Group std: sample (N−1) or population.', format: ['sample', 'population'], default: 'sample' },
    stdEpsilon: {
      doc: 'Added to the group std before advantages are divided by it (verl: 1e-6; TRL: 1e-4).',
      format: 'non-negative-number',
      default: 1e-6,
    },
    filterZeroVariance: { doc: 'Drop groups whose advantages are all zero (dynamic sampling).', format: 'flag', default: false },
    klInReward: {
      coef: {
        doc: 'β of the KL penalty in the reward (0 = off; needs a reference = the initial policy).',
        format: 'non-negative-number',
        default: 0,
      },
      estimator: { doc: 'KL estimator of the reward penalty.', format: KL_ESTIMATORS, default: 'k1' },
    },
  },
  trainer: {
    backend: {
      doc: "Where the policy trains: 'local' (TF.js in this process) or 'tinker' (a LoRA adapter on a Tinker-API service, tinker.*; rollouts sample through it).",
      format: ['local', 'tinker'],
      default: 'local',
    },
    algorithm: {
      doc: "What the trainer minimizes: 'grpo' (the clipped policy gradient over group advantages), 'sft' (the cross-entropy of reference outputs, sft.*) or 'distill' (on-policy distillation: the clipped policy gradient over per-token advantages teacher − student log-prob, distill.*).",
      format: ['grpo', 'sft', 'distill'],
      default: 'grpo',
    },
    learningRate: { doc: 'Adam learning rate.', format: 'positive-number', default: 1e-3 },
    clipLow: { doc: 'PPO lower clip range.', format: 'clip-range', default: 0.2 },
    clipHigh: { doc: 'PPO upper clip range (DAPO clip-higher).', format: 'non-negative-number', default: 0.28 },
    clipRatioC: { doc: 'Dual-clip bound (> 1) for negative advantages (null = off).', format: 'optional-positive-number', default: null },
    lossAggregation: {
      doc: 'Loss aggregation.',
      format: ['token-mean', 'seq-mean-token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum-norm'],
      default: 'token-mean',
    },
    microBatchSize: { doc: 'Rows per forward/backward pass.', format: 'positive-int', default: 64 },
    ppoEpochs: { doc: 'Passes over each batch.', format: 'positive-int', default: 1 },
    miniBatches: { doc: 'Optimizer updates per pass.', format: 'positive-int', default: 1 },
    maxGradNorm: { doc: 'Global gradient-norm clip.', format: 'positive-number', default: 1 },
    entropyCoef: { doc: 'Entropy bonus coefficient.', format: 'non-negative-number', default: 0 },
    skipZeroAdvantage: {
      doc: 'Score a micro-batch whose rows all have zero advantage forward only (its gradient is exactly 0); false differentiates it anyway, as TRL does (equal-work benchmarks).',
      format: 'flag',
      default: true,
    },
    maxStaleness: {
      doc: 'Drop rows staler than this at train time (null = keep all).',
      format: 'optional-non-negative-int',
      default: null,
    },
    importanceCap: { doc: 'Truncated importance correction cap (null = off).', format: 'optional-positive-number', default: null },
    klLoss: {
      coef: {
        doc: 'KL-to-reference loss coefficient (0 = off; the reference is the initial policy).',
        format: 'non-negative-number',
        default: 0,
      },
      estimator: { doc: 'KL estimator of the loss term.', format: KL_ESTIMATORS, default: 'low_var_kl' },
    },
  },
  sft: {
    source: {
      doc: "trainer.algorithm 'sft': the targets — 'dataset' (each task's reference output: its response, or its answer; rollout.groupSize 1) or 'rollouts' (the policy's own samples whose reward reaches sft.minReward: rejection-sampling fine-tuning).",
      format: ['dataset', 'rollouts'],
      default: 'dataset',
    },
    minReward: {
      doc: "trainer.algorithm 'sft' with sft.source 'rollouts': a sample is imitated when its reward is at least this.",
      format: 'finite-number',
      default: 1,
    },
  },
  distill: {
    teacher: {
      path: {
        doc: "trainer.algorithm 'distill': the teacher's model directory or id (as model.path), loaded in this process (relative to the recipe; ~/ is the home directory).",
        format: 'optional-string',
        default: null,
      },
      baseUrl: {
        doc: "trainer.algorithm 'distill': instead of path, an OpenAI-compatible server that scores with prompt_logprobs (vLLM, rxrl serve), e.g. http://127.0.0.1:8000/v1.",
        format: 'optional-string',
        default: null,
      },
      model: { doc: 'distill.teacher.baseUrl: the model the server serves.', format: 'optional-string', default: null },
      apiKey: { doc: 'distill.teacher.baseUrl: its API key.', format: 'optional-string', default: null, sensitive: true },
      timeoutMs: {
        doc: "distill.teacher.baseUrl: a scoring request unanswered after this long fails (it is retried, within the same deadline counted from its first attempt); a stopped run's request ends at once.",
        format: 'positive-int',
        default: 120_000,
      },
    },
    rewardCoef: {
      doc: "trainer.algorithm 'distill': weight of the task reward added to every token's advantage (0 = distillation alone).",
      format: 'finite-number',
      default: 0,
    },
  },
  sync: {
    mode: { doc: 'Staleness mode.', format: ['sync', 'batch-async', 'fully-async'], default: 'sync', env: 'RXRL_MODE' },
    stalenessThreshold: { doc: 'η of batch-async.', format: 'positive-int', default: 1 },
    capacity: { doc: 'fully-async: most admitted-but-untrained tasks (0 = 4 batches).', format: 'non-negative-int', default: 0 },
    batchSize: { doc: 'Tasks (groups) per train step.', format: 'positive-int', default: 32 },
    generationBatchSize: {
      doc: "Tasks rolled out per train step, >= sync.batchSize (verl's gen_batch_size; null = sync.batchSize). Larger needs algorithm.filterZeroVariance: each step trains the first sync.batchSize groups, in admission order, whose rewards differ (DAPO's dynamic sampling).",
      format: 'optional-positive-int',
      default: null,
    },
  },
  kafka: {
    brokers: { doc: 'Comma-separated Kafka brokers.', format: String, default: 'localhost:9092', env: 'KAFKA_BROKERS' },
    clientId: { doc: 'Kafka client id.', format: 'non-empty-string', default: 'rxrl' },
    topicPrefix: { doc: 'Prefix of the tasks / trajectories / weights topics.', format: 'non-empty-string', default: 'rxrl' },
    weightsDir: {
      doc: 'rxrl trainer: directory shared with the workers for weight files (null = <run.dir>/weights).',
      format: 'optional-string',
      default: null,
    },
    keepVersions: {
      doc: 'rxrl trainer: weight versions of each policy kept in the weights directory (runs of ended trainer processes are removed).',
      format: 'positive-int',
      default: 3,
    },
    weightsRoot: {
      doc: 'rxrl worker: announced weight files must lie in this directory once links are followed, else they are refused (null = kafka.weightsDir, else <run.dir>/weights).',
      format: 'optional-string',
      default: null,
    },
    workerConcurrency: { doc: 'rxrl worker: tasks rolled out at once.', format: 'positive-int', default: 8 },
    rolloutDelayMs: { doc: 'rxrl worker: extra latency before each task (demos and fault tests).', format: 'non-negative-int', default: 0 },
    heartbeatMs: {
      doc: "rxrl worker: a heartbeat on the '<prefix>.heartbeats' topic every this many ms (0 = none); rxrl trainer: a worker unheard of for 3 of these is gone in its status.",
      format: 'non-negative-int',
      default: 5_000,
    },
    schemaRegistry: {
      url: {
        doc: "Confluent-compatible schema registry (its API's base URL, e.g. http://localhost:8081): the record schema is registered under each topic's '<topic>-value' subject, checked compatible, and records are written in the Confluent wire format (null = plain Protocol Buffers records; readers take both).",
        format: 'optional-string',
        default: null,
        env: 'RXRL_SCHEMA_REGISTRY_URL',
      },
      timeoutMs: {
        doc: 'kafka.schemaRegistry.url: each request to the registry unanswered after this long fails.',
        format: 'positive-int',
        default: 10_000,
      },
    },
  },
  openai: {
    baseUrl: {
      // No environment variable: an OPENAI_BASE_URL set for other programs must not move a run's rollouts.
      doc: 'OpenAI-compatible server the run rolls out and validates on, serving model.path as openai.model (vLLM, SGLang, rxrl serve); versions are published below <run-dir>/served (null = the in-process engine).',
      format: 'optional-string',
      default: null,
    },
    apiKey: { doc: 'API key of the server.', format: String, default: 'EMPTY', env: 'OPENAI_API_KEY', sensitive: true },
    model: { doc: 'Model name on the server.', format: 'non-empty-string', default: 'rxrl-policy' },
    weightSyncTimeoutMs: {
      doc: "openai.baseUrl: a weight update (the weight-update endpoint, or a LoRA policy's load_lora_adapter and its check in /v1/models) unanswered after this long fails, its retries included; a stopped run's update ends at once.",
      format: 'positive-int',
      default: 300_000,
    },
  },
  tinker: {
    baseUrl: {
      doc: "trainer.backend 'tinker': the service's URL (the SDK's TINKER_BASE_URL).",
      format: 'optional-string',
      default: null,
      env: 'TINKER_BASE_URL',
    },
    apiKey: {
      doc: "trainer.backend 'tinker': the service's API key.",
      format: String,
      default: '',
      env: 'TINKER_API_KEY',
      sensitive: true,
    },
    baseModel: {
      doc: "trainer.backend 'tinker': the base model the service adapts (its base_model name).",
      format: 'optional-string',
      default: null,
    },
    rank: {
      doc: "trainer.backend 'tinker': LoRA rank of the adapter (a resumed run keeps its checkpoint's).",
      format: 'positive-int',
      default: 32,
    },
    futureTimeoutMs: {
      doc: "trainer.backend 'tinker': a request unfinished after this long fails (the service is lost).",
      format: 'positive-int',
      default: 600_000,
    },
    pollTimeoutMs: {
      doc: "trainer.backend 'tinker': one poll of a request's result held longer than this is polled again (the SDK's 45 s).",
      format: 'positive-int',
      default: 45_000,
    },
    recoverTimeoutMs: {
      doc: "trainer.backend 'tinker', run.errorPolicy 'continue': how long a run waits for a lost service to answer again before it fails.",
      format: 'non-negative-int',
      default: 300_000,
    },
    maxRecoveries: {
      doc: "trainer.backend 'tinker', run.errorPolicy 'continue': restarts from the last checkpoint in a row, without a new checkpoint between, before the run fails (0 = never).",
      format: 'non-negative-int',
      default: 3,
    },
  },
  activity: {
    stallSeconds: {
      doc: 'A module of the run (loader, rollout, trainer, weight sync, validation, checkpoint) with work in flight and none of it ending for this many seconds is stalled: a warning, the status server, the progress line and the report say so.',
      format: 'positive-number',
      default: 300,
    },
    stallFailSeconds: {
      doc: "Under run.errorPolicy 'stop_on_error', a module stalled this many seconds fails the run with a StalledError naming it (0 = never; else more than activity.stallSeconds).",
      format: 'non-negative-number',
      default: 0,
    },
  },
  checkpoint: {
    every: { doc: 'Save a checkpoint every K steps (0 = never).', format: 'non-negative-int', default: 50 },
    keepLast: { doc: 'Keep the newest N checkpoints (0 = all).', format: 'non-negative-int', default: 3 },
    onStop: { doc: 'Save a checkpoint on a graceful stop (SIGINT/SIGTERM).', format: 'flag', default: true },
    dtype: {
      doc: "Element type of a checkpoint's model weights, as save_pretrained writes them (bfloat16 and float16 halve the bytes; the float32 weights go to master.safetensors beside them, which resume reads). LoRA adapters stay float32.",
      format: ['float32', 'bfloat16', 'float16'],
      default: 'float32',
    },
    maxShardSize: {
      doc: "Largest weights file of a checkpoint ('50GB' as transformers 5's save_pretrained, '500MB', '2GiB', or a number of bytes): bigger weights are sharded with model.safetensors.index.json.",
      format: 'shard-size',
      default: '50GB',
    },
  },
  resume: {
    mode: {
      doc: 'disable, auto (highest intact global_step_*: a damaged one is skipped with a warning), or from_path (damaged: an error).',
      format: ['disable', 'auto', 'from_path'],
      default: 'auto',
      env: 'RXRL_RESUME',
    },
    path: { doc: "Checkpoint directory for 'from_path'.", format: 'optional-string', default: null },
  },
  validation: {
    beforeTrain: { doc: 'Score the held-out split before training.', format: 'flag', default: true },
    every: {
      doc: 'Score the held-out split every N versions (0 = only at the end; a last version already scored is not scored again).',
      format: 'non-negative-int',
      default: 0,
    },
    temperature: { doc: 'Validation sampling temperature (0 = greedy).', format: 'non-negative-number', default: 0 },
    generations: {
      doc: "Write each validation's samples to <run-dir>/validation/<version>.jsonl: task id, answer, response, reward and the evaluator's metrics, one line per held-out task (verl's validation_data_dir; nothing without a run directory).",
      format: 'flag',
      default: false,
    },
  },
  logging: {
    level: {
      doc: 'Log level.',
      format: ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'],
      default: 'info',
      env: 'RXRL_LOG_LEVEL',
    },
    tensorboard: {
      doc: 'Write every metric as TensorBoard scalars under <run-dir>/tensorboard (tensorboard --logdir it); a resumed run repeats no step.',
      format: 'flag',
      default: false,
    },
    mlflow: {
      trackingUri: {
        doc: "An MLflow tracking server (http://host:5000) to log the recipe's settings and every metric to (null = none); a resumed run continues its MLflow run without repeating a step.",
        format: 'optional-string',
        default: null,
        env: 'MLFLOW_TRACKING_URI',
      },
      experiment: {
        doc: 'MLflow experiment of the run (created when missing).',
        format: 'non-empty-string',
        default: 'rxrl',
        env: 'MLFLOW_EXPERIMENT_NAME',
      },
      timeoutSeconds: {
        doc: "Deadline of the MLflow run's start, of each flush of queued metrics (every log-batch call of it together) and of its end; a stop (SIGTERM/SIGINT) cuts a call short and leaves the end 2 s.",
        format: 'positive-number',
        default: 30,
      },
      maxQueued: {
        doc: 'Most metric values kept for MLflow while its server does not take them; past it the oldest are dropped, with a warning.',
        format: 'positive-int',
        default: 20000,
      },
    },
  },
  agents: {
    environment: {
      doc: "Multi-agent environment: 'writer-editor' (bundled, on the bundled string task), 'module' (agents.module, on the recipe's data), or 'none' for a single-agent run.",
      format: ['none', 'writer-editor', 'module'],
      default: 'none',
    },
    module: {
      module: {
        doc: "Module exporting a MultiAgentEnvironment (agents.environment 'module'); relative to the recipe.",
        format: 'optional-string',
        default: null,
      },
      export: { doc: 'Export name of the environment.', format: 'non-empty-string', default: 'default' },
    },
    granularity: {
      doc: 'Multi-agent: one trajectory per (agent, turn), or per agent (its turns joined).',
      format: ['turn', 'agent'],
      default: 'turn',
    },
    roles: {
      doc: 'Multi-agent: every agent of the environment as {name, policy, prompt?}; policy names an entry of policies.',
      format: 'agent-roles',
      default: [],
    },
  },
  policies: {
    doc: 'The policies as {name, specialization: prompt | lora | full, lora?: {rank, alpha, targetModules}, adapterPath?: a PEFT adapter directory a lora policy starts from}: one per agents.roles policy, or (single-agent) at most one, e.g. a LoRA adapter on the model.',
    format: 'policy-entries',
    default: [],
  },
} as const satisfies SchemaGroup;

/** The value type of a leaf's format: its {@link FormatValues} entry, the union of its allowed values, or `string`. */
type FormatValue<F> = F extends FormatName
  ? FormatValues[F]
  : F extends readonly (infer V)[]
    ? V
    : F extends StringConstructor
      ? string
      : never;

/** The configuration a schema group resolves to: a leaf's value typed by its format, a group recursively. */
type ConfigOf<S extends SchemaGroup> = {
  -readonly [K in keyof S]: S[K] extends SchemaLeaf ? FormatValue<S[K]['format']> : S[K] extends SchemaGroup ? ConfigOf<S[K]> : never;
};

/**
 * The resolved, validated configuration of a run: one field per {@link SCHEMA} leaf, typed by its format. Every key,
 * with its format, default and environment variable, is listed in `docs/configuration-reference.md`.
 */
export type RxrlConfig = ConfigOf<typeof SCHEMA>;

/** `T` with every `readonly` removed, in arrays too (functions such as `String` kept as they are). */
type Writable<T> = T extends (...args: never[]) => unknown ? T : { -readonly [K in keyof T]: Writable<T[K]> };

/** Options of {@link loadConfig}. */
export interface LoadConfigOptions {
  /** A recipe file (`.json`, `.yaml`, `.yml`), or none for the defaults. */
  readonly file?: string;
  /** A recipe object, merged after the file. */
  readonly values?: Readonly<Record<string, unknown>>;
  /**
   * `key=value` overrides (`--set`), applied last; values parse as JSON when they can (`3`, `true`, `null`). A path
   * (a key of `PATH_KEYS`) given here is relative to `cwd`, where a recipe's paths are relative to the recipe.
   */
  readonly set?: readonly string[];
  /** What a relative path in `set` is relative to. Default the working directory. */
  readonly cwd?: string;
  /** Environment for `env` overrides. Default `process.env`. */
  readonly env?: NodeJS.ProcessEnv;
}

/**
 * Loads, merges and validates a configuration: defaults ← environment ← recipe file ← `values` ← `--set`.
 * Unknown keys, wrong types, out-of-range numbers and missing required values are rejected with a
 * {@link ConfigError} whose message names each offending key; an unknown key is one line naming the nearest key,
 * or rxrl's key for a TRL or verl name (`FOREIGN_KEYS`).
 */
export function loadConfig(options: LoadConfigOptions = {}): RxrlConfig {
  // convict's typings take mutable arrays (`format: any[]`); SCHEMA is readonly (`as const`, so that its literals
  // type RxrlConfig). convict clones each leaf and never writes the schema, so the writable view is only a type.
  const config = convict<RxrlConfig>(SCHEMA as Writable<typeof SCHEMA>, { env: options.env ?? process.env, args: [] });
  let recipe: Record<string, unknown> | undefined;
  try {
    if (options.file !== undefined) {
      const text = readFileSync(options.file, 'utf8');
      const parsed: unknown = /\.ya?ml$/i.test(extname(options.file)) ? parseYaml(text) : JSON.parse(text);
      if (parsed !== null && parsed !== undefined) {
        if (typeof parsed !== 'object' || Array.isArray(parsed)) throw new Error('a recipe must be a mapping of keys to values');
        recipe = parsed as Record<string, unknown>;
      }
    }
  } catch (cause) {
    throw new ConfigError(`cannot read recipe ${options.file ?? '(values)'}: ${(cause as Error).message}`, {
      cause,
      context: { file: options.file },
    });
  }
  const schemaKeys = leafKeys(SCHEMA);
  for (const [values, file] of [
    [recipe, options.file],
    [options.values, undefined],
  ] as const) {
    if (values === undefined) continue;
    checkKeys(values, schemaKeys, file);
    config.load(values as Partial<RxrlConfig>);
  }
  for (const assignment of options.set ?? []) {
    const eq = assignment.indexOf('=');
    // The command line's own form: a usage error (the CLI names its command and exits 2).
    if (eq <= 0) {
      throw new UsageError(`--set must be key=value (e.g. --set trainer.learningRate=1e-5), got '${assignment}'`, {
        context: { flag: '--set' },
      });
    }
    const key = assignment.slice(0, eq);
    if (!schemaKeys.has(key)) throw new ConfigError(unknownKeyProblem(key, schemaKeys), { context: { key, set: assignment } });
    config.set(key as never, setValue(key, assignment.slice(eq + 1), options.cwd) as never);
  }
  try {
    config.validate({ allowed: 'strict' });
  } catch (cause) {
    throw new ConfigError(`invalid configuration:\n${(cause as Error).message}`, { cause });
  }
  const resolved = config.getProperties();
  requireWhen(resolved);
  return resolved;
}

/** Refuses a recipe naming a key the schema has no leaf for: one line, the first such key (and how many more). */
function checkKeys(values: Readonly<Record<string, unknown>>, schemaKeys: ReadonlySet<string>, file: string | undefined): void {
  const unknown = unknownKeys(values, SCHEMA);
  if (unknown.length === 0) return;
  const more =
    unknown.length === 1
      ? ''
      : ` (${unknown.length - 1} more unknown: ${unknown.slice(1, 4).join(', ')}${unknown.length > 4 ? ', …' : ''})`;
  throw new ConfigError(`${unknownKeyProblem(unknown[0], schemaKeys)}${more}`, { context: { keys: unknown, file } });
}

/** Values that are required only in some settings. */
function requireWhen(c: RxrlConfig): void {
  const missing: string[] = [];
  if (c.data.source === 'jsonl') {
    if (c.data.trainFile === null) missing.push("data.trainFile: required when data.source is 'jsonl'");
    if (c.data.alphabet === null && c.model.path === null) {
      missing.push("data.alphabet: required when data.source is 'jsonl' and no model.path gives a tokenizer");
    }
    // A multi-agent environment scores its episodes itself; an agent program may give its own rewards.
    const agentRewards = c.rollout.agent.command !== null || c.rollout.agent.module !== null;
    // Reference outputs for supervised fine-tuning need no score, unless a validation split is to be scored.
    const references = c.trainer.algorithm === 'sft' && c.sft.source === 'dataset' && c.data.validationFile === null;
    if (c.rollout.evaluator.module === null && c.agents.environment === 'none' && !agentRewards && !references) {
      missing.push("rollout.evaluator.module: required when data.source is 'jsonl' (unless rollout.agent gives the rewards)");
    }
  }
  if (c.data.source === 'arithmetic' && c.model.path === null)
    missing.push("model.path: required when data.source is 'arithmetic' (a chat model)");
  if (c.rollout.agent.command !== null && c.rollout.agent.module !== null)
    missing.push('rollout.agent: give a command or a module, not both');
  if ((c.rollout.agent.command !== null || c.rollout.agent.module !== null) && c.rollout.worker.module !== null) {
    missing.push('rollout.agent: an agent is the rollout worker; leave rollout.worker.module unset');
  }
  if (c.rollout.ignoreEos && (c.rollout.agent.command !== null || c.rollout.agent.module !== null))
    missing.push("rollout.ignoreEos: not with rollout.agent (an agent's turns end at the model's stop tokens)");
  if (c.rollout.chatTemplate === 'model' && c.model.path === null)
    missing.push("model.path: required when rollout.chatTemplate is 'model'");
  try {
    parseShardSize(c.checkpoint.maxShardSize);
  } catch (error) {
    missing.push((error as Error).message);
  }
  if (c.activity.stallFailSeconds > 0 && c.activity.stallFailSeconds <= c.activity.stallSeconds)
    missing.push('activity.stallFailSeconds: must be 0 or more than activity.stallSeconds');
  if (c.resume.mode === 'from_path' && c.resume.path === null) missing.push("resume.path: required when resume.mode is 'from_path'");
  if (c.data.task.maxLength < c.data.task.minLength) missing.push('data.task.maxLength: must be >= data.task.minLength');
  if (c.model.dModel % c.model.nHeads !== 0) missing.push('model.nHeads: must divide model.dModel');
  missing.push(...samplingProblems(c));
  missing.push(...agentProblems(c), ...tinkerProblems(c), ...sftProblems(c));
  if (c.model.nKvHeads !== 0 && c.model.nHeads % c.model.nKvHeads !== 0) missing.push('model.nKvHeads: must divide model.nHeads');
  if ((c.model.dModel / c.model.nHeads) % 2 !== 0) missing.push('model.nHeads: dModel / nHeads (the head width) must be even');
  if (missing.length > 0)
    throw new ConfigError(`invalid configuration:\n${missing.join('\n')}`, { context: { keys: missing.map((m) => m.split(':')[0]) } });
}

/** Dynamic sampling: a generation batch at least the train batch, larger only with the zero-variance filter. */
function samplingProblems(c: RxrlConfig): string[] {
  const generation = c.sync.generationBatchSize;
  if (generation === null) return [];
  const problem = generationBatchProblem(
    { batch: c.sync.batchSize, generation, filter: c.algorithm.filterZeroVariance },
    { batch: 'sync.batchSize', generation: 'sync.generationBatchSize', filter: 'algorithm.filterZeroVariance' },
  );
  return problem === undefined ? [] : [problem];
}

/** What supervised fine-tuning and distillation need, and what they cannot be combined with. */
function sftProblems(c: RxrlConfig): string[] {
  if (c.trainer.algorithm === 'grpo') return [];
  const problems: string[] = [];
  const why = `with trainer.algorithm '${c.trainer.algorithm}'`;
  if (c.trainer.algorithm === 'distill') {
    const { path, baseUrl, model } = c.distill.teacher;
    if ((path === null) === (baseUrl === null)) problems.push(`distill.teacher: give a path or a baseUrl (with a model) ${why}`);
    if (baseUrl !== null && model === null) problems.push('distill.teacher.model: required with distill.teacher.baseUrl');
    if (c.algorithm.klInReward.coef > 0) problems.push(`algorithm.klInReward.coef: must be 0 ${why}`);
    if (c.algorithm.filterZeroVariance)
      problems.push(`algorithm.filterZeroVariance: must be false ${why} (every token has its own advantage)`);
    if (c.agents.environment !== 'none') problems.push(`agents.environment: multi-agent runs train with GRPO; not ${why}`);
    return problems;
  }
  if (c.algorithm.klInReward.coef > 0) problems.push(`algorithm.klInReward.coef: must be 0 ${why} (there is no reward to penalize)`);
  if (c.algorithm.filterZeroVariance) problems.push(`algorithm.filterZeroVariance: must be false ${why} (rows are kept by sft.minReward)`);
  if (c.agents.environment !== 'none') problems.push(`agents.environment: multi-agent runs train with GRPO; not ${why}`);
  if (c.sft.source === 'dataset') {
    const dataset = "with sft.source 'dataset'";
    if (c.rollout.groupSize !== 1) problems.push(`rollout.groupSize: must be 1 ${dataset} (a task has one reference output)`);
    if (c.rollout.agent.command !== null || c.rollout.agent.module !== null || c.rollout.worker.module !== null)
      problems.push(`rollout.agent, rollout.worker: the samples are the dataset's reference outputs ${dataset}; leave them unset`);
  }
  return problems;
}

/** What a Tinker-backed run needs, and the trainer settings it cannot honour (the service computes the loss). */
function tinkerProblems(c: RxrlConfig): string[] {
  if (c.trainer.backend !== 'tinker') return [];
  const problems: string[] = [];
  const why = "with trainer.backend 'tinker'";
  if (c.tinker.baseUrl === null) problems.push(`tinker.baseUrl: required ${why} (or TINKER_BASE_URL)`);
  if (c.tinker.baseModel === null) problems.push(`tinker.baseModel: required ${why}`);
  if (c.agents.environment !== 'none') problems.push(`agents.environment: multi-agent runs train locally; not ${why}`);
  if (c.policies.length > 0) problems.push(`policies: the service trains one LoRA adapter of tinker.rank; leave policies empty ${why}`);
  if (c.openai.baseUrl !== null) problems.push(`openai.baseUrl: rollouts sample through the Tinker service ${why}`);
  const t = c.trainer;
  const unsupported: [boolean, string][] = [
    [t.klLoss.coef > 0, 'trainer.klLoss.coef: must be 0'],
    [c.algorithm.klInReward.coef > 0, 'algorithm.klInReward.coef: must be 0'],
    [t.lossAggregation !== 'token-mean', "trainer.lossAggregation: must be 'token-mean'"],
    [t.ppoEpochs !== 1, 'trainer.ppoEpochs: must be 1'],
    [t.miniBatches !== 1, 'trainer.miniBatches: must be 1'],
    [t.entropyCoef !== 0, 'trainer.entropyCoef: must be 0'],
    [t.clipRatioC !== null, 'trainer.clipRatioC: must be null'],
    [t.importanceCap !== null, 'trainer.importanceCap: must be null'],
    [t.maxStaleness !== null, 'trainer.maxStaleness: must be null'],
  ];
  for (const [bad, message] of unsupported) if (bad) problems.push(`${message} ${why} (the service's ppo loss has no such term)`);
  return problems;
}

/** Cross-field checks of `agents` and `policies`, each naming its key. */
function agentProblems(c: RxrlConfig): string[] {
  const problems: string[] = [];
  const { roles, environment } = c.agents;
  c.policies.forEach((policy, i) => problems.push(...policyProblems(policy, i)));
  if (environment === 'none') {
    // A single-agent run is one agent mapped to one policy: `policies` may name it (a LoRA one, say).
    if (roles.length > 0) problems.push("agents.roles: needs agents.environment (it is 'none')");
    if (c.policies.length > 1)
      problems.push(`policies: a single-agent run (agents.environment 'none') trains one policy, got ${c.policies.length}`);
    return problems;
  }
  if (roles.length === 0) problems.push(`agents.roles: required when agents.environment is '${environment}'`);
  if (environment === 'module' && c.agents.module.module === null)
    problems.push("agents.module.module: required when agents.environment is 'module'");
  if (environment !== 'module' && c.agents.module.module !== null)
    problems.push("agents.module.module: only for agents.environment 'module'");
  const names = c.policies.map((p) => p.name);
  c.policies.forEach((policy, i) => {
    if (names.indexOf(policy.name) !== i) problems.push(`policies[${i}].name: policy '${policy.name}' is listed twice`);
    if (!roles.some((role) => role.policy === policy.name)) problems.push(`policies[${i}]: no agent samples from policy '${policy.name}'`);
  });
  roles.forEach((role, i) => {
    if (roles.findIndex((r) => r.name === role.name) !== i) problems.push(`agents.roles[${i}].name: agent '${role.name}' is listed twice`);
    if (!names.includes(role.policy)) {
      problems.push(
        `agents.roles[${i}].policy: agent '${role.name}' maps to unknown policy '${role.policy}'; policies: ${names.join(', ') || 'none'}`,
      );
    }
  });
  return problems;
}

/** One policy's own checks: an adapter only for `lora`, and a valid one. */
function policyProblems(policy: PolicyEntryConfig, i: number): string[] {
  if (policy.lora !== undefined && policy.specialization !== 'lora') return [`policies[${i}].lora: only for specialization 'lora'`];
  if (policy.adapterPath !== undefined && policy.specialization !== 'lora')
    return [`policies[${i}].adapterPath: only for specialization 'lora'`];
  if (policy.specialization !== 'lora') return [];
  try {
    validateLoraConfig(resolvedLora(policy), `policies[${i}].lora`);
    return [];
  } catch (error) {
    return [(error as Error).message.replace(/^(policies\[\d+\]\.lora\.[\w[\]]+) /, '$1: ')];
  }
}

/** Default adapter of a `lora` policy: rank 8, alpha 16, every target module. */
export { DEFAULT_POLICY_LORA } from '../model/lora.js';

/** A `lora` policy's adapter with the defaults filled in. */
export function resolvedLora(policy: PolicyEntryConfig): LoraConfig {
  return { ...DEFAULT_POLICY_LORA, ...policy.lora };
}

/**
 * A `--set` value of `key`: JSON when it parses (`3`, `true`, `null`, `[1]`), else the text itself; a path made
 * absolute against `cwd` ({@link resolveSetPath}), so that it does not resolve against the recipe's directory.
 */
function setValue(key: string, raw: string, cwd = process.cwd()): unknown {
  return resolveSetPath(key, parseSetValue(raw), cwd);
}

/** A `--set` value: JSON when it parses (`3`, `true`, `null`, `[1]`), else the text itself. */
function parseSetValue(raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

function leafKeys(schema: object): Set<string> {
  return new Set(schemaLeaves(schema).map(({ key }) => key));
}

/**
 * Every leaf of a schema (a node with `doc`) under its dotted key, in the schema's order: what `--set` and a recipe
 * may name, and what the configuration reference lists.
 *
 * @param schema - a convict schema of nested groups and leaves.
 */
export function schemaLeaves(schema: object, prefix = ''): { key: string; leaf: SchemaLeaf }[] {
  return Object.entries(schema).flatMap(([name, node]: [string, object]) => {
    const key = prefix ? `${prefix}.${name}` : name;
    return typeof node === 'object' && node !== null && !('doc' in node) ? schemaLeaves(node, key) : [{ key, leaf: node as SchemaLeaf }];
  });
}

/** The configuration as JSON, secrets masked by the one rule of {@link redactSecrets} (MLflow's params follow it too). */
export function describeConfig(config: RxrlConfig): string {
  return JSON.stringify(redactSecrets(config), null, 2);
}
