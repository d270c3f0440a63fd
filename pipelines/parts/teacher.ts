/**
 * The teacher of an on-policy distillation run (`trainer.algorithm: distill`, `distill.teacher`): a model directory
 * loaded in this process, or a model on an OpenAI-compatible server that answers `prompt_logprobs` (vLLM, `rxrl
 * serve`). Either must share the student's tokenizer.
 *
 * @packageDocumentation
 */
import type { RxrlConfig } from '../../lib/config/schema.js';
import type { ReferencePolicy } from '../../lib/core/types.js';
import { checkSameTokenizer, modelScorer, openaiScorer } from '../../lib/engine/teacher.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { resolveModelDir } from '../../lib/model/hubCache.js';

/** A run's teacher and what releases it. */
export interface RunTeacher {
  readonly scorer: ReferencePolicy;
  readonly dispose: () => void;
}

/**
 * The recipe's teacher, or `undefined` when the run does not distill.
 *
 * @throws {@link ConfigError} naming `distill.teacher` when its tokenizer is not the student's.
 */
export async function loadTeacher(
  config: Pick<RxrlConfig, 'distill' | 'model' | 'trainer'>,
  baseDir: string,
  tokenizer: Tokenizer,
  signal?: AbortSignal,
): Promise<RunTeacher | undefined> {
  if (config.trainer.algorithm !== 'distill') return undefined;
  const { path, baseUrl, model, apiKey, timeoutMs } = config.distill.teacher;
  if (baseUrl !== null) {
    const scorer = openaiScorer({ baseUrl, model: model as string, apiKey: apiKey ?? undefined, tokenizer, timeoutMs });
    return { scorer, dispose: () => undefined };
  }
  const dir = await resolveModelDir(path as string, { baseDir, key: 'distill.teacher.path', timeoutMs: config.model.hubTimeoutMs, signal });
  checkSameTokenizer(tokenizer, await loadTokenizer(dir), dir);
  const { model: teacher } = await loadModelDir(dir);
  return { scorer: modelScorer(teacher), dispose: () => teacher.dispose() };
}
