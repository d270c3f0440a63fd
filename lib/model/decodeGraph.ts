/**
 * The prefill and the KV-cache decoding step as TensorFlow graphs (native backend): the same computation as the eager
 * passes of `PolicyModel` (same ops in the same order, so the same logits to float32 rounding), each run as one
 * session call instead of about 45 eager dispatches from JavaScript a block.
 *
 * A graph's inputs are the weights (read in place), the pass's tokens, their RoPE tables and attention bias and the
 * shapes that split heads (made here in plain memory, a few thousand values), and for a step or an extension each
 * block's cache; its outputs are the next-token logits `[b, V]` of each row's last position and each block's keys and
 * values (the prompt's, or the cache extended by the pass's positions). Batch size, positions a row and cache length
 * are left open, so one graph serves every pass of a kind for a model whose blocks have the same structure (fused or
 * not, biases, adapter pairs, q/k norms).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { MASK_BIAS, VOCAB_MAJOR_HEAD, type ResolvedPolicyConfig } from './config.js';
import type { BlockLinear, BlockWeights } from './samplingWeights.js';
import { GraphBuilder, GraphSession } from './tfGraph.js';

/** Keys and values of one block for a batch: `k [b, Hkv, L, dh]`, `v [b, Hkv, L, dh]`. */
export type LayerCache = {
  readonly k: tf.Tensor4D;
  readonly v: tf.Tensor4D;
};

/** What a pass reads besides its blocks. */
export interface DecodeWeights {
  readonly embedTokens: tf.Tensor;
  readonly finalNorm: tf.Tensor;
  /** The untied head `[d, V]`, or null (the embedding read transposed). */
  readonly lmHead: tf.Tensor | null;
  /** `[dh, dh]`: `x · rotateHalf = concat(−x₂, x₁)`. */
  readonly rotateHalf: tf.Tensor;
  readonly blocks: readonly BlockWeights[];
}

/**
 * One pass's inputs: `t` new tokens a row and their positions (row-major `[b, t]`), the keys' mask `[b, L+t]`, and
 * for a step the caches `[b, Hkv, L, dh]` (a prefill has none: `L` is 0).
 */
export interface DecodeStepInput {
  readonly rows: number;
  readonly tokens: Int32Array;
  readonly positions: Int32Array;
  readonly keyMask: Float32Array;
  readonly caches: readonly LayerCache[] | null;
}

/**
 * What a graph computes: a prompt batch from nothing (`prefill`), one more position of each row after its cache
 * (`step`), or several more (`extend`: the rest of prompts whose shared beginning is cached).
 */
export type DecodePass = 'prefill' | 'step' | 'extend';

/** A pass's weights flattened in graph-input order, with the structure that decides the graph (equal strings: the same graph). */
export interface DecodeFeeds {
  readonly tensors: readonly tf.Tensor[];
  readonly structure: string;
}

/** The weights a pass feeds, in graph-input order, and their structure: one walk over the blocks a pass. */
export function decodeFeeds(weights: DecodeWeights): DecodeFeeds {
  const tensors: tf.Tensor[] = [weights.embedTokens, weights.finalNorm, weights.rotateHalf];
  const parts: string[] = [weights.lmHead === null ? 'tied' : 'head'];
  if (weights.lmHead !== null) tensors.push(weights.lmHead);
  const linear = (layer: BlockLinear): string => {
    tensors.push(layer.w);
    if (layer.bias !== null) tensors.push(layer.bias);
    if (layer.lora !== null) tensors.push(layer.lora.a, layer.lora.b);
    return `${layer.outMajor ? 'T' : 'W'}${layer.bias === null ? '' : 'b'}${layer.lora === null ? '' : `l${layer.lora.scale}`}`;
  };
  for (const block of weights.blocks) {
    tensors.push(block.inputNorm, block.postNorm);
    if (block.qNorm !== null && block.kNorm !== null) tensors.push(block.qNorm, block.kNorm);
    const layers = [...block.qkv, block.o, ...block.gateUp, block.down].map(linear);
    parts.push(`${block.qNorm === null ? '' : 'n'}${block.qkv.length}${block.gateUp.length}:${layers.join(',')}`);
  }
  return { tensors, structure: parts.join('|') };
}

/** Typed shorthands over a {@link GraphBuilder} for float32 ops. */
class Ops {
  constructor(readonly g: GraphBuilder) {}

  private f(op: string, inputs: string[], attrs: Parameters<GraphBuilder['op']>[2] = {}): string {
    return this.g.op(op, inputs, { T: { type: 'float32' }, ...attrs });
  }

  add(a: string, b: string): string {
    return this.f('AddV2', [a, b]);
  }

  sub(a: string, b: string): string {
    return this.f('Sub', [a, b]);
  }

  mul(a: string, b: string): string {
    return this.f('Mul', [a, b]);
  }

  scalar(value: number): string {
    return this.g.constant(Float32Array.of(value), []);
  }

  matMul(a: string, b: string, transposeA = false, transposeB = false): string {
    return this.f('MatMul', [a, b], { transpose_a: { b: transposeA }, transpose_b: { b: transposeB } });
  }

  batchMatMul(a: string, b: string, adjY = false): string {
    return this.f('BatchMatMulV2', [a, b], { adj_x: { b: false }, adj_y: { b: adjY } });
  }

  reshape(x: string, shape: readonly number[]): string {
    return this.reshapeTo(x, this.g.ints(shape));
  }

  /** A reshape to a shape the graph computes or is fed (an int32 vector). */
  reshapeTo(x: string, shape: string): string {
    return this.f('Reshape', [x, shape], { Tshape: { type: 'int32' } });
  }

  transpose(x: string, perm: readonly number[]): string {
    return this.f('Transpose', [x, this.g.ints(perm)], { Tperm: { type: 'int32' } });
  }

  concat(values: readonly string[], axis: number): string {
    return this.f('ConcatV2', [...values, this.g.int(axis)], { N: { i: values.length }, Tidx: { type: 'int32' } });
  }

  /** Splits the last axis of a 2-D tensor into pieces of the given widths. */
  split(x: string, widths: readonly number[]): string[] {
    const first = this.f('SplitV', [x, this.g.ints(widths), this.g.int(1)], { Tlen: { type: 'int32' }, num_split: { i: widths.length } });
    return widths.map((_, i) => first.replace(/:0$/, `:${i}`));
  }

  unary(op: 'Square' | 'Rsqrt' | 'Sigmoid' | 'Softmax', x: string): string {
    return this.f(op, [x]);
  }

  /** The mean over the last axis, kept. */
  meanLast(x: string): string {
    return this.f('Mean', [x, this.g.int(-1)], { Tidx: { type: 'int32' }, keep_dims: { b: true } });
  }

  gather(params: string, indices: string): string {
    return this.g.op('GatherV2', [params, indices, this.g.int(0)], {
      Tparams: { type: 'float32' },
      Tindices: { type: 'int32' },
      Taxis: { type: 'int32' },
      batch_dims: { i: 0 },
    });
  }
}

/**
 * A compiled prefill or decoding step for one model structure: build it once (a new {@link DecodeFeeds.structure} needs
 * another), run it every pass with the current weights.
 */
export class DecodeGraph {
  private readonly session: GraphSession;
  private readonly pass: DecodePass;
  private readonly invFreq: Float32Array;
  /** A fused q/k/v row without q/k norms: one RoPE pass over the whole row (else queries and keys apart). */
  private readonly fusedRope: boolean;

  /**
   * @param weights - The weights whose structure (and shapes) the graph is written for ({@link decodeFeeds}).
   * @param invFreq - Rotary inverse frequencies `[dh/2]` (the model's, scaling applied).
   */
  constructor(
    private readonly config: ResolvedPolicyConfig,
    weights: DecodeWeights,
    invFreq: Float32Array,
    pass: DecodePass,
  ) {
    this.invFreq = invFreq;
    this.pass = pass;
    const first = weights.blocks[0];
    this.fusedRope = first !== undefined && first.qkv.length === 1 && first.qNorm === null;
    const g = new GraphBuilder();
    const built = new StepGraph(new Ops(g), config, weights, this.fusedRope, pass).build();
    this.session = new GraphSession(g, built.inputs, built.outputs);
  }

  /**
   * One pass: the next-token logits `[b, V]` of each row's last position, and each block's keys and values (the
   * prompt's, or the given caches extended by the step's; those are left to the caller). Tensors made here for the
   * pass are disposed by the caller's `tf.tidy`.
   */
  run(feeds: DecodeFeeds, input: DecodeStepInput): { logits: tf.Tensor2D; caches: LayerCache[] } {
    const { rows: b, tokens } = input;
    const t = tokens.length / b;
    if ((input.caches !== null) !== (this.pass !== 'prefill'))
      throw new Error(`DecodeGraph: a ${this.pass} graph given ${input.caches === null ? 'no caches' : 'caches'}`);
    const { nHeads: H, nKvHeads: Hkv, headDim: dh } = this.config;
    const g = H / Hkv;
    const shapes = (
      this.pass === 'step'
        ? []
        : [
            [b, t, H, dh],
            [b, t, Hkv, dh],
            [b, Hkv, g * t, dh],
            [b, H, t, dh],
          ]
    ).map((shape) => tf.tensor1d(shape, 'int32'));
    const tables = this.ropeTables(input.positions).map((table) => tf.tensor2d(table.values, [b * t, table.width]));
    const inputs = [
      ...feeds.tensors,
      tf.tensor1d(tokens, 'int32'),
      tf.tensor1d(
        Int32Array.from({ length: b }, (_, r) => r * t + t - 1),
        'int32',
      ),
      ...shapes,
      ...tables,
      this.bias(input.keyMask, b, t),
      ...(input.caches ?? []).flatMap((c) => [c.k, c.v]),
    ];
    const [logits, ...kv] = this.session.run(inputs);
    const caches = Array.from({ length: kv.length / 2 }, (_, i) => ({ k: kv[2 * i] as tf.Tensor4D, v: kv[2 * i + 1] as tf.Tensor4D }));
    return { logits: logits as tf.Tensor2D, caches };
  }

  /**
   * The additive attention bias of `t` queries a row over `K = L + t` keys, repeated for the `g` query heads of a
   * group, `[b, 1, g·t, K]`: 0 where query `i` may see key `j` (the key is real, and cached or `j − L ≤ i`),
   * {@link MASK_BIAS} elsewhere (as the eager passes' `attentionBias` and `groupBias`).
   */
  private bias(keyMask: Float32Array, b: number, t: number): tf.Tensor4D {
    const K = keyMask.length / b;
    const L = K - t;
    const g = this.config.nHeads / this.config.nKvHeads;
    const values = new Float32Array(b * g * t * K);
    for (let r = 0; r < b; r++) {
      for (let i = 0; i < t; i++) {
        const row = new Float32Array(K);
        for (let j = 0; j < K; j++) row[j] = keyMask[r * K + j] === 1 && (j < L || j - L <= i) ? 0 : MASK_BIAS;
        for (let h = 0; h < g; h++) values.set(row, ((r * g + h) * t + i) * K);
      }
    }
    return tf.tensor4d(values, [b, 1, g * t, K]);
  }

  /**
   * RoPE's cosines and sines for each row's position, as the eager step's tables: `[b, (H + 2·Hkv)·dh]` for a fused
   * row (the queries' scaled by `1/√dh`, 1 and 0 over the values, which RoPE leaves as they are), else the queries'
   * `[b, H·dh]` and the keys' `[b, Hkv·dh]`. Angles are float32 products, as the eager step's.
   */
  private ropeTables(positions: Int32Array): { values: Float32Array; width: number }[] {
    const { nHeads: H, nKvHeads: Hkv, headDim: dh } = this.config;
    const scale = Math.fround(1 / Math.sqrt(dh));
    const half = dh / 2;
    const angles = Array.from(positions, (p) => Array.from(this.invFreq, (f) => Math.fround(p * f)));
    /** Heads side by side: `[count, factor]`, factor null for value heads (cos 1, sin 0). */
    const table = (heads: readonly (readonly [number, number | null])[], trig: (a: number) => number, identity: number) => {
      const width = heads.reduce((w, [n]) => w + n * dh, 0);
      const values = new Float32Array(positions.length * width);
      angles.forEach((row, r) => {
        const head = Float32Array.from({ length: dh }, (_, j) => trig(row[j % half]));
        let at = r * width;
        for (const [n, factor] of heads) {
          for (let i = 0; i < n; i++, at += dh) {
            for (let j = 0; j < dh; j++) values[at + j] = factor === null ? identity : head[j] * factor;
          }
        }
      });
      return { values, width };
    };
    const rows = (heads: readonly (readonly [number, number | null])[]) => [table(heads, Math.cos, 1), table(heads, Math.sin, 0)];
    if (this.fusedRope) {
      return rows([
        [H, scale],
        [Hkv, 1],
        [Hkv, null],
      ]);
    }
    return [...rows([[H, scale]]), ...rows([[Hkv, 1]])];
  }

  dispose(): void {
    this.session.dispose();
  }
}

/** Writes a pass's nodes: the weights' inputs in {@link decodeFeeds}'s order, then the pass's own, then a step's caches. */
class StepGraph {
  private readonly inputs: string[] = [];
  /** The weights' shapes, in {@link decodeFeeds}'s order. */
  private readonly shapes: readonly (readonly number[])[];

  constructor(
    private readonly ops: Ops,
    private readonly config: ResolvedPolicyConfig,
    private readonly weights: DecodeWeights,
    private readonly fusedRope: boolean,
    private readonly pass: DecodePass,
  ) {
    this.shapes = decodeFeeds(weights).tensors.map((t) => t.shape);
  }

  /** A placeholder for the next weight of {@link decodeFeeds}'s order, of its shape. */
  private weight(): string {
    const shape = this.shapes[this.inputs.length];
    return this.input(`w${this.inputs.length}`, 'float32', shape);
  }

  /** A placeholder (shapes known to the graph, so that Grappler can plan every op). */
  private input(name: string, dtype: 'float32' | 'int32', shape: readonly (number | null)[]): string {
    const out = this.ops.g.placeholder(name, dtype, shape);
    this.inputs.push(out);
    return out;
  }

  build(): { inputs: string[]; outputs: string[] } {
    const { weights, ops } = this;
    const embed = this.weight();
    const finalNorm = this.weight();
    const rotate = this.weight();
    const lmHead = weights.lmHead === null ? null : this.weight();
    const blocks = weights.blocks.map((block) => this.blockWeights(block));
    const { nHeads: H, nKvHeads: Hkv, headDim: dh } = this.config;
    const tokens = this.input('tokens', 'int32', [null]);
    const last = this.input('last', 'int32', [null]);
    const split =
      this.pass === 'step'
        ? null
        : {
            q: this.input('shape_q', 'int32', [4]),
            kv: this.input('shape_kv', 'int32', [4]),
            qg: this.input('shape_qg', 'int32', [4]),
            o: this.input('shape_o', 'int32', [4]),
          };
    const table = (name: string, heads: number): RopeInputs => ({
      cos: this.input(`${name}_cos`, 'float32', [null, heads * dh]),
      sin: this.input(`${name}_sin`, 'float32', [null, heads * dh]),
    });
    const tables = this.fusedRope ? { qkv: table('qkv', H + 2 * Hkv) } : { q: table('q', H), k: table('k', Hkv) };
    const bias = this.input('bias', 'float32', [null, 1, null, null]);
    const cache = (name: string): string => this.input(name, 'float32', [null, Hkv, null, dh]);
    const caches = this.pass === 'prefill' ? null : blocks.map((_, i) => ({ k: cache(`k${i}`), v: cache(`v${i}`) }));
    let x = ops.gather(embed, tokens); // [b·t, d]
    const outputs: string[] = [];
    blocks.forEach((block, i) => {
      const cached = caches?.[i] ?? null;
      const attention = split === null ? this.stepAttention(bias, cached!) : this.promptAttention(bias, split, cached);
      const step = this.block(x, block, { rotate, tables, attention });
      x = step.x;
      outputs.push(step.k, step.v);
    });
    const h = this.rmsNorm(ops.gather(x, last), finalNorm); // each row's last position, [b, d]
    return { inputs: this.inputs, outputs: [this.head(h, embed, lmHead), ...outputs] };
  }

  /** Placeholders of a block's weights, in {@link decodeFeeds}'s order. */
  private blockWeights(block: BlockWeights): GraphBlock {
    const inputNorm = this.weight();
    const postNorm = this.weight();
    const norms = block.qNorm !== null && block.kNorm !== null ? { q: this.weight(), k: this.weight() } : null;
    const linear = (layer: BlockLinear): GraphLinear => ({
      w: this.weight(),
      outMajor: layer.outMajor,
      bias: layer.bias === null ? null : this.weight(),
      lora: layer.lora === null ? null : { a: this.weight(), b: this.weight(), scale: layer.lora.scale },
    });
    const qkv = block.qkv.map(linear);
    const o = linear(block.o);
    const gateUp = block.gateUp.map(linear);
    return { inputNorm, postNorm, norms, qkv, o, gateUp, down: linear(block.down) };
  }

  /**
   * A step's attention, one position a row: the new key and value appended to the cache, the `g` query heads of a
   * group stacked (reshapes only, as the eager step).
   */
  private stepAttention(bias: string, cache: { k: string; v: string }): GraphAttention {
    const { ops } = this;
    const { nHeads: H, nKvHeads: Hkv, headDim: dh } = this.config;
    return (q, k, v) => {
      const qg = ops.reshape(q, [-1, Hkv, H / Hkv, dh]); // [b, Hkv, g, dh]
      const keys = ops.concat([cache.k, ops.reshape(k, [-1, Hkv, 1, dh])], 2); // [b, Hkv, L+1, dh]
      const values = ops.concat([cache.v, ops.reshape(v, [-1, Hkv, 1, dh])], 2);
      const probs = ops.unary('Softmax', ops.add(ops.batchMatMul(qg, keys, true), bias)); // [b, Hkv, g, L+1]
      return { heads: ops.reshape(ops.batchMatMul(probs, values), [-1, H * dh]), k: keys, v: values };
    };
  }

  /**
   * A prompt's attention, `t` positions a row: heads split by the fed shapes, as the eager prefill; after `cache`'s
   * keys and values where the pass extends one.
   */
  private promptAttention(
    bias: string,
    shape: { q: string; kv: string; qg: string; o: string },
    cache: { k: string; v: string } | null,
  ): GraphAttention {
    const { ops } = this;
    const { nHeads: H, headDim: dh } = this.config;
    const heads = (x: string, to: string): string => ops.transpose(ops.reshapeTo(x, to), [0, 2, 1, 3]); // [b, heads, t, dh]
    return (q, k, v) => {
      const keys = cache === null ? heads(k, shape.kv) : ops.concat([cache.k, heads(k, shape.kv)], 2); // [b, Hkv, L+t, dh]
      const values = cache === null ? heads(v, shape.kv) : ops.concat([cache.v, heads(v, shape.kv)], 2);
      const qg = ops.reshapeTo(heads(q, shape.q), shape.qg); // [b, Hkv, g·t, dh]
      const probs = ops.unary('Softmax', ops.add(ops.batchMatMul(qg, keys, true), bias)); // [b, Hkv, g·t, L+t]
      const o = ops.transpose(ops.reshapeTo(ops.batchMatMul(probs, values), shape.o), [0, 2, 1, 3]); // [b, t, H, dh]
      return { heads: ops.reshape(o, [-1, H * dh]), k: keys, v: values };
    };
  }

  private block(x: string, block: GraphBlock, at: BlockInputs): { x: string; k: string; v: string } {
    const { ops } = this;
    const [q, k, v] = this.qkv(this.rmsNorm(x, block.inputNorm), block, at);
    const { heads, k: keys, v: values } = at.attention(q, k, v);
    const mid = ops.add(x, this.project(heads, block.o));
    const h = this.rmsNorm(mid, block.postNorm);
    const parts = block.gateUp.map((layer) => this.project(h, layer));
    const [gate, up] = parts.length === 2 ? parts : ops.split(parts[0], [this.config.dFF, this.config.dFF]);
    const act = ops.mul(ops.mul(gate, ops.unary('Sigmoid', gate)), up);
    return { x: ops.add(mid, this.project(act, block.down)), k: keys, v: values };
  }

  /** Queries (scaled), keys and values of the normed stream, after biases, q/k norms and RoPE. */
  private qkv(h: string, block: GraphBlock, at: BlockInputs): [string, string, string] {
    const { ops } = this;
    const { nHeads: H, nKvHeads: Hkv, headDim: dh } = this.config;
    const widths = [H * dh, Hkv * dh, Hkv * dh];
    const parts = block.qkv.map((layer) => this.project(h, layer));
    if ('qkv' in at.tables) {
      const [q, k, v] = ops.split(this.rope(parts[0], H + 2 * Hkv, at.rotate, at.tables.qkv), widths);
      return [q, k, v];
    }
    const [q0, k0, v] = parts.length === 3 ? parts : ops.split(parts[0], widths);
    let q = q0;
    let k = k0;
    if (block.norms !== null) {
      q = ops.reshape(this.rmsNorm(ops.reshape(q, [-1, dh]), block.norms.q), [-1, H * dh]);
      k = ops.reshape(this.rmsNorm(ops.reshape(k, [-1, dh]), block.norms.k), [-1, Hkv * dh]);
    }
    return [this.rope(q, H, at.rotate, at.tables.q), this.rope(k, Hkv, at.rotate, at.tables.k), v];
  }

  private rope(x: string, heads: number, rotate: string, { cos, sin }: { cos: string; sin: string }): string {
    const { ops } = this;
    const dh = this.config.headDim;
    const turned = ops.reshape(ops.matMul(ops.reshape(x, [-1, dh]), rotate), [-1, heads * dh]);
    return ops.add(ops.mul(x, cos), ops.mul(turned, sin));
  }

  private project(x: string, layer: GraphLinear): string {
    const { ops } = this;
    let y = ops.matMul(x, layer.w, false, layer.outMajor);
    if (layer.bias !== null) y = ops.add(y, layer.bias);
    if (layer.lora === null) return y;
    const low = ops.mul(ops.matMul(x, layer.lora.a), ops.scalar(layer.lora.scale));
    return ops.add(y, ops.matMul(low, layer.lora.b));
  }

  private rmsNorm(x: string, scale: string): string {
    const { ops } = this;
    const r = ops.unary('Rsqrt', ops.add(ops.meanLast(ops.unary('Square', x)), ops.scalar(this.config.rmsNormEps)));
    return ops.mul(ops.mul(x, r), scale);
  }

  private head(h: string, embed: string, lmHead: string | null): string {
    const { ops } = this;
    if (lmHead !== null) return ops.matMul(h, lmHead);
    if (this.config.vocabSize < VOCAB_MAJOR_HEAD) return ops.matMul(h, embed, false, true);
    return ops.transpose(ops.matMul(embed, h, false, true), [1, 0]);
  }
}

interface GraphLinear {
  readonly w: string;
  readonly outMajor: boolean;
  readonly bias: string | null;
  readonly lora: { readonly a: string; readonly b: string; readonly scale: number } | null;
}

interface GraphBlock {
  readonly inputNorm: string;
  readonly postNorm: string;
  readonly norms: { readonly q: string; readonly k: string } | null;
  readonly qkv: readonly GraphLinear[];
  readonly o: GraphLinear;
  readonly gateUp: readonly GraphLinear[];
  readonly down: GraphLinear;
}

interface BlockInputs {
  readonly rotate: string;
  readonly tables: { qkv: RopeInputs } | { q: RopeInputs; k: RopeInputs };
  readonly attention: GraphAttention;
}

/** Attention of a block: queries, keys and values `[b·t, ·]` in; merged heads `[b·t, H·dh]` and the block's keys and values out. */
type GraphAttention = (q: string, k: string, v: string) => { heads: string; k: string; v: string };

interface RopeInputs {
  readonly cos: string;
  readonly sin: string;
}
