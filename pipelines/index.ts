/**
 * Ready compositions of the rxrl operators.
 *
 * @packageDocumentation
 * @module rxrl/pipelines
 */

// ── the GRPO loop ──────────────────────────────────────────────────────────────
export { grpoPipeline } from './grpoPipeline.js';
export type { GrpoPipelineConfig, LoopSettings, PolicyLane, PolicyLoopConfig, PolicyStepResult } from './grpoPipeline.js';

// ── several agents, several policies (PettingLLMs' L1–L3) ─────────────────────
export { multiAgentPipeline } from './multiAgentPipeline.js';
export type { MultiAgentPipelineConfig, PolicySpec } from './multiAgentPipeline.js';
export { validateAgents } from './validate.js';
export type { ValidateAgentsOptions } from './validate.js';
export { runAgents } from './agents.js';
export type { AgentsRunOptions, AgentsRunSummary, PolicyRunSummary } from './agents.js';

// ── held-out evaluation ────────────────────────────────────────────────────────
export { validate } from './validate.js';
export type { ValidateOptions } from './validate.js';

// ── the embedded main job (npm start) ──────────────────────────────────────────
export { EMBEDDED_MODEL, EMBEDDED_TRAINER, embeddedConfig, embeddedSummary, runEmbedded } from './embedded.js';
export type { EmbeddedRunOptions, EmbeddedRunSummary } from './embedded.js';
export { EMBEDDED_STEPS } from './embedded.js';

// ── Kafka halves: trainer and rollout workers in separate processes ────────────
export { kafkaTrainer } from './kafkaTrainer.js';
export type { KafkaTrainerConfig } from './kafkaTrainer.js';
export { kafkaRolloutWorker } from './kafkaRolloutWorker.js';
export type { KafkaRolloutWorkerConfig, WorkerTaskResult } from './kafkaRolloutWorker.js';
export type { KafkaPolicy } from './kafkaRollout.js';
export type { KafkaEpisodes } from './parts/contracts.js';
export type { KafkaTransport } from './parts/settings.js';

// ── training through an OpenAI-compatible server ──────────────────────────────
export { runServed } from './served.js';
export type { ServedRunOptions, ServedRunSummary } from './served.js';

// ── recipe runs: checkpoints, resume, validation, metrics (rxrl run) ───────────
export { runTraining } from './run.js';
export { grpoTrainerOptions } from './parts/settings.js';
export { recipeDir } from './parts/data.js';
export type { EngineContext, RunSummary, RunTrainingOptions } from './run.js';
