/**
 * What a Tinker service does with the requests rxrl sends, read from the service itself before a run trains on it.
 *
 * Services speaking the Tinker API differ: SkyRL's server (FastAPI) declares its request models in `/openapi.json`
 * and silently drops the fields it does not know — `adam_params.grad_clip_norm`, the adapter's `train_unembed`,
 * `train_mlp`, `train_attn` — and it has no `sessions/{id}/finish`, and its `load_weights` needs the `model_id` of
 * a client made first. The official SDK asks `client/config` whether `load_weights` may create the client
 * (`create_model_via_load_weights`) and falls back otherwise; rxrl does the same, and reads the schema a service
 * publishes to learn which settings it will not honour, so a run says so once instead of training on something
 * other than what was configured without a word. A service that publishes no schema (rxrl's own, the hosted one) is
 * taken to honour everything the API defines.
 *
 * @packageDocumentation
 */
import { limitBody } from '../core/http.js';

/** What a service does with rxrl's requests (see the module comment). */
export interface TinkerCapabilities {
  /** A `load_weights` addressed by session creates the training client; else `create_model`, then `load_weights` into it. */
  readonly loadCreatesModel: boolean;
  /** The service has `sessions/{id}/finish` (finishing a session frees its training clients). */
  readonly finishesSessions: boolean;
  /**
   * The settings rxrl sends that the service declares it does not take, each as `what (the request's field)`, e.g.
   * `trainer.maxGradNorm (optim_step adam_params.grad_clip_norm)`. Empty when it publishes no schema.
   */
  readonly unhonoured: readonly string[];
}

/** The settings rxrl sends that a service may not honour: the request, the path of the field in it, what it is. */
const SETTINGS: readonly { path: string; field: readonly string[]; what: string }[] = [
  { path: '/api/v1/optim_step', field: ['adam_params', 'grad_clip_norm'], what: 'trainer.maxGradNorm' },
  { path: '/api/v1/create_model', field: ['lora_config', 'train_unembed'], what: 'the adapter on the unembedding' },
  { path: '/api/v1/create_model', field: ['lora_config', 'train_mlp'], what: 'the adapter on the MLP layers' },
  { path: '/api/v1/create_model', field: ['lora_config', 'train_attn'], what: 'the adapter on the attention layers' },
  { path: '/api/v1/create_model', field: ['lora_config', 'seed'], what: "the adapter's initialisation seed (run.seed)" },
];

/** Largest schema read, in bytes. */
const SCHEMA_BYTES = 4 * 1024 * 1024;

type Json = Record<string, unknown>;

/**
 * Reads what the service at `baseURL` does with rxrl's requests: its `client/config` answer (already fetched) and,
 * where it publishes one, its OpenAPI schema (5 s, 4 MiB at most; an unreadable schema counts as none).
 *
 * @param config - The service's `client/config` answer.
 * @param signal - Ends the read at once.
 */
export async function readCapabilities(
  baseURL: string,
  apiKey: string,
  config: unknown,
  signal?: AbortSignal,
): Promise<TinkerCapabilities> {
  const sessionLoad = (config as Json | null)?.create_model_via_load_weights === true;
  const schema = await fetchSchema(baseURL, apiKey, signal);
  if (schema === undefined) return { loadCreatesModel: sessionLoad, finishesSessions: true, unhonoured: [] };
  const paths = (schema.paths ?? {}) as Json;
  const loadRequest = requestSchema(schema, '/api/v1/load_weights');
  const needsModel = Array.isArray(loadRequest?.required) && loadRequest.required.includes('model_id');
  const unhonoured: string[] = [];
  for (const { path, field, what } of SETTINGS) {
    let node = requestSchema(schema, path);
    if (node === undefined) continue; // the route is not described: nothing to tell
    for (const name of field) node = node === undefined ? undefined : resolve(schema, (node.properties as Json | undefined)?.[name]);
    if (node === undefined) unhonoured.push(`${what} (${path.slice('/api/v1/'.length)} ${field.join('.')})`);
  }
  return {
    loadCreatesModel: sessionLoad && !needsModel,
    finishesSessions: Object.keys(paths).some((p) => /^\/api\/v1\/sessions\/\{[^}]+\}\/finish$/.test(p)),
    unhonoured,
  };
}

async function fetchSchema(baseURL: string, apiKey: string, signal?: AbortSignal): Promise<Json | undefined> {
  const timeout = AbortSignal.timeout(5_000);
  try {
    const response = await fetch(`${baseURL.replace(/\/+$/, '')}/openapi.json`, {
      headers: { 'x-api-key': apiKey },
      signal: signal ? AbortSignal.any([signal, timeout]) : timeout,
    });
    if (!response.ok) {
      await response.body?.cancel();
      return undefined;
    }
    const body = (await (await limitBody(response, SCHEMA_BYTES, 'tinker /openapi.json')).json()) as unknown;
    return typeof body === 'object' && body !== null && typeof (body as Json).paths === 'object' ? (body as Json) : undefined;
  } catch (error) {
    if (signal?.aborted) throw error;
    return undefined;
  }
}

/** The JSON body schema of `POST path`, its `$ref` followed. */
function requestSchema(schema: Json, path: string): Json | undefined {
  const post = ((schema.paths as Json)[path] as Json | undefined)?.post as Json | undefined;
  const body = (((post?.requestBody as Json | undefined)?.content as Json | undefined)?.['application/json'] as Json | undefined)?.schema;
  return resolve(schema, body);
}

/** `node`, or what its `$ref` (`#/components/schemas/X`) names, or the one schema of an `anyOf` with `null`. */
function resolve(schema: Json, node: unknown, depth = 0): Json | undefined {
  if (typeof node !== 'object' || node === null || depth > 8) return undefined;
  const record = node as Json;
  if (typeof record.$ref === 'string') {
    const name = /^#\/components\/schemas\/(.+)$/.exec(record.$ref)?.[1];
    const target = name === undefined ? undefined : ((schema.components as Json | undefined)?.schemas as Json | undefined)?.[name];
    return resolve(schema, target, depth + 1);
  }
  if (Array.isArray(record.anyOf)) {
    const options = record.anyOf.filter((o) => (o as Json | null)?.type !== 'null');
    return options.length === 1 ? resolve(schema, options[0], depth + 1) : record;
  }
  return record;
}
