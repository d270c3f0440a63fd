/**
 * The embedded policy: backend selection, tokenizer, transformer with KV-cache sampling, checkpoints.
 *
 * @packageDocumentation
 */

// ── backends ───────────────────────────────────────────────────────────────────
export { BACKEND_KINDS, NATIVE_BACKEND_PACKAGES, WASM_BACKEND_PACKAGE, initBackend, installBackendFixes, swapLastAxes } from './backend.js';
export type { BackendKind, BackendLogger, BackendName, InitBackendOptions } from './backend.js';
export { registerCoreGradients, sumToShape } from './gradients.js';

// ── tokenizer ──────────────────────────────────────────────────────────────────
export {
  CHAR_ALPHABET_CONFIG_KEY,
  CHAR_BOS_ID,
  CHAR_EOS_ID,
  CHAR_PAD_ID,
  CHAR_SPECIAL_LABELS,
  CHAR_SPECIAL_TOKENS,
  CharTokenizer,
  DEFAULT_ALPHABET,
} from './tokenizer.js';
export { HfTokenizer, TOKENIZER_FILES, loadTokenizer, namedSpecialTokens, readTokenizerFiles } from './hfTokenizer.js';
export type { HfTokenizerFiles, HfTokenizerSources, JsonRecord } from './hfTokenizer.js';

// ── configuration (architectures, validation) ─────────────────────────────────
export { MODEL_TYPES, RMS_NORM_EPS, ROPE_THETA, validatePolicyConfig } from './config.js';
export type { ModelType, PolicyConfig, ResolvedPolicyConfig, RopeScaling } from './config.js';

// ── policy model ───────────────────────────────────────────────────────────────
export { INIT_STD, MASK_BIAS, PolicyModel, policyParamSpecs, ropeInverseFrequencies } from './transformer.js';
export type { PolicyInitKind, PolicyParamSpec, TokenLogprobs } from './transformer.js';
export { SAMPLING_WEIGHTS_MEMORY_SHARE, samplingWeightBytes, samplingWeightsFit } from './samplingWeights.js';

// ── sampling ───────────────────────────────────────────────────────────────────
export { PROMPT_PAD_ID, padPrompts, runGeneration } from './generate.js';
export type { GenerateOptions, PromptBatch, StepDecoder } from './generate.js';
export { sampleToken, samplingDistribution } from './sampling.js';
export type { SampledToken, SamplingDistribution, SamplingParams } from './sampling.js';

// ── checkpoints ────────────────────────────────────────────────────────────────
export {
  SAFETENSORS_MAX_HEADER_BYTES,
  SAFETENSORS_METADATA_KEY,
  decodeSafetensors,
  encodeSafetensors,
  loadSafetensors,
  saveSafetensors,
} from './safetensors.js';
export type { SafetensorsContents, SafetensorsDtype, SafetensorsMetadata } from './safetensors.js';
export {
  MODEL_FILES,
  POLICY_VERSION_METADATA_KEY,
  isModelDir,
  loadModelDir,
  policyConfigFromHf,
  policyConfigToHf,
  readModelDir,
  saveModelDir,
  specialIdsOf,
} from './modelDir.js';
export type { ModelDirContents, SaveModelDirOptions, SpecialTokenIds } from './modelDir.js';
export {
  LORA_TARGETS,
  LoraAdapter,
  PEFT_FILES,
  loadPeftAdapter,
  peftAdapterConfig,
  readPeftAdapterConfig,
  savePeftAdapter,
  validateLoraConfig,
} from './lora.js';
export type { LoraConfig, ResolvedLoraConfig } from './lora.js';
export type { LoraPair, LoraTarget, ModelAdapter } from './adapter.js';

// ── a run's models ─────────────────────────────────────────────────────────────
export { initialModel, policyModels, remoteContextLength, tinyModelConfig } from './policies.js';
export type { PolicyModels, PolicySpec, TinyModelSettings } from './policies.js';
