/**
 * A multi-agent recipe's parts: its environment and data, the tokenizer, the agents and the episode spec that both
 * halves of a Kafka run share.
 *
 * @packageDocumentation
 */

import type { AgentSpec, MultiAgentEnvironment } from '../../lib/agent/environment.js';
import type { RxrlConfig } from '../../lib/config/schema.js';
import type { TaskSource } from '../../lib/data/loader.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { ConfigError } from '../../lib/core/errors.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import type { Task } from '../../lib/core/types.js';
import { writerEditorTask } from '../../recipes/writerEditor.js';
import type { KafkaEpisodes } from './contracts.js';
import { resolveModelDir } from '../../lib/model/hubCache.js';
import { importExport, loadData } from './data.js';

/** The data and environment of a multi-agent recipe. */
export interface AgentsTask {
  /** Recipe name (the bundled task's, or the train file's). */
  readonly name: string;
  /** Training tasks: an array, or a JSONL file read lazily. */
  readonly train: TaskSource;
  /** Held-out tasks. */
  readonly validation: readonly Task[];
  readonly environment: MultiAgentEnvironment;
}

/** What a multi-agent recipe gives both halves of a run: the task, the tokenizer, the agents, the episode spec. */
export interface AgentsRecipe {
  readonly task: AgentsTask;
  readonly tokenizer: Tokenizer;
  readonly agents: AgentSpec[];
  readonly episodes: KafkaEpisodes;
  /** Longest response per turn. */
  readonly maxTokens: number;
  /** The Hugging Face model directory of `model.path`, if any. */
  readonly modelDir: string | undefined;
}

/**
 * Reads the multi-agent parts of a recipe: the bundled environment and its splits, the tokenizer (the model
 * directory's, or the task's characters) and the agents.
 *
 * @param config - a configuration whose `agents.environment` is not `none`.
 * @param baseDir - what `model.path` is relative to.
 * @param signal - stops a download of `model.path` named by a model id.
 * @returns the recipe's task, tokenizer, agents and episode spec.
 */
export async function loadAgentsRecipe(
  config: Pick<RxrlConfig, 'agents' | 'data' | 'model' | 'rollout' | 'run'>,
  baseDir: string,
  signal?: AbortSignal,
): Promise<AgentsRecipe> {
  if (config.agents.environment === 'none')
    throw new ConfigError("agents.environment: a multi-agent run needs an environment, got 'none'", {
      context: { key: 'agents.environment' },
    });
  const modelDir =
    config.model.path === null
      ? undefined
      : await resolveModelDir(config.model.path, { baseDir, timeoutMs: config.model.hubTimeoutMs, signal });
  let task: AgentsTask;
  let characters: string;
  let maxTokens: number;
  if (config.agents.environment === 'writer-editor') {
    const bundled = writerEditorTask({ ...config.data.task, seed: config.run.seed });
    task = bundled;
    characters = bundled.characters;
    maxTokens = config.rollout.maxTokens > 0 ? config.rollout.maxTokens : bundled.maxAnswerLength + 1;
  } else {
    // A recipe's own environment, on the recipe's data (bundled string tasks or JSONL files).
    const environment = checkEnvironment(await importExport<unknown>(config.agents.module, baseDir, 'agents.module'));
    const data = await loadData(config, baseDir);
    task = { name: data.name, train: data.train, validation: data.validation, environment };
    characters = data.characters;
    maxTokens = data.maxTokens;
  }
  const tokenizer: Tokenizer = modelDir ? await loadTokenizer(modelDir) : new CharTokenizer(characters);
  const agents: AgentSpec[] = config.agents.roles.map((role) => ({
    name: role.name,
    policy: role.policy,
    ...(role.prompt === undefined ? {} : { prompt: role.prompt }),
  }));
  // A prompt the tokenizer cannot encode would fail every episode: refuse it now, naming the key.
  config.agents.roles.forEach((role, i) => {
    if (role.prompt === undefined) return;
    try {
      tokenizer.encode(role.prompt);
    } catch (cause) {
      throw new ConfigError(`agents.roles[${i}].prompt: the tokenizer cannot encode it: ${(cause as Error).message}`, {
        cause,
        context: { key: `agents.roles[${i}].prompt` },
      });
    }
  });
  return {
    task,
    tokenizer,
    agents,
    episodes: { environment: task.environment, agents, granularity: config.agents.granularity },
    maxTokens,
    modelDir,
  };
}

/** The module's export as an environment; a `ConfigError` naming `agents.module.export` when it is not one. */
function checkEnvironment(value: unknown): MultiAgentEnvironment {
  const env = value as Partial<MultiAgentEnvironment> | null;
  const ok =
    typeof env === 'object' &&
    env !== null &&
    Array.isArray(env.turnOrder) &&
    env.turnOrder.every((a) => typeof a === 'string') &&
    Number.isInteger(env.maxTurns) &&
    typeof env.reset === 'function';
  if (!ok) {
    throw new ConfigError('agents.module.export: not a MultiAgentEnvironment (turnOrder: string[], maxTurns: integer, reset(task, seed))', {
      context: { key: 'agents.module.export' },
    });
  }
  return env as MultiAgentEnvironment;
}
