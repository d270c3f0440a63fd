/**
 * Each row's softmax numerators, `exp(logit − rowMax)`, computed by TensorFlow for the sampler: whole-vocabulary
 * sampling at temperature 1 (GRPO's usual setting) and greedy decoding then sum them on the host instead of
 * exponentiating every logit there (`Math.exp` over 16 rows of 49,152 logits takes about 14 ms, a sixth of a decoding
 * step of SmolLM2-135M; the graph takes about 1 ms over both cores).
 *
 * @packageDocumentation
 */
import * as tf from '@tensorflow/tfjs-core';

import { BackendUnavailableError } from '../core/errors.js';
import { GraphBuilder, GraphSession, graphSessionsAvailable } from './tfGraph.js';

/** A step's softmax numerators and each row's max, float32 on the device (owned by the caller). */
export interface RowExps {
  /** `exp(logits − max)`, `[b, V]`. */
  readonly exps: tf.Tensor2D;
  /** Each row's largest logit, `[b, 1]`. */
  readonly max: tf.Tensor2D;
}

/** The loaded graph of each backend instance (null: TensorFlow refused it, and the host exponentiates). */
const sessions = new WeakMap<object, GraphSession | null>();

/** The graph `logits → (max, exp(logits − max))`, rows and vocabulary of any size. */
function expSession(): GraphSession | null {
  const backend = tf.backend();
  let session = sessions.get(backend);
  if (session !== undefined) return session;
  const g = new GraphBuilder();
  const float = { T: { type: 'float32' } } as const;
  const logits = g.placeholder('logits', 'float32', [null, null]);
  const max = g.op('Max', [logits, g.int(1)], { ...float, Tidx: { type: 'int32' }, keep_dims: { b: true } });
  const exps = g.op('Exp', [g.op('Sub', [logits, max], float)], float);
  try {
    session = new GraphSession(g, [logits], [exps, max]);
  } catch (error) {
    if (!(error instanceof BackendUnavailableError)) throw error;
    session = null;
  }
  sessions.set(backend, session);
  return session;
}

/**
 * `exp(logits − rowMax)` and the row maxima, in one TensorFlow session call, where the active backend runs graphs
 * (the native `tensorflow` one); null elsewhere, where the sampler exponentiates on the host.
 *
 * @param logits - Next-token logits `[b, V]` (not disposed).
 */
export function rowExps(logits: tf.Tensor2D): RowExps | null {
  if (!graphSessionsAvailable()) return null;
  const session = expSession();
  if (session === null) return null;
  const [exps, max] = session.run([logits]);
  return { exps: exps as tf.Tensor2D, max: max as tf.Tensor2D };
}
