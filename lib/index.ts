/**
 * rxrl: reinforcement-learning post-training of language models as a reactive stream.
 *
 * @packageDocumentation
 * @module rxrl
 */

// ── core vocabulary ────────────────────────────────────────────────────────────
export type {
  Batch,
  BatchMeta,
  FinishReason,
  Group,
  Metrics,
  ModelTag,
  PolicyVersion,
  RolloutOutput,
  RolloutTiming,
  SampleFailure,
  Task,
  TimeSpan,
  Trajectory,
} from './core/types.js';
export { isSampleFailure } from './core/types.js';
export type { Defined } from './core/types.js';

// ── errors ─────────────────────────────────────────────────────────────────────
export {
  AbortError,
  BackendUnavailableError,
  ConfigError,
  ContextLengthError,
  DecodeError,
  EngineError,
  EvaluationError,
  AgentError,
  ForbiddenPathError,
  RxrlError,
  RunLockedError,
  ShapeError,
  StepFailedError,
  StorageError,
  UsageError,
  asStorageError,
  assertNever,
  isAbortError,
  isRetriable,
  isRxrlError,
  isUsageError,
  throwIfAborted,
} from './core/errors.js';
export type { RxrlErrorOptions } from './core/errors.js';

// ── engines ────────────────────────────────────────────────────────────────────
export type {
  DecodeOptions,
  EncodeOptions,
  GenerateRequest,
  GenerateResponse,
  NamedWeights,
  Tokenizer,
  WeightArray,
} from './model/types.js';
export type { RolloutEngine } from './engine/types.js';

// ── GRPO math (pure functions over tensors) ────────────────────────────────────
export {
  ADAPTIVE_KL_ERROR_CLIP,
  ADVANTAGE_EPSILON,
  aggregateLoss,
  applyKlPenalty,
  applyMask,
  broadcastAdvantages,
  computeGroupAdvantages,
  computeGroupAdvantagesTensor,
  createKlController,
  DEFAULT_CLIP_RATIO,
  DEFAULT_IS_WEIGHT_CAP,
  disposeMetrics,
  getKlEstimator,
  GROUP_ADVANTAGE_METRIC_KEYS,
  importanceRatio,
  indexGroups,
  isKlEstimatorName,
  isLossAggMode,
  keepMetrics,
  KL_CONTROLLER_TYPES,
  KL_ESTIMATOR_NAMES,
  klAbs,
  klK1,
  klLoss,
  klLowVar,
  klMse,
  LOG_RATIO_CLAMP,
  LOSS_AGG_MODES,
  LOW_VAR_KL_CLAMP,
  LOW_VAR_KL_LOG_RATIO_CLAMP,
  MASK_EPSILON,
  maskedMean,
  maskedSum,
  maskToBool,
  parseLossAggMode,
  ppoClipLoss,
  readMetrics,
  readMetricsSync,
  STD_KINDS,
  stopGradient,
  tokenLevelRewards,
  truncatedImportanceWeights,
  updateKlController,
} from './algos/index.js';
export type {
  AdaptiveKlController,
  AdvantageKey,
  AggregateLossOptions,
  FixedKlController,
  GroupAdvantageArrayOptions,
  GroupAdvantageOptions,
  GroupAdvantageResult,
  GroupAdvantageStats,
  GroupAdvantageTensorOptions,
  GroupAdvantageTensorResult,
  GroupIndex,
  GroupKind,
  KlController,
  KlControllerType,
  KlEstimator,
  KlEstimatorName,
  KlLossInput,
  KlLossOptions,
  KlPenaltyInput,
  KlPenaltyOptions,
  KlPenaltyResult,
  LossAggMode,
  LossOutput,
  PolicyLossInput,
  PpoClipOptions,
  ScalarMetrics,
  StdKind,
  TruncatedImportanceOptions,
  TruncatedImportanceResult,
} from './algos/index.js';

// ── policy model and backends ──────────────────────────────────────────────────
export { BACKEND_KINDS, initBackend } from './model/backend.js';
export type { BackendKind, BackendLogger, BackendName, InitBackendOptions } from './model/backend.js';
export { NATIVE_BACKEND_PACKAGES, installBackendFixes } from './model/backend.js';
export {
  CHAR_ALPHABET_CONFIG_KEY,
  CHAR_BOS_ID,
  CHAR_EOS_ID,
  CHAR_PAD_ID,
  CHAR_SPECIAL_LABELS,
  CHAR_SPECIAL_TOKENS,
  CharTokenizer,
  DEFAULT_ALPHABET,
} from './model/tokenizer.js';
export { HfTokenizer, TOKENIZER_FILES, loadTokenizer, namedSpecialTokens, readTokenizerFiles } from './model/hfTokenizer.js';
export type { HfTokenizerFiles, HfTokenizerSources, JsonRecord } from './model/hfTokenizer.js';
export { MODEL_TYPES, PolicyModel, validatePolicyConfig } from './model/transformer.js';
export type { ModelType, PolicyConfig, ResolvedPolicyConfig, RopeScaling, TokenLogprobs } from './model/transformer.js';
export type { GenerateOptions } from './model/generate.js';
export type { ModelAdapter } from './model/adapter.js';
export type { FileLimits } from './model/files.js';
export { backendMemoryBytes, checkModelFits } from './model/capacity.js';
export type { ModelFitOptions } from './model/capacity.js';
export { SAMPLING_WEIGHTS_MEMORY_SHARE } from './model/samplingWeights.js';
export { decodeSafetensors, encodeSafetensors, loadSafetensors, saveSafetensors } from './model/safetensors.js';
export {
  LORA_TARGETS,
  LoraAdapter,
  PEFT_FILES,
  loadPeftAdapter,
  peftAdapterConfig,
  readPeftAdapterConfig,
  savePeftAdapter,
  validateLoraConfig,
} from './model/lora.js';
export type { LoraConfig, LoraPair, LoraTarget, PeftReadOptions, ResolvedLoraConfig } from './model/lora.js';
export type { SafetensorsContents, SafetensorsDtype, SafetensorsMetadata } from './model/safetensors.js';
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
} from './model/modelDir.js';
export type { ModelDirContents, SaveModelDirOptions, SpecialTokenIds } from './model/modelDir.js';
export { DEFAULT_MAX_SHARD_BYTES } from './model/modelDir.js';
export type { ReadModelDirOptions, SavedDtype } from './model/modelDir.js';

// ── engines ────────────────────────────────────────────────────────────────────
export { LocalEngine } from './engine/local.js';
export type { LocalEngineOptions, SamplingModel, WeightSyncPolicy } from './engine/local.js';
export { BATCH_HISTORY } from './engine/local.js';

// ── evaluators ─────────────────────────────────────────────────────────────────
export type { EvaluationResult, Evaluator, ResponseInfo } from './core/evaluator.js';

// ── data ───────────────────────────────────────────────────────────────────────
export { TaskLoader, loadTasks, parseTaskLine, readLocatedTasks, readTaskFile, taskFileOf, validateTask } from './data/loader.js';
export type { LoadTasksOptions, LoaderPosition, LocatedTask, RowPlace, TaskSource } from './data/loader.js';
export { cachedSnapshot, hubCacheDir, modelNameOf, parseModelId, resolveModelDir } from './model/hubCache.js';
export type { ModelId, ResolveModelOptions } from './model/hubCache.js';
export { checkPrompts } from './data/checkPrompts.js';
export { DEFAULT_READ_BOUNDS } from './data/readBounds.js';
export type { ReadBounds } from './data/readBounds.js';
export type { CheckPromptsOptions, PromptsChecked } from './data/checkPrompts.js';
export { collate } from './data/collate.js';
export type { CollateOptions } from './data/collate.js';

// ── staleness and admission ────────────────────────────────────────────────────
export { AdmissionGate } from './sync/gate.js';
export type { AdmissionGateOptions, StalenessMode } from './sync/gate.js';

// ── training ───────────────────────────────────────────────────────────────────
export { GrpoTrainer, stalenessMetrics } from './train/grpoTrainer.js';
export type { BatchGradients, GrpoTrainerOptions, TrainerLoss } from './train/grpoTrainer.js';
export type { StepResult, Trainer } from './train/types.js';

// ── seeded randomness ──────────────────────────────────────────────────────────
export { createRng, hashSeed, normalArray, shuffledIndices } from './core/random.js';
export type { Rng } from './core/random.js';

// ── Kafka bridge ───────────────────────────────────────────────────────────────
export { createKafka, createProducer, ensureTopics, parseBrokers } from './kafka/client.js';
export type { CreateKafkaOptions, TopicPartitions } from './kafka/client.js';
export {
  RECORD_SCHEMA_PACKAGE,
  RECORD_TYPES,
  decodeHeartbeatMessage,
  decodeTaskMessage,
  decodeTrajectoryMessage,
  decodeWeightsMessage,
  encodeHeartbeatMessage,
  encodeTaskMessage,
  encodeTrajectoryMessage,
  encodeWeightsMessage,
  recordFormatOf,
} from './kafka/codec.js';
export { BrokerStartError, EncodeError, KafkaBridgeError, isKafkaBridgeError } from './kafka/errors.js';
export { PLAIN_ENCODERS, SchemaRegistryError, framed, registerRecordSchemas } from './kafka/schemaRegistry.js';
export type { RegisteredSchemas, SchemaRegistryOptions } from './kafka/schemaRegistry.js';
export { OffsetTracker } from './kafka/offsets.js';
export type { CommitOffset } from './kafka/offsets.js';
export { kafkaTopics } from './kafka/types.js';
export { WORKER_ID_MAX_LENGTH, workerIdOf, workerIdProblem } from './kafka/workerId.js';
export type {
  HeartbeatMessage,
  KafkaEvent,
  KafkaEventType,
  KafkaRecord,
  KafkaTopics,
  RecordEncoders,
  RolloutTimes,
  RunEndMessage,
  TaskMessage,
  TaskSampling,
  TrajectoryMessage,
  WeightsMessage,
  WeightsVersionMessage,
} from './kafka/types.js';
export { WEIGHTS_RUN_METADATA_KEY, WEIGHTS_VERSION_METADATA_KEY, WeightsFollower, WeightsPublisher } from './kafka/weights.js';
export type { WeightsFollowerEvent, WeightsFollowerOptions, WeightsPublisherOptions } from './kafka/weights.js';
export { removeEndedRuns } from './kafka/weightsCleanup.js';
export type { WeightsCleanup } from './kafka/weightsCleanup.js';
export { fetchKafkaBroker, kafkaVersion, repositoryRoot, startKafkaBroker } from './kafka/broker.js';
export type { KafkaBroker, KafkaBrokerOptions } from './kafka/broker.js';

// ── OpenAI-compatible serving, remote rollouts and agents ──────────────────────
export { RetriesExhaustedError } from './core/errors.js';
export { RETRY_DEFAULTS, RETRY_TEST_DEFAULTS, isProgrammerError, retry, retryDefaults, retryDelay, sleep } from './core/retry.js';
export type { RetryEvent, RetryOptions } from './core/retry.js';
export { disposeEach, releaseAfter, releasing, suppress } from './core/release.js';
export type { WithSuppressed } from './core/release.js';
export { DEFAULT_WEIGHT_UPDATE_ENDPOINT, OpenAIEngine, TOKEN_ID_PREFIX, resolveEndpoint } from './engine/openai.js';
export type { OpenAIEngineOptions, OpenAIEngineStats, OpenAIWeightSyncOptions } from './engine/openai.js';
export { DEFAULT_MAX_RESPONSE_BYTES, openaiClient } from './engine/openaiClient.js';
export type { OpenAIClientOptions } from './engine/openaiClient.js';
export { CHAT_ROLES, isChatEngine } from './chat/types.js';
export type { ChatEngine, ChatMessage, ChatRequest, ChatResult, ChatRole, ChatTool, ToolCall, ToolParameters } from './chat/types.js';
export { createChatTemplate } from './chat/template.js';
export type { ChatTemplate, ChatTemplateOptions, RenderOptions } from './chat/template.js';
export { createJinjaChatTemplate, loadChatTemplate, parseHermesToolCalls } from './chat/jinjaTemplate.js';
export type { JinjaChatTemplate, JinjaChatTemplateOptions } from './chat/jinjaTemplate.js';
export { DEFAULT_TOOL_ARGUMENT, formatToolCall, isToolName, parseToolCalls, toolArgumentNames } from './chat/toolCalls.js';
export type { ParsedAssistantText } from './chat/toolCalls.js';
export { chatWorker, closeWorker, referenceWorker, singleTurnWorker } from './engine/worker.js';
export type { RolloutSample, RolloutWorker, RolloutWorkerInput } from './engine/worker.js';
export { agentWorker } from './agent/agentWorker.js';
export type { AgentWorkerOptions, ToolEnvironment } from './agent/agentWorker.js';
export { AGENT_BASE_ENV } from './agent/agentCommand.js';
export { gatewayWorker } from './agent/gateway.js';
export type {
  AgentCommand,
  AgentContext,
  AgentFunction,
  AgentProgram,
  AgentResult,
  GatewayWorker,
  GatewayWorkerOptions,
} from './agent/gateway.js';
export { TRAJECTORY_GRANULARITIES, episodeSlots } from './agent/environment.js';
export type {
  AgentName,
  AgentSpec,
  Episode,
  EpisodeSlot,
  EpisodeStep,
  MultiAgentEnvironment,
  TrajectoryGranularity,
} from './agent/environment.js';
export { DEFAULT_MODEL_NAME, MAX_TOP_LOGPROBS, serve } from './serve/server.js';
export type { RxrlServer, ServeLogger, ServeOptions } from './serve/server.js';
export { RequestError } from './serve/protocol.js';
export type { JsonObject, OpenAIErrorBody } from './serve/protocol.js';
export { Session, SessionStore, sessionSamples } from './serve/sessions.js';
export type { Admission } from './serve/sessions.js';
export { tinkerService } from './tinker/service.js';
export type { TinkerService, TinkerServiceOptions } from './tinker/service.js';
export type { TinkerLogger } from './tinker/context.js';
export type {
  ForwardBackwardOutputWire,
  SampleResponseWire,
  SampledSequenceWire,
  TensorDtype,
  WireDatum,
  WireTensor,
} from './tinker/proto.js';
export { DEFAULT_CHUNK_TOKENS, TinkerTrainer, TINKER_LOSSES } from './tinker/training.js';
export {
  TINKER_MAX_RESPONSE_BYTES,
  TinkerClient,
  TinkerClientTrainer,
  TinkerEngine,
  TinkerError,
  tinkerHealthy,
  tinkerSeed,
  tinkerServiceLost,
} from './tinker/client.js';
export type { TinkerClientOptions, TinkerClientTrainerOptions } from './tinker/client.js';
export type { TinkerCapabilities } from './tinker/capabilities.js';
export { SkyrlStartError, startSkyrl } from './tinker/skyrlServer.js';
export type { SkyrlServer, SkyrlServerOptions } from './tinker/skyrlServer.js';
export type { AdamParams, ForwardResult, TinkerLoss, TinkerTrainerOptions } from './tinker/training.js';
export type {
  Drift,
  ExportMode,
  RecordedCall,
  RecordedChoice,
  SessionDefaults,
  SessionLimits,
  SessionTrajectory,
} from './serve/sessions.js';
export { runServeCommand } from './serve/command.js';
export type { ServeCommandOptions } from './serve/command.js';
export { REASONING_PARSERS } from './serve/reasoning.js';
export type { ReasoningParserName } from './serve/reasoning.js';
export { spawnServe } from './serve/spawn.js';
export type { SpawnServeOptions, SpawnedServer } from './serve/spawn.js';

// ── observability: logs, events, activity, error policy, metrics stream, progress, report ──
export {
  ActivityOverflowError,
  ActivityTracker,
  DEFAULT_ACTIVITY_CAPACITY,
  DEFAULT_WORKER_GONE_MS,
  ERROR_POLICIES,
  ErrorReporter,
  Instrumentation,
  LOG_LEVELS,
  METRICS_FILE,
  METRICS_RESERVED_KEYS,
  MetricsWriter,
  Progress,
  REPORT_PALETTE,
  REPORTER_MESSAGE_CAPACITY,
  REPORT_PLOTS,
  RunDirError,
  StalledError,
  TENSORBOARD_DIR,
  TensorBoardWriter,
  MlflowTracker,
  crc32c,
  reportPlotsFor,
  createLogger,
  describeError,
  escapeHtml,
  boundedStatus,
  fetchStatus,
  formatStatus,
  printable,
  prometheusText,
  serveStatus,
  watchStalls,
  formatPretty,
  formatStepLine,
  metricsPath,
  moduleLogger,
  parseErrorPolicy,
  parseMetricsLines,
  readRunMetrics,
  renderReport,
  silentLogger,
  writeReport,
} from './observe/index.js';
export type {
  Activity,
  ActivityError,
  ActivitySnapshot,
  ActivityTrackerOptions,
  MlflowOptions,
  TensorBoardOptions,
  FetchStatusOptions,
  RunInfo,
  RunStatus,
  ServeStatusOptions,
  StallWatchOptions,
  StatusOmitted,
  StatusServer,
  WorkerActivity,
  WorkerBeat,
  AnyInstrumentationEvent,
  CreateLoggerOptions,
  ErrorAction,
  ErrorContext,
  ErrorInfo,
  ErrorPolicy,
  ErrorReporterOptions,
  InstrumentationEvent,
  InstrumentationOptions,
  LogDestination,
  LogLevel,
  LogStream,
  Logger,
  MetricsEntry,
  MetricsReadResult,
  MetricsRecord,
  MetricsWriterOptions,
  ModuleActivity,
  ProgressOptions,
  ProgressStep,
  ProgressStream,
  StepLineTiming,
  ReportInput,
  ReportPlot,
  ReportSeries,
  RxrlEventMap,
  RxrlEventType,
  SkippedLine,
  WriteReportOptions,
} from './observe/index.js';
export { MAX_TRACKED_WORKERS } from './observe/activity.js';
export type { TrackWork } from './observe/activity.js';
export { DEFAULT_STATUS_MAX_BYTES, DEFAULT_STATUS_READ_BYTES, DEFAULT_STATUS_TIMEOUT_MS } from './observe/status.js';
export { STOP_GRACE_MS } from './observe/mlflow.js';

// ── configuration ──────────────────────────────────────────────────────────────
export { DEFAULT_POLICY_LORA, SCHEMA, SPECIALIZATIONS, describeConfig, loadConfig, resolvedLora } from './config/schema.js';
export { FOREIGN_KEYS } from './config/keys.js';
export type { ForeignKey, ForeignSource } from './config/keys.js';
export type { AgentRoleConfig, LoadConfigOptions, PolicyEntryConfig, RxrlConfig, Specialization } from './config/schema.js';
export { configWarnings } from './config/configWarnings.js';
export type { ConfigWarningsContext } from './config/configWarnings.js';
export { REDACTED, redactSecrets } from './config/redact.js';

// ── checkpoints ────────────────────────────────────────────────────────────────
export {
  CHECKPOINT_FORMAT,
  checkpointName,
  latestCheckpoint,
  listCheckpoints,
  loadCheckpoint,
  pruneCheckpoints,
  removeUnfinishedCheckpoints,
  resumeCheckpoint,
  saveCheckpoint,
  TINKER_STATE_FILE,
  verifyCheckpoint,
} from './checkpoint/checkpoint.js';
export type {
  BufferedSample,
  Checkpoint,
  CheckpointFiles,
  CheckpointState,
  CheckpointTinker,
  TinkerStateRef,
} from './checkpoint/checkpoint.js';
export type { CheckpointAdapter, CheckpointModel } from './checkpoint/checkpoint.js';
export { RUN_LOCK_FILE, acquireRunLock, withRunLock } from './checkpoint/runLock.js';
export type { RunLock, RunLockHolder, RunLockOptions } from './checkpoint/runLock.js';
