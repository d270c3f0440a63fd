/**
 * A bundled two-agent task with different roles: a writer answers a string task (`abcd=` → `dcba`), then an editor
 * sees the task and the writer's draft (`abcd=dcbx>`) and writes the corrected answer. A rule-based judge gives
 * each agent partial credit for its own text against the reference, so the editor gains by copying a right draft
 * and fixing a wrong one. Generated, nothing downloaded; learnable from scratch by the tiny model on a CPU.
 *
 * @packageDocumentation
 */
import type { AgentSpec, Episode, MultiAgentEnvironment } from '../lib/agent/environment.js';
import { ConfigError } from '../lib/core/errors.js';
import type { Task } from '../lib/core/types.js';
import { partialCredit, stringTransformTask, type StringTransformOptions } from './stringTransform.js';

/** Ends the draft in the editor's prompt. */
export const DRAFT_SEPARATOR = '>';

/** The agents of the writer–editor task, in turn order. */
export const WRITER_EDITOR_AGENTS = ['writer', 'editor'] as const;

/** The writer–editor task family: splits, the environment and the sizes a run needs. */
export interface WriterEditorTask {
  /** Recipe name, e.g. `writer-editor-reverse-abcde-4`. */
  readonly name: string;
  /** Characters a tokenizer for this task must know. */
  readonly characters: string;
  readonly train: readonly Task[];
  readonly validation: readonly Task[];
  /** The two-turn environment (writer, then editor). */
  readonly environment: MultiAgentEnvironment;
  /** Longest answer, for `maxTokens` (add one for the stop token). */
  readonly maxAnswerLength: number;
}

/**
 * Generates the writer–editor task over a string transformation (default: reverse 4 letters over `abcde`).
 *
 * @param options - the string task's transform, alphabet, lengths and split.
 * @returns the splits and the environment.
 */
export function writerEditorTask(options: StringTransformOptions = {}): WriterEditorTask {
  const base = stringTransformTask(options);
  if (base.characters.includes(DRAFT_SEPARATOR)) {
    throw new ConfigError(`the writer–editor task needs an alphabet without '${DRAFT_SEPARATOR}'`, {
      context: { key: 'data.task.alphabet' },
    });
  }
  return {
    name: `writer-editor-${base.name}`,
    characters: base.characters + DRAFT_SEPARATOR,
    train: base.train,
    validation: base.validation,
    environment: writerEditorEnvironment(),
    maxAnswerLength: base.maxAnswerLength,
  };
}

/**
 * The environment: turn 0 the writer sees the task's prompt; turn 1 the editor sees the prompt, the writer's draft
 * and `>`. Each agent is rewarded with the partial credit of its own text; `accuracy` (exact match) is a metric.
 */
export function writerEditorEnvironment(): MultiAgentEnvironment {
  return {
    turnOrder: WRITER_EDITOR_AGENTS,
    maxTurns: 2,
    reset(task: Task): Episode {
      const answer = task.answer ?? '';
      let draft = '';
      return {
        observe: (agent) => (agent === 'writer' ? task.prompt : `${task.prompt}${draft}${DRAFT_SEPARATOR}`),
        step: (agent, response) => {
          if (agent === 'writer') draft = response;
          return {
            rewards: { [agent]: partialCredit(answer, response) },
            done: agent === 'editor',
            metrics: { accuracy: response === answer ? 1 : 0 },
          };
        },
      };
    },
  };
}

/**
 * The agent specs of a specialization level: `shared` (L1: one policy for both, told apart by their prompts, which
 * already differ in shape) or `separate` (L2/L3: a policy per agent, named after it).
 */
export function writerEditorAgents(policies: 'shared' | 'separate', sharedTag = 'shared'): AgentSpec[] {
  return WRITER_EDITOR_AGENTS.map((name) => ({ name, policy: policies === 'shared' ? sharedTag : name }));
}
