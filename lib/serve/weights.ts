/**
 * `POST /update_weights_from_disk` of `rxrl serve` (SGLang's weight-update API).
 *
 * @packageDocumentation
 */
import { stat } from 'node:fs/promises';

import { ForbiddenPathError, RxrlError, ShapeError } from '../core/errors.js';
import { WEIGHTS_HEADER_SLACK_BYTES, resolveInside } from '../model/files.js';
import { POLICY_VERSION_METADATA_KEY, isModelDir, readModelDir } from '../model/modelDir.js';
import { configMismatches } from '../model/transformer.js';
import type { PolicyVersion } from '../core/types.js';
import { ownModel, type ServeContext } from './context.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, excerpt, invalid, quote, readBoolean, readString, type JsonObject } from './protocol.js';

/** Most characters of a client-named path (`model_path`, `lora_path`) that a message quotes. */
export const MAX_QUOTED_PATH_CHARS = 256;

/**
 * Answers `POST /update_weights_from_disk`: loads the Hugging Face model directory `model_path` (as rxrl writes
 * them: `config.json` + safetensors) as version `weight_version`, else the file's `rxrl.policyVersion`, else
 * the current one + 1. The engine swaps weights between batches.
 *
 * Safe with any path: only a directory whose files are regular files (each below `--weights-root` once its links
 * are followed, when set, else 403), none larger than the served model in float32, is read; its architecture must be the served one's; the version
 * must be above the current one unless `force: true`. Every refusal is a 4xx naming the parameter, whatever the
 * directory holds (malformed files included); messages are short: an excerpt of the path and of the reader's reason.
 */
export async function updateWeights(ctx: ServeContext, body: JsonObject): Promise<unknown> {
  const modelPath = readString(body, 'model_path');
  const force = readBoolean(body, 'force', false);
  const named = quote(modelPath, MAX_QUOTED_PATH_CHARS);
  const real = await resolveClientDir(ctx, 'model_path', modelPath);
  if (!(await isModelDir(real))) {
    throw invalid('model_path', `model_path ${named} is not a model directory (no config.json)`);
  }
  const requested = readVersion(body.weight_version, 'weight_version');
  if (requested !== undefined && requested <= ctx.engine.version && !force) {
    throw new RequestError(
      400,
      `weight_version ${requested} is not above the served version ${ctx.engine.version} (pass force: true to go back)`,
      { param: 'weight_version', code: 'stale_version' },
    );
  }
  const served = ownModel(ctx, 'update_weights_from_disk').serving.model;
  let contents: Awaited<ReturnType<typeof readModelDir>>;
  try {
    contents = await readModelDir(real, { maxWeightBytes: maxWeightBytes(ctx), ...rootOf(ctx) });
  } catch (cause) {
    throw cannotLoad('model_path', modelPath, cause);
  }
  const [mismatch] = configMismatches(served.config, contents.config);
  if (mismatch !== undefined) {
    const differs = `${mismatch} ${JSON.stringify(contents.config[mismatch])}, served ${JSON.stringify(served.config[mismatch])}`;
    throw invalid('model_path', `model_path ${named} holds another architecture: ${differs}`);
  }
  const { weights, metadata } = contents;
  const version = requested ?? readVersion(metadata[POLICY_VERSION_METADATA_KEY], 'metadata') ?? ctx.engine.version + 1;
  if (version <= ctx.engine.version && !force) {
    throw new RequestError(
      400,
      `the directory's version ${version} is not above the served version ${ctx.engine.version} (pass force: true)`,
      {
        param: 'weight_version',
        code: 'stale_version',
      },
    );
  }
  try {
    await ctx.engine.loadWeights(version, weights);
  } catch (cause) {
    // Missing, unknown or misshapen tensors: checked before any weight is replaced, so the served ones stay.
    if (!(cause instanceof ShapeError)) throw cause;
    const why = excerpt(cause.message, MAX_ERROR_MESSAGE_CHARS);
    throw new RequestError(400, `model_path ${named}: ${why}`, { param: 'model_path', code: 'invalid_value' }, { cause });
  }
  ctx.log({ event: 'weights', version, modelPath: excerpt(modelPath, MAX_ERROR_MESSAGE_CHARS) });
  return {
    success: true,
    message: `loaded ${excerpt(modelPath, MAX_ERROR_MESSAGE_CHARS)} as policy version ${version}`,
    weight_version: String(version),
    policy_version: version,
    num_paused_requests: 0,
  };
}

/**
 * The real path of a directory a client named in `param`: 400 when it is empty, does not exist or is no
 * directory. Under `--weights-root`, every path that is outside the root after links are followed, or that
 * cannot be resolved, gets one and the same 403 (whether it exists or not, the client learns nothing), and every
 * file read from the directory later is checked again (a link inside the root to a file outside is refused too).
 */
export async function resolveClientDir(ctx: ServeContext, param: string, path: string): Promise<string> {
  if (path.trim() === '' || path.includes('\0')) throw invalid(param, `${param} must be a directory path`);
  const named = quote(path, MAX_QUOTED_PATH_CHARS);
  let real: string;
  let isDir: boolean;
  try {
    real = await resolveInside(path, ctx.weightsRoot);
    isDir = (await stat(real)).isDirectory();
  } catch (cause) {
    if (cause instanceof ForbiddenPathError) throw forbiddenPath(param, path, cause);
    const code = ((cause as Error).cause as NodeJS.ErrnoException | undefined)?.code ?? (cause as NodeJS.ErrnoException).code;
    const why = code === 'ENOENT' || code === undefined ? 'does not exist' : `cannot be resolved (${code})`;
    throw new RequestError(400, `${param} ${named} ${why}`, { param, code: 'not_found' }, { cause });
  }
  if (!isDir) throw invalid(param, `${param} ${named} is not a directory`);
  return real;
}

/** The one 403 of a path refused by `--weights-root`, whatever the reason. */
function forbiddenPath(param: string, path: string, cause: unknown): RequestError {
  return new RequestError(
    403,
    `${param} ${quote(path, MAX_QUOTED_PATH_CHARS)} is outside the weights root or not readable there`,
    { param, code: 'forbidden_path' },
    { cause },
  );
}

/** The `root` option of the file readers: `--weights-root`, when set. */
export function rootOf(ctx: ServeContext): { readonly root?: string } {
  return ctx.weightsRoot === undefined ? {} : { root: ctx.weightsRoot };
}

/** The largest weights file a client may make the server read: the served model in float32, plus header slack. */
export function maxWeightBytes(ctx: ServeContext): number {
  return ownModel(ctx, 'loading weights').serving.model.numParameters() * 4 + WEIGHTS_HEADER_SLACK_BYTES;
}

/**
 * The 400 for files a client named in `param` that the reader refused (the 403 for a file outside the root). Whatever they make it throw (a typed
 * refusal, or a TypeError or RangeError on content it did not expect) is a bad request; only rxrl's own
 * messages are passed on, cut short.
 */
export function cannotLoad(param: string, path: string, cause: unknown): RequestError {
  if (cause instanceof ForbiddenPathError) return forbiddenPath(param, path, cause);
  const why =
    cause instanceof RxrlError
      ? excerpt(cause.message, MAX_ERROR_MESSAGE_CHARS)
      : `malformed files (${cause instanceof Error ? cause.name : 'error'})`;
  return new RequestError(
    400,
    `${param} ${quote(path, MAX_QUOTED_PATH_CHARS)} cannot be loaded: ${why}`,
    { param, code: 'invalid_value' },
    { cause },
  );
}

function readVersion(value: unknown, param: string): PolicyVersion | undefined {
  if (value === undefined || value === null) return undefined;
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) {
    throw invalid(param === 'metadata' ? 'model_path' : param, `${param} must be a non-negative integer version, got ${quote(value)}`);
  }
  return n;
}
