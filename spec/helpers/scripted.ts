import type { NamedWeights, WeightArray } from '../../lib/engine/types.js';
import type { Tokenizer } from '../../lib/engine/types.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';

/** Logit margin of a scripted token (after the final RMSNorm): p(scripted) ≈ 1 − V·e^−margin. */
const SCRIPT_MARGIN = 30;

/**
 * Weights of a real {@link PolicyModel} whose next token depends only on the position: at position `p` it
 * samples `script[p]` (a character, or `'<eos>'`) with probability ≈ 1 at any temperature, and uniformly where
 * the script has nothing. Every block's output projections are zero, so the residual stream is the position
 * embedding `e_p` (one-hot), and the head maps it to the scripted token.
 *
 * @param config - Architecture; `dModel` must be at least `maxSeqLen`.
 * @param tokenizer - Maps the script's characters to ids.
 * @param script - Position → the token sampled there (the token at that position of the full sequence).
 */
export function scriptedWeights(config: PolicyConfig, tokenizer: Tokenizer, script: ReadonlyMap<number, string>): NamedWeights {
  if (config.dModel < config.maxSeqLen) throw new Error('scriptedWeights needs dModel >= maxSeqLen');
  const base = PolicyModel.create(config, 0);
  const weights = new Map<string, WeightArray>(base.getWeights());
  base.dispose();
  const d = config.dModel;
  const V = config.vocabSize;
  const zero = (name: string): void => {
    const w = weights.get(name)!;
    weights.set(name, { shape: w.shape, data: new Float32Array(w.data.length) });
  };
  zero('tokEmbedding');
  for (const name of weights.keys()) if (/\.(attn\.wo|mlp\.wOut)$/.test(name)) zero(name);
  const pos = new Float32Array(config.maxSeqLen * d);
  for (let p = 0; p < config.maxSeqLen; p++) pos[p * d + p] = 1;
  weights.set('posEmbedding', { shape: [config.maxSeqLen, d], data: pos });
  // RMSNorm scales the one-hot e_p by √d; the head row p then holds the logits of the token at p + 1.
  const head = new Float32Array(d * V);
  for (const [position, char] of script) {
    if (position < 1 || position > config.maxSeqLen) continue;
    const token = char === '<eos>' ? tokenizer.eosId : tokenizer.encode(char)[0];
    head[(position - 1) * V + token] = SCRIPT_MARGIN / Math.sqrt(d);
  }
  weights.set('lmHead', { shape: [d, V], data: head });
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
