/**
 * A bundled tool-use task: arithmetic with a calculator tool, for multi-turn agent rollouts.
 *
 * The user message is an expression such as `12*7`; the policy may call `calc(12*7)` (the `name(args)` tool-call
 * format of the bundled chat template), reads the tool's answer `84`, and answers `84`. An episode at the
 * character level looks like this (`␃` is the end-of-turn token):
 *
 * ```
 * ␂12*7␃calc(12*7)␃84␃84␃        policy tokens: calc(12*7)␃ and 84␃ (loss mask 1); tool result 84␃ (mask 0)
 * ```
 *
 * The reward is 1 for the exact answer and half the per-position partial credit otherwise. No downloads: every
 * split is enumerated from the operand range and shuffled with a seed.
 *
 * @packageDocumentation
 */
import type { ToolEnvironment } from '../lib/agent/agentWorker.js';
import type { ChatTool } from '../lib/chat/types.js';
import { ConfigError, DecodeError } from '../lib/core/errors.js';
import type { EvaluationResult, Evaluator } from '../lib/core/evaluator.js';
import { createRng, shuffledIndices } from '../lib/core/random.js';
import type { Task } from '../lib/core/types.js';
import { partialCredit } from './stringTransform.js';

/** Arithmetic operators the tasks use. */
export type CalculatorOperator = '+' | '-' | '*';

/** Options of {@link calculatorTask}. */
export interface CalculatorTaskOptions {
  /** Operators of the tasks. Default `['+', '*']`. */
  readonly operators?: readonly CalculatorOperator[];
  /** Largest operand (operands are `0 .. maxOperand`). Default 20. */
  readonly maxOperand?: number;
  /** Tasks held out for validation. Default 100. */
  readonly validationSize?: number;
  /** Seed of the split. Default 0. */
  readonly seed?: number;
}

/** The calculator task family with its splits, tool environment and evaluator. */
export interface CalculatorTask {
  /** Recipe name, e.g. `calculator-+*-20`. */
  readonly name: string;
  /** Characters a tokenizer for this task must know: digits, operators, parentheses, the tool name, `?`. */
  readonly characters: string;
  /** Training tasks (prompt: the expression; answer: its value). */
  readonly train: readonly Task[];
  /** Held-out tasks. */
  readonly validation: readonly Task[];
  /** The `calc` tool and its implementation. */
  readonly environment: ToolEnvironment;
  /** Exact match 1, else half the partial credit. */
  readonly evaluator: Evaluator;
  /** Longest answer in characters. */
  readonly maxAnswerLength: number;
}

/** Name of the calculator tool. */
export const CALCULATOR_TOOL_NAME = 'calc';

/** Text the environment answers for an expression it cannot evaluate. */
export const CALCULATOR_ERROR_TEXT = '?';

/** The calculator tool as offered to the policy. */
export const CALCULATOR_TOOL: ChatTool = {
  name: CALCULATOR_TOOL_NAME,
  description: 'Evaluates an integer arithmetic expression with + - * and parentheses.',
  parameters: {
    type: 'object',
    properties: { expression: { type: 'string', description: 'for example 12*(3+4)' } },
    required: ['expression'],
  },
};

/** Longest expression the tool evaluates, in characters. */
const MAX_EXPRESSION_LENGTH = 64;

/**
 * Evaluates an integer expression with `+`, `-`, `*`, unary minus and parentheses (recursive descent, no
 * `eval`).
 *
 * @throws {@link rxrl!DecodeError} for anything else (empty, unbalanced, other characters, too long, unsafe result).
 */
export function evaluateArithmetic(expression: string): number {
  if (expression.length === 0 || expression.length > MAX_EXPRESSION_LENGTH) {
    throw new DecodeError(`expression must have 1..${MAX_EXPRESSION_LENGTH} characters`);
  }
  let at = 0;
  const fail = (what: string): never => {
    throw new DecodeError(`${what} at ${at} in ${JSON.stringify(expression)}`, { context: { expression, at } });
  };
  const sum = (): number => {
    let value = product();
    while (expression[at] === '+' || expression[at] === '-') {
      const op = expression[at++];
      const right = product();
      value = op === '+' ? value + right : value - right;
    }
    return value;
  };
  const product = (): number => {
    let value = unary();
    while (expression[at] === '*') {
      at++;
      value *= unary();
    }
    return value;
  };
  const unary = (): number => {
    if (expression[at] === '-') {
      at++;
      return -unary();
    }
    if (expression[at] === '(') {
      at++;
      const value = sum();
      if (expression[at] !== ')') fail('expected )');
      at++;
      return value;
    }
    const start = at;
    while (at < expression.length && expression[at] >= '0' && expression[at] <= '9') at++;
    if (at === start) fail('expected a number');
    return Number(expression.slice(start, at));
  };
  const value = sum();
  if (at !== expression.length) fail('unexpected character');
  if (!Number.isSafeInteger(value)) fail('result is not a safe integer');
  return value === 0 ? 0 : value; // no -0
}

/** The `calc` environment: evaluates the `expression` argument. */
export const calculatorEnvironment: ToolEnvironment = {
  tools: [CALCULATOR_TOOL],
  call(call) {
    if (call.name !== CALCULATOR_TOOL_NAME) throw new DecodeError(`unknown tool '${call.name}'`);
    const args = JSON.parse(call.arguments) as { expression?: unknown };
    if (typeof args.expression !== 'string') throw new DecodeError('calc needs a string expression');
    return String(evaluateArithmetic(args.expression));
  },
  errorText: () => CALCULATOR_ERROR_TEXT,
};

/** Exact match scores 1; otherwise half the per-position partial credit. Metrics: `accuracy`. */
export const calculatorEvaluator: Evaluator = {
  evaluate(task: Task, response: string): EvaluationResult {
    const answer = task.answer ?? '';
    const exact = response === answer;
    return { reward: exact ? 1 : 0.5 * partialCredit(answer, response), groundTruth: answer, metrics: { accuracy: exact ? 1 : 0 } };
  },
};

/**
 * Generates the calculator task family: every `a op b` with operands in `0 .. maxOperand`, shuffled with the
 * seed; the first `validationSize` are held out.
 *
 * @param options - operators, operand range and split.
 * @returns the splits, the tool environment and the evaluator.
 */
export function calculatorTask(options: CalculatorTaskOptions = {}): CalculatorTask {
  const operators = options.operators ?? ['+', '*'];
  const maxOperand = options.maxOperand ?? 20;
  const validationSize = options.validationSize ?? 100;
  if (operators.length === 0 || !operators.every((op) => op === '+' || op === '-' || op === '*')) {
    throw new ConfigError(`operators must be a non-empty subset of + - *, got ${JSON.stringify(operators)}`);
  }
  if (!Number.isInteger(maxOperand) || maxOperand < 1) throw new ConfigError(`maxOperand must be an integer >= 1, got ${maxOperand}`);
  const expressions: string[] = [];
  for (const op of operators) {
    for (let a = 0; a <= maxOperand; a++) for (let b = 0; b <= maxOperand; b++) expressions.push(`${a}${op}${b}`);
  }
  if (!Number.isInteger(validationSize) || validationSize < 0 || validationSize >= expressions.length) {
    throw new ConfigError(`validationSize must be an integer in [0, ${expressions.length}), got ${validationSize}`);
  }
  const name = `calculator-${operators.join('')}-${maxOperand}`;
  const order = shuffledIndices(expressions.length, createRng(options.seed ?? 0, name));
  const tasks: Task[] = order.map((i) => {
    const expression = expressions[i];
    return { id: `${name}/${expression}`, prompt: expression, answer: String(evaluateArithmetic(expression)) };
  });
  return {
    name,
    characters: `0123456789+-*()${[...new Set(CALCULATOR_TOOL_NAME)].join('')}${CALCULATOR_ERROR_TEXT}`,
    train: tasks.slice(validationSize),
    validation: tasks.slice(0, validationSize),
    environment: calculatorEnvironment,
    evaluator: calculatorEvaluator,
    maxAnswerLength: Math.max(...tasks.map((t) => t.answer!.length)),
  };
}
