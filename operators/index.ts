/**
 * rxrl operators: one RxJS operator per file, composed into GRPO loops.
 *
 * @packageDocumentation
 * @module rxrl/operators
 */

// ── admission (pull from the loader on credit) ─────────────────────────────────
export { admit } from './admit.js';
export type { AdmitOptions } from './admit.js';

// ── rollout ────────────────────────────────────────────────────────────────────
export { groupIdOf, rollout } from './rollout.js';
export type { RolloutOptions } from './rollout.js';
export { agentMap, rolloutEpisodes } from './rolloutEpisodes.js';
export type { RolloutEpisodesOptions } from './rolloutEpisodes.js';

// ── grouped trajectory store and batching ──────────────────────────────────────
export { groupTrajectories } from './groupTrajectories.js';
export type { GroupKey, GroupTrajectoriesOptions, IncompletePolicy, KeyFields } from './groupTrajectories.js';
export { batchGroups } from './batchGroups.js';
export type { BatchGroupsOptions, BatchReadiness } from './batchGroups.js';

// ── algorithm stage ────────────────────────────────────────────────────────────
export { grpoPrepare } from './grpoPrepare.js';
export type { GrpoPrepareOptions, KlInRewardOptions, ReferencePolicy } from './grpoPrepare.js';
export { sftPrepare } from './sftPrepare.js';
export { distillPrepare } from './distillPrepare.js';
export type { DistillPrepareOptions } from './distillPrepare.js';
export type { SftPrepareOptions } from './sftPrepare.js';

// ── training and weight sync ───────────────────────────────────────────────────
export { train } from './train.js';
export type { TrainOptions } from './train.js';
export { syncWeights } from './syncWeights.js';
export type { SyncWeightsOptions } from './syncWeights.js';

// ── progress on stderr ─────────────────────────────────────────────────────────
export { printProgress } from './printProgress.js';
export type { PrintProgressOptions } from './printProgress.js';

// ── Kafka edges (any stage can cross a topic) ──────────────────────────────────
export { toKafka } from './toKafka.js';
export type { ToKafkaOptions } from './toKafka.js';
export { DEAD_LETTER_HEADERS, fromKafka } from './fromKafka.js';
export type { DeadLetterOptions, FromKafkaOptions } from './fromKafka.js';
export { dropDuplicates } from './dropDuplicates.js';
export type { DropDuplicatesOptions } from './dropDuplicates.js';

// ── rollout workers (single-turn default, multi-turn agents) ───────────────────
export type { RolloutSample, RolloutWorker, RolloutWorkerInput } from '../lib/engine/worker.js';
