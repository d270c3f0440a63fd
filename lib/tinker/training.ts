/**
 * One LoRA training client of rxrl's Tinker service: an adapter on a shared base model, the three losses of the
 * Tinker API over per-datum targets, gradients summed over `forward_backward` calls until `optim_step` applies them
 * with Adam (the call's own parameters: learning rate, betas, epsilon, decoupled weight decay, gradient clipping).
 *
 * A datum is a token sequence `x[0..T)` and per-position inputs of length `T`: position `i` predicts
 * `target_tokens[i]` from `x[0..i]`. Losses are sums over positions and datums, as Tinker's are:
 * - `cross_entropy`: `−Σ weights · logp`;
 * - `importance_sampling`: `−Σ exp(logp − logprobs) · advantages` (`logprobs`: the sampler's);
 * - `ppo`: `−Σ min(r · A, clip(r, low, high) · A)`, `r = exp(logp − logprobs)`, thresholds from `loss_fn_config`
 *   (`clip_low_threshold` 0.8, `clip_high_threshold` 1.2 by default).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { ConfigError, ShapeError } from '../core/errors.js';
import { LORA_TARGETS, LoraAdapter } from '../model/lora.js';
import { PolicyModel } from '../model/transformer.js';
import { mapInTurns, yieldToEventLoop } from '../core/turns.js';
import type { WireDatum, WireTensor } from './proto.js';

/** The losses a training client computes. */
export const TINKER_LOSSES = ['cross_entropy', 'importance_sampling', 'ppo'] as const;

/** A loss of {@link TINKER_LOSSES}. */
export type TinkerLoss = (typeof TINKER_LOSSES)[number];

/** Adam's parameters of one `optim_step` (Tinker's `AdamParams`). */
export interface AdamParams {
  readonly learningRate: number;
  readonly beta1: number;
  readonly beta2: number;
  readonly eps: number;
  /** Decoupled (AdamW) weight decay. */
  readonly weightDecay: number;
  /** Clip the gradient's global norm to this (0 = no clipping). */
  readonly gradClipNorm: number;
}

/** What `forward_backward` (or `forward`) returns: per datum its log-probs and losses, and summed metrics. */
export interface ForwardResult {
  readonly outputs: { readonly logprobs: Float32Array; readonly elementwise_loss: Float32Array }[];
  readonly metrics: Record<string, number>;
}

/**
 * Padded positions (datums × their longest length) one chunk of a `forward_backward` computes before the trainer
 * yields to the event loop: small enough that a server answers in between (its health check), large enough to
 * batch. Default of {@link TinkerTrainerOptions.chunkTokens}.
 */
export const DEFAULT_CHUNK_TOKENS = 128;

/** Options of a {@link TinkerTrainer}. */
export interface TinkerTrainerOptions {
  /** Padded positions per chunk of a forward pass (at least one datum each). Default {@link DEFAULT_CHUNK_TOKENS}. */
  readonly chunkTokens?: number;
}

/** A LoRA training client: its adapter, its view of the base, its summed gradients and its Adam state. */
export class TinkerTrainer {
  readonly adapter: LoraAdapter;
  readonly view: PolicyModel;
  private grads = new Map<string, tf.Tensor>();
  private readonly moments = new Map<string, { m: tf.Tensor; v: tf.Tensor }>();
  /** Optimizer steps taken. */
  steps = 0;
  private readonly chunkTokens: number;

  /**
   * @param base - The shared base model (not owned).
   * @param rank - LoRA rank; every linear layer of every block is adapted, with `alpha = rank` (scale 1).
   * @param seed - Seed of the adapter's initialization.
   * @param options - How the forward pass is cut into chunks.
   */
  constructor(
    readonly base: PolicyModel,
    readonly rank: number,
    seed: number,
    options: TinkerTrainerOptions = {},
  ) {
    if (!Number.isInteger(rank) || rank < 1) throw new ConfigError(`lora rank must be an integer >= 1, got ${rank}`);
    this.chunkTokens = options.chunkTokens ?? DEFAULT_CHUNK_TOKENS;
    if (!Number.isInteger(this.chunkTokens) || this.chunkTokens < 1) {
      throw new ConfigError(`chunkTokens must be an integer >= 1, got ${this.chunkTokens}`, { context: { key: 'chunkTokens' } });
    }
    this.adapter = LoraAdapter.create(base.config, { rank, alpha: rank, targetModules: LORA_TARGETS }, seed);
    this.view = PolicyModel.withAdapter(base, this.adapter);
  }

  /**
   * Log-probs of each datum's targets under the current adapter and the loss; with `backward`, the loss's gradient
   * is added to the gradients an {@link TinkerTrainer.optimStep} applies. The datums are computed in chunks of
   * `chunkTokens` padded positions, with a turn of the event loop before each chunk.
   *
   * @throws {@link ConfigError} for an unknown loss; {@link ShapeError} for a datum whose inputs do not fit it.
   */
  async forward(
    data: readonly WireDatum[],
    loss: string,
    config: Readonly<Record<string, number | string>>,
    backward: boolean,
  ): Promise<ForwardResult> {
    if (!(TINKER_LOSSES as readonly string[]).includes(loss)) {
      throw new ConfigError(`unknown loss_fn '${loss}'; this service computes ${TINKER_LOSSES.join(', ')}`, {
        context: { key: 'loss_fn' },
      });
    }
    const V = this.base.config.vocabSize;
    const inputs = await mapInTurns(data, (datum, index) => datumInputs(datum, loss as TinkerLoss, index, V), 64);
    const outputs: ForwardResult['outputs'] = [];
    let total = 0;
    for (const chunk of chunksOf(data, V, this.chunkTokens)) {
      // A turn of the event loop before each chunk: the request that queued this work has been answered, and other
      // requests (a health check) are served between chunks.
      await yieldToEventLoop();
      const rows = chunk.map((index) => ({ datum: data[index], inputs: inputs[index] }));
      const out = this.forwardChunk(rows, loss as TinkerLoss, config, backward);
      total += out.loss;
      rows.forEach(({ datum }, b) => {
        const n = datum.tokens.length;
        outputs[chunk[b]] = {
          logprobs: out.logp.slice(b * out.T, b * out.T + n),
          elementwise_loss: out.elementwise.slice(b * out.T, b * out.T + n),
        };
      });
    }
    return { outputs, metrics: { 'loss:sum': total } };
  }

  /** One chunk of {@link TinkerTrainer.forward}: its summed loss, and per padded position `[B·T]` log-probs and losses. */
  private forwardChunk(
    rows: readonly { readonly datum: WireDatum; readonly inputs: DatumInputs }[],
    loss: TinkerLoss,
    config: Readonly<Record<string, number | string>>,
    backward: boolean,
  ): { loss: number; logp: Float32Array; elementwise: Float32Array; T: number } {
    const B = rows.length;
    const T = Math.max(...rows.map((r) => r.datum.tokens.length));
    // Right-padded: a causal model's real positions never see the padding, and padded positions weigh 0.
    const ids = new Int32Array(B * T);
    const mask = new Float32Array(B * T);
    const targets = new Int32Array(B * T);
    const a = new Float32Array(B * T); // weights (cross_entropy) or advantages
    const old = new Float32Array(B * T); // sampler log-probs (importance_sampling, ppo)
    rows.forEach(({ datum, inputs: x }, b) => {
      datum.tokens.forEach((token, t) => {
        ids[b * T + t] = token;
        mask[b * T + t] = 1;
        targets[b * T + t] = x.targets[t];
        a[b * T + t] = (x.weights ?? x.advantages)![t];
        if (x.logprobs) old[b * T + t] = x.logprobs[t];
      });
    });
    const compute = (): { loss: tf.Scalar; logp: tf.Tensor1D; elementwise: tf.Tensor1D } => {
      const positions = tf.tensor2d(
        Int32Array.from({ length: B * T }, (_, i) => i % T),
        [B, T],
        'int32',
      );
      const logits = this.view.logits(tf.tensor2d(ids, [B, T], 'int32'), tf.tensor2d(mask, [B, T]), positions); // [B, T, V]
      const V = logits.shape[2];
      const logSoft = tf.logSoftmax(tf.reshape(logits, [B * T, V]));
      const oneHot = tf.cast(tf.oneHot(tf.tensor1d(targets, 'int32'), V), 'float32');
      const logp = tf.sum(tf.mul(logSoft, oneHot), -1) as tf.Tensor1D; // [B*T]
      const elementwise = tf.mul(elementwiseLoss(loss, logp, tf.tensor1d(a), tf.tensor1d(old), config), tf.tensor1d(mask)) as tf.Tensor1D;
      return { loss: tf.sum(elementwise) as tf.Scalar, logp, elementwise };
    };
    if (!backward) {
      const out = tf.tidy(() => {
        const r = compute();
        return [r.loss, r.logp, r.elementwise] as const;
      });
      const result = {
        loss: out[0].dataSync()[0],
        logp: out[1].dataSync() as Float32Array,
        elementwise: out[2].dataSync() as Float32Array,
        T,
      };
      tf.dispose([...out]);
      return result;
    }
    let kept: { logp: tf.Tensor1D; elementwise: tf.Tensor1D } | undefined;
    const { value, grads } = tf.variableGrads(() => {
      const out = compute();
      kept = { logp: tf.keep(out.logp), elementwise: tf.keep(out.elementwise) };
      return out.loss;
    }, this.view.trainableVariables());
    const total = value.dataSync()[0];
    value.dispose();
    this.addGrads(grads);
    const result = {
      loss: total,
      logp: kept!.logp.dataSync() as Float32Array,
      elementwise: kept!.elementwise.dataSync() as Float32Array,
      T,
    };
    tf.dispose([kept!.logp, kept!.elementwise]);
    return result;
  }

  /** Applies the summed gradients with Adam and clears them; the metrics say the gradient norm before clipping. */
  optimStep(adam: AdamParams): Record<string, number> {
    const variables = this.view.trainableVariables();
    const names = this.adapter.weightNames();
    let norm = 0;
    tf.tidy(() => {
      const squares = [...this.grads.values()].map((g) => tf.sum(tf.square(g)));
      norm = squares.length === 0 ? 0 : Math.sqrt(tf.addN(squares).dataSync()[0]);
    });
    const clip = adam.gradClipNorm > 0 && norm > adam.gradClipNorm ? adam.gradClipNorm / norm : 1;
    this.steps++;
    const t = this.steps;
    variables.forEach((variable, i) => {
      const grad = this.grads.get(names[i]);
      if (grad === undefined) return;
      const state = this.moments.get(names[i]) ?? { m: tf.zerosLike(variable), v: tf.zerosLike(variable) };
      const next = tf.tidy(() => {
        const g = tf.mul(grad, clip);
        const m = tf.add(tf.mul(state.m, adam.beta1), tf.mul(g, 1 - adam.beta1));
        const v = tf.add(tf.mul(state.v, adam.beta2), tf.mul(tf.square(g), 1 - adam.beta2));
        const mHat = tf.div(m, 1 - adam.beta1 ** t);
        const vHat = tf.div(v, 1 - adam.beta2 ** t);
        const step = tf.add(tf.div(mHat, tf.add(tf.sqrt(vHat), adam.eps)), tf.mul(variable, adam.weightDecay));
        variable.assign(tf.sub(variable, tf.mul(step, adam.learningRate)));
        return { m, v };
      });
      tf.dispose([state.m, state.v]);
      this.moments.set(names[i], next);
    });
    this.view.weightsChanged();
    this.clearGrads();
    return { 'grad_norm:mean': norm, 'learning_rate:mean': adam.learningRate };
  }

  /** The adapter's weights and, for a full state, the Adam moments and step (`m/<name>`, `v/<name>`, `step`). */
  state(withOptimizer: boolean): Map<string, { shape: number[]; data: Float32Array }> {
    const out = new Map<string, { shape: number[]; data: Float32Array }>();
    for (const [name, w] of this.adapter.getWeights()) out.set(name, { shape: [...w.shape], data: w.data });
    if (withOptimizer) {
      for (const [name, { m, v }] of this.moments) {
        out.set(`m/${name}`, { shape: [...m.shape], data: m.dataSync() as Float32Array });
        out.set(`v/${name}`, { shape: [...v.shape], data: v.dataSync() as Float32Array });
      }
      out.set('step', { shape: [1], data: Float32Array.of(this.steps) });
    }
    return out;
  }

  /** Restores {@link TinkerTrainer.state}: the adapter's weights, and the optimizer's when the state has them. */
  restore(state: ReadonlyMap<string, { readonly shape: readonly number[]; readonly data: Float32Array }>, withOptimizer: boolean): void {
    const weights = new Map([...state].filter(([name]) => !name.startsWith('m/') && !name.startsWith('v/') && name !== 'step'));
    this.view.setWeights(weights);
    this.clearGrads();
    for (const { m, v } of this.moments.values()) tf.dispose([m, v]);
    this.moments.clear();
    this.steps = 0;
    if (!withOptimizer) return;
    for (const name of this.adapter.weightNames()) {
      const m = state.get(`m/${name}`);
      const v = state.get(`v/${name}`);
      if (m === undefined || v === undefined) continue;
      // Moments are kept in the variables' layout; the saved arrays are in that layout too.
      this.moments.set(name, { m: tf.tensor(m.data, [...m.shape]), v: tf.tensor(v.data, [...v.shape]) });
    }
    this.steps = state.get('step')?.data[0] ?? 0;
  }

  /** Releases the adapter, the gradients and the optimizer state (the base is the service's). */
  dispose(): void {
    this.clearGrads();
    for (const { m, v } of this.moments.values()) tf.dispose([m, v]);
    this.moments.clear();
    this.view.dispose();
    this.adapter.dispose();
  }

  private addGrads(grads: Record<string, tf.Tensor>): void {
    const names = this.adapter.weightNames();
    const variables = this.view.trainableVariables();
    variables.forEach((variable, i) => {
      const grad = grads[variable.name];
      if (grad === undefined) return;
      const prev = this.grads.get(names[i]);
      if (prev === undefined) {
        this.grads.set(names[i], grad);
      } else {
        this.grads.set(names[i], tf.add(prev, grad));
        tf.dispose([prev, grad]);
      }
    });
  }

  private clearGrads(): void {
    tf.dispose([...this.grads.values()]);
    this.grads = new Map();
  }
}

/** A datum's per-position inputs, checked against its length and the vocabulary. */
interface DatumInputs {
  readonly targets: number[];
  readonly weights?: Float32Array;
  readonly logprobs?: Float32Array;
  readonly advantages?: Float32Array;
}

function datumInputs(datum: WireDatum, loss: TinkerLoss, index: number, vocabSize: number): DatumInputs {
  const T = datum.tokens.length;
  const where = `data[${index}]`;
  if (T === 0) throw new ShapeError(`${where}: model_input is empty`);
  if (!datum.tokens.every((t) => Number.isInteger(t) && t >= 0 && t < vocabSize)) {
    throw new ShapeError(`${where}: model_input has token ids outside [0, ${vocabSize})`);
  }
  const tensor = (name: string): WireTensor => {
    const t = datum.lossFnInputs[name];
    if (t === undefined) throw new ShapeError(`${where}: loss_fn_inputs needs '${name}' for ${loss}`);
    if (t.data.length !== T) throw new ShapeError(`${where}: loss_fn_inputs.${name} has ${t.data.length} values for ${T} positions`);
    return t;
  };
  const floats = (name: string): Float32Array => {
    const values = Float32Array.from(tensor(name).data as ArrayLike<number>, Number);
    if (!values.every(Number.isFinite)) throw new ShapeError(`${where}: loss_fn_inputs.${name} has a value that is not finite`);
    return values;
  };
  const targets = Array.from(tensor('target_tokens').data as ArrayLike<number | bigint>, Number);
  if (!targets.every((t: number) => Number.isInteger(t) && t >= 0 && t < vocabSize)) {
    throw new ShapeError(`${where}: target_tokens has ids outside [0, ${vocabSize})`);
  }
  if (loss === 'cross_entropy') return { targets, weights: floats('weights') };
  return { targets, logprobs: floats('logprobs'), advantages: floats('advantages') };
}

/**
 * Datums computed together: at most 64, their padded positions within `chunkTokens`, and those times the
 * vocabulary within 2^25 floats (the logits); a datum longer than a chunk's budget is a chunk of its own.
 */
function chunksOf(data: readonly WireDatum[], vocabSize: number, chunkTokens: number): number[][] {
  const budget = 2 ** 25;
  const chunks: number[][] = [];
  let chunk: number[] = [];
  let longest = 0;
  data.forEach((datum, index) => {
    const T = Math.max(longest, datum.tokens.length);
    const rows = chunk.length + 1;
    if (chunk.length > 0 && (chunk.length >= 64 || rows * T > chunkTokens || rows * T * vocabSize > budget)) {
      chunks.push(chunk);
      chunk = [];
      longest = 0;
    }
    chunk.push(index);
    longest = Math.max(longest, datum.tokens.length);
  });
  if (chunk.length > 0) chunks.push(chunk);
  return chunks;
}

/**
 * The loss at each position: `a` holds the weights (`cross_entropy`) or the advantages, `old` the sampler's
 * log-probs.
 */
function elementwiseLoss(
  loss: TinkerLoss,
  logp: tf.Tensor1D,
  a: tf.Tensor1D,
  old: tf.Tensor1D,
  config: Readonly<Record<string, number | string>>,
): tf.Tensor1D {
  if (loss === 'cross_entropy') return tf.neg(tf.mul(logp, a)) as tf.Tensor1D;
  const advantages = a;
  const ratio = tf.exp(tf.sub(logp, old));
  if (loss === 'importance_sampling') return tf.neg(tf.mul(ratio, advantages)) as tf.Tensor1D;
  const low = typeof config.clip_low_threshold === 'number' ? config.clip_low_threshold : 0.8;
  const high = typeof config.clip_high_threshold === 'number' ? config.clip_high_threshold : 1.2;
  const clipped = tf.clipByValue(ratio, low, high);
  return tf.neg(tf.minimum(tf.mul(ratio, advantages), tf.mul(clipped, advantages))) as tf.Tensor1D;
}
