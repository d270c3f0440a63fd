/**
 * Bundled tasks: generated data, rule-based evaluators and default settings.
 *
 * @packageDocumentation
 * @module rxrl/recipes
 */

// ── string transformations ─────────────────────────────────────────────────────
export {
  PROMPT_SEPARATOR,
  STRING_TRANSFORMS,
  applyTransform,
  partialCredit,
  partialCreditEvaluator,
  stringTransformTask,
} from './stringTransform.js';
export type { StringTransform, StringTransformOptions, StringTransformTask } from './stringTransform.js';

// ── a shaping reward for untrained models ──────────────────────────────────────
export { letterShare, letterShareEvaluator } from './letters.js';

// ── arithmetic for a chat model ───────────────────────────────────────────────
export { ARITHMETIC_OPERATORS, FORMAT_CREDIT, arithmeticTask, equationEvaluator } from './arithmetic.js';
export type { ArithmeticOperator, ArithmeticTask, ArithmeticTaskOptions } from './arithmetic.js';

// ── tool use: a calculator for agent rollouts ──────────────────────────────────
export {
  CALCULATOR_ERROR_TEXT,
  CALCULATOR_TOOL,
  CALCULATOR_TOOL_NAME,
  calculatorEnvironment,
  calculatorEvaluator,
  calculatorTask,
  evaluateArithmetic,
} from './calculator.js';
export type { CalculatorOperator, CalculatorTask, CalculatorTaskOptions } from './calculator.js';

// ── two agents, different roles: a writer and an editor ────────────────────────
export { DRAFT_SEPARATOR, WRITER_EDITOR_AGENTS, writerEditorAgents, writerEditorEnvironment, writerEditorTask } from './writerEditor.js';
export type { WriterEditorTask } from './writerEditor.js';
