/**
 * A bundled, generated task family: transform a short string over a small alphabet (copy, reverse, or shift each
 * letter by one), scored by a rule with partial credit per position. No downloads: every split is enumerated
 * from the alphabet and shuffled with a seed.
 *
 * @packageDocumentation
 */
import { ConfigError } from '../lib/core/errors.js';
import type { EvaluationResult, Evaluator, ResponseInfo } from '../lib/core/evaluator.js';
import { createRng, shuffledIndices } from '../lib/core/random.js';
import type { Task } from '../lib/core/types.js';

/** Which transformation the policy must learn. */
export type StringTransform = 'copy' | 'reverse' | 'shift';

/** Valid transformation names. */
export const STRING_TRANSFORMS: readonly StringTransform[] = ['copy', 'reverse', 'shift'];

/** Options of {@link stringTransformTask}. */
export interface StringTransformOptions {
  /** Transformation. Default `reverse`. */
  readonly transform?: StringTransform;
  /** Letters the strings are made of (distinct characters). Default `abcde`. */
  readonly alphabet?: string;
  /** Shortest string. Default 4. */
  readonly minLength?: number;
  /** Longest string. Default 4. */
  readonly maxLength?: number;
  /** Tasks held out for validation. Default 100. */
  readonly validationSize?: number;
  /** Seed of the split. Default 0. */
  readonly seed?: number;
}

/** A generated task family with its splits and evaluator. */
export interface StringTransformTask {
  /** Recipe name, e.g. `reverse-abcde-4`. */
  readonly name: string;
  /** Characters a tokenizer for this task must know (alphabet plus the separator). */
  readonly characters: string;
  /** Training tasks. */
  readonly train: readonly Task[];
  /** Held-out tasks (disjoint prompts). */
  readonly validation: readonly Task[];
  /** Partial-credit evaluator. */
  readonly evaluator: Evaluator;
  /** Longest answer, for `maxTokens` (add one for the stop token). */
  readonly maxAnswerLength: number;
  /** Expected reward of a policy that samples uniformly over the characters and the stop token. */
  readonly randomPolicyReward: number;
}

/** Separates the input string from the answer in a prompt: `abcd=`. */
export const PROMPT_SEPARATOR = '=';

/** Applies a transformation to a string over `alphabet`. */
export function applyTransform(transform: StringTransform, text: string, alphabet: string): string {
  switch (transform) {
    case 'copy':
      return text;
    case 'reverse':
      return [...text].reverse().join('');
    case 'shift':
      return [...text].map((c) => alphabet[(alphabet.indexOf(c) + 1) % alphabet.length]).join('');
    default:
      throw new ConfigError(`unknown transform '${String(transform)}'; valid: ${STRING_TRANSFORMS.join(', ')}`);
  }
}

/**
 * Partial credit: the fraction of answer positions the response gets right, over the longer of the two
 * lengths (so extra characters cost as much as missing ones). Exact match scores 1.
 *
 * @example `score('dcba', 'dcxa')` = 0.75; `score('dcba', 'dcbaa')` = 0.8; `score('dcba', '')` = 0.
 */
export function partialCredit(answer: string, response: string): number {
  const n = Math.max(answer.length, response.length);
  if (n === 0) return 1;
  let hits = 0;
  for (let i = 0; i < Math.min(answer.length, response.length); i++) if (answer[i] === response[i]) hits++;
  return hits / n;
}

/**
 * Rule-based evaluator for string tasks: partial credit, plus `accuracy` (exact match) as a metric. A response the
 * token budget cut off (`info.finishReason` `length`) scores 0: the policy never said it was done. Without that
 * rule, stopping is worth only what the letters before it are worth (`dcba` 1 against `dcbaa` 0.8), nothing while
 * the letters are still wrong, so early training drives the stop token out everywhere (stopping too soon costs
 * letters) and a run settles at "right letters, one too many" (measured in the issue "Prove it learns").
 */
export const partialCreditEvaluator: Evaluator = {
  evaluate(task: Task, response: string, _signal?: AbortSignal, info?: ResponseInfo): EvaluationResult {
    const answer = task.answer ?? '';
    const finished = info?.finishReason !== 'length';
    return {
      reward: finished ? partialCredit(answer, response) : 0,
      groundTruth: answer,
      metrics: {
        accuracy: finished && response === answer ? 1 : 0,
        length_match: finished && response.length === answer.length ? 1 : 0,
      },
    };
  },
};

/**
 * Generates the task family: every string of the allowed lengths, shuffled with the seed; the first
 * `validationSize` are held out.
 *
 * @param options - transform, alphabet, lengths and split.
 * @returns the splits, the evaluator and the random-policy reward.
 */
/** Most strings the task family may hold (they are all generated and shuffled). */
export const MAX_STRINGS = 1_000_000;

export function stringTransformTask(options: StringTransformOptions = {}): StringTransformTask {
  const transform = options.transform ?? 'reverse';
  const alphabet = options.alphabet ?? 'abcde';
  const minLength = options.minLength ?? 4;
  const maxLength = options.maxLength ?? 4;
  const validationSize = options.validationSize ?? 100;
  if (!STRING_TRANSFORMS.includes(transform)) {
    throw new ConfigError(`unknown transform '${String(transform)}'; valid: ${STRING_TRANSFORMS.join(', ')}`);
  }
  if (new Set(alphabet).size !== alphabet.length || alphabet.length < 2 || alphabet.includes(PROMPT_SEPARATOR)) {
    throw new ConfigError(`alphabet must have >= 2 distinct characters and no '${PROMPT_SEPARATOR}', got '${alphabet}'`);
  }
  if (!(Number.isInteger(minLength) && minLength >= 1 && Number.isInteger(maxLength) && maxLength >= minLength)) {
    throw new ConfigError(`need integer lengths 1 <= minLength <= maxLength, got ${minLength}..${maxLength}`);
  }
  let total = 0;
  for (let length = minLength; length <= maxLength && total <= MAX_STRINGS; length++) total += alphabet.length ** length;
  if (total > MAX_STRINGS) {
    throw new ConfigError(
      `data.task: ${alphabet.length} letters of lengths ${minLength}..${maxLength} make more than ${MAX_STRINGS} strings ` +
        '(every one is generated): use a shorter maxLength or a smaller alphabet',
      { context: { key: 'data.task.maxLength', strings: total } },
    );
  }
  const strings: string[] = [];
  const grow = (prefix: string): void => {
    if (prefix.length >= minLength) strings.push(prefix);
    if (prefix.length === maxLength) return;
    for (const c of alphabet) grow(prefix + c);
  };
  grow('');
  if (validationSize >= strings.length) {
    throw new ConfigError(`validationSize ${validationSize} leaves no training tasks (${strings.length} strings)`);
  }
  const name = `${transform}-${alphabet}-${minLength === maxLength ? minLength : `${minLength}to${maxLength}`}`;
  const order = shuffledIndices(strings.length, createRng(options.seed ?? 0));
  const tasks: Task[] = order.map((i) => {
    const text = strings[i];
    return { id: `${name}/${text}`, prompt: `${text}${PROMPT_SEPARATOR}`, answer: applyTransform(transform, text, alphabet) };
  });
  // A uniform policy over the alphabet, the separator and the stop token hits a position with probability
  // 1/(|alphabet|+2); estimate its partial credit by simulation with a fixed seed.
  const randomPolicyReward = simulateRandomPolicy(tasks.slice(0, validationSize), alphabet, maxLength);
  return {
    name,
    characters: alphabet + PROMPT_SEPARATOR,
    train: tasks.slice(validationSize),
    validation: tasks.slice(0, validationSize),
    evaluator: partialCreditEvaluator,
    maxAnswerLength: maxLength,
    randomPolicyReward,
  };
}

function simulateRandomPolicy(tasks: readonly Task[], alphabet: string, maxLength: number): number {
  const rng = createRng(12345);
  const symbols = alphabet + PROMPT_SEPARATOR;
  const choices = symbols.length + 1; // + stop token
  let total = 0;
  let count = 0;
  for (let round = 0; round < 20; round++) {
    for (const task of tasks) {
      // The budget is the longest answer plus the stop token; a response that never stops within it scores 0.
      let response = '';
      let stopped = false;
      for (let i = 0; i <= maxLength && !stopped; i++) {
        const pick = Math.floor(rng.next() * choices);
        if (pick === symbols.length) stopped = true;
        else response += symbols[pick];
      }
      if (stopped) total += partialCredit(task.answer ?? '', response);
      count++;
    }
  }
  return total / count;
}
