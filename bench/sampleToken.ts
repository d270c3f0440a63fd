/**
 * Cost of one `sampleToken` call on a SmolLM2-sized row (49152 logits), per sampling setting: what the decode loop
 * pays per row per new token on the CPU, besides the model.
 *
 * Usage: `npm run bench -- sampleToken [--vocab 49152] [--draws 2000]`. Prints one JSON line per setting:
 * `{ bench, vocab, temperature, topP, topK, draws, usPerToken }`.
 *
 * @packageDocumentation
 */
import { sampleToken, type SamplingParams } from '../lib/model/sampling.js';
import { createRng, normalArray } from '../lib/core/random.js';

const SETTINGS: readonly SamplingParams[] = [
  { temperature: 0, topP: 1 },
  { temperature: 1, topP: 1 },
  { temperature: 0.7, topP: 1 },
  { temperature: 1, topP: 0.9 },
  { temperature: 0.7, topP: 0.9, topK: 50 },
  { temperature: 1, topP: 1, topK: 50 },
];

function flag(args: readonly string[], name: string, fallback: number): number {
  const at = args.indexOf(`--${name}`);
  return at >= 0 ? Number(args[at + 1]) : fallback;
}

/** Runs the bench; see the module comment. */
export async function main(args: readonly string[]): Promise<void> {
  const vocab = flag(args, 'vocab', 49152);
  const draws = flag(args, 'draws', 2000);
  const logits = normalArray(vocab, 2.5, createRng(1, 'logits')); // a bulk of ±7 with no single dominant token
  for (const params of SETTINGS) {
    const rng = createRng(2, 'draws');
    sampleToken(logits, 0, vocab, params, rng); // warm-up
    const started = process.hrtime.bigint();
    for (let i = 0; i < draws; i++) sampleToken(logits, 0, vocab, params, rng);
    const us = Number(process.hrtime.bigint() - started) / 1e3 / draws;
    console.log(
      JSON.stringify({ bench: 'sampleToken', vocab, ...params, topK: params.topK ?? 0, draws, usPerToken: Number(us.toFixed(1)) }),
    );
  }
}
