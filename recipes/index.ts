/**
 * Bundled tasks: generated data, rule-based evaluators and default settings.
 *
 * @packageDocumentation
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
