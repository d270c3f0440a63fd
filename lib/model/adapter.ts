/**
 * What the decoder needs of an adapter: the targets it adapts, its scale, its `A`/`B` pair per layer and target, and
 * its weights. {@link LoraAdapter} (`lora.ts`) implements it; the decoder never imports LoRA itself.
 *
 * @packageDocumentation
 */
import type * as tf from '@tensorflow/tfjs-core';

import type { NamedWeights } from './types.js';
import type { ResolvedPolicyConfig } from './config.js';

/** A linear layer of a decoder block that an adapter can target (PEFT's `target_modules` names). */
export type LoraTarget = 'q_proj' | 'k_proj' | 'v_proj' | 'o_proj' | 'gate_proj' | 'up_proj' | 'down_proj';

/** Every {@link LoraTarget}, in block order. */
export const LORA_TARGETS: readonly LoraTarget[] = ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'];

/** One adapted layer: `A` held as `[in, r]` and `B` as `[r, out]`, so the update is two plain products. */
export interface LoraPair {
  readonly a: tf.Variable;
  readonly b: tf.Variable;
}

/** An adapter a {@link PolicyModel} view computes with (`W·x + scale·B·A·x` on its targets). */
export interface ModelAdapter {
  /** The architecture it was made for. */
  readonly config: ResolvedPolicyConfig;
  /** Its targets and the scale of its update. */
  readonly lora: { readonly targetModules: readonly LoraTarget[]; readonly scale: number };
  /** The pair of `layer`'s `target`, or null where it has none. */
  pair(layer: number, target: LoraTarget): LoraPair | null;
  /** Its weight names, in a stable order. */
  weightNames(): string[];
  /** Its trainable variables. */
  variables(): tf.Variable[];
  /** Its number of weights (scalars). */
  numParameters(): number;
  getWeights(): NamedWeights;
  setWeights(weights: NamedWeights): void;
  /** Frees its variables. */
  dispose(): void;
}
