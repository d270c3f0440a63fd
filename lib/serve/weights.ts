/**
 * `POST /update_weights_from_disk` of `rxrl serve` (SGLang's weight-update API).
 *
 * @packageDocumentation
 */
import { stat } from 'node:fs/promises';

import { ConfigError, DecodeError } from '../errors.js';
import { POLICY_VERSION_METADATA_KEY, isModelDir, readModelDir } from '../model/modelDir.js';
import type { PolicyVersion } from '../types.js';
import type { ServeContext } from './context.js';
import { RequestError, invalid, readString, type JsonObject } from './protocol.js';


/**
 * Answers `POST /update_weights_from_disk`: loads the Hugging Face model directory `model_path` (as rxrl writes
 * them: `config.json` + safetensors) as version `weight_version`, else the file's `rxrl.policyVersion`, else
 * the current one + 1. The engine swaps weights between batches.
 */
export async function updateWeights(ctx: ServeContext, body: JsonObject): Promise<unknown> {
  const modelPath = readString(body, 'model_path');
  let isDir: boolean;
  try {
    isDir = (await stat(modelPath)).isDirectory();
  } catch (cause) {
    throw new RequestError(400, `model_path ${JSON.stringify(modelPath)} does not exist`, { param: 'model_path', code: 'not_found' }, { cause });
  }
  if (!isDir || !(await isModelDir(modelPath))) {
    throw invalid('model_path', `model_path ${JSON.stringify(modelPath)} is not a model directory (no config.json)`);
  }
  let contents: Awaited<ReturnType<typeof readModelDir>>;
  try {
    contents = await readModelDir(modelPath);
  } catch (cause) {
    if (cause instanceof ConfigError || cause instanceof DecodeError) throw invalid('model_path', cause.message);
    throw cause;
  }
  const { weights, metadata } = contents;
  const version =
    readVersion(body.weight_version, 'weight_version') ??
    readVersion(metadata[POLICY_VERSION_METADATA_KEY], 'metadata') ??
    ctx.engine.version + 1;
  await ctx.engine.loadWeights(version, weights);
  ctx.log({ event: 'weights', version, modelPath });
  return {
    success: true,
    message: `loaded ${modelPath} as policy version ${version}`,
    weight_version: String(version),
    policy_version: version,
    num_paused_requests: 0,
  };
}

function readVersion(value: unknown, param: string): PolicyVersion | undefined {
  if (value === undefined || value === null) return undefined;
  const n = typeof value === 'string' && value.trim() !== '' ? Number(value) : value;
  if (typeof n !== 'number' || !Number.isSafeInteger(n) || n < 0) {
    throw invalid(param === 'metadata' ? 'model_path' : param, `${param} must be a non-negative integer version, got ${JSON.stringify(value)}`);
  }
  return n;
}
