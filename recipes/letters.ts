/**
 * A shaping reward for models that know nothing yet: the share of a response's characters that occur in the task's
 * answer. An untrained model earns a little of it by chance, and more as it learns to emit the answer's letters, so
 * every group has rewards that differ from the first step on; exact or positional credit (the string tasks' own) is
 * 0 for every sample of such a model, and GRPO then has nothing to learn from. `npm run bench -- engines` and the
 * SkyRL specs train a random tiny Qwen3 on it.
 *
 * @packageDocumentation
 */
import type { EvaluationResult, Evaluator } from '../lib/core/evaluator.js';
import type { Task } from '../lib/core/types.js';

/**
 * The share of `response`'s characters that occur in `answer` (0 for an empty response).
 *
 * @example `letterShare('cba', 'abxx')` = 0.5
 */
export function letterShare(answer: string, response: string): number {
  if (response.length === 0) return 0;
  const letters = new Set(answer);
  let hits = 0;
  for (const c of response) if (letters.has(c)) hits++;
  return hits / [...response].length;
}

/** Evaluator of {@link letterShare} against the task's answer. */
export const letterShareEvaluator: Evaluator = {
  evaluate(task: Task, response: string): EvaluationResult {
    return { reward: letterShare(task.answer ?? '', response) };
  },
};
