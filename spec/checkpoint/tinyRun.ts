/** A tiny single-agent recipe for run-directory specs: the bundled reverse task, a one-layer model, cpu backend. */
import { loadConfig, type RxrlConfig } from '../../lib/config/schema.js';

const TASK = { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } as const;

/**
 * The recipe of a run of `steps` steps in `dir` (absolute), checkpointing every step and keeping them all,
 * resuming automatically; `values` override whole sections.
 */
export function tinyRun(dir: string, steps: number, values: Record<string, unknown> = {}): RxrlConfig {
  return loadConfig({
    env: {},
    values: {
      run: { dir, seed: 3, steps, backend: 'cpu' },
      data: { source: 'bundled', task: TASK, epochs: 0, shuffle: true },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
      rollout: { groupSize: 2 },
      sync: { mode: 'sync', batchSize: 2 },
      checkpoint: { every: 1, keepLast: 0 },
      resume: { mode: 'auto' },
      validation: { beforeTrain: false },
      ...values,
    },
  });
}
