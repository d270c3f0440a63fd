import type { NamedWeights, WeightArray } from '../../lib/model/types.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { PolicyModel, validatePolicyConfig, type PolicyConfig } from '../../lib/model/transformer.js';

/** Logit margin of a scripted token: p(scripted) ≈ 1 − V·e^−margin at temperature 1. */
const SCRIPT_MARGIN = 30;
/** Slope of the gate pre-activations: SiLU(K·z) is ReLU(K·z) to float32 precision once K·|z| ≫ 30. */
const GATE_SLOPE = 1e5;

/**
 * Weights of a real {@link PolicyModel} (a plain Llama block, untied head) whose next token depends only on the
 * position: at position `p` it samples `script[p]` (a character, or `'<eos>'`) with probability ≈ 1 at any
 * temperature, and uniformly where the script has nothing. Prompts must start with the BOS token.
 *
 * How (residual dims: 0 constant, 1 BOS marker, 2 position signal, 3… one per scripted token):
 * - every token embeds as `e0`, BOS as `e0 + e1`;
 * - layer 0's attention has zero queries and keys, so each position attends uniformly to its `p + 1` real
 *   tokens; values read the BOS marker, so the output `β/(p+1)` (β: the normed marker) lands in dim 2;
 * - layer 0's SwiGLU computes `Σ_j W_j · ReLU(s − s_j)` of that signal `s` (gate = K·(s − s_j), up = the
 *   constant dim), a piecewise-linear function whose knots are the signals of every position: the `W_j`
 *   are solved so its value at position `p` is the scripted token's direction (a per-position positive scale
 *   from the norms does not matter: the final RMSNorm removes it);
 * - the head maps each token direction to its token with the margin; other layers add nothing.
 *
 * @param config - Architecture; needs `dModel ≥ 3 + distinct scripted tokens` and `dFF ≥ maxSeqLen − 1`.
 * @param tokenizer - Maps the script's characters to ids (its `bosId` starts every prompt).
 * @param script - Position → the token sampled there (the token at that position of the full sequence).
 */
export function scriptedWeights(config: PolicyConfig, tokenizer: Tokenizer, script: ReadonlyMap<number, string>): NamedWeights {
  const c = validatePolicyConfig(config);
  if (c.tieWordEmbeddings || c.qkNorm || c.qkvBias) throw new Error('scriptedWeights needs a plain Llama block with an untied head');
  const { dModel: d, vocabSize: V, maxSeqLen: S, dFF: F } = c;
  const tokenOf = (char: string): number => (char === '<eos>' ? tokenizer.eosId : tokenizer.encode(char)[0]);
  const tokens = [...new Set([...script.values()].map(tokenOf))];
  if (d < 3 + tokens.length) throw new Error(`scriptedWeights needs dModel >= ${3 + tokens.length}`);
  if (F < S - 1) throw new Error(`scriptedWeights needs dFF >= ${S - 1}`);
  const bos = tokenizer.bosId;
  if (bos === undefined || bos === null) throw new Error('scriptedWeights needs a tokenizer with a BOS token');

  const base = PolicyModel.create(c, 0);
  const weights = new Map<string, WeightArray>(base.getWeights());
  base.dispose();
  const zeros = (name: string): Float32Array => {
    const w = weights.get(name) as WeightArray;
    const data = new Float32Array(w.data.length);
    weights.set(name, { shape: w.shape, data });
    return data;
  };
  const L0 = 'model.layers.0';
  // Embeddings: e0 for every token, e0 + e1 for BOS.
  const embed = zeros('model.embed_tokens.weight');
  for (let t = 0; t < V; t++) embed[t * d] = 1;
  embed[bos * d + 1] = 1;
  // Attention of layer 0: uniform (no queries, no keys); the value of head 0, channel 0 reads the BOS marker;
  // the output projection writes it to dim 2. Later layers write nothing back.
  zeros(`${L0}.self_attn.q_proj.weight`);
  zeros(`${L0}.self_attn.k_proj.weight`);
  zeros(`${L0}.self_attn.v_proj.weight`)[0 * d + 1] = 1; // [out, in]: channel 0 ← dim 1
  zeros(`${L0}.self_attn.o_proj.weight`)[2 * (c.nHeads * c.headDim) + 0] = 1; // dim 2 ← head 0, channel 0
  for (let i = 1; i < c.nLayers; i++) {
    zeros(`model.layers.${i}.self_attn.o_proj.weight`);
    zeros(`model.layers.${i}.mlp.down_proj.weight`);
  }
  // The signal at each position, computed as the model does (RMSNorm of the BOS embedding, uniform average).
  const beta = Math.sqrt(d / 2); // normed BOS marker: 1 / √((1 + 1) / d)
  const signal = Array.from({ length: S }, (_, p) => beta / (p + 1)); // s_p, decreasing in p
  // Targets: the token direction to produce at position p (predicting position p + 1), or nothing.
  const slot = new Map(tokens.map((t, i) => [t, 3 + i]));
  const target = (p: number): number | undefined => {
    const char = script.get(p + 1);
    return char === undefined ? undefined : slot.get(tokenOf(char));
  };
  // Unit j (knot s_j, j = 1 … S−1) is active at position p iff p < j. Solve W_j (one weight per residual dim)
  // from the last position backwards: g(s_p) = Σ_{j>p} W_j·(s_p − s_j) = target(p).
  const W = Array.from({ length: S }, () => new Float64Array(d));
  for (let p = S - 2; p >= 0; p--) {
    const want = new Float64Array(d);
    const k = target(p);
    if (k !== undefined) want[k] = 1;
    for (let j = p + 2; j < S; j++) {
      for (let r = 0; r < d; r++) want[r] -= W[j][r] * (signal[p] - signal[j]);
    }
    for (let r = 0; r < d; r++) W[p + 1][r] = want[r] / (signal[p] - signal[p + 1]);
  }
  // SwiGLU of layer 0, unit u = j − 1: gate = K·(x₂ − s_j·x₀) = K·(s − s_j)·(x₀ / c); up = x₀; down = W_j.
  const gate = zeros(`${L0}.mlp.gate_proj.weight`); // [F, d]
  const up = zeros(`${L0}.mlp.up_proj.weight`); // [F, d]
  const down = zeros(`${L0}.mlp.down_proj.weight`); // [d, F]
  for (let j = 1; j < S; j++) {
    const u = j - 1;
    gate[u * d + 2] = GATE_SLOPE;
    gate[u * d + 0] = -GATE_SLOPE * signal[j];
    up[u * d + 0] = 1;
    for (let r = 0; r < d; r++) down[r * F + u] = W[j][r];
  }
  // Head: token direction → its token. After the final RMSNorm the direction has length ≈ √d.
  const head = zeros('lm_head.weight'); // [V, d]
  for (const [token, k] of slot) head[token * d + k] = SCRIPT_MARGIN / Math.sqrt(d);
  return weights;
}

/** A script that writes `text` (then `<eos>` when `stop`) from position `start` on. */
export function writeAt(start: number, text: string, stop = true): Map<number, string> {
  const script = new Map<number, string>();
  [...text].forEach((c, i) => script.set(start + i, c));
  if (stop) script.set(start + text.length, '<eos>');
  return script;
}

/** Merges scripts (later ones win). */
export function mergeScripts(...scripts: ReadonlyMap<number, string>[]): Map<number, string> {
  const out = new Map<number, string>();
  for (const s of scripts) for (const [k, v] of s) out.set(k, v);
  return out;
}
