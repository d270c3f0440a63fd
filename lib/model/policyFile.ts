/**
 * Policy checkpoints as single safetensors files: the weights plus the architecture in the metadata, so a
 * file alone is enough to rebuild the model.
 *
 * @packageDocumentation
 */
import { DecodeError } from '../errors.js';
import { loadSafetensors, saveSafetensors, type SafetensorsMetadata } from './safetensors.js';
import { PolicyModel, validatePolicyConfig, type PolicyConfig } from './transformer.js';

/** Metadata key holding the JSON-encoded {@link PolicyConfig}. */
export const POLICY_CONFIG_METADATA_KEY = 'rxrl.policyConfig';

/**
 * Saves a model's weights and configuration.
 *
 * @param path - Destination `.safetensors` file.
 * @param model - The model to save.
 * @param metadata - Extra string metadata (for example the policy version).
 */
export async function savePolicy(path: string, model: PolicyModel, metadata: SafetensorsMetadata = {}): Promise<void> {
  await saveSafetensors(path, model.getWeights(), {
    ...metadata,
    [POLICY_CONFIG_METADATA_KEY]: JSON.stringify(model.config),
  });
}

/**
 * Loads a model saved by {@link savePolicy}.
 *
 * @returns The model (owned by the caller) and the file's metadata.
 * @throws {@link DecodeError} when the file is malformed or has no valid configuration.
 * @throws `ShapeError` when the weights do not fit the stored configuration.
 */
export async function loadPolicy(path: string): Promise<{ model: PolicyModel; metadata: SafetensorsMetadata }> {
  const { weights, metadata } = await loadSafetensors(path);
  const raw = metadata[POLICY_CONFIG_METADATA_KEY];
  let config: PolicyConfig;
  try {
    config = validatePolicyConfig(JSON.parse(raw ?? 'null') as PolicyConfig);
  } catch (cause) {
    throw new DecodeError(`${path}: metadata '${POLICY_CONFIG_METADATA_KEY}' is missing or invalid`, {
      cause,
      context: { path },
    });
  }
  return { model: PolicyModel.fromWeights(config, weights), metadata };
}
