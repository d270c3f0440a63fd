/** Unknown configuration keys: one line with the nearest key; TRL and verl names answered with rxrl's key. */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';

import { FOREIGN_KEYS, editDistance, foreignKey, nearestKeys, unknownKeyProblem, unknownKeys } from '../../lib/config/keys.js';
import { SCHEMA, loadConfig } from '../../lib/config/schema.js';
import { ConfigError, UsageError } from '../../lib/core/errors.js';

/** Every leaf key of the schema, as `--set` names it. */
function leaves(tree: object, prefix = ''): string[] {
  return Object.entries(tree).flatMap(([name, node]: [string, object]) => {
    const path = prefix ? `${prefix}.${name}` : name;
    return 'doc' in node ? [path] : leaves(node, path);
  });
}
const KEYS = leaves(SCHEMA);

const dir = mkdtempSync(join(tmpdir(), 'rxrl-keys-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** The message of the ConfigError `load` throws. */
function refusal(load: () => unknown): string {
  try {
    load();
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigError);
    return (error as Error).message;
  }
  throw new Error('loaded');
}

describe('unknown keys: the nearest key', () => {
  it('edit distance counts insertions, deletions and substitutions', () => {
    expect(editDistance('kitten', 'sitting')).toBe(3);
    expect(editDistance('', 'abc')).toBe(3);
    expect(editDistance('same', 'same')).toBe(0);
  });

  it('suggests by the whole dotted path, by the last segment, ignoring case and _; nothing when nothing is close', () => {
    expect(unknownKeyProblem('trainer.learnig_rate', KEYS)).toBe(
      "config: unknown key 'trainer.learnig_rate' (did you mean 'trainer.learningRate'?)",
    );
    expect(nearestKeys('learnig_rate', KEYS)).toEqual(['trainer.learningRate']);
    expect(nearestKeys('run.step', KEYS)).toEqual(['run.steps']);
    expect(nearestKeys('rollout.group_size', KEYS)).toEqual(['rollout.groupSize']);
    expect(nearestKeys('model.pth', KEYS)).toEqual(['model.path']);
    expect(unknownKeyProblem('pth', KEYS)).toBe(
      "config: unknown key 'pth' (did you mean 'model.path', 'distill.teacher.path' or 'resume.path'?)",
    );
    expect(unknownKeyProblem('frobnicate', KEYS)).toBe("config: unknown key 'frobnicate'");
    expect(unknownKeyProblem('lr', KEYS)).toBe("config: unknown key 'lr'");
  });

  it('a value given to a group names its keys', () => {
    expect(unknownKeyProblem('trainer.klLoss', KEYS)).toBe(
      "config: 'trainer.klLoss' is a group of keys (trainer.klLoss.coef, trainer.klLoss.estimator), not a value",
    );
  });

  it('lists the unknown leaves of a recipe, a foreign group by its leaves', () => {
    const recipe = {
      run: { steps: 3, stesp: 1 },
      trainer: 2,
      actor_rollout_ref: { actor: { optim: { lr: 1e-6 } } },
      policies: [{ name: 'p' }],
    };
    expect(unknownKeys(recipe, SCHEMA)).toEqual(['run.stesp', 'trainer', 'actor_rollout_ref.actor.optim.lr']);
  });
});

describe('TRL and verl names', () => {
  it("every mapped key is one of rxrl's, and each foreign name is listed once", () => {
    for (const entry of FOREIGN_KEYS) expect(KEYS, entry.name).toContain(entry.key);
    expect(new Set(FOREIGN_KEYS.map((f) => f.name)).size).toBe(FOREIGN_KEYS.length);
    for (const entry of FOREIGN_KEYS) expect(KEYS, entry.name).not.toContain(entry.name);
  });

  it("docs/configuration.md's table lists every mapped name beside rxrl's key", () => {
    const rows = readFileSync(new URL('../../docs/configuration.md', import.meta.url), 'utf8')
      .split('\n')
      .filter((line) => line.startsWith('| '));
    for (const entry of FOREIGN_KEYS) {
      const last = entry.name.split('.').at(-1) ?? entry.name;
      const row = rows.find((line) => line.includes(`${last}\``) && line.includes(`\`${entry.key}\``));
      expect(row, `${entry.name} → ${entry.key}`).toBeDefined();
    }
  });

  it("answers TRL's names anywhere and verl's by their path, naming rxrl's key", () => {
    const cases: [string, string][] = [
      ['learning_rate', "config: 'learning_rate' is TRL's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…)"],
      ['num_generations', "config: 'num_generations' is TRL's name; in rxrl it is 'rollout.groupSize' (--set rollout.groupSize=…)"],
      [
        'max_completion_length',
        "config: 'max_completion_length' is TRL's name; in rxrl it is 'rollout.maxTokens' (--set rollout.maxTokens=…)",
      ],
      [
        'trainer.learning_rate',
        "config: unknown key 'trainer.learning_rate': 'learning_rate' is TRL's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…)",
      ],
      [
        'actor_rollout_ref.actor.optim.lr',
        "config: 'actor_rollout_ref.actor.optim.lr' is verl's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…)",
      ],
      [
        'actor_rollout_ref.rollout.n',
        "config: 'actor_rollout_ref.rollout.n' is verl's name; in rxrl it is 'rollout.groupSize' (--set rollout.groupSize=…)",
      ],
      [
        'data.max_response_length',
        "config: 'data.max_response_length' is verl's name; in rxrl it is 'rollout.maxTokens' (--set rollout.maxTokens=…)",
      ],
      [
        'algorithm.kl_ctrl.kl_coef',
        "config: 'algorithm.kl_ctrl.kl_coef' is verl's name; in rxrl it is 'algorithm.klInReward.coef' (--set algorithm.klInReward.coef=…)",
      ],
      [
        'actor_rollout_ref.actor.kl_loss_coef',
        "config: 'actor_rollout_ref.actor.kl_loss_coef' is verl's name; in rxrl it is 'trainer.klLoss.coef' (--set trainer.klLoss.coef=…)",
      ],
    ];
    for (const [key, line] of cases) expect(unknownKeyProblem(key, KEYS)).toBe(line);
    expect(unknownKeyProblem('beta', KEYS)).toMatch(/^config: 'beta' is TRL's name; in rxrl it is 'trainer\.klLoss\.coef', /);
    // The batch sizes count other things: the note says what rxrl's counts.
    expect(unknownKeyProblem('per_device_train_batch_size', KEYS)).toMatch(
      /^config: 'per_device_train_batch_size' is TRL's name; in rxrl it is 'sync\.batchSize', counted in tasks \(prompts\)/,
    );
    expect(unknownKeyProblem('data.train_batch_size', KEYS)).toMatch(/is verl's name; in rxrl it is 'sync\.batchSize', counted in tasks/);
    // A verl name is matched by its whole path only; TRL's by the last segment.
    expect(foreignKey('optim.lr')).toBeUndefined();
    expect(foreignKey('rollout.n')).toBeUndefined();
    expect(foreignKey('x.num_generations')?.key).toBe('rollout.groupSize');
  });
});

describe('loadConfig: unknown keys in a recipe and in --set', () => {
  it('a recipe file with a typo: one line naming the key and the nearest one', () => {
    const file = join(dir, 'typo.yaml');
    writeFileSync(file, 'trainer:\n  learnig_rate: 1e-5\n');
    const message = refusal(() => loadConfig({ file, env: {} }));
    expect(message).toBe("config: unknown key 'trainer.learnig_rate' (did you mean 'trainer.learningRate'?)");
  });

  it("a TRL/verl-style recipe: the first name answered with rxrl's key, the others counted", () => {
    const file = join(dir, 'trl.yaml');
    writeFileSync(file, 'learning_rate: 1e-5\nnum_generations: 8\nactor_rollout_ref:\n  rollout:\n    n: 4\n');
    expect(refusal(() => loadConfig({ file, env: {} }))).toBe(
      "config: 'learning_rate' is TRL's name; in rxrl it is 'trainer.learningRate' (--set trainer.learningRate=…) (2 more unknown: num_generations, actor_rollout_ref.rollout.n)",
    );
  });

  it('values and --set are checked the same way, one line each', () => {
    expect(refusal(() => loadConfig({ env: {}, values: { sync: { batchsize: 2 } } }))).toBe(
      "config: unknown key 'sync.batchsize' (did you mean 'sync.batchSize'?)",
    );
    expect(refusal(() => loadConfig({ env: {}, set: ['trainer.learnig_rate=1e-5'] }))).toBe(
      "config: unknown key 'trainer.learnig_rate' (did you mean 'trainer.learningRate'?)",
    );
    expect(refusal(() => loadConfig({ env: {}, set: ['beta=0.04'] }))).toMatch(
      /^config: 'beta' is TRL's name; in rxrl it is 'trainer\.klLoss\.coef'/,
    );
    // Not key=value at all: the command line's form is wrong, a usage error (the CLI exits 2).
    let malformed: unknown;
    try {
      loadConfig({ env: {}, set: ['norun'] });
    } catch (error) {
      malformed = error;
    }
    expect(malformed).toBeInstanceOf(UsageError);
    expect((malformed as Error).message).toBe("--set must be key=value (e.g. --set trainer.learningRate=1e-5), got 'norun'");
    expect(loadConfig({ env: {}, set: ['trainer.learningRate=1e-5'] }).trainer.learningRate).toBe(1e-5);
  });
});
