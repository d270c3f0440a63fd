/**
 * A recipe's data: a generated task (strings, arithmetic, calculator expressions) or JSONL files, the evaluator and
 * rollout worker (or agent) it names, and the policy's tokenizer.
 *
 * @packageDocumentation
 */
import { readFile } from 'node:fs/promises';
import { basename, dirname, join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

import { gatewayWorker, type AgentFunction, type AgentProgram, type GatewayWorker } from '../../lib/agent/gateway.js';
import { loadChatTemplate } from '../../lib/chat/jinjaTemplate.js';
import { createChatTemplate, type ChatTemplate } from '../../lib/chat/template.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import { readTaskFile } from '../../lib/data/loader.js';
import { taskPathKind } from '../../lib/data/taskFiles.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { ConfigError } from '../../lib/core/errors.js';
import type { Evaluator } from '../../lib/core/evaluator.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { resolveModelDir } from '../../lib/model/hubCache.js';
import { isBareSpecifier } from '../../lib/config/paths.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import type { Task } from '../../lib/core/types.js';
import { chatWorker, referenceWorker, type RolloutWorker } from '../../lib/engine/worker.js';
import { arithmeticTask } from '../../recipes/arithmetic.js';
import { calculatorTask, type CalculatorOperator } from '../../recipes/calculator.js';
import { stringTransformTask } from '../../recipes/stringTransform.js';

/** A recipe's tasks and what comes with them. */
export interface Data {
  readonly name: string;
  readonly characters: string;
  readonly train: readonly Task[] | { readonly file: string };
  readonly validation: readonly Task[];
  readonly evaluator: Evaluator;
  readonly maxTokens: number;
  readonly randomPolicyReward?: number;
}

/**
 * What both halves of a run build from the recipe: the data, the evaluator and rollout worker it names (`worker`:
 * what makes the training samples; `sampler`: what samples the policy, for validation — the same but for supervised
 * fine-tuning on reference outputs; `undefined`: `singleTurnWorker`), and the policy's tokenizer (the model
 * directory's, or a character tokenizer over the data's alphabet).
 */
export async function loadRollout(
  config: Pick<RxrlConfig, 'data' | 'model' | 'rollout' | 'run' | 'sft' | 'trainer'>,
  baseDir: string,
  log?: (line: string) => void,
  signal?: AbortSignal,
): Promise<{
  data: Data;
  evaluator: Evaluator;
  worker: RolloutWorker | undefined;
  sampler: RolloutWorker | undefined;
  modelDir: string | undefined;
  tokenizer: Tokenizer;
}> {
  const data = await loadData(config, baseDir);
  const references = config.trainer.algorithm === 'sft' && config.sft.source === 'dataset';
  const evaluator = config.rollout.evaluator.module
    ? await importExport<Evaluator>(config.rollout.evaluator, baseDir, 'rollout.evaluator')
    : references && config.data.source === 'jsonl'
      ? UNSCORED
      : data.evaluator;
  const modelDir =
    config.model.path === null
      ? undefined
      : await resolveModelDir(config.model.path, { baseDir, log, timeoutMs: config.model.hubTimeoutMs, signal });
  const tokenizer: Tokenizer = modelDir ? await loadTokenizer(modelDir) : new CharTokenizer(data.characters);
  const agent = config.rollout.agent;
  const template = config.rollout.chatTemplate === 'model' && modelDir !== undefined ? await modelTemplate(modelDir, tokenizer) : undefined;
  const system = config.rollout.system === null ? {} : { system: config.rollout.system };
  const sampler = config.rollout.worker.module
    ? await importExport<RolloutWorker>(config.rollout.worker, baseDir, 'rollout.worker')
    : agent.command !== null || agent.module !== null
      ? await agentWorker(config, baseDir, modelDir, tokenizer)
      : template
        ? chatWorker(template, system)
        : undefined;
  // Supervised fine-tuning on reference outputs trains on them, and validates by sampling as any run does.
  const worker = references ? referenceWorker(template, system) : sampler;
  return { data, evaluator, worker, sampler, modelDir, tokenizer };
}

/**
 * The recipe's agent (`rollout.agent`) as a rollout worker: each sample runs it against a session of a gateway
 * over the run's engine, rendering chats with the model directory's template (the bundled one without a model).
 */
async function agentWorker(
  config: Pick<RxrlConfig, 'model' | 'rollout'>,
  baseDir: string,
  modelDir: string | undefined,
  tokenizer: Tokenizer,
): Promise<GatewayWorker> {
  const agent = config.rollout.agent;
  const template = (modelDir === undefined ? undefined : await loadChatTemplate(modelDir, tokenizer)) ?? createChatTemplate(tokenizer);
  let contextLength = config.model.maxSeqLen;
  if (modelDir !== undefined) {
    const hf = JSON.parse(await readFile(join(modelDir, 'config.json'), 'utf8')) as { max_position_embeddings?: unknown };
    if (typeof hf.max_position_embeddings === 'number') contextLength = hf.max_position_embeddings;
  }
  const maxModelLen = Math.min(contextLength, config.model.maxModelLen ?? Infinity);
  const program: AgentProgram =
    agent.module !== null
      ? { run: await importExport<AgentFunction>({ module: agent.module, export: agent.export }, baseDir, 'rollout.agent') }
      : { command: agent.command!, cwd: resolve(baseDir, agent.cwd ?? '.'), env: agent.env, inheritEnv: agent.inheritEnv };
  if ('run' in program && typeof program.run !== 'function') {
    throw new ConfigError(`rollout.agent.export: '${agent.export}' of ${agent.module} is not a function`, {
      context: { key: 'rollout.agent.export' },
    });
  }
  return gatewayWorker(program, { maxModelLen, template });
}

/** The evaluator of reference outputs from a JSONL dataset with none named: they are not scored (reward 0). */
const UNSCORED: Evaluator = { evaluate: () => ({ reward: 0 }) };

/** The model directory's chat template (`rollout.chatTemplate: model`). */
async function modelTemplate(modelDir: string, tokenizer: Tokenizer): Promise<ChatTemplate> {
  const template = await loadChatTemplate(modelDir, tokenizer);
  if (template === undefined) {
    throw new ConfigError(`rollout.chatTemplate: ${modelDir} has no chat template (chat_template.jinja or tokenizer_config.json)`, {
      context: { key: 'rollout.chatTemplate', modelDir },
    });
  }
  return template;
}

/** What {@link loadData} needs of a generated task. */
interface GeneratedTask {
  readonly name: string;
  readonly characters?: string;
  readonly train: readonly Task[];
  readonly validation: readonly Task[];
  readonly evaluator: Evaluator;
  readonly randomPolicyReward?: number;
}

/**
 * The recipe's data: the bundled string task, arithmetic questions, calculator expressions, or JSONL files.
 *
 * @internal
 */
export async function loadData(config: Pick<RxrlConfig, 'data' | 'rollout' | 'run'>, baseDir: string): Promise<Data> {
  /** A generated task's data; its responses get `maxTokens` new tokens unless the recipe sets `rollout.maxTokens`. */
  const generated = (task: GeneratedTask, maxTokens: number): Data => ({
    name: task.name,
    characters: task.characters ?? '',
    train: task.train,
    validation: task.validation,
    evaluator: task.evaluator,
    maxTokens: config.rollout.maxTokens > 0 ? config.rollout.maxTokens : maxTokens,
    ...(task.randomPolicyReward === undefined ? {} : { randomPolicyReward: task.randomPolicyReward }),
  });
  if (config.data.source === 'bundled') {
    const task = stringTransformTask({ ...config.data.task, seed: config.run.seed });
    return generated(task, task.maxAnswerLength + 1);
  }
  if (config.data.source === 'arithmetic') {
    return generated({ ...arithmeticTask({ ...config.data.arithmetic, seed: config.run.seed }), characters: '' }, 16);
  }
  if (config.data.source === 'calculator') {
    const { operators, maxOperand, validationSize } = config.data.calculator;
    const task = calculatorTask({ operators: [...operators] as CalculatorOperator[], maxOperand, validationSize, seed: config.run.seed });
    return generated(task, task.maxAnswerLength + 1);
  }
  if (config.rollout.maxTokens === 0) throw new ConfigError("rollout.maxTokens: required (> 0) when data.source is 'jsonl'");
  const trainFile = await taskPath(baseDir, 'data.trainFile', config.data.trainFile!);
  const validation = config.data.validationFile
    ? await readTaskFile(await taskPath(baseDir, 'data.validationFile', config.data.validationFile))
    : [];
  const fallback: Evaluator = {
    evaluate: () => {
      throw new ConfigError('rollout.evaluator.module: an evaluator is required for jsonl data (or an agent that gives its rewards)');
    },
  };
  return {
    name: basename(trainFile).replace(/\.(jsonl|parquet)$/, ''),
    characters: config.data.alphabet!,
    train: { file: trainFile },
    validation,
    evaluator: fallback,
    maxTokens: config.rollout.maxTokens,
  };
}

/**
 * The path of a task file or directory the recipe names (relative to `baseDir`), refused now when it cannot be read
 * or is neither a regular file nor a directory: a FIFO would block the run's first read forever.
 *
 * @throws {@link ConfigError} naming the key and the path.
 */
async function taskPath(baseDir: string, key: 'data.trainFile' | 'data.validationFile', value: string): Promise<string> {
  const path = resolve(baseDir, value);
  await taskPathKind(path).catch((cause: unknown) => {
    throw new ConfigError(`${key}: ${(cause as Error).message}`, { cause, context: { key, path } });
  });
  return path;
}

/**
 * Imports `spec.export` of the recipe's module `spec.module` (relative to `baseDir`); errors name the key
 * (`<key>.module`, `<key>.export`).
 *
 * @internal
 */
export async function importExport<T>(spec: { module: string | null; export: string }, baseDir: string, key: string): Promise<T> {
  // A bare specifier (`rxrl/recipes`, a package) is imported by name; anything else is a file relative to the recipe.
  const bare = isBareSpecifier(spec.module!);
  const file = bare ? spec.module! : resolve(baseDir, spec.module!);
  let module: Record<string, unknown>;
  try {
    module = (await import(bare ? file : pathToFileURL(file).href)) as Record<string, unknown>;
  } catch (cause) {
    throw new ConfigError(`${key}.module: cannot import ${file}`, { cause, context: { file, key: `${key}.module` } });
  }
  const value = module[spec.export];
  if (value === undefined) {
    throw new ConfigError(`${key}.export: ${file} has no export '${spec.export}'`, {
      context: { file, export: spec.export, key: `${key}.export` },
    });
  }
  return value as T;
}

/** The directory a recipe file's relative paths are resolved against. */
export function recipeDir(file: string): string {
  return dirname(resolve(file));
}
