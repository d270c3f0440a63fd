/**
 * A bundled task for real chat models: one-operation arithmetic asked in plain English, answered as the equation in
 * a strict format (`7 * 8 = 56`), scored by a rule. Every question is enumerated from the operand range and the
 * operators and shuffled with a seed; nothing is downloaded.
 *
 * Sized for SmolLM2-135M-Instruct on a CPU: the model usually answers with a number, often not in the asked
 * format and often wrong, so it starts well below the ceiling and the format is learnable in tens of steps.
 *
 * @packageDocumentation
 */
import { ConfigError } from '../lib/core/errors.js';
import type { EvaluationResult, Evaluator, ResponseInfo } from '../lib/core/evaluator.js';
import { createRng, shuffledIndices } from '../lib/core/random.js';
import type { Task } from '../lib/core/types.js';

/** Operators of the arithmetic task. */
export type ArithmeticOperator = '+' | '-' | '*';

/** Valid operators, in the order a recipe's `data.arithmetic.operators` string lists them. */
export const ARITHMETIC_OPERATORS: readonly ArithmeticOperator[] = ['+', '-', '*'];

/** Options of {@link arithmeticTask}. */
export interface ArithmeticTaskOptions {
  /** Operators, as a string of `+`, `-`, `*`. Default `+*`. */
  readonly operators?: string;
  /** Largest operand; operands run from 1. Default 12. */
  readonly maxOperand?: number;
  /** Questions held out for validation. Default 64. */
  readonly validationSize?: number;
  /** Seed of the split. Default 0. */
  readonly seed?: number;
}

/** The arithmetic task family with its splits and evaluator. */
export interface ArithmeticTask {
  /** Recipe name, e.g. `arithmetic-+*-12`. */
  readonly name: string;
  readonly train: readonly Task[];
  readonly validation: readonly Task[];
  /** {@link equationEvaluator}. */
  readonly evaluator: Evaluator;
  /** Longest answer in characters (`12 * 12 = 144`). */
  readonly maxAnswerLength: number;
}

/** Reward of a response that states the asked equation with a wrong result: the format alone. */
export const FORMAT_CREDIT = 0.2;

const EQUATION = /(-?\d+)\s*([+*-])\s*(-?\d+)\s*=\s*(-?\d+)/;

/**
 * Scores an answer to an arithmetic question: 1 when the response states the question's equation with the right
 * result (`7 * 8 = 56`, surrounding words allowed), {@link FORMAT_CREDIT} for the equation with a wrong result, 0
 * otherwise, and 0 for a response the token budget cut off. Metrics: `format`, `correct`.
 */
export const equationEvaluator: Evaluator = {
  evaluate(task: Task, response: string, _signal?: AbortSignal, info?: ResponseInfo): EvaluationResult {
    const answer = task.answer ?? '';
    const [question] = answer.split(' = ');
    const match = info?.finishReason === 'length' ? null : EQUATION.exec(response);
    const format = match !== null && `${match[1]} ${match[2]} ${match[3]}` === question;
    const correct = format && `${question} = ${match[4]}` === answer;
    return {
      reward: correct ? 1 : format ? FORMAT_CREDIT : 0,
      groundTruth: answer,
      metrics: { format: format ? 1 : 0, correct: correct ? 1 : 0 },
    };
  },
};

function apply(op: ArithmeticOperator, a: number, b: number): number {
  return op === '+' ? a + b : op === '-' ? a - b : a * b;
}

/**
 * Generates the task family: every `a op b` with `1 ≤ a, b ≤ maxOperand`, shuffled with the seed; the first
 * `validationSize` are held out. Prompts ask for the equation only, with an example of the format.
 *
 * @throws {@link rxrl!ConfigError} naming the key for unknown operators, a bad range, or no training questions left.
 */
export function arithmeticTask(options: ArithmeticTaskOptions = {}): ArithmeticTask {
  const operators = options.operators ?? '+*';
  const maxOperand = options.maxOperand ?? 12;
  const validationSize = options.validationSize ?? 64;
  const ops = [...operators];
  if (ops.length === 0 || new Set(ops).size !== ops.length || !ops.every((op) => ARITHMETIC_OPERATORS.includes(op as ArithmeticOperator))) {
    throw new ConfigError(`data.arithmetic.operators: distinct characters of '+-*', got '${operators}'`, {
      context: { key: 'data.arithmetic.operators' },
    });
  }
  if (!(Number.isInteger(maxOperand) && maxOperand >= 2 && maxOperand <= 999)) {
    throw new ConfigError(`data.arithmetic.maxOperand: an integer in 2..999, got ${maxOperand}`, {
      context: { key: 'data.arithmetic.maxOperand' },
    });
  }
  const questions: { a: number; op: ArithmeticOperator; b: number }[] = [];
  for (const op of ops as ArithmeticOperator[])
    for (let a = 1; a <= maxOperand; a++) for (let b = 1; b <= maxOperand; b++) questions.push({ a, op, b });
  if (validationSize >= questions.length) {
    throw new ConfigError(`data.task.validationSize: ${validationSize} leaves no training questions (${questions.length} in all)`, {
      context: { key: 'data.task.validationSize' },
    });
  }
  const name = `arithmetic-${operators}-${maxOperand}`;
  const order = shuffledIndices(questions.length, createRng(options.seed ?? 0));
  const tasks: Task[] = order.map((i) => {
    const { a, op, b } = questions[i];
    const spoken = op === '*' ? 'times' : op === '+' ? 'plus' : 'minus';
    return {
      id: `${name}/${a}${op}${b}`,
      prompt: `What is ${a} ${spoken} ${b}? Answer with the equation only, like "2 + 2 = 4".`,
      answer: `${a} ${op} ${b} = ${apply(op, a, b)}`,
    };
  });
  const maxAnswerLength = Math.max(...tasks.map((t) => (t.answer ?? '').length));
  return {
    name,
    train: tasks.slice(validationSize),
    validation: tasks.slice(0, validationSize),
    evaluator: equationEvaluator,
    maxAnswerLength,
  };
}
