/**
 * LoRA adapters served by `rxrl serve` beside their base model, as vLLM does (`--lora-modules name=path`,
 * `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`): each adapter is a model name of its own whose
 * requests run on the shared base weights plus that adapter, batched by an engine of its own.
 *
 * @packageDocumentation
 */
import { LocalEngine } from '../engine/local.js';
import { LoraAdapter, loadPeftAdapter } from '../model/lora.js';
import { PolicyModel } from '../model/transformer.js';
import { ownModel, type ServeContext, type ServedAdapter } from './context.js';
import { MAX_ERROR_MESSAGE_CHARS, RequestError, excerpt, invalid, quote, readBoolean, readString, type JsonObject } from './protocol.js';
import { ServingModel } from './servingModel.js';
import { cannotLoad, maxWeightBytes, resolveClientDir, rootOf } from './weights.js';

/** The context a request runs in: the base model's, or that of the adapter it names (404 for any other name). */
export function modelContext(ctx: ServeContext, name: string): ServeContext {
  if (name === ctx.modelName) return ctx;
  const served = ctx.adapters.get(name);
  if (served === undefined) {
    throw new RequestError(404, `The model '${excerpt(name)}' does not exist`, { param: 'model', code: 'model_not_found' });
  }
  return { ...ctx, engine: served.engine, own: { serving: served.serving, engine: served.engine }, modelName: name };
}

/**
 * Loads the PEFT directory `path` as adapter `name` (refused when the name is taken, unless `inPlace`: then the
 * adapter's engine swaps to the new weights between batches, as a new version).
 *
 * @throws {@link RequestError} 400 naming the field for a taken or invalid name, a directory that is not a PEFT
 *   LoRA directory of the served architecture, or files that are not regular files of a plausible size; 403
 *   outside the weights root.
 */
export async function addAdapter(ctx: ServeContext, name: string, path: string, inPlace = false): Promise<ServedAdapter> {
  if (name.trim() === '' || name.length > 256 || /[\0/]/.test(name))
    throw invalid('lora_name', 'lora_name must be a non-empty name without "/"');
  if (name === ctx.modelName) throw invalid('lora_name', `lora_name ${quote(name)} is the base model's name`);
  const existing = ctx.adapters.get(name);
  if (existing !== undefined && !inPlace) {
    throw new RequestError(400, `The lora adapter ${quote(name)} has already been loaded (pass load_inplace: true to replace it)`, {
      param: 'lora_name',
      code: 'adapter_exists',
    });
  }
  const dir = await resolveClientDir(ctx, 'lora_path', path);
  let adapter: LoraAdapter;
  try {
    // Regular files only (a FIFO or /dev/zero must not hang the reader), no larger than the base model.
    adapter = (
      await loadPeftAdapter(dir, ownModel(ctx, 'LoRA').serving.model.config, { maxWeightBytes: maxWeightBytes(ctx), ...rootOf(ctx) })
    ).adapter;
  } catch (cause) {
    throw cannotLoad('lora_path', path, cause);
  }
  if (ctx.adapters.get(name) !== existing) {
    // Another request loaded, replaced or unloaded this name while the files were read.
    adapter.dispose();
    throw new RequestError(409, `The lora adapter ${quote(name)} changed while loading; try again`, {
      param: 'lora_name',
      code: 'adapter_changed',
    });
  }
  if (existing !== undefined) {
    // Same rank and targets: swap the weights between batches. Otherwise the new adapter gets an engine of its own.
    const sameShape = JSON.stringify(existing.adapter.lora) === JSON.stringify(adapter.lora);
    if (sameShape) {
      try {
        await existing.engine.loadWeights(existing.engine.version + 1, adapter.getWeights());
      } finally {
        adapter.dispose();
      }
      const replaced = { ...existing, path };
      ctx.adapters.set(name, replaced);
      return replaced;
    }
  }
  const own = ownModel(ctx, 'LoRA');
  const view = PolicyModel.withAdapter(own.serving.model, adapter);
  const serving = new ServingModel(view);
  const engine = new LocalEngine(serving, {
    tokenizer: ctx.tokenizer,
    modelTag: name,
    maxBatchSize: own.engine.maxBatchSize,
    maxWaitMs: own.engine.maxWaitMs,
    version: 0,
  });
  const served: ServedAdapter = { name, path, adapter, view, serving, engine };
  ctx.adapters.set(name, served);
  if (existing !== undefined) void retire(existing);
  return served;
}

/** Frees an adapter once its engine has finished the batch it runs (new requests no longer reach it). */
async function retire(served: ServedAdapter): Promise<void> {
  await served.engine.idle();
  served.view.dispose();
  served.adapter.dispose();
}

/** `POST /v1/load_lora_adapter`: `{ lora_name, lora_path, load_inplace? }`. */
export async function loadLoraAdapter(ctx: ServeContext, body: JsonObject): Promise<unknown> {
  const name = readString(body, 'lora_name');
  const path = readString(body, 'lora_path');
  const served = await addAdapter(ctx, name, path, readBoolean(body, 'load_inplace', false));
  ctx.log({ event: 'lora_loaded', name, path: excerpt(path, MAX_ERROR_MESSAGE_CHARS) });
  return {
    success: true,
    message: `Success: LoRA adapter '${excerpt(name)}' added successfully.`,
    lora_name: name,
    policy_version: served.engine.version,
  };
}

/** `POST /v1/unload_lora_adapter`: `{ lora_name }`. Requests already running finish on it. */
export async function unloadLoraAdapter(ctx: ServeContext, body: JsonObject): Promise<unknown> {
  const name = readString(body, 'lora_name');
  const served = ctx.adapters.get(name);
  if (served === undefined) {
    throw new RequestError(404, `The lora adapter ${quote(name)} cannot be found`, { param: 'lora_name', code: 'adapter_not_found' });
  }
  ctx.adapters.delete(name);
  await retire(served);
  ctx.log({ event: 'lora_unloaded', name });
  return { success: true, message: `Success: LoRA adapter '${excerpt(name)}' removed successfully.`, lora_name: name };
}
