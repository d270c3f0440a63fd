/**
 * The configuration keys whose values are paths, and what a path given on the command line (`--set key=path`) is
 * relative to: the working directory, as a shell user expects. A recipe's own paths stay relative to the recipe's
 * directory (the run resolves them against it), so a `--set` path is made absolute before the run sees it.
 *
 * @packageDocumentation
 */
import { existsSync } from 'node:fs';
import { isAbsolute, resolve } from 'node:path';

import { parseModelId } from '../model/hubCache.js';

/** How the value of a path key is read. */
export type PathKind = 'path' | 'module' | 'model';

/**
 * Every key whose value is a path, and its kind: `path` a file or directory; `module` a module file, or a bare
 * package specifier (`rxrl/recipes`) kept as it is; `model` a model directory, or a Hugging Face id kept as it is
 * when no such local path exists. `policies` holds a path in each entry's `adapterPath`.
 */
export const PATH_KEYS: Readonly<Record<string, PathKind>> = {
  'run.dir': 'path',
  'data.trainFile': 'path',
  'data.validationFile': 'path',
  'model.path': 'model',
  'rollout.worker.module': 'module',
  'rollout.agent.cwd': 'path',
  'rollout.agent.module': 'module',
  'rollout.evaluator.module': 'module',
  'distill.teacher.path': 'model',
  'kafka.weightsDir': 'path',
  'kafka.weightsRoot': 'path',
  'resume.path': 'path',
  'agents.module.module': 'module',
};

/**
 * True for a module specifier imported by name (`rxrl/recipes`, `@scope/pkg/sub`, a package): no `./`, `../`, `/`
 * or `~` start, no `.js`/`.ts` file name. Anything else names a file.
 *
 * @param specifier - a `*.module` value.
 */
export function isBareSpecifier(specifier: string): boolean {
  return /^(@[\w.-]+\/)?[\w][\w.-]*(\/[\w.-]+)*$/.test(specifier) && !/\.[cm]?[jt]s$/.test(specifier);
}

/**
 * A `--set` value of `key` with its paths made absolute against `cwd`; any other value as it is. A path starting
 * with `~` is left for the home directory, a bare module specifier and a model id that is no local path are kept.
 *
 * @example
 * ```ts
 * resolveSetPath('data.trainFile', 'data/train.jsonl', '/home/me/project'); // → '/home/me/project/data/train.jsonl'
 * resolveSetPath('model.path', 'Qwen/Qwen3-0.6B', '/home/me/project');     // → 'Qwen/Qwen3-0.6B' (no such directory)
 * resolveSetPath('rollout.evaluator.module', 'rxrl/recipes', '/x');       // → 'rxrl/recipes'
 * ```
 * @param key - the dotted key.
 * @param value - the value `--set` parsed.
 * @param cwd - the working directory.
 */
export function resolveSetPath(key: string, value: unknown, cwd: string): unknown {
  if (key === 'policies' && Array.isArray(value)) {
    return value.map((entry: unknown) => {
      if (typeof entry !== 'object' || entry === null || !('adapterPath' in entry)) return entry;
      const { adapterPath } = entry as { adapterPath: unknown };
      return typeof adapterPath === 'string' ? { ...entry, adapterPath: absolute(adapterPath, 'path', cwd) } : entry;
    });
  }
  const kind = Object.hasOwn(PATH_KEYS, key) ? PATH_KEYS[key] : undefined;
  return kind === undefined || typeof value !== 'string' || value === '' ? value : absolute(value, kind, cwd);
}

function absolute(path: string, kind: PathKind, cwd: string): string {
  if (isAbsolute(path) || path.startsWith('~')) return path;
  if (kind === 'module' && isBareSpecifier(path)) return path;
  const local = resolve(cwd, path);
  if (kind === 'model' && parseModelId(path) !== undefined && !existsSync(local)) return path;
  return local;
}
