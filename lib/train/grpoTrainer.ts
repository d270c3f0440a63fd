/**
 * The GRPO trainer: PPO-clipped policy-gradient steps on prepared batches, on TensorFlow.js.
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';
import { type LossAggMode, aggregateLoss, parseLossAggMode } from '../algos/aggregate.js';
import { truncatedImportanceWeights } from '../algos/importance.js';
import { type KlEstimatorName, klLoss } from '../algos/kl.js';
import { keepMetrics, readMetricsSync, type ScalarMetrics } from '../algos/metrics.js';
import { ppoClipLoss } from '../algos/policyLoss.js';
import type { NamedWeights } from '../model/types.js';
import { ConfigError, assertNever, throwIfAborted } from '../core/errors.js';
import type { PolicyModel } from '../model/transformer.js';
import { createRng, shuffledIndices } from '../core/random.js';
import type { Batch, BatchMeta, Defined, Metrics, ModelTag } from '../core/types.js';
import { Adam } from './adam.js';
import type { StepResult, Trainer } from './types.js';

/** What a trainer minimizes: the clipped policy gradient (GRPO, distillation), or the cross-entropy (SFT). */
export type TrainerLoss = 'policy-gradient' | 'cross-entropy';

/** Options of {@link GrpoTrainer}. */
export interface GrpoTrainerOptions {
  /**
   * The loss: `policy-gradient` (the PPO clipped surrogate over the batch's advantages: GRPO, distillation) or
   * `cross-entropy` (SFT: the response tokens' negative log-probs under the loss mask, each weighted by its
   * advantage — 1 in batches from `sftPrepare` — aggregated as `lossAggregation` says; the rollout log-probs are not
   * read). Default `policy-gradient`.
   */
  readonly loss?: TrainerLoss;
  /** Adam learning rate. Default 1e-3. */
  readonly learningRate?: number;
  /** Adam β1. Default 0.9. */
  readonly adamBeta1?: number;
  /** Adam β2. Default 0.999. */
  readonly adamBeta2?: number;
  /** Adam ε. Default 1e-8. */
  readonly adamEpsilon?: number;
  /** Clip gradients to this global L2 norm; `Infinity` turns clipping off. Default 1. */
  readonly maxGradNorm?: number;
  /**
   * Which weights train (by Hugging Face name, e.g. `(n) => n.startsWith('model.layers.29.')`): the others are
   * frozen, with no gradients and no optimizer state, which is what lets a 135 M model's last blocks train inside
   * the wasm backend's memory. Default: every weight.
   */
  readonly trainable?: (name: string) => boolean;
  /** Rows per forward/backward pass; gradients of a mini-batch's micro-batches are accumulated. Default 64. */
  readonly microBatchSize?: number;
  /** Passes over each batch. Default 1. */
  readonly ppoEpochs?: number;
  /** Optimizer updates per pass (the batch is split into this many shuffled mini-batches). Default 1. */
  readonly miniBatches?: number;
  /** PPO lower clip range. Default 0.2. */
  readonly clipLow?: number;
  /** PPO upper clip range (DAPO raises it, e.g. 0.28). Default `clipLow`. */
  readonly clipHigh?: number;
  /** Dual-clip bound (> 1) for negative advantages. Default none. */
  readonly clipRatioC?: number;
  /** Loss aggregation. Default `token-mean`. */
  readonly lossAggregation?: LossAggMode;
  /** Constant length of `seq-mean-token-sum-norm`. Default the batch's response width. */
  readonly maxLength?: number;
  /** Coefficient of an entropy bonus. Default 0. */
  readonly entropyCoef?: number;
  /**
   * Score a micro-batch whose every row has a zero advantage forward only, when the loss is the clipped surrogate
   * with no entropy bonus and no KL term (its gradient is exactly 0, so the update, losses and metrics are the same).
   * `false` differentiates it anyway, as TRL's `GRPOTrainer` does: the same work on both sides of a benchmark.
   * Default true.
   */
  readonly skipZeroAdvantage?: boolean;
  /** KL to the reference policy as a loss term (needs `batch.refLogprobs` or a `reference` model). */
  readonly klLoss?: { readonly coef: number; readonly estimator?: KlEstimatorName };
  /** Frozen reference policy used for the KL loss when a batch carries no reference log-probs. */
  readonly reference?: PolicyModel;
  /**
   * Decoupled PPO for stale data: the ratio is taken against the current weights before the update (the
   * proximal policy), and each token is weighted by `min(π_prox/π_rollout, cap)`. Off by default (the ratio is
   * then taken against the rollout-time log-probs).
   */
  readonly importanceCap?: number;
  /**
   * Drop rows whose staleness (`step − policyVersion`) exceeds this bound: their loss mask is zeroed, so they
   * neither train nor count in the loss; the count is reported as `rollout/dropped_stale`. Default: keep all.
   */
  readonly maxStaleness?: number;
  /** Model tag. Default `policy`. */
  readonly modelTag?: ModelTag;
  /** Seed of the mini-batch shuffle. Default 0. */
  readonly seed?: number;
}

/** Token tensors of a group of rows. */
interface RowTensors {
  readonly ids: tf.Tensor2D; // [b, T]
  readonly attention: tf.Tensor2D; // [b, T]
  readonly positions: tf.Tensor2D; // [b, T]
  readonly lossMask: tf.Tensor2D; // [b, R]
  readonly oldLogprobs: tf.Tensor2D; // [b, R]
  readonly advantages: tf.Tensor2D; // [b, R]
  readonly refLogprobs?: tf.Tensor2D; // [b, R]
}

/** The batch's tensors and what the loss takes from the whole batch, computed once per step. */
interface StepInputs {
  readonly all: RowTensors;
  /** Log-probs of the weights before the update (decoupled PPO), `[B, R]`. */
  readonly proxLogprobs?: tf.Tensor2D | undefined;
  /** Truncated importance weights (decoupled PPO), `[B, R]`. */
  readonly isWeights?: tf.Tensor2D | undefined;
  /** Reference log-probs for the KL loss, `[B, R]`. */
  readonly refLogprobs?: tf.Tensor2D | undefined;
}

/** What {@link GrpoTrainer.computeGradients} returns. */
export interface BatchGradients {
  /** Gradient of the batch's loss for each trained weight, before clipping, in `model.getWeights()`' names and layout. */
  readonly gradients: NamedWeights;
  /** The batch's loss: the sum of {@link BatchGradients.microBatchLosses}. */
  readonly loss: number;
  /** Each micro-batch's loss weighted by its share of the batch (the value differentiated), in order. */
  readonly microBatchLosses: readonly number[];
  /** Global L2 norm of the gradients, which clipping compares with `maxGradNorm`. */
  readonly gradNorm: number;
}

/** Clamp of the global-norm denominator. */
const GRAD_NORM_EPSILON = 1e-6;

/**
 * Trains a {@link PolicyModel} with the GRPO objective: the PPO clipped surrogate over group-normalized
 * advantages, optional KL-to-reference loss and entropy bonus; micro-batches with gradient accumulation,
 * global-norm clipping and Adam. A non-finite loss or gradient skips the update and says so in the metrics
 * (`actor/skipped_nonfinite`); the step still counts, so versions keep moving.
 *
 * Each step's metrics time it: `timing/step_s` (the whole step), of which `timing/forward_backward_s` (every
 * micro-batch's loss and gradients, their accumulation included) and `timing/optimizer_s` (the global norm, the
 * clip and Adam's update); the rest is the batch's tensors and what the loss needs of the whole batch (proximal or
 * reference log-probs).
 */
export class GrpoTrainer implements Trainer {
  readonly modelTag: ModelTag;
  private steps = 0;
  private readonly optimizer: Adam;
  /** Names and variables of the weights that train, in `model.weightNames()` order. */
  private readonly trainedNames: readonly string[];
  private readonly trainedVariables: readonly tf.Variable[];
  private readonly options: Defined<
    Pick<GrpoTrainerOptions, 'maxGradNorm' | 'microBatchSize' | 'ppoEpochs' | 'miniBatches' | 'clipLow' | 'lossAggregation' | 'entropyCoef'>
  > &
    GrpoTrainerOptions;
  private readonly seed: number;

  constructor(
    readonly model: PolicyModel,
    options: GrpoTrainerOptions = {},
  ) {
    this.modelTag = options.modelTag ?? 'policy';
    this.options = {
      ...options,
      maxGradNorm: options.maxGradNorm ?? 1,
      microBatchSize: options.microBatchSize ?? 64,
      ppoEpochs: options.ppoEpochs ?? 1,
      miniBatches: options.miniBatches ?? 1,
      clipLow: options.clipLow ?? 0.2,
      lossAggregation: parseLossAggMode(options.lossAggregation ?? 'token-mean'),
      entropyCoef: options.entropyCoef ?? 0,
    };
    for (const key of ['microBatchSize', 'ppoEpochs', 'miniBatches'] as const) {
      const value = this.options[key];
      if (!Number.isInteger(value) || value < 1) throw new ConfigError(`${key} must be an integer >= 1, got ${value}`);
    }
    if (!(this.options.maxGradNorm > 0)) throw new ConfigError(`maxGradNorm must be > 0, got ${this.options.maxGradNorm}`);
    const lr = options.learningRate ?? 1e-3;
    if (!(lr > 0)) throw new ConfigError(`learningRate must be > 0, got ${lr}`);
    if (options.maxStaleness !== undefined && !(Number.isInteger(options.maxStaleness) && options.maxStaleness >= 0)) {
      throw new ConfigError(`maxStaleness must be an integer >= 0, got ${options.maxStaleness}`);
    }
    if (options.importanceCap !== undefined && !(options.importanceCap >= 1)) {
      throw new ConfigError(`importanceCap must be >= 1, got ${options.importanceCap}`);
    }
    const trainable = options.trainable ?? (() => true);
    const names = model.weightNames();
    const variables = model.trainableVariables();
    this.trainedNames = names.filter((name) => trainable(name));
    if (this.trainedNames.length === 0) throw new ConfigError('trainable: no weight is trainable');
    this.trainedVariables = variables.filter((_, i) => trainable(names[i]));
    this.optimizer = new Adam(this.trainedVariables, {
      learningRate: lr,
      beta1: options.adamBeta1,
      beta2: options.adamBeta2,
      epsilon: options.adamEpsilon,
    });
    this.seed = options.seed ?? 0;
  }

  get step(): number {
    return this.steps;
  }

  /** Copies of the current weights. */
  getWeights(): NamedWeights {
    return this.model.getWeights();
  }

  async trainStep(input: Batch, signal?: AbortSignal): Promise<StepResult> {
    let batch = input;
    throwIfAborted(signal);
    const started = performance.now();
    const step = this.steps;
    const metrics: Metrics = { ...(batch.metrics ?? {}), ...stalenessMetrics(batch, step) };
    if (this.options.maxStaleness !== undefined) {
      const { batch: fresh, dropped } = dropStale(batch, step, this.options.maxStaleness);
      metrics['rollout/dropped_stale'] = dropped;
      batch = fresh;
    }
    let skipped = batch.size === 0;
    if (!skipped) {
      const { epochs, skippedUpdates } = await this.optimize(batch, metrics, signal);
      skipped = skippedUpdates === epochs;
      metrics['actor/skipped_nonfinite'] = skippedUpdates;
    } else {
      metrics['actor/skipped_empty'] = 1;
    }
    this.steps++;
    const seconds = (performance.now() - started) / 1000;
    const tokens = sum(batch.attentionMask);
    metrics['timing/step_s'] = seconds;
    metrics['perf/tokens'] = tokens;
    metrics['perf/tokens_per_s'] = seconds > 0 ? tokens / seconds : 0;
    metrics['training/global_step'] = step + 1;
    const model = this.model;
    return {
      step,
      version: step + 1,
      metrics,
      skipped,
      trajectoryIds: batch.meta.trajectoryIds,
      weights: () => model.getWeights(),
    };
  }

  /**
   * The optimizer state as named weights: `iter` (`[1]`), and each trained weight's Adam moments as `m/<name>`
   * and `v/<name>` (names from `model.weightNames()`), ready for safetensors. Empty moments before the first update.
   */
  async optimizerState(): Promise<NamedWeights> {
    const { step, m, v } = await this.optimizer.state();
    const out = new Map<string, { shape: readonly number[]; data: Float32Array }>();
    out.set('iter', { shape: [1], data: Float32Array.of(step) });
    for (const [kind, moments] of [
      ['m', m],
      ['v', v],
    ] as const) {
      moments.forEach((data, i) => out.set(`${kind}/${this.trainedNames[i]}`, { shape: [...this.trainedVariables[i].shape], data }));
    }
    return out;
  }

  /**
   * Restores a checkpoint: the step counter (so versions continue) and, when given, the optimizer state saved by
   * {@link GrpoTrainer.optimizerState}.
   */
  async restore(state: { readonly step: number; readonly optimizer?: NamedWeights }): Promise<void> {
    if (!(Number.isInteger(state.step) && state.step >= 0))
      throw new ConfigError(`restore: step must be an integer >= 0, got ${state.step}`);
    this.steps = state.step;
    const optimizer = state.optimizer;
    if (!optimizer || !optimizer.has('m/' + this.trainedNames[0])) return;
    const iter = optimizer.get('iter');
    if (!iter) throw new ConfigError('restore: optimizer state has no iter');
    const moments = (kind: 'm' | 'v'): Float32Array[] =>
      this.trainedNames.map((name) => {
        const w = optimizer.get(`${kind}/${name}`);
        if (!w) throw new ConfigError(`restore: optimizer state lacks ${kind}/${name}`);
        return w.data;
      });
    this.optimizer.setState({ step: iter.data[0], m: moments('m'), v: moments('v') });
  }

  /** Releases the optimizer state (the model belongs to the caller). */
  dispose(): void {
    this.optimizer.dispose();
  }

  /**
   * The gradient of the first update {@link GrpoTrainer.trainStep} would make on `batch` with one mini-batch (every
   * row, in micro-batches of `microBatchSize`, rows staler than `maxStaleness` dropped), without applying it: the
   * gradient of each trained weight after accumulation and before clipping, in the names and layout of
   * `model.getWeights()`, with the loss of each micro-batch (its share of the batch's loss, the value differentiated)
   * and the global norm that clipping compares with `maxGradNorm`. Nothing changes: neither the weights, nor the
   * optimizer, nor the step counter. `trainStep` computes each update's gradient with the same code.
   */
  async computeGradients(input: Batch, signal?: AbortSignal): Promise<BatchGradients> {
    const batch = this.options.maxStaleness === undefined ? input : dropStale(input, this.steps, this.options.maxStaleness).batch;
    const inputs = this.stepInputs(batch, () => undefined);
    try {
      const rows = [...Array(batch.size).keys()];
      const { grads, losses } = await this.accumulate(batch, rows, inputs, () => undefined, signal);
      try {
        // A weight the loss does not reach has no gradient from tf.variableGrads: its gradient is 0.
        for (const v of this.trainedVariables) if (!grads.has(v.name)) grads.set(v.name, tf.zerosLike(v));
        const gradients = this.model.namedWeightsOf(
          new Map(this.trainedVariables.map((v, i) => [this.trainedNames[i], grads.get(v.name)!])),
        );
        return {
          gradients,
          loss: losses.reduce((a, b) => a + b, 0),
          microBatchLosses: losses,
          gradNorm: this.globalNorm([...grads.values()]),
        };
      } finally {
        tf.dispose([...grads.values()]);
      }
    } finally {
      disposeStepInputs(inputs);
    }
  }

  private async optimize(batch: Batch, metrics: Metrics, signal?: AbortSignal): Promise<{ epochs: number; skippedUpdates: number }> {
    const { ppoEpochs, miniBatches } = this.options;
    const B = batch.size;
    const totals = new Map<string, { sum: number; weight: number }>();
    const record = (values: Metrics, weight: number): void => {
      for (const [key, value] of Object.entries(values)) {
        const t = totals.get(key) ?? { sum: 0, weight: 0 };
        t.sum += value * weight;
        t.weight += weight;
        totals.set(key, t);
      }
    };
    let updates = 0;
    let skippedUpdates = 0;
    // Seconds of the micro-batches' losses and gradients (accumulation included) and of the updates (norm, clip,
    // Adam), summed over the step's updates. Both end on a value read back from the backend (each micro-batch's
    // loss, the gradient norm), so queued work is not counted in the wrong part.
    const seconds = { forwardBackward: 0, optimizer: 0 };
    const inputs = this.stepInputs(batch, record);
    try {
      for (let epoch = 0; epoch < ppoEpochs; epoch++) {
        // The shuffle derives from (seed, step, epoch): nothing to checkpoint, and a resumed run repeats it.
        const rng = createRng(this.seed, 'minibatch', String(this.steps), String(epoch));
        const order = miniBatches > 1 ? shuffledIndices(B, rng) : [...Array(B).keys()];
        const miniSize = Math.ceil(B / miniBatches);
        for (let m = 0; m < B; m += miniSize) {
          throwIfAborted(signal);
          const accumulating = performance.now();
          const { grads, finite } = await this.accumulate(batch, order.slice(m, m + miniSize), inputs, record, signal);
          const updating = performance.now();
          const { norm, applied } = this.applyClipped(Object.fromEntries(grads), finite);
          seconds.forwardBackward += (updating - accumulating) / 1000;
          seconds.optimizer += (performance.now() - updating) / 1000;
          record({ 'actor/grad_norm': norm }, 1);
          updates++;
          if (!applied) skippedUpdates++;
        }
      }
    } finally {
      disposeStepInputs(inputs);
    }
    for (const [key, { sum: s, weight }] of totals) metrics[key] = weight > 0 ? s / weight : 0;
    metrics['actor/updates'] = updates;
    metrics['actor/lr'] = this.options.learningRate ?? 1e-3;
    metrics['timing/forward_backward_s'] = seconds.forwardBackward;
    metrics['timing/optimizer_s'] = seconds.optimizer;
    return { epochs: updates, skippedUpdates };
  }

  /**
   * The batch's tensors and what the loss needs of the whole batch before any update: the proximal log-probs and
   * importance weights (decoupled PPO), the reference log-probs (KL loss without `batch.refLogprobs`).
   */
  private stepInputs(batch: Batch, record: (values: Metrics, weight: number) => void): StepInputs {
    const all = rowTensors(batch, 0, batch.size);
    let proxLogprobs: tf.Tensor2D | undefined; // [B, R]
    let isWeights: tf.Tensor2D | undefined; // [B, R]
    let refLogprobs = all.refLogprobs; // [B, R]
    try {
      if (this.options.importanceCap !== undefined) {
        proxLogprobs = tf.tidy(() => this.responseLogprobs(all, batch).logprob);
        const is = truncatedImportanceWeights(proxLogprobs, all.oldLogprobs, all.lossMask, {
          cap: this.options.importanceCap,
        });
        isWeights = is.weights;
        record(readMetricsSync(is.metrics), 1);
      }
      if (this.options.klLoss && !refLogprobs) {
        const reference = this.options.reference;
        if (!reference) throw new ConfigError('klLoss needs batch.refLogprobs or a reference model');
        refLogprobs = tf.tidy(() => reference.responseLogprobs(all.ids, all.attention, all.positions, batch.promptLength).logprobs);
      }
    } catch (error) {
      disposeStepInputs({ all, proxLogprobs, isWeights, refLogprobs });
      throw error;
    }
    return { all, proxLogprobs, isWeights, refLogprobs };
  }

  /**
   * Gradients of the loss of the rows `mini` (indices into the batch), summed over their micro-batches: each
   * micro-batch's loss is weighted by its share of the mini-batch's loss weight ({@link GrpoTrainer.lossWeight}), so
   * the sum is the mini-batch's loss. A micro-batch none of whose rows can move the weights
   * ({@link GrpoTrainer.inertRows}) is scored forward only (its loss and metrics count; its gradient, exactly 0, adds
   * nothing); when no micro-batch can, every gradient is an exact 0, as differentiating them would give. Returns the
   * gradients by variable name (the caller disposes them), whether every micro-batch loss was finite, and those
   * weighted losses.
   */
  private async accumulate(
    batch: Batch,
    mini: readonly number[],
    inputs: StepInputs,
    record: (values: Metrics, weight: number) => void,
    signal?: AbortSignal,
  ): Promise<{ grads: Map<string, tf.Tensor>; finite: boolean; losses: number[] }> {
    const { microBatchSize } = this.options;
    const grads = new Map<string, tf.Tensor>();
    const losses: number[] = [];
    const miniWeight = this.lossWeight(batch, mini);
    const inert = this.inertRows(batch);
    let differentiated = false;
    try {
      for (let u = 0; u < mini.length; u += microBatchSize) {
        throwIfAborted(signal);
        const micro = mini.slice(u, u + microBatchSize);
        const share = miniWeight > 0 ? this.lossWeight(batch, micro) / miniWeight : 0;
        const differentiate = micro.some((b) => !inert[b]);
        differentiated ||= differentiate;
        const { value, grads: g, metrics } = this.microBatch(pickRows(inputs, micro), share, batch, differentiate);
        losses.push(value);
        record(metrics, micro.length);
        for (const [name, grad] of Object.entries(g)) {
          const prev = grads.get(name);
          grads.set(name, prev ? tf.add(prev, grad) : grad);
          if (prev) tf.dispose([prev, grad]);
        }
        await Promise.resolve();
      }
      if (!differentiated && mini.length > 0) for (const v of this.trainedVariables) grads.set(v.name, tf.zerosLike(v));
    } catch (error) {
      tf.dispose([...grads.values()]);
      throw error;
    }
    return { grads, finite: losses.every((l) => Number.isFinite(l)), losses };
  }

  /** One micro-batch's weighted loss and metrics, and its gradients when `differentiate`; disposes `part`. */
  private microBatch(
    part: RowTensors & { isWeights?: tf.Tensor2D },
    share: number,
    batch: Batch,
    differentiate: boolean,
  ): { value: number; grads: tf.NamedTensorMap; metrics: Metrics } {
    let kept: ScalarMetrics = {};
    const f = (): tf.Scalar => {
      const out = this.loss(part, part.isWeights, batch);
      kept = keepMetrics(out.metrics);
      return tf.mul(out.loss, share) as tf.Scalar;
    };
    try {
      const { value, grads } = differentiate ? tf.variableGrads(f, [...this.trainedVariables]) : { value: tf.tidy(f), grads: {} };
      const loss = value.dataSync()[0];
      value.dispose();
      return { value: loss, grads, metrics: readMetricsSync(kept) };
    } finally {
      tf.dispose(Object.values(part));
    }
  }

  /**
   * Per row of `batch`, whether its loss term has an exactly zero gradient whatever the weights: a policy-gradient
   * loss with no entropy bonus and no KL term, and an advantage of 0 at every token the loss mask keeps (GRPO's
   * groups whose rewards are all equal, rows masked out). All false for any other loss.
   */
  private inertRows(batch: Batch): boolean[] {
    const R = batch.responseLength;
    const rows = [...Array<boolean>(batch.size)].fill(false);
    const { loss, entropyCoef, klLoss, skipZeroAdvantage } = this.options;
    if (loss === 'cross-entropy' || entropyCoef !== 0 || klLoss || skipZeroAdvantage === false) return rows;
    return rows.map((_, b) => {
      for (let i = b * R; i < (b + 1) * R; i++) if (batch.lossMask[i] !== 0 && batch.advantages[i] !== 0) return false;
      return true;
    });
  }

  /** Weight of a set of rows in the aggregated loss: tokens for `token-mean`, non-empty rows otherwise. */
  private lossWeight(batch: Batch, rows: readonly number[]): number {
    const R = batch.responseLength;
    let tokens = 0;
    let nonEmpty = 0;
    for (const b of rows) {
      let n = 0;
      for (let i = 0; i < R; i++) n += batch.lossMask[b * R + i];
      tokens += n;
      if (n > 0) nonEmpty++;
    }
    switch (this.options.lossAggregation) {
      case 'token-mean':
        return tokens;
      case 'seq-mean-token-sum':
      case 'seq-mean-token-mean':
        return nonEmpty;
      case 'seq-mean-token-sum-norm':
        return rows.length;
      default:
        return assertNever(this.options.lossAggregation, 'loss aggregation');
    }
  }

  /** Per-token response log-probs `[b, R]` and entropies of the current policy (rows are `P + R` wide). */
  private responseLogprobs(t: RowTensors, batch: Batch): { logprob: tf.Tensor2D; entropy: tf.Tensor2D } {
    const out = this.model.responseLogprobs(t.ids, t.attention, t.positions, batch.promptLength); // [b, R]
    return { logprob: out.logprobs, entropy: out.entropy };
  }

  private loss(t: RowTensors, isWeights: tf.Tensor2D | undefined, batch: Batch): { loss: tf.Scalar; metrics: ScalarMetrics } {
    const { logprob, entropy } = this.responseLogprobs(t, batch); // [b, R]
    const mode = this.options.lossAggregation;
    const maxLength = this.options.maxLength ?? batch.responseLength;
    const pg =
      this.options.loss === 'cross-entropy'
        ? crossEntropy(logprob, t, mode, maxLength)
        : ppoClipLoss(
            {
              logprob,
              oldLogprob: t.oldLogprobs,
              advantages: t.advantages,
              mask: t.lossMask,
              ...(isWeights ? { importanceWeights: isWeights } : {}),
            },
            { clipLow: this.options.clipLow, clipHigh: this.options.clipHigh, clipRatioC: this.options.clipRatioC, mode, maxLength },
          );
    const metrics: ScalarMetrics = { ...pg.metrics };
    let loss = pg.loss;
    const entropyMean = aggregateLoss(entropy, t.lossMask, mode, { maxLength });
    metrics['actor/entropy'] = entropyMean;
    if (this.options.entropyCoef !== 0) loss = tf.sub(loss, tf.mul(entropyMean, this.options.entropyCoef));
    if (this.options.klLoss && t.refLogprobs) {
      const kl = klLoss(
        { logprob, refLogprob: t.refLogprobs, mask: t.lossMask },
        { coef: this.options.klLoss.coef, estimator: this.options.klLoss.estimator ?? 'low_var_kl', mode, maxLength },
      );
      Object.assign(metrics, kl.metrics);
      loss = tf.add(loss, kl.loss);
    }
    return { loss: loss as tf.Scalar, metrics };
  }

  /** Global L2 norm of a set of tensors (as the clip computes it). */
  private globalNorm(tensors: readonly tf.Tensor[]): number {
    const { squares, norm } = this.optimizer.gradientNorm(tensors);
    tf.dispose(squares.filter((x): x is tf.Tensor => x !== undefined));
    return norm;
  }

  /**
   * Clips `grads` (by variable name) to the global norm and applies them when `finite`; disposes them. The clip is
   * a factor on Adam's gradients, and the squares the norm sums serve Adam's second moment where its kernel uses them.
   */
  private applyClipped(grads: tf.NamedTensorMap, finite: boolean): { norm: number; applied: boolean } {
    const ordered = this.trainedVariables.map((v): tf.Tensor | undefined => grads[v.name]);
    let squares: (tf.Tensor | undefined)[] = [];
    try {
      const out = this.optimizer.gradientNorm(ordered);
      squares = out.squares;
      const norm = out.norm;
      if (!finite || !Number.isFinite(norm)) return { norm, applied: false };
      const scale = Math.min(1, this.options.maxGradNorm / (norm + GRAD_NORM_EPSILON));
      this.optimizer.apply(ordered, { scale, squares });
      this.model.weightsChanged(); // generation must not go on sampling a fused copy of the old weights
      return { norm, applied: true };
    } finally {
      tf.dispose([...Object.values(grads), ...squares.filter((x): x is tf.Tensor => x !== undefined)]);
    }
  }
}

/** The SFT loss: `−advantage · log-prob` of each response token under the loss mask, aggregated (`actor/sft_loss`). */
function crossEntropy(
  logprob: tf.Tensor2D,
  t: RowTensors,
  mode: LossAggMode,
  maxLength: number,
): { loss: tf.Scalar; metrics: ScalarMetrics } {
  const loss = aggregateLoss(tf.neg(tf.mul(logprob, t.advantages)), t.lossMask, mode, { maxLength });
  return { loss, metrics: { 'actor/sft_loss': loss } };
}

/** `rollout/staleness_{min,mean,max}` of a batch trained at `step`: `step − policyVersion` per row. */
export function stalenessMetrics(batch: Batch, step: number): Metrics {
  const versions = batch.meta.policyVersions;
  if (versions.length === 0) return {};
  const staleness = versions.map((v) => step - v);
  return {
    'rollout/staleness_min': Math.min(...staleness),
    'rollout/staleness_mean': staleness.reduce((a, b) => a + b, 0) / staleness.length,
    'rollout/staleness_max': Math.max(...staleness),
    'rollout/reward_mean': batch.meta.rewards.reduce((a, b) => a + b, 0) / batch.meta.rewards.length,
    'response_length/mean': sum(batch.responseMask) / batch.size,
    ...clipRatio(batch.meta.finishReasons),
  };
}

/** `response_length/clip_ratio`: the fraction of rows whose generation ended at the token budget, as verl reports. */
function clipRatio(reasons: BatchMeta['finishReasons']): Metrics {
  if (reasons === undefined || reasons.length === 0) return {};
  return { 'response_length/clip_ratio': reasons.filter((r) => r === 'length').length / reasons.length };
}

/** A copy of `batch` whose rows staler than `maxStaleness` at `step` have an all-zero loss mask. */
function dropStale(batch: Batch, step: number, maxStaleness: number): { batch: Batch; dropped: number } {
  const R = batch.responseLength;
  let dropped = 0;
  const lossMask = Float32Array.from(batch.lossMask); // [B, R]
  batch.meta.policyVersions.forEach((version, b) => {
    if (step - version > maxStaleness) {
      dropped++;
      lossMask.fill(0, b * R, (b + 1) * R);
    }
  });
  return { batch: dropped > 0 ? { ...batch, lossMask } : batch, dropped };
}

/** The rows `index` of a step's inputs, as one micro-batch sees them (the proximal log-probs as the old ones). */
function pickRows(inputs: StepInputs, rows: readonly number[]): RowTensors & { isWeights?: tf.Tensor2D } {
  return tf.tidy(() => {
    const index = tf.tensor1d(Int32Array.from(rows), 'int32');
    const pick = (t: tf.Tensor2D): tf.Tensor2D => tf.gather(t, index) as tf.Tensor2D; // [b, ·]
    const { all, proxLogprobs, isWeights, refLogprobs } = inputs;
    return {
      ids: pick(all.ids),
      attention: pick(all.attention),
      positions: pick(all.positions),
      lossMask: pick(all.lossMask),
      oldLogprobs: pick(proxLogprobs ?? all.oldLogprobs),
      advantages: pick(all.advantages),
      ...(refLogprobs ? { refLogprobs: pick(refLogprobs) } : {}),
      ...(isWeights ? { isWeights: pick(isWeights) } : {}),
    };
  });
}

function disposeStepInputs(inputs: {
  all: RowTensors;
  proxLogprobs?: tf.Tensor | undefined;
  isWeights?: tf.Tensor | undefined;
  refLogprobs?: tf.Tensor | undefined;
}): void {
  tf.dispose([...Object.values(inputs.all), inputs.proxLogprobs, inputs.isWeights, inputs.refLogprobs].filter((t): t is tf.Tensor => !!t));
}

function rowTensors(batch: Batch, from: number, to: number): RowTensors {
  const T = batch.promptLength + batch.responseLength;
  const R = batch.responseLength;
  const n = to - from;
  return {
    ids: tf.tensor2d(batch.inputIds.subarray(from * T, to * T), [n, T], 'int32'),
    attention: tf.tensor2d(batch.attentionMask.subarray(from * T, to * T), [n, T]),
    positions: tf.tensor2d(batch.positionIds.subarray(from * T, to * T), [n, T], 'int32'),
    lossMask: tf.tensor2d(batch.lossMask.subarray(from * R, to * R), [n, R]),
    oldLogprobs: tf.tensor2d(batch.oldLogprobs.subarray(from * R, to * R), [n, R]),
    advantages: tf.tensor2d(batch.advantages.subarray(from * R, to * R), [n, R]),
    ...(batch.refLogprobs ? { refLogprobs: tf.tensor2d(batch.refLogprobs.subarray(from * R, to * R), [n, R]) } : {}),
  };
}

function sum(values: ArrayLike<number>): number {
  let s = 0;
  for (let i = 0; i < values.length; i++) s += values[i];
  return s;
}
