/**
 * The keys a recipe or `--set` may name, checked before convict sees them: an unknown key is one line naming the
 * nearest key, and the common TRL and verl names are answered with rxrl's key ({@link FOREIGN_KEYS}).
 *
 * @packageDocumentation
 */

/** Where a foreign configuration name comes from. */
export type ForeignSource = 'TRL' | 'verl';

/** A TRL or verl setting and the rxrl key that means it. */
export interface ForeignKey {
  /** The name as TRL (a `GRPOConfig` field) or verl (a dotted Hydra path) spells it. */
  readonly name: string;
  /** Whose name it is. */
  readonly source: ForeignSource;
  /** rxrl's key. */
  readonly key: string;
  /** How the meaning differs, when it does (units, sign, what is counted). */
  readonly note?: string;
}

const BATCH_NOTE = 'counted in tasks (prompts), each sampled rollout.groupSize times';

/**
 * The TRL (`GRPOConfig`, `TrainingArguments`) and verl (`ppo_trainer.yaml`) names a recipe or `--set` may use by
 * habit, and rxrl's key for each. A TRL name is recognized anywhere (`learning_rate`, `trainer.learning_rate`); a
 * verl name by its full dotted path. Such a name is refused with one line naming rxrl's key, never taken silently:
 * some count other things (TRL's batch size counts completions, rxrl's counts tasks).
 */
export const FOREIGN_KEYS: readonly ForeignKey[] = [
  { name: 'learning_rate', source: 'TRL', key: 'trainer.learningRate' },
  {
    name: 'per_device_train_batch_size',
    source: 'TRL',
    key: 'sync.batchSize',
    note: `${BATCH_NOTE}: per_device_train_batch_size × processes × gradient_accumulation_steps / num_generations`,
  },
  { name: 'num_generations', source: 'TRL', key: 'rollout.groupSize' },
  { name: 'max_completion_length', source: 'TRL', key: 'rollout.maxTokens' },
  {
    name: 'beta',
    source: 'TRL',
    key: 'trainer.klLoss.coef',
    note: "the KL-to-reference loss term; its estimator is trainer.klLoss.estimator ('k3' as TRL)",
  },
  { name: 'epsilon', source: 'TRL', key: 'trainer.clipLow' },
  { name: 'epsilon_high', source: 'TRL', key: 'trainer.clipHigh' },
  { name: 'num_iterations', source: 'TRL', key: 'trainer.ppoEpochs' },
  { name: 'max_grad_norm', source: 'TRL', key: 'trainer.maxGradNorm' },
  { name: 'temperature', source: 'TRL', key: 'rollout.temperature' },
  { name: 'top_p', source: 'TRL', key: 'rollout.topP' },
  { name: 'max_steps', source: 'TRL', key: 'run.steps' },
  { name: 'num_train_epochs', source: 'TRL', key: 'data.epochs' },
  { name: 'seed', source: 'TRL', key: 'run.seed' },
  { name: 'output_dir', source: 'TRL', key: 'run.dir' },
  { name: 'save_steps', source: 'TRL', key: 'checkpoint.every' },
  { name: 'save_total_limit', source: 'TRL', key: 'checkpoint.keepLast' },
  { name: 'model_name_or_path', source: 'TRL', key: 'model.path' },
  { name: 'scale_rewards', source: 'TRL', key: 'algorithm.normalizeByStd', note: 'true or false' },
  { name: 'loss_type', source: 'TRL', key: 'trainer.lossAggregation', note: "TRL's 'dapo' is rxrl's 'token-mean'" },
  { name: 'actor_rollout_ref.actor.optim.lr', source: 'verl', key: 'trainer.learningRate' },
  { name: 'data.train_batch_size', source: 'verl', key: 'sync.batchSize', note: BATCH_NOTE },
  { name: 'actor_rollout_ref.rollout.n', source: 'verl', key: 'rollout.groupSize' },
  { name: 'data.max_response_length', source: 'verl', key: 'rollout.maxTokens' },
  { name: 'algorithm.kl_ctrl.kl_coef', source: 'verl', key: 'algorithm.klInReward.coef' },
  { name: 'actor_rollout_ref.actor.kl_loss_coef', source: 'verl', key: 'trainer.klLoss.coef' },
  { name: 'actor_rollout_ref.actor.kl_loss_type', source: 'verl', key: 'trainer.klLoss.estimator' },
  { name: 'actor_rollout_ref.actor.clip_ratio_low', source: 'verl', key: 'trainer.clipLow' },
  { name: 'actor_rollout_ref.actor.clip_ratio_high', source: 'verl', key: 'trainer.clipHigh' },
  { name: 'actor_rollout_ref.actor.clip_ratio_c', source: 'verl', key: 'trainer.clipRatioC' },
  { name: 'actor_rollout_ref.actor.ppo_epochs', source: 'verl', key: 'trainer.ppoEpochs' },
  { name: 'actor_rollout_ref.actor.grad_clip', source: 'verl', key: 'trainer.maxGradNorm' },
  { name: 'actor_rollout_ref.actor.entropy_coeff', source: 'verl', key: 'trainer.entropyCoef' },
  { name: 'actor_rollout_ref.actor.loss_agg_mode', source: 'verl', key: 'trainer.lossAggregation' },
  { name: 'actor_rollout_ref.rollout.temperature', source: 'verl', key: 'rollout.temperature' },
  { name: 'actor_rollout_ref.rollout.top_p', source: 'verl', key: 'rollout.topP' },
  { name: 'actor_rollout_ref.model.path', source: 'verl', key: 'model.path' },
  { name: 'algorithm.norm_adv_by_std_in_grpo', source: 'verl', key: 'algorithm.normalizeByStd' },
  { name: 'data.train_files', source: 'verl', key: 'data.trainFile' },
  { name: 'data.val_files', source: 'verl', key: 'data.validationFile' },
  { name: 'trainer.total_training_steps', source: 'verl', key: 'run.steps' },
  { name: 'trainer.total_epochs', source: 'verl', key: 'data.epochs' },
  { name: 'trainer.save_freq', source: 'verl', key: 'checkpoint.every' },
  { name: 'trainer.test_freq', source: 'verl', key: 'validation.every' },
  { name: 'trainer.val_before_train', source: 'verl', key: 'validation.beforeTrain' },
  { name: 'trainer.default_local_dir', source: 'verl', key: 'run.dir' },
];

/** The entry of {@link FOREIGN_KEYS} for `key`: a verl path as a whole, a TRL name as the key's last segment. */
export function foreignKey(key: string): ForeignKey | undefined {
  const last = key.slice(key.lastIndexOf('.') + 1);
  return FOREIGN_KEYS.find((f) => f.source === 'verl' && f.name === key) ?? FOREIGN_KEYS.find((f) => f.source === 'TRL' && f.name === last);
}

/**
 * The one line for a key no schema leaf has: rxrl's key for a TRL or verl name, else the nearest keys by edit
 * distance (over the whole dotted path, and over the last segment), else none.
 *
 * @example
 * ```ts
 * unknownKeyProblem('trainer.learnig_rate', keys);
 * // → "config: unknown key 'trainer.learnig_rate' (did you mean 'trainer.learningRate'?)"
 * unknownKeyProblem('learning_rate', keys);
 * // → "config: 'learning_rate' is TRL's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…)"
 * ```
 * @param key - the dotted key as given.
 * @param known - every leaf key of the schema.
 */
export function unknownKeyProblem(key: string, known: Iterable<string>): string {
  const foreign = foreignKey(key);
  if (foreign !== undefined) {
    const named = foreign.name === key ? `'${key}'` : `unknown key '${key}': '${foreign.name}'`;
    const note = foreign.note === undefined ? '' : `, ${foreign.note}`;
    return `config: ${named} is ${foreign.source}'s name; in rxrl it is '${foreign.key}'${note} (--set ${foreign.key}=…)`;
  }
  const keys = [...known];
  const inside = keys.filter((k) => k.startsWith(`${key}.`));
  if (inside.length > 0) {
    const more = inside.length > 4 ? ', …' : '';
    return `config: '${key}' is a group of keys (${inside.slice(0, 4).join(', ')}${more}), not a value`;
  }
  const near = nearestKeys(key, keys);
  const quoted = near.map((k) => `'${k}'`);
  const hint = near.length === 0 ? '' : ` (did you mean ${[quoted.slice(0, -1).join(', '), quoted.at(-1)].filter(Boolean).join(' or ')}?)`;
  return `config: unknown key '${key}'${hint}`;
}

/** How a key is compared: case, `_` and `-` do not count (`learning_rate` is near `learningRate`). */
function folded(text: string): string {
  return text.toLowerCase().replace(/[_-]/g, '');
}

/**
 * The known keys nearest `key` (at most three, equally near): by edit distance between the folded dotted paths,
 * or between the folded last segments; none when the nearest is further than a third of the name's length.
 */
export function nearestKeys(key: string, known: Iterable<string>): string[] {
  const whole = folded(key);
  const last = folded(key.slice(key.lastIndexOf('.') + 1));
  let best = Number.POSITIVE_INFINITY;
  let found: string[] = [];
  for (const candidate of known) {
    const byPath = editDistance(whole, folded(candidate)) / Math.max(1, whole.length);
    const byLast = editDistance(last, folded(candidate.slice(candidate.lastIndexOf('.') + 1))) / Math.max(1, last.length);
    const score = Math.min(byPath, byLast);
    if (score < best) [best, found] = [score, [candidate]];
    else if (score === best) found.push(candidate);
  }
  return best <= 1 / 3 && found.length <= 3 ? found : [];
}

/** Levenshtein distance: insertions, deletions and substitutions of one character each. */
export function editDistance(a: string, b: string): number {
  let previous = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) {
      row.push(Math.min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1)));
    }
    previous = row;
  }
  return previous[b.length];
}

/** A schema as {@link unknownKeys} reads it: a leaf has a `doc`; anything else is a group of keys. */
export interface KeyTree {
  readonly [key: string]: object;
}

/**
 * The dotted keys of `values` that `schema` has no leaf for, in order: a key outside the schema is listed by its
 * leaves (`actor_rollout_ref.actor.optim.lr`), and a value given to a group (`trainer: 3`) lists the group; an
 * `undefined` value (an option left out) is no key.
 *
 * @param values - a recipe (or the object `--set` builds).
 * @param schema - the schema's groups and leaves.
 */
export function unknownKeys(values: Readonly<Record<string, unknown>>, schema: KeyTree, prefix = ''): string[] {
  const out: string[] = [];
  for (const [name, value] of Object.entries(values)) {
    const path = prefix === '' ? name : `${prefix}.${name}`;
    const node = Object.hasOwn(schema, name) ? schema[name] : undefined;
    if ((node !== undefined && 'doc' in node) || value === undefined) continue;
    if (isPlainObject(value)) out.push(...unknownKeys(value, (node ?? {}) as KeyTree, path));
    else out.push(path);
  }
  return out;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}
