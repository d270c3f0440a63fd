/**
 * The recipes shipped inside the package (`recipes/*.json|yaml`), addressed as `rxrl:<name>` by every command that
 * takes a recipe (`rxrl run rxrl:reverse`), listed by `rxrl recipes`, and copied into the working directory by
 * `rxrl init`. A bundled recipe holds no relative path, so it reads the same from the package and from a copy.
 *
 * @packageDocumentation
 */
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, extname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse as parseYaml, stringify as stringifyYaml } from 'yaml';

import { ConfigError, UsageError } from '../lib/core/errors.js';

/** The prefix that names a bundled recipe on the command line: `rxrl:reverse`. */
export const BUNDLED_PREFIX = 'rxrl:';

/** What `rxrl init` writes when given no `--out`. */
export const DEFAULT_INIT_FILE = 'rxrl-recipe.yaml';

/** The recipe `rxrl init` copies when given no name. */
export const DEFAULT_INIT_RECIPE = 'reverse';

/** One recipe shipped in the package. */
export interface BundledRecipe {
  /** Its name after `rxrl:`. */
  readonly name: string;
  /** Its file under the package's `recipes/` directory. */
  readonly file: string;
  /** One line for `rxrl recipes`. */
  readonly description: string;
  /** What it needs beyond the package, said to the user before they run it; absent when it runs as installed. */
  readonly needs?: string;
}

const SMOLLM2 = 'SmolLM2-135M-Instruct in ~/.cache/rxrl-models (npm run model:smollm2 in a checkout) or --set model.path=DIR';

/** Every bundled recipe, in the order `rxrl recipes` lists them. */
export const BUNDLED_RECIPES: readonly BundledRecipe[] = [
  {
    name: 'reverse',
    file: 'reverse.json',
    description: 'GRPO on the embedded tiny policy: reverse 4-letter strings over abcde (800 steps, minutes on a CPU)',
  },
  {
    name: 'reverse-batch-async',
    file: 'reverse-batch-async.yaml',
    description: 'the reverse task with rollouts up to two policy versions ahead of training (batch-async)',
  },
  {
    name: 'writer-editor-lora',
    file: 'writer-editor-lora.yaml',
    description: 'two agents (a writer answers, an editor corrects), each its own LoRA adapter on one frozen tiny base',
  },
  {
    name: 'smollm2-arithmetic',
    file: 'smollm2-arithmetic.yaml',
    description: 'SmolLM2-135M-Instruct learns one-operation arithmetic with GRPO and a rank-16 LoRA adapter',
    needs: SMOLLM2,
  },
  {
    name: 'smollm2-arithmetic-full',
    file: 'smollm2-arithmetic-full.yaml',
    description: 'the SmolLM2 arithmetic recipe with every weight trained (full fine-tuning, native backend)',
    needs: SMOLLM2,
  },
  {
    name: 'smollm2-arithmetic-sft',
    file: 'smollm2-arithmetic-sft.yaml',
    description: "supervised fine-tuning of SmolLM2-135M-Instruct on the arithmetic task's reference answers",
    needs: SMOLLM2,
  },
];

/**
 * The package's root directory (the one holding `package.json` and `recipes/`), found from this module's location
 * whether it runs from `cli/` in a checkout or from `dist/cli/` in an install.
 */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json'))) {
    const parent = dirname(dir);
    if (parent === dir) throw new ConfigError(`no package.json above ${fileURLToPath(import.meta.url)}; reinstall rxrl`);
    dir = parent;
  }
  return dir;
}

/** True for a recipe argument that names a bundled recipe (`rxrl:reverse`) rather than a file. */
export function isBundledName(recipe: string): boolean {
  return recipe.startsWith(BUNDLED_PREFIX);
}

/**
 * The bundled recipe called `name` (with or without the `rxrl:` prefix).
 *
 * @throws {@link UsageError} for a name no bundled recipe has, listing the names.
 */
export function bundledRecipe(name: string): BundledRecipe {
  const bare = isBundledName(name) ? name.slice(BUNDLED_PREFIX.length) : name;
  const found = BUNDLED_RECIPES.find((r) => r.name === bare);
  if (found === undefined) {
    const names = BUNDLED_RECIPES.map((r) => `${BUNDLED_PREFIX}${r.name}`).join(', ');
    throw new UsageError(`no bundled recipe '${BUNDLED_PREFIX}${bare}' (bundled: ${names}; rxrl recipes describes them)`, {
      context: { recipe: name },
    });
  }
  return found;
}

/** The path of a bundled recipe's file inside the installed package. */
export function bundledRecipePath(recipe: BundledRecipe): string {
  return join(packageRoot(), 'recipes', recipe.file);
}

/**
 * The file a recipe argument names: a bundled recipe's file for `rxrl:<name>`, else the argument itself.
 *
 * @throws {@link UsageError} for an unknown `rxrl:` name.
 */
export function recipeFile(recipe: string): string {
  return isBundledName(recipe) ? bundledRecipePath(bundledRecipe(recipe)) : recipe;
}

/** What `rxrl recipes` prints: one line per bundled recipe (name and description), and what each one needs. */
export function describeBundledRecipes(): string {
  const width = Math.max(...BUNDLED_RECIPES.map((r) => r.name.length)) + BUNDLED_PREFIX.length;
  const lines = BUNDLED_RECIPES.flatMap((r) => {
    const line = `${`${BUNDLED_PREFIX}${r.name}`.padEnd(width)}  ${r.description}`;
    return r.needs === undefined ? [line] : [line, `${' '.repeat(width)}  needs ${r.needs}`];
  });
  return `${lines.join('\n')}\n\nrxrl run rxrl:<name> trains one; rxrl init <name> copies one here as ${DEFAULT_INIT_FILE} to edit.\n`;
}

/**
 * Writes the bundled recipe `name` to `out` (resolved against the working directory; missing directories made) as a
 * starter recipe: YAML (its comments kept) unless `out` ends in `.json`.
 *
 * @returns The absolute path written.
 * @throws {@link UsageError} for an unknown name; {@link ConfigError} when `out` exists (it is never overwritten).
 */
export function initRecipe(name: string, out: string): string {
  const recipe = bundledRecipe(name);
  const target = resolve(out);
  if (existsSync(target)) {
    throw new ConfigError(`${out} exists and is left as it is (remove it, or give --out FILE for another name)`, {
      context: { file: target },
    });
  }
  const source = readFileSync(bundledRecipePath(recipe), 'utf8');
  const yamlSource = /\.ya?ml$/i.test(recipe.file);
  const parsed: unknown = yamlSource ? parseYaml(source) : JSON.parse(source);
  const header = `# Starter recipe from ${BUNDLED_PREFIX}${recipe.name}: ${recipe.description}.\n# Train it with: npx rxrl run ${out}\n`;
  let text: string;
  if (extname(target).toLowerCase() === '.json') text = `${JSON.stringify(parsed, null, 2)}\n`;
  else text = `${header}${yamlSource ? source : stringifyYaml(parsed)}`;
  mkdirSync(dirname(target), { recursive: true });
  writeFileSync(target, text, { flag: 'wx' });
  return target;
}
