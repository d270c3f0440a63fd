/**
 * A run's policies as built for training: per policy its models, engine and trainer (the models themselves come
 * from `lib/model/policies.ts`).
 *
 * @packageDocumentation
 */
import type { PolicyEntryConfig } from '../../lib/config/schema.js';
import type { LocalEngine } from '../../lib/engine/local.js';
import type { PolicyModels } from '../../lib/model/policies.js';
import type { GrpoTrainer } from '../../lib/train/grpoTrainer.js';

/** One policy of a run, as built for training. */
export interface BuiltPolicy extends PolicyModels {
  readonly entry: PolicyEntryConfig;
  readonly engine: LocalEngine;
  readonly trainer: GrpoTrainer;
  readonly syncBytes: number;
  readonly trainableParameters: number;
}

/** The policy of a run whose recipe names none (`policies` empty): one full model. */
export const SINGLE_POLICY: PolicyEntryConfig = { name: 'policy', specialization: 'full' };
