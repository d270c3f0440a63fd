/**
 * What the Tinker protobuf codec (lib/tinker/proto.ts) costs on realistic messages: a `ForwardBackwardRequest` as the
 * SDK sends one from an RL loop (`--datums` datums of `--tokens` tokens, each with `target_tokens` int64,
 * `logprobs` and `advantages` float32 `[T]`, importance_sampling config), the `ForwardBackwardOutput` the service
 * answers it with (`logprobs` and `elementwise_loss` per datum) and a `SampleResponse` of `--samples` sequences.
 * Data is seeded; each operation runs once to warm up, then `--rounds` times.
 *
 * Usage: `npm run bench -- protobuf [--datums 64] [--tokens 512] [--samples 16] [--rounds 30]`. Prints one JSON
 * line per operation: `{ bench, op, bytes, rounds, msMedian, mbPerSecond }` (bytes: the encoded message's size).
 *
 * @packageDocumentation
 */
import { createRng, normalArray } from '../lib/core/random.js';
import {
  decodeForwardBackwardOutput,
  decodeForwardBackwardRequest,
  decodeSampleResponse,
  encodeForwardBackwardOutput,
  encodeForwardBackwardRequest,
  encodeSampleResponse,
  type ForwardBackwardOutputWire,
  type ForwardBackwardRequest,
  type SampleResponseWire,
} from '../lib/tinker/proto.js';
import { median } from './_stats.js';

function flag(args: readonly string[], name: string, fallback: number): number {
  const at = args.indexOf(`--${name}`);
  return at >= 0 ? Number(args[at + 1]) : fallback;
}

const VOCAB = 49152;

function tokenIds(n: number, seed: number): number[] {
  const rng = createRng(seed, 'tokens');
  return Array.from({ length: n }, () => Math.floor(rng.next() * VOCAB));
}

function request(datums: number, tokens: number): ForwardBackwardRequest {
  const data = Array.from({ length: datums }, (_, i) => {
    const ids = tokenIds(tokens + 1, i);
    const logprobs = normalArray(tokens, 1, createRng(i, 'logprobs')).map((x) => -Math.abs(x));
    const advantages = new Float32Array(tokens).fill(i % 2 === 0 ? 0.5 : -0.5);
    return {
      tokens: ids.slice(0, tokens),
      lossFnInputs: {
        target_tokens: { dtype: 'int64' as const, data: ids.slice(1), shape: [tokens] },
        logprobs: { dtype: 'float32' as const, data: logprobs, shape: [tokens] },
        advantages: { dtype: 'float32' as const, data: advantages, shape: [tokens] },
      },
    };
  });
  return {
    modelId: 'sess-1:train:0',
    seqId: 7,
    data,
    lossFn: 'importance_sampling',
    lossFnConfig: { clip_low: 0.8, clip_high: 1.2 },
    forwardOnly: false,
  };
}

function output(datums: number, tokens: number): ForwardBackwardOutputWire {
  const outputs = Array.from({ length: datums }, (_, i) => ({
    logprobs: normalArray(tokens, 1, createRng(i, 'out')).map((x) => -Math.abs(x)),
    elementwise_loss: normalArray(tokens, 1, createRng(i, 'loss')),
  }));
  return { outputs, metrics: { 'loss:sum': 12.5, 'tokens:sum': datums * tokens } };
}

function samples(n: number, tokens: number): SampleResponseWire {
  const sequences = Array.from({ length: n }, (_, i) => ({
    tokens: tokenIds(tokens, 1000 + i),
    logprobs: Array.from(normalArray(tokens, 1, createRng(i, 'sample')), (x) => Math.fround(-Math.abs(x))),
    stopReason: i % 3 === 0 ? ('length' as const) : ('stop' as const),
  }));
  return {
    sequences,
    promptLogprobs: [Number.NaN, ...Array.from(normalArray(tokens - 1, 1, createRng(0, 'prompt')), (x) => -Math.abs(x))],
  };
}

/** Times `op` (after one warm-up call); prints its line. */
function time(op: string, bytes: number, rounds: number, run: () => unknown): void {
  run();
  const ms: number[] = [];
  for (let i = 0; i < rounds; i++) {
    const started = process.hrtime.bigint();
    run();
    ms.push(Number(process.hrtime.bigint() - started) / 1e6);
  }
  const msMedian = median(ms);
  const mbPerSecond = bytes / 1e6 / (msMedian / 1e3);
  console.log(
    JSON.stringify({
      bench: 'protobuf',
      op,
      bytes,
      rounds,
      msMedian: Number(msMedian.toFixed(3)),
      mbPerSecond: Number(mbPerSecond.toFixed(1)),
    }),
  );
}

/** Runs the bench; see the module comment. */
export async function main(args: readonly string[]): Promise<void> {
  const datums = flag(args, 'datums', 64);
  const tokens = flag(args, 'tokens', 512);
  const n = flag(args, 'samples', 16);
  const rounds = flag(args, 'rounds', 30);

  const req = request(datums, tokens);
  const reqBytes = encodeForwardBackwardRequest(req);
  time('encodeForwardBackwardRequest', reqBytes.length, rounds, () => encodeForwardBackwardRequest(req));
  time('decodeForwardBackwardRequest', reqBytes.length, rounds, () => decodeForwardBackwardRequest(reqBytes));

  const out = output(datums, tokens);
  const outBytes = encodeForwardBackwardOutput(out);
  time('encodeForwardBackwardOutput', outBytes.length, rounds, () => encodeForwardBackwardOutput(out));
  time('decodeForwardBackwardOutput', outBytes.length, rounds, () => decodeForwardBackwardOutput(outBytes));

  const sampled = samples(n, tokens);
  const sampleBytes = encodeSampleResponse(sampled);
  time('encodeSampleResponse', sampleBytes.length, rounds, () => encodeSampleResponse(sampled));
  time('decodeSampleResponse', sampleBytes.length, rounds, () => decodeSampleResponse(sampleBytes));
}
