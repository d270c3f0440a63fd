/**
 * The routes of rxrl's Tinker service that make, train, save and free LoRA training clients: `create_model`,
 * `get_info`, `unload_model`, `forward_backward` / `forward`, `optim_step`, `save_weights`, `load_weights`. Each
 * checks what it can at once (a 4xx) and queues the rest on the client, answering a future.
 *
 * @packageDocumentation
 */
import {
  RequestError,
  absent,
  excerpt,
  invalid,
  quote,
  readBoolean,
  readInteger,
  readNumber,
  readString,
  type JsonObject,
} from '../serve/protocol.js';
import type { TinkerContext, FutureAnswer } from './context.js';
import type { TrainingClient } from './clients.js';
import { decodeForwardBackwardRequest, encodeForwardBackwardOutput, readForwardBackwardModelId } from './proto.js';
import { checkName, readState, stateFile, writeState } from './states.js';
import { TinkerTrainer, type AdamParams } from './training.js';

/** Largest `model_seq_id`. */
const MAX_SEQ_ID = 2 ** 31 - 1;

/** A JSON object field (absent: `{}`); 400 for anything else. */
export function readObject(body: JsonObject, name: string): JsonObject {
  if (absent(body, name)) return {};
  const value = body[name];
  if (typeof value !== 'object' || value === null || Array.isArray(value))
    throw invalid(name, `'${name}' must be an object, got ${quote(value)}`);
  return value as JsonObject;
}

/** 400 unless `base_model` is the served one (absent is allowed when `optional`). */
function checkBase(ctx: TinkerContext, body: JsonObject, optional: boolean): void {
  if (optional && absent(body, 'base_model')) return;
  if (body.base_model !== ctx.baseModel)
    throw invalid('base_model', `this service trains '${ctx.baseModel}', not '${excerpt(String(body.base_model))}'`);
}

/** A new trainer of `rank` on the base model, with the service's next seed. */
function newTrainer(ctx: TinkerContext, rank: number): TinkerTrainer {
  return new TinkerTrainer(ctx.model, rank, ctx.nextSeed++, { chunkTokens: ctx.limits.chunkTokens });
}

/** Queues `work` on `client`; the future's answer. */
function queueOn(ctx: TinkerContext, client: TrainingClient, work: Parameters<TinkerContext['futures']['submit']>[0]): FutureAnswer {
  return { request_id: ctx.futures.submit(work, client.queue, client.session), model_id: client.id };
}

/** `POST create_model`: a LoRA training client of `lora_config.rank` in `session_id` (full fine-tuning is refused). */
export function createModel(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const session = readString(body, 'session_id');
  if (!ctx.clients.touch(session)) throw new RequestError(404, `no session ${quote(session)}`);
  const seq = readInteger(body, 'model_seq_id', 0, MAX_SEQ_ID);
  checkBase(ctx, body, false);
  if (absent(body, 'lora_config')) throw invalid('lora_config', 'full fine-tuning is not supported: give lora_config');
  const rank = readInteger(readObject(body, 'lora_config'), 'rank', 1, ctx.limits.maxRank);
  if (rank === undefined) throw invalid('lora_config', `lora_config.rank must be an integer in [1, ${ctx.limits.maxRank}]`);
  const id = ctx.clients.reserve(session, seq);
  const client = ctx.clients.add(id, session, newTrainer(ctx, rank));
  return queueOn(ctx, client, () => ({ json: { model_id: id, type: 'create_model' } }));
}

/** `POST get_info`: the client's model, rank and tokenizer. */
export function getInfo(ctx: TinkerContext, body: JsonObject): unknown {
  const client = ctx.clients.get(body.model_id);
  return {
    model_id: client.id,
    model_data: { model_name: ctx.baseModel, tokenizer_id: ctx.tokenizerId, arch: null },
    is_lora: true,
    lora_rank: client.trainer.rank,
    type: 'get_info',
  };
}

/**
 * `POST unload_model` (the SDK's `UnloadModelRequest`): the client is gone at once (404 from now on); its future
 * settles with `{ model_id, type: 'unload_model' }` once the requests queued before are done and it is freed.
 */
export function unloadModel(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const client = ctx.clients.get(body.model_id);
  const id = ctx.futures.submit(
    async () => {
      await ctx.clients.free(client);
      return { json: { model_id: client.id, type: 'unload_model' } };
    },
    undefined,
    client.session,
  );
  return { request_id: id, model_id: client.id };
}

/**
 * `POST forward_backward` / `forward` (protobuf): the client is looked up before the payload is decoded, and the
 * payload is decoded within the model's context (each datum, each tensor) and the request's budget, before
 * anything of a tensor's size is allocated.
 */
export function forwardBackward(ctx: TinkerContext, bytes: Uint8Array, forwardOnly: boolean): FutureAnswer {
  const client = ctx.clients.get(readForwardBackwardModelId(bytes));
  const request = decodeForwardBackwardRequest(bytes, { maxDatumTokens: ctx.limits.context, maxElements: ctx.limits.maxForwardElements });
  return queueOn(ctx, client, async () => {
    const out = await client.trainer.forward(request.data, request.lossFn, request.lossFnConfig, !(forwardOnly || request.forwardOnly));
    return { proto: encodeForwardBackwardOutput({ outputs: out.outputs, metrics: out.metrics }) };
  });
}

/** `POST optim_step`: Adam with the call's `adam_params` (other optimizers are refused). */
export function optimStep(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const client = ctx.clients.get(body.model_id);
  if (absent(body, 'adam_params')) throw invalid('adam_params', 'optim_step needs adam_params (other optimizers are not supported)');
  const p = readObject(body, 'adam_params');
  const max = Number.MAX_VALUE;
  const beta = (name: string, fallback: number): number => {
    const value = readNumber(p, name, 0, 1, fallback);
    if (value >= 1) throw invalid(name, `adam_params.${name} must be in [0, 1), got ${value}`);
    return value;
  };
  const adam: AdamParams = {
    learningRate: readNumber(p, 'learning_rate', 0, max, 1e-4),
    beta1: beta('beta1', 0.9),
    beta2: beta('beta2', 0.95),
    eps: readNumber(p, 'eps', 0, max, 1e-12),
    weightDecay: readNumber(p, 'weight_decay', 0, max, 0),
    gradClipNorm: readNumber(p, 'grad_clip_norm', 0, max, 0),
  };
  return queueOn(ctx, client, () => ({ json: { metrics: client.trainer.optimStep(adam), type: 'optim_step' } }));
}

/** `POST save_weights`: the adapter and Adam's state as `tinker://<model>/weights/<path>`. */
export function saveWeights(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const client = ctx.clients.get(body.model_id);
  const name = checkName(body.path);
  return queueOn(ctx, client, async () => ({ json: { path: await writeState(ctx.stateDir, client, name), type: 'save_weights' } }));
}

/** `POST load_weights`: into a client (`model_id`), or a new client made from the state (`session_id`). */
export function loadWeights(ctx: TinkerContext, body: JsonObject): FutureAnswer | Promise<FutureAnswer> {
  return absent(body, 'model_id') ? createFromState(ctx, body) : loadState(ctx, body);
}

/** `load_weights` into an existing client: its rank must be the state's. */
function loadState(ctx: TinkerContext, body: JsonObject): FutureAnswer {
  const client = ctx.clients.get(body.model_id);
  const path = body.path;
  stateFile(ctx.stateDir, path);
  const withOptimizer = readBoolean(body, 'optimizer', false);
  return queueOn(ctx, client, async () => {
    const state = await readState(ctx.stateDir, path, ctx.limits.maxStateBytes);
    if (state.rank !== client.trainer.rank) {
      throw new RequestError(400, `the state at ${quote(path)} has rank ${state.rank}, this client ${client.trainer.rank}`);
    }
    client.trainer.restore(state.weights, withOptimizer);
    return { json: { path, type: 'load_weights' } };
  });
}

/** `load_weights` addressed by session: a new training client whose rank and weights come from the state. */
async function createFromState(ctx: TinkerContext, body: JsonObject): Promise<FutureAnswer> {
  const session = readString(body, 'session_id');
  if (!ctx.clients.touch(session)) throw new RequestError(404, `no session ${quote(session)}`);
  const seq = readInteger(body, 'model_seq_id', 0, MAX_SEQ_ID);
  checkBase(ctx, body, true);
  const withOptimizer = readBoolean(body, 'optimizer', false);
  const path = body.path;
  ctx.clients.reserve(session, seq);
  const state = await readState(ctx.stateDir, path, ctx.limits.maxStateBytes);
  if (!Number.isInteger(state.rank) || state.rank < 1 || state.rank > ctx.limits.maxRank)
    throw new RequestError(400, `the state at ${quote(path)} has no valid rank`);
  // Checked again: other clients may have been made while the state was read.
  const id = ctx.clients.reserve(session, seq);
  const trainer = newTrainer(ctx, state.rank);
  try {
    trainer.restore(state.weights, withOptimizer);
  } catch (error) {
    trainer.dispose();
    throw error;
  }
  return queueOn(ctx, ctx.clients.add(id, session, trainer), () => ({ json: { path, type: 'load_weights' } }));
}
