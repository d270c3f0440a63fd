/**
 * What the machine allows a GRPO step, at best: the arithmetic behind `bench trl`'s `trl-bounds` line.
 *
 * Two rates measured on the backend (an sgemm rate in GFLOP/s, a memory bandwidth in GB/s) and the shape of the
 * model and of the step give two lower bounds on seconds:
 *
 * A token through the model costs `2 · body` FLOPs (`body`: the blocks' linear weights) and, where its next-token
 * distribution is needed, `2 · head` more (`head`: the `[V, d]` output product).
 *
 * - **generation** reads every weight once per decoding step (float32, 4 bytes a weight; the batch's rows decode
 *   together, so one read serves them all): `weightBytes ÷ bandwidth × maxTokens`. Its FLOPs: each distinct prompt
 *   once through the blocks (a group's samples share their prompt), each row's response tokens through the blocks
 *   and the head: `2 · body · (prompts · promptTokens + rows · maxTokens) + 2 · head · rows · maxTokens`, `÷ sgemm`.
 *   The bound is the larger of the two.
 * - **training** runs, per PPO epoch, each distinct prompt once (a group's rows share their prompt's keys and values,
 *   and its gradient sums over them, as rxrl's trainer computes it) and each row's response tokens: a forward pass
 *   (`2 · body` a token, `2 · head` a response token) and a backward pass: with a LoRA adapter the frozen weights need only the gradients of their inputs (as
 *   much again; the adapter's own weight gradients are left out, rank ≪ width); full fine-tuning also takes each
 *   weight's gradient (twice the forward). A KL loss without reference log-probs in the batch adds the reference
 *   model's forward pass. `FLOPs ÷ sgemm` is the bound.
 *
 * Left out of both: attention's own products (`T²` terms, small at these lengths), norms, activations, the
 * optimizer, and any memory traffic of training. The bounds are what no implementation on this machine beats; a
 * measured time over its bound (`ratio`) says how far from it one runs.
 *
 * @packageDocumentation
 */
import { policyParamSpecs } from '../lib/model/transformer.js';
import type { PolicyConfig } from '../lib/model/config.js';

/** Bytes of one float32 weight. */
const WEIGHT_BYTES = 4;

/** Weight counts of a model. */
export interface ModelSizes {
  /** Every weight, a tied embedding once (what one pass over the weights reads). */
  readonly params: number;
  /** Weights of the matrix products a token goes through in the blocks (every linear layer but the head). */
  readonly bodyParams: number;
  /** Weights of the output head's product, `V · d` (a tied head too). */
  readonly headParams: number;
}

/** Weight counts of a model configuration. */
export function modelSizes(config: PolicyConfig): ModelSizes {
  let params = 0;
  let bodyParams = 0;
  for (const spec of policyParamSpecs(config)) {
    const n = spec.shape.reduce((a, b) => a * b, 1);
    params += n;
    if (spec.linear && spec.name !== 'lm_head.weight') bodyParams += n;
  }
  // The output head is a product with [V, d] whether it is its own weight or the tied embedding.
  return { params, bodyParams, headParams: config.vocabSize * config.dModel };
}

/** What {@link stepBounds} needs: the machine's rates, the model and one step's shape. */
export interface BoundsInput {
  readonly sizes: ModelSizes;
  /** Measured sgemm rate, GFLOP/s. */
  readonly gflops: number;
  /** Measured memory bandwidth, GB/s. */
  readonly bandwidthGBs: number;
  /** Completions per step (prompts × group size). */
  readonly rows: number;
  /** Completions per prompt (a group shares its prompt). */
  readonly groupSize: number;
  /** Mean prompt tokens of a row. */
  readonly promptTokens: number;
  /** Largest response: decoding steps per generation. */
  readonly maxTokens: number;
  /** Passes over the batch. */
  readonly ppoEpochs: number;
  /** A LoRA adapter trains (the frozen weights take no weight gradients). */
  readonly lora: boolean;
  /** A reference model's forward pass is part of the step (KL loss without reference log-probs in the batch). */
  readonly referenceForward: boolean;
}

/** Lower bounds on one step's generation and training seconds, with the quantities they come from. */
export interface StepBounds {
  /** Bytes read per decoding step: every weight once. */
  readonly decode_bytes: number;
  /** `decode_bytes ÷ bandwidth × maxTokens`. */
  readonly decode_memory_bound_s: number;
  /** FLOPs of generating the batch: each prompt once, each response token, and the head at each response token. */
  readonly generate_flops: number;
  /** `generate_flops ÷ sgemm`. */
  readonly generate_flops_bound_s: number;
  /** The larger of the two generation bounds. */
  readonly generate_bound_s: number;
  /** Tokens a training pass runs through the blocks: each prompt once, and every row's longest response. */
  readonly train_tokens: number;
  /** FLOPs of the training step (forward, backward, every PPO epoch, the reference forward if any). */
  readonly train_flops: number;
  /** `train_flops ÷ sgemm`. */
  readonly train_bound_s: number;
}

/** The bounds of one step (see the module's comment for the formulas and what they leave out). */
export function stepBounds(input: BoundsInput): StepBounds {
  const { sizes, rows, promptTokens, maxTokens } = input;
  const flopsPerSecond = input.gflops * 1e9;
  const decodeBytes = sizes.params * WEIGHT_BYTES;
  const decodeMemory = (decodeBytes / (input.bandwidthGBs * 1e9)) * maxTokens;
  const responseTokens = rows * maxTokens;
  const headFlops = 2 * sizes.headParams * responseTokens;
  const generateFlops = 2 * sizes.bodyParams * ((rows / input.groupSize) * promptTokens + responseTokens) + headFlops;
  const trainTokens = (rows / input.groupSize) * promptTokens + responseTokens;
  const forward = 2 * sizes.bodyParams * trainTokens + headFlops;
  const backward = (input.lora ? 1 : 2) * forward;
  const trainFlops = (forward + backward) * input.ppoEpochs + (input.referenceForward ? forward : 0);
  return {
    decode_bytes: decodeBytes,
    decode_memory_bound_s: decodeMemory,
    generate_flops: generateFlops,
    generate_flops_bound_s: generateFlops / flopsPerSecond,
    generate_bound_s: Math.max(decodeMemory, generateFlops / flopsPerSecond),
    train_tokens: trainTokens,
    train_flops: trainFlops,
    train_bound_s: trainFlops / flopsPerSecond,
  };
}
