/**
 * Settings that are valid but almost surely not what was meant: the run would start, train nothing and say
 * nothing. {@link configWarnings} names them so the caller can log each one once before training.
 *
 * @packageDocumentation
 */
import type { RxrlConfig } from './schema.js';

/** What {@link configWarnings} needs to know besides the configuration. */
export interface ConfigWarningsContext {
  /** Number of tasks in the train split once loaded; omit when not known (no warning about it then). */
  readonly trainTasks?: number;
}

/**
 * Warnings about a validated configuration (and its loaded data), one sentence each, naming the key:
 *
 * - `rollout.groupSize` 1: every GRPO group holds one sample, whose group-relative advantage is 0, so the
 *   policy-gradient loss is 0 and the rewards teach nothing.
 * - an empty train split: there is nothing to train.
 *
 * @example
 * ```ts
 * import { configWarnings, loadConfig } from 'rxrl';
 * for (const warning of configWarnings(loadConfig({ file: 'recipe.yaml' }), { trainTasks: 0 })) console.warn(warning);
 * ```
 * @param config - the validated configuration.
 * @param context - facts known after loading, such as the number of training tasks.
 * @returns the warnings, in a fixed order; empty when there is nothing to say.
 */
export function configWarnings(
  config: Pick<RxrlConfig, 'algorithm' | 'data' | 'rollout'> & { readonly trainer?: Pick<RxrlConfig['trainer'], 'algorithm'> },
  context: ConfigWarningsContext = {},
): string[] {
  const warnings: string[] = [];
  // Supervised fine-tuning has no group advantages: one sample a task is its normal shape.
  if (config.rollout.groupSize === 1 && config.trainer?.algorithm !== 'sft') {
    warnings.push(
      'rollout.groupSize is 1: every GRPO group has one sample, whose advantage (reward minus the group mean) is ' +
        'always 0, so the policy-gradient loss is 0 and nothing is learned from the rewards' +
        (config.algorithm.filterZeroVariance ? ' (and algorithm.filterZeroVariance drops every group)' : '') +
        '; use rollout.groupSize >= 2',
    );
  }
  if (context.trainTasks === 0) {
    const where = config.data.source === 'jsonl' && config.data.trainFile !== null ? `data.trainFile ${config.data.trainFile}` : 'data';
    warnings.push(`${where}: the train split has no tasks: nothing to train`);
  }
  return warnings;
}
