/**
 * Seeded fuzzing of `rxrl serve` over real HTTP: a few thousand random, malformed and valid requests on every
 * route (and on routes and methods it does not have). The server must stay up; every answer must be a valid
 * OpenAI-shaped response or a 4xx with an OpenAI error body whose message stays short; nothing may reach the
 * server's internal-error path; memory must stay bounded.
 *
 * The sequence of requests is fixed by the seed (`RXRL_FUZZ_SEED` overrides it, `RXRL_FUZZ_REQUESTS` the count); a
 * failure names the request's index, route, method, content type and the start of its body, so it can be replayed.
 * `RXRL_FUZZ_REPORT=1` prints the memory growth and the number of requests of each kind.
 */
import { mkdir, mkdtemp, rm, symlink, truncate, writeFile } from 'node:fs/promises';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

import * as tf from '@tensorflow/tfjs-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { initBackend } from '../../lib/model/backend.js';
import { saveModelDir } from '../../lib/model/modelDir.js';
import { CharTokenizer, DEFAULT_ALPHABET } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { mulberry32, randomInt, type Rng } from '../helpers/random.js';

const SEED = Number(process.env.RXRL_FUZZ_SEED ?? 0x5eed_f022);
const REQUESTS = Number(process.env.RXRL_FUZZ_REQUESTS ?? 3000);
const CONCURRENCY = 8;
/** Longest error message accepted: messages must not echo request bodies. */
const MAX_MESSAGE_CHARS = 1000;
/**
 * Most the process's resident memory may grow over the whole run. Resident memory keeps what the allocator freed
 * but did not give back (the run peaks with 4 MiB bodies), so the bound is loose; the live heap's is tight.
 */
const MAX_RSS_GROWTH_BYTES = 300 * 1024 * 1024;
/** Most the live JS heap plus external memory (after a collection) may grow over the whole run. */
const MAX_HEAP_GROWTH_BYTES = 64 * 1024 * 1024;
/** The server's default body limit (4 MiB). */
const MAX_BODY_BYTES = 4 * 1024 * 1024;
const MODEL = 'rxrl-policy';

const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };

/** One request of the run. */
interface FuzzRequest {
  /** Which generator made it (for the failure report). */
  readonly kind: string;
  readonly method: string;
  /** Path and query, percent-encoded as sent. */
  readonly path: string;
  readonly headers: Record<string, string>;
  readonly body?: string | Uint8Array | undefined;
  /** The request is valid: only a 200 with the route's shape is accepted (unless `allow` names more). */
  readonly valid?: boolean;
  /** Error codes a valid request may still get (a stale weight version, say). */
  readonly allow?: readonly string[];
  /** Sent on a raw socket: garbage must get a 400 error body; a request cut off part-way must not hurt the server. */
  readonly raw?: 'partial-body' | 'headers-only' | 'garbage';
}

type Json = Record<string, unknown>;

// ---------------------------------------------------------------------------------------------------------------
// Random JSON text (text, not values: nesting deeper than JSON.stringify can handle must be expressible).

function pick<T>(rng: Rng, items: readonly T[]): T {
  return items[Math.floor(rng() * items.length)];
}

function chance(rng: Rng, p: number): boolean {
  return rng() < p;
}

/** A short string of the tokenizer's alphabet (a prompt the model accepts). */
function alphabetText(rng: Rng, maxLength: number): string {
  return Array.from({ length: randomInt(rng, 1, maxLength) }, () => pick(rng, [...DEFAULT_ALPHABET])).join('');
}

const ODD_STRINGS = [
  '',
  ' ',
  'NaN',
  'Infinity',
  '-Infinity',
  '1e999',
  '0x10',
  '007',
  'null',
  'true',
  'undefined',
  '__proto__',
  'constructor',
  '<eos>',
  '<bos><pad>',
  '%00',
  '%E0%A4%A',
  '../../etc/passwd',
  'ÄÖü',
  '🙂🙃',
  '\u202eabc',
  'a\u0000b',
  'rxrl-policy',
  'RXRL-POLICY',
  'calc(2+3)',
];

/** JSON text of a string: lone surrogates and escapes kept as escapes. */
function jsonString(rng: Rng): string {
  switch (randomInt(rng, 0, 5)) {
    case 0:
      return JSON.stringify(pick(rng, ODD_STRINGS));
    case 1:
      return pick(rng, ['"\\ud800"', '"\\udfff\\ud800"', '"a\\ud83d"', '"\\u0000"', '"\\/\\b\\f\\n\\r\\t"']);
    case 2:
      return JSON.stringify(pick(rng, ['a', 'é', '🙂', '(', '<eos>']).repeat(randomInt(rng, 100, 60_000)));
    default:
      return JSON.stringify(alphabetText(rng, 12));
  }
}

function jsonNumber(rng: Rng): string {
  return pick(rng, [
    '0',
    '-0',
    '1',
    '-1',
    '2',
    '3',
    '1.5',
    '-2.5',
    '0.000001',
    '1e308',
    '-1e308',
    '1e400',
    '9007199254740993',
    '-9007199254740993',
    '4294967296',
    '128',
    '129',
    '33',
    '1e-400',
    '12345678901234567890123456789',
  ]);
}

const OBJECT_KEYS = ['a', 'type', 'text', 'role', 'content', '__proto__', 'constructor', ''];

/** JSON text of a random value, at most `depth` levels of containers (plus occasional very deep nesting). */
function jsonValue(rng: Rng, depth = 3): string {
  const kind = randomInt(rng, 0, depth > 0 ? 9 : 4);
  switch (kind) {
    case 0:
      return 'null';
    case 1:
      return pick(rng, ['true', 'false']);
    case 2:
      return jsonNumber(rng);
    case 3:
    case 4:
      return jsonString(rng);
    case 5:
    case 6:
      return `[${Array.from({ length: randomInt(rng, 0, 4) }, () => jsonValue(rng, depth - 1)).join(',')}]`;
    case 7:
    case 8:
      return jsonObject(Array.from({ length: randomInt(rng, 0, 4) }, () => [pick(rng, OBJECT_KEYS), jsonValue(rng, depth - 1)] as const));
    default: {
      const n = pick(rng, [100, 5_000, 200_000]);
      return chance(rng, 0.5) ? '['.repeat(n) + ']'.repeat(n) : '{"a":'.repeat(n) + '1' + '}'.repeat(n);
    }
  }
}

/** JSON text of an object whose values are given as JSON texts (keys may repeat). */
function jsonObject(entries: readonly (readonly [string, string])[]): string {
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${v}`).join(',')}}`;
}

/** A body as JSON text: known fields (given as JSON texts), some replaced by junk, dropped, or joined by others. */
function mutate(rng: Rng, fields: Readonly<Record<string, string>>, extraKeys: readonly string[]): string {
  const entries = Object.entries(fields).map(([k, v]) => [k, v] as [string, string]);
  const edits = randomInt(rng, 1, 3);
  for (let e = 0; e < edits; e++) {
    const op = randomInt(rng, 0, 3);
    if (op === 0 && entries.length > 0) {
      entries.splice(randomInt(rng, 0, entries.length - 1), 1);
    } else if (op === 1 || entries.length === 0) {
      entries.push([pick(rng, extraKeys), jsonValue(rng)]);
    } else {
      const i = randomInt(rng, 0, entries.length - 1);
      entries[i] = [entries[i][0], jsonValue(rng)];
    }
  }
  return jsonObject(entries);
}

// ---------------------------------------------------------------------------------------------------------------
// Valid bodies.

function validCompletion(rng: Rng): Json {
  const prompt = chance(rng, 0.6)
    ? alphabetText(rng, 10)
    : chance(rng, 0.5)
      ? Array.from({ length: randomInt(rng, 1, 8) }, () => randomInt(rng, 0, tokenizer.vocabSize - 1))
      : Array.from({ length: randomInt(rng, 1, 3) }, () => alphabetText(rng, 6));
  const body: Json = { model: MODEL, prompt, max_tokens: randomInt(rng, 0, 4) };
  if (chance(rng, 0.3)) body.n = randomInt(rng, 1, 3);
  if (chance(rng, 0.3)) body.temperature = pick(rng, [0, 0.5, 1, 2]);
  if (chance(rng, 0.2)) body.top_p = pick(rng, [0.1, 0.9, 1]);
  if (chance(rng, 0.4)) body.seed = randomInt(rng, -1000, 1000);
  if (chance(rng, 0.3)) body.logprobs = randomInt(rng, 0, 3);
  if (chance(rng, 0.2)) body.prompt_logprobs = randomInt(rng, 0, 2);
  if (chance(rng, 0.2)) body.stop = chance(rng, 0.5) ? 'a' : ['b', 'cd'];
  if (chance(rng, 0.2)) body.stop_token_ids = [randomInt(rng, 0, tokenizer.vocabSize - 1)];
  if (chance(rng, 0.2)) body.return_token_ids = true;
  if (chance(rng, 0.2)) body.return_tokens_as_token_ids = chance(rng, 0.5);
  if (chance(rng, 0.1)) body.include_stop_str_in_output = true;
  if (chance(rng, 0.1)) body.ignore_eos = true;
  if (chance(rng, 0.1))
    Object.assign(body, { echo: false, stream: false, best_of: body.n ?? 1, logit_bias: {}, presence_penalty: 0, suffix: '' });
  return body;
}

const TOOL_NAMES = ['calc', 'a', 'b_1', 'ab'];

function validChat(rng: Rng): Json {
  const messages: Json[] = [];
  if (chance(rng, 0.3)) messages.push({ role: pick(rng, ['system', 'developer']), content: alphabetText(rng, 4) });
  messages.push({ role: 'user', content: chance(rng, 0.8) ? alphabetText(rng, 6) : [{ type: 'text', text: alphabetText(rng, 3) }] });
  if (chance(rng, 0.2)) {
    const call = { id: 'call_1', type: 'function', function: { name: 'calc', arguments: '{"expression":"1+2"}' } };
    messages.push({ role: 'assistant', content: null, tool_calls: [call] });
    messages.push({ role: 'tool', tool_call_id: 'call_1', content: '3' });
  }
  const body: Json = { model: MODEL, messages };
  body[chance(rng, 0.5) ? 'max_tokens' : 'max_completion_tokens'] = randomInt(rng, 0, 4);
  if (chance(rng, 0.4)) {
    body.tools = TOOL_NAMES.slice(0, randomInt(rng, 1, TOOL_NAMES.length)).map((name) => ({
      type: 'function',
      function: {
        name,
        ...(chance(rng, 0.5) ? { parameters: { type: 'object', properties: { x: { type: 'number' }, y: { type: 'string' } } } } : {}),
      },
    }));
    if (chance(rng, 0.3)) body.tool_choice = pick(rng, ['auto', 'none', 'required', { type: 'function', function: { name: 'calc' } }]);
  }
  if (chance(rng, 0.3)) {
    body.logprobs = true;
    if (chance(rng, 0.5)) body.top_logprobs = randomInt(rng, 0, 3);
  }
  if (chance(rng, 0.3)) body.n = randomInt(rng, 1, 3);
  if (chance(rng, 0.3)) body.seed = randomInt(rng, 0, 1000);
  if (chance(rng, 0.2)) body.temperature = pick(rng, [0, 1]);
  if (chance(rng, 0.2)) body.return_token_ids = true;
  if (chance(rng, 0.1)) body.stop = 'a';
  return body;
}

/** JSON texts of a valid body's fields, for {@link mutate}. */
function fieldsOf(body: Json): Record<string, string> {
  return Object.fromEntries(Object.entries(body).map(([k, v]) => [k, JSON.stringify(v)]));
}

const COMPLETION_KEYS = [
  'model',
  'prompt',
  'max_tokens',
  'n',
  'temperature',
  'top_p',
  'seed',
  'logprobs',
  'prompt_logprobs',
  'stop',
  'stop_token_ids',
  'echo',
  'suffix',
  'best_of',
  'stream',
  'logit_bias',
  'presence_penalty',
  'frequency_penalty',
  'return_token_ids',
  'return_tokens_as_token_ids',
  'include_stop_str_in_output',
  'ignore_eos',
  'user',
  '__proto__',
];
const CHAT_KEYS = [
  'model',
  'messages',
  'max_tokens',
  'max_completion_tokens',
  'n',
  'temperature',
  'top_p',
  'seed',
  'logprobs',
  'top_logprobs',
  'tools',
  'tool_choice',
  'stop',
  'stream',
  'response_format',
  'return_token_ids',
  'constructor',
];
const WEIGHT_KEYS = ['model_path', 'weight_version', 'force', 'load_format', 'abort_all_requests'];

/** Chat messages with one message broken in a random way. */
function brokenMessages(rng: Rng): string {
  const good = [JSON.stringify({ role: 'user', content: alphabetText(rng, 4) })];
  const bad = pick(rng, [
    () => `{"role":${jsonValue(rng, 1)},"content":"ab"}`,
    () => `{"role":"user","content":${jsonValue(rng)}}`,
    () => `{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}`,
    () => `{"role":"user","content":[{"type":"text","text":${jsonValue(rng, 1)}}]}`,
    () => `{"role":"tool","content":"1","tool_call_id":${jsonValue(rng, 1)}}`,
    () => `{"role":"assistant","content":null,"tool_calls":${jsonValue(rng)}}`,
    () => {
      const name = pick(rng, ['"calc"', '"1x"', '""', '"a b"']);
      const args = pick(rng, ['"{}"', '"[1]"', '"{"', '"null"', '"{\\"x\\":[[[[1]]]]}"', jsonValue(rng, 1)]);
      return `{"role":"assistant","content":null,"tool_calls":[{"id":"c","type":"function","function":{"name":${name},"arguments":${args}}}]}`;
    },
    () => jsonValue(rng, 1),
    () => JSON.stringify({ role: 'user', content: 'a'.repeat(randomInt(rng, 20, 300_000)) }),
  ])();
  const list = chance(rng, 0.5) ? [...good, bad] : [bad, ...good];
  return `[${list.join(',')}]`;
}

function brokenTools(rng: Rng): string {
  return pick(rng, [
    () => jsonValue(rng),
    () =>
      `[{"type":"function","function":{"name":${pick(rng, ['"1x"', '""', '"a-b"', '"calc"', jsonValue(rng, 1)])},"parameters":${jsonValue(rng, 2)}}}]`,
    () => `[{"type":"function","function":{"name":"a","parameters":{"type":"object","properties":${jsonValue(rng, 2)}}}}]`,
    () => `[{"type":${jsonValue(rng, 1)}}]`,
  ])();
}

// ---------------------------------------------------------------------------------------------------------------
// Request generators, one per route family.

const JSON_HEADERS = { 'content-type': 'application/json' };

function completionRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, ['/v1/completions', '/v1/completions/', '/v1/completions?x=1']);
  const body = validCompletion(rng);
  if (chance(rng, 0.25))
    return { kind: 'completions/valid', method: 'POST', path, headers: JSON_HEADERS, body: JSON.stringify(body), valid: true };
  const fields = fieldsOf(body);
  const text = pick(rng, [
    () => mutate(rng, fields, COMPLETION_KEYS),
    () => mutate(rng, fields, COMPLETION_KEYS),
    () => {
      const prompt = pick(rng, ['[]', '[[]]', '[-1]', '[51]', '[1.5]', '[[1],"a"]', '["a",[1]]', '"ABC"', '"\\ud800"', jsonValue(rng)]);
      return mutate(rng, { ...fields, prompt }, COMPLETION_KEYS);
    },
    () => jsonObject(Object.entries({ ...fields, prompt: manyPrompts(rng) })),
    () => {
      const numeric = pick(rng, ['max_tokens', 'n', 'logprobs', 'seed', 'temperature', 'top_p', 'prompt_logprobs']);
      return jsonObject(Object.entries({ ...fields, [numeric]: jsonNumber(rng) }));
    },
    () =>
      jsonObject(
        Object.entries({ ...fields, stop: pick(rng, ['[]', '["a","b","c","d","e"]', '[""]', '[1]', '"\\ud800"', jsonValue(rng)]) }),
      ),
    () => jsonObject(Object.entries({ ...fields, model: jsonValue(rng) })),
  ])();
  return { kind: 'completions/mutated', method: 'POST', path, headers: JSON_HEADERS, body: text };
}

/** A list of many one-character prompts (up to about 1 MB of JSON). */
function manyPrompts(rng: Rng): string {
  const count = pick(rng, [100, 5_000, 250_000]);
  return chance(rng, 0.5) ? `[${Array(count).fill('"a"').join(',')}]` : `[${Array(count).fill('[1,3]').join(',')}]`;
}

function chatRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, ['/v1/chat/completions', '/v1/chat/completions/']);
  const body = validChat(rng);
  if (chance(rng, 0.25))
    return { kind: 'chat/valid', method: 'POST', path, headers: JSON_HEADERS, body: JSON.stringify(body), valid: true };
  const fields = fieldsOf(body);
  const text = pick(rng, [
    () => mutate(rng, fields, CHAT_KEYS),
    () => jsonObject(Object.entries({ ...fields, messages: brokenMessages(rng) })),
    () => jsonObject(Object.entries({ ...fields, messages: brokenMessages(rng) })),
    () => jsonObject(Object.entries({ ...fields, tools: brokenTools(rng) })),
    () => jsonObject(Object.entries({ ...fields, tool_choice: jsonValue(rng, 2) })),
    () =>
      jsonObject(
        Object.entries({
          ...fields,
          messages: `[${Array(pick(rng, [10, 40_000]))
            .fill('{"role":"user","content":"a"}')
            .join(',')}]`,
        }),
      ),
  ])();
  return { kind: 'chat/mutated', method: 'POST', path, headers: JSON_HEADERS, body: text };
}

/** Paths for `update_weights_from_disk`, filled in by the fixtures (never devices or FIFOs). */
const weightPaths: { good: string[]; bad: string[] } = { good: [], bad: [] };

function weightsRequest(rng: Rng): FuzzRequest {
  const path = '/update_weights_from_disk';
  if (chance(rng, 0.15) && weightPaths.good.length > 0) {
    const body: Json = { model_path: pick(rng, weightPaths.good) };
    if (chance(rng, 0.5)) body.weight_version = chance(rng, 0.5) ? randomInt(rng, 0, 10_000) : String(randomInt(rng, 0, 10_000));
    if (chance(rng, 0.3)) body.force = true;
    return {
      kind: 'weights/valid',
      method: 'POST',
      path,
      headers: JSON_HEADERS,
      body: JSON.stringify(body),
      valid: true,
      allow: ['stale_version'],
    };
  }
  const modelPath = JSON.stringify(pick(rng, weightPaths.bad));
  const text = pick(rng, [
    () => jsonObject([['model_path', modelPath]]),
    () => jsonObject([['model_path', modelPath]]),
    () =>
      jsonObject([
        ['model_path', modelPath],
        ['weight_version', jsonValue(rng, 1)],
      ]),
    () => mutate(rng, { model_path: JSON.stringify(pick(rng, weightPaths.good)), weight_version: jsonNumber(rng) }, WEIGHT_KEYS),
    () => jsonObject([['model_path', jsonValue(rng)]]),
  ])();
  return { kind: 'weights/mutated', method: 'POST', path, headers: JSON_HEADERS, body: text };
}

const LORA_KEYS = ['lora_name', 'lora_path', 'load_inplace'];

/** vLLM's adapter routes with names and paths that are never a PEFT adapter (so none may succeed). */
function loraRequest(rng: Rng): FuzzRequest {
  if (chance(rng, 0.3)) {
    const name = pick(rng, ['coder', MODEL, '', 'a/b', 'x'.repeat(randomInt(rng, 1, 400)), '\u0000']);
    return {
      kind: 'lora/unload',
      method: 'POST',
      path: '/v1/unload_lora_adapter',
      headers: JSON_HEADERS,
      body: JSON.stringify({ lora_name: name }),
    };
  }
  const loraPath = pick(rng, [...weightPaths.bad, ...weightPaths.good, '/nonexistent']);
  const text = pick(rng, [
    () => JSON.stringify({ lora_name: 'coder', lora_path: loraPath }),
    () => JSON.stringify({ lora_name: pick(rng, [MODEL, '', 'a/b', 'x'.repeat(300)]), lora_path: loraPath }),
    () => mutate(rng, { lora_name: '"coder"', lora_path: JSON.stringify(loraPath), load_inplace: 'true' }, LORA_KEYS),
    () =>
      jsonObject([
        ['lora_path', jsonValue(rng)],
        ['lora_name', jsonValue(rng)],
      ]),
  ])();
  return { kind: 'lora/load', method: 'POST', path: '/v1/load_lora_adapter', headers: JSON_HEADERS, body: text };
}

function modelsRequest(rng: Rng): FuzzRequest {
  if (chance(rng, 0.4))
    return {
      kind: 'models/list',
      method: 'GET',
      path: pick(rng, ['/v1/models', '/v1/models/', '/v1/models?limit=1']),
      headers: {},
      valid: true,
    };
  const id = pick(rng, [
    MODEL,
    encodeURIComponent(MODEL),
    'rxrl%2Dpolicy',
    'gpt-4',
    '%E0%A4%A',
    '%',
    '%zz',
    '%ED%A0%80',
    '%00',
    encodeURIComponent('🙂'),
    'a/b',
    'x'.repeat(randomInt(rng, 100, 4000)),
    '%41'.repeat(randomInt(rng, 10, 1000)),
  ]);
  return {
    kind: 'models/retrieve',
    method: 'GET',
    path: `/v1/models/${id}`,
    headers: {},
    valid: id === MODEL || id === encodeURIComponent(MODEL),
  };
}

function healthRequest(rng: Rng): FuzzRequest {
  return {
    kind: 'health',
    method: 'GET',
    path: pick(rng, ['/health', '/health/', '/health?full=1', '/health//']),
    headers: {},
    valid: true,
  };
}

const ROUTES = [
  '/health',
  '/v1/models',
  `/v1/models/${MODEL}`,
  '/v1/completions',
  '/v1/chat/completions',
  '/update_weights_from_disk',
  '/v1/load_lora_adapter',
  '/v1/unload_lora_adapter',
];

function wrongMethodRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, ROUTES);
  const getRoute = path === '/health' || path.startsWith('/v1/models');
  const method = pick(
    rng,
    getRoute ? ['POST', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD'] : ['GET', 'PUT', 'DELETE', 'PATCH', 'OPTIONS', 'HEAD'],
  );
  const body = method === 'GET' || method === 'HEAD' ? undefined : '{}';
  return { kind: 'wrong-method', method, path, headers: chance(rng, 0.7) ? JSON_HEADERS : {}, body };
}

function unknownRouteRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, [
    '/',
    '/v1',
    '/v1/',
    '/v2/completions',
    '/v1/completions/extra',
    '/v1/chat',
    '/v1/embeddings',
    '/tokenize',
    '/metrics/x',
    '/health/x',
    '/%',
    '/%E0',
    '/..%2f..%2fetc%2fpasswd',
    '/v1/models%2Frxrl-policy',
    `/${'a'.repeat(randomInt(rng, 100, 8000))}`,
    `/${encodeURIComponent('🙂').repeat(randomInt(rng, 1, 500))}`,
    `/v1/completions?${'q=1&'.repeat(randomInt(rng, 1, 1000))}`,
  ]);
  const method = pick(rng, ['GET', 'POST', 'DELETE']);
  return {
    kind: 'unknown-route',
    method,
    path,
    headers: method === 'POST' ? JSON_HEADERS : {},
    body: method === 'POST' ? '{}' : undefined,
  };
}

/** A POST route with a body that is cut, not JSON, not an object or not UTF-8, or with a wrong content type. */
function malformedBodyRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, ['/v1/completions', '/v1/chat/completions', '/update_weights_from_disk']);
  const valid = JSON.stringify(
    path === '/v1/completions' ? validCompletion(rng) : path === '/v1/chat/completions' ? validChat(rng) : { model_path: '/nonexistent' },
  );
  const contentType = pick(rng, [
    'application/json',
    'application/json',
    'application/json',
    'application/json; charset=utf-8',
    'APPLICATION/JSON',
    'application/json; charset=latin1',
    'application/jsonx',
    'text/plain',
    'application/x-www-form-urlencoded',
    'multipart/form-data; boundary=x',
    '',
    ';',
  ]);
  const body: string | Uint8Array = pick(rng, [
    () => valid.slice(0, randomInt(rng, 0, valid.length - 1)),
    () => '',
    () => ' ',
    () =>
      pick(rng, [
        'null',
        '[]',
        '[{}]',
        '1',
        '"x"',
        'true',
        '{}',
        '{"model":}',
        "{'model':'x'}",
        '{"a":1,}',
        'NaN',
        '\ufeff{}',
        '{"a":"\\x"}',
      ]),
    () => Uint8Array.from({ length: randomInt(rng, 1, 2000) }, () => randomInt(rng, 0, 255)),
    () => Buffer.concat([Buffer.from(valid.slice(0, -1)), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('}')]),
    () => valid + valid,
    () => `${valid}${' '.repeat(randomInt(rng, 1, 10_000))}`,
  ])();
  const headers: Record<string, string> = contentType === '' ? {} : { 'content-type': contentType };
  return { kind: `body/${typeof body === 'string' ? 'text' : 'bytes'}`, method: 'POST', path, headers, body };
}

function oversizeRequest(rng: Rng): FuzzRequest {
  const path = pick(rng, ['/v1/completions', '/v1/chat/completions', '/update_weights_from_disk']);
  const body = `{"model":"${MODEL}","prompt":"${'a'.repeat(MAX_BODY_BYTES + randomInt(rng, 1, 100_000))}"}`;
  return { kind: 'oversize', method: 'POST', path, headers: JSON_HEADERS, body };
}

/** Headers the server never expects, on any route. */
function headerJunkRequest(rng: Rng): FuzzRequest {
  const base = pick(rng, [healthRequest, modelsRequest, completionRequest])(rng);
  const headers: Record<string, string> = { ...base.headers };
  headers[pick(rng, ['authorization', 'x-request-id', 'accept', 'accept-encoding', 'openai-organization'])] = pick(rng, [
    'Bearer ',
    'Bearer x',
    'Basic Zm9vOmJhcg==',
    'x'.repeat(randomInt(rng, 1, 6000)),
    'gzip, br',
    '*/*',
  ]);
  if (chance(rng, 0.1)) headers['x-big'] = 'y'.repeat(20_000); // past node's header limit: 431, from the clientError handler
  return { ...base, kind: `${base.kind}+headers`, headers };
}

function rawRequest(rng: Rng): FuzzRequest {
  return {
    kind: 'raw',
    method: 'POST',
    path: '/v1/completions',
    headers: JSON_HEADERS,
    raw: pick(rng, ['partial-body', 'headers-only', 'garbage'] as const),
  };
}

const GENERATORS: readonly (readonly [number, (rng: Rng) => FuzzRequest])[] = [
  [22, completionRequest],
  [20, chatRequest],
  [10, weightsRequest],
  [5, loraRequest],
  [6, modelsRequest],
  [3, healthRequest],
  [6, wrongMethodRequest],
  [6, unknownRouteRequest],
  [18, malformedBodyRequest],
  [5, headerJunkRequest],
  [1, rawRequest],
];

function nextRequest(rng: Rng): FuzzRequest {
  if (chance(rng, 0.003)) return oversizeRequest(rng);
  const total = GENERATORS.reduce((sum, [weight]) => sum + weight, 0);
  let r = rng() * total;
  for (const [weight, make] of GENERATORS) {
    r -= weight;
    if (r < 0) return make(rng);
  }
  return GENERATORS[0][1](rng);
}

// ---------------------------------------------------------------------------------------------------------------
// Checking answers.

const isString = (x: unknown): x is string => typeof x === 'string';
const isNumber = (x: unknown): x is number => typeof x === 'number' && Number.isFinite(x);
const isObject = (x: unknown): x is Json => typeof x === 'object' && x !== null && !Array.isArray(x);

/** What is wrong with an error body, or undefined. */
function errorProblem(json: unknown, sglang: boolean): string | undefined {
  if (!isObject(json) || !isObject(json.error)) return 'body is not { error: {...} }';
  const { message, type, param, code } = json.error;
  if (!isString(message) || message === '') return 'error.message is not a non-empty string';
  if (message.length > MAX_MESSAGE_CHARS) return `error.message has ${message.length} chars (echoes the request?)`;
  if (!isString(type) || type === '') return 'error.type is not a non-empty string';
  if (!(param === null || isString(param))) return 'error.param is not a string or null';
  if (!(code === null || isString(code))) return 'error.code is not a string or null';
  if (isString(param) && param.length > 200) return 'error.param is too long';
  if (sglang && (json.success !== false || json.message !== message))
    return 'update_weights_from_disk error lacks success: false and message';
  return undefined;
}

function completionProblem(json: Json): string | undefined {
  if (json.object !== 'text_completion' || !isString(json.id) || json.model !== MODEL || !isNumber(json.created))
    return 'not a text_completion envelope';
  if (!Array.isArray(json.choices) || json.choices.length === 0) return 'choices is not a non-empty array';
  for (const [i, choice] of (json.choices as unknown[]).entries()) {
    if (!isObject(choice) || choice.index !== i || !isString(choice.text)) return `choices[${i}] lacks index or text`;
    if (choice.finish_reason !== 'stop' && choice.finish_reason !== 'length')
      return `choices[${i}].finish_reason ${String(choice.finish_reason)}`;
    if (!(choice.logprobs === null || isObject(choice.logprobs))) return `choices[${i}].logprobs is neither null nor an object`;
  }
  return usageProblem(json.usage);
}

function chatProblem(json: Json): string | undefined {
  if (json.object !== 'chat.completion' || !isString(json.id) || json.model !== MODEL || !isNumber(json.created))
    return 'not a chat.completion envelope';
  if (!Array.isArray(json.choices) || json.choices.length === 0) return 'choices is not a non-empty array';
  for (const [i, choice] of (json.choices as unknown[]).entries()) {
    if (!isObject(choice) || choice.index !== i || !isObject(choice.message)) return `choices[${i}] lacks index or message`;
    const { role, content, tool_calls: calls } = choice.message;
    if (role !== 'assistant' || !(content === null || isString(content))) return `choices[${i}].message is not an assistant message`;
    const isCall = (c: unknown): boolean => isObject(c) && c.type === 'function' && isObject(c.function) && isString(c.function.arguments);
    if (calls !== undefined && !(Array.isArray(calls) && calls.every(isCall))) {
      return `choices[${i}].message.tool_calls is malformed`;
    }
    if (!['stop', 'length', 'tool_calls'].includes(String(choice.finish_reason)))
      return `choices[${i}].finish_reason ${String(choice.finish_reason)}`;
  }
  return usageProblem(json.usage);
}

function usageProblem(usage: unknown): string | undefined {
  if (!isObject(usage) || !isNumber(usage.prompt_tokens) || !isNumber(usage.completion_tokens)) return 'usage is malformed';
  return usage.total_tokens === usage.prompt_tokens + usage.completion_tokens ? undefined : 'usage.total_tokens is not the sum';
}

function modelCardProblem(card: unknown): string | undefined {
  return isObject(card) && card.id === MODEL && card.object === 'model' && isNumber(card.created) && isString(card.owned_by)
    ? undefined
    : 'not a model card';
}

/** What is wrong with a 200 answer to `request`, or undefined. */
function successProblem(request: FuzzRequest, json: unknown): string | undefined {
  if (!isObject(json)) return 'body is not a JSON object';
  const path = request.path.split('?')[0].replace(/\/+$/, '');
  if (path === '/health') return json.status === 'ok' && isNumber(json.policy_version) ? undefined : 'not a health answer';
  if (path === '/v1/models') {
    return json.object === 'list' && Array.isArray(json.data) && json.data.length === 1
      ? modelCardProblem(json.data[0])
      : 'not a model list';
  }
  if (path.startsWith('/v1/models/')) return modelCardProblem(json);
  if (path === '/v1/completions') return completionProblem(json);
  if (path === '/v1/chat/completions') return chatProblem(json);
  if (path === '/update_weights_from_disk') {
    return json.success === true && isString(json.message) && isString(json.weight_version) && isNumber(json.policy_version)
      ? undefined
      : 'not an update answer';
  }
  if (path === '/v1/load_lora_adapter' || path === '/v1/unload_lora_adapter')
    return 'a LoRA route succeeded, but no request names an adapter';
  return `200 on a route that does not exist`;
}

/** One line that lets a failure be replayed. */
function describeRequest(index: number, request: FuzzRequest): string {
  const body =
    request.body === undefined ? '' : typeof request.body === 'string' ? request.body : Buffer.from(request.body).toString('hex');
  const more = body.length > 300 ? `… (${body.length} chars)` : '';
  const headers = JSON.stringify(request.headers).slice(0, 200);
  return `#${index} [${request.kind}] ${request.method} ${request.path.slice(0, 200)} ${headers} body: ${body.slice(0, 300)}${more}`;
}

// ---------------------------------------------------------------------------------------------------------------
// Sending.

/**
 * Sends bytes on a raw socket: garbage must get a 400 with an OpenAI error body; a request cut off part-way (in its
 * headers or its body) must only leave the server unharmed (checked through its log and later requests).
 */
function sendRaw(url: URL, kind: NonNullable<FuzzRequest['raw']>): Promise<string | undefined> {
  return new Promise((resolve) => {
    let reply = '';
    const socket = connect(Number(url.port), url.hostname, () => {
      const head = `POST /v1/completions HTTP/1.1\r\nHost: ${url.host}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n`;
      if (kind === 'garbage') {
        socket.write('\x00\x01GET / HTTP/9.9\r\n\r\n');
        return;
      }
      socket.write(kind === 'partial-body' ? `${head}{"model":"${MODEL}","prompt":"ab` : head.slice(0, -2));
      setTimeout(() => socket.destroy(), 5);
    });
    socket.on('data', (chunk: Buffer) => (reply += chunk.toString('utf8')));
    socket.on('close', () => {
      if (kind !== 'garbage') return resolve(undefined);
      const [head = '', body = ''] = reply.split('\r\n\r\n');
      let json: unknown;
      try {
        json = JSON.parse(body);
      } catch {
        return resolve(`garbage got a reply whose body is not JSON: ${reply.slice(0, 200)}`);
      }
      resolve(/^HTTP\/1\.1 400 /.test(head) ? errorProblem(json, false) : `garbage got ${head.slice(0, 100)}`);
    });
    socket.on('error', () => undefined);
  });
}

interface Answer {
  readonly status: number;
  readonly text: string;
}

async function send(origin: string, request: FuzzRequest): Promise<Answer> {
  const response = await fetch(`${origin}${request.path}`, {
    method: request.method,
    headers: request.headers,
    ...(request.body === undefined ? {} : { body: request.body }),
  });
  return { status: response.status, text: await response.text() };
}

/** What is wrong with `answer` to `request`, or undefined. */
function check(request: FuzzRequest, answer: Answer): string | undefined {
  const { status, text } = answer;
  if (request.method === 'HEAD') return status >= 400 && status < 500 ? undefined : `HEAD answered ${status}`;
  if (request.headers['x-big'] !== undefined && status !== 431) return `headers past node's limit got ${status}, not 431`;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return `status ${status} with a body that is not JSON: ${text.slice(0, 200)}`;
  }
  if (status === 200) return successProblem(request, json);
  if (status < 400 || status >= 500) return `status ${status}: ${text.slice(0, 300)}`;
  const problem = errorProblem(json, request.path.startsWith('/update_weights_from_disk'));
  if (problem !== undefined) return `${status}: ${problem}: ${text.slice(0, 300)}`;
  if (request.valid === true && request.headers['x-big'] === undefined) {
    const code = (json as { error: { code: unknown } }).error.code;
    if (!request.allow?.includes(String(code))) return `a valid request got ${status}: ${text.slice(0, 300)}`;
  }
  return request.kind === 'oversize' && status !== 413 ? `an oversize body got ${status}` : undefined;
}

// ---------------------------------------------------------------------------------------------------------------

/**
 * A full garbage collection, so that resident memory measures what is kept rather than what is not yet collected:
 * `global.gc` when node runs with `--expose-gc`, else one exposed for this process; undefined if neither works.
 */
function collector(): (() => void) | undefined {
  const exposed = (globalThis as { gc?: () => void }).gc;
  if (exposed !== undefined) return exposed;
  try {
    setFlagsFromString('--expose-gc');
    const gc: unknown = runInNewContext('gc');
    return typeof gc === 'function' ? () => void gc() : undefined;
  } catch {
    return undefined;
  }
}

let root: string;
let server: RxrlServer;
let model: PolicyModel;
/** Log records of requests that reached the server's internal-error path (or were answered 5xx). */
const internal: Readonly<Record<string, unknown>>[] = [];

async function writeFixtures(dir: string): Promise<void> {
  const weightsRoot = join(dir, 'root');
  const at = (name: string): string => join(weightsRoot, name);
  await mkdir(weightsRoot);
  const fresh = PolicyModel.create(config, 2);
  const weights = fresh.getWeights();
  fresh.dispose();
  const good = async (name: string, metadata?: Record<string, string>): Promise<string> => {
    await saveModelDir(at(name), { config, weights }, metadata === undefined ? {} : { metadata });
    return at(name);
  };
  const rng = mulberry32(SEED ^ 0x5a5a);
  const bytes = (n: number): Uint8Array => Uint8Array.from({ length: n }, () => randomInt(rng, 0, 255));

  weightPaths.good.push(await good('good'), await good('good-v9', { 'rxrl.policyVersion': '9' }));
  await mkdir(at('empty-dir'));
  await writeFile(at('empty-file'), '');
  await writeFile(at('random-file'), bytes(1024));
  await mkdir(at('config-random'));
  await writeFile(join(at('config-random'), 'config.json'), bytes(512));
  await mkdir(at('config-null'));
  await writeFile(join(at('config-null'), 'config.json'), 'null');
  await mkdir(at('config-deep'));
  await writeFile(join(at('config-deep'), 'config.json'), `{"model_type":${'['.repeat(200_000)}${']'.repeat(200_000)}}`);
  await mkdir(at('config-long'));
  await writeFile(join(at('config-long'), 'config.json'), JSON.stringify({ model_type: 'q'.repeat(100_000) }));
  await mkdir(join(at('config-is-dir'), 'config.json'), { recursive: true });
  await good('weights-empty');
  await truncate(join(at('weights-empty'), 'model.safetensors'), 0);
  await good('weights-random');
  await writeFile(join(at('weights-random'), 'model.safetensors'), bytes(4096));
  await good('weights-truncated');
  await truncate(join(at('weights-truncated'), 'model.safetensors'), 700);
  await good('weights-missing');
  await rm(join(at('weights-missing'), 'model.safetensors'));
  await good('index-null');
  await writeFile(join(at('index-null'), 'model.safetensors.index.json'), 'null');
  await good('index-escape');
  await writeFile(
    join(at('index-escape'), 'model.safetensors.index.json'),
    JSON.stringify({ weight_map: { x: '../../../good/model.safetensors' } }),
  );
  await good('generation-null');
  await writeFile(join(at('generation-null'), 'generation_config.json'), 'null');
  await good('version-junk', { 'rxrl.policyVersion': 'soon' });
  await saveModelDir(at('other-arch'), { config: { ...config, dFF: 48 }, weights: new Map() });
  await saveModelDir(at('wrong-weights'), { config, weights: new Map([['lm_head.weight', { shape: [2], data: new Float32Array(2) }]]) });
  await symlink(at('loop'), at('loop'));
  await mkdir(join(dir, 'outside'));
  await symlink(join(dir, 'outside'), at('link-out'));
  weightPaths.bad.push(
    ...[
      'missing',
      'empty-dir',
      'empty-file',
      'random-file',
      'config-random',
      'config-null',
      'config-deep',
      'config-long',
      'config-is-dir',
      'weights-empty',
      'weights-random',
      'weights-truncated',
      'weights-missing',
      'index-null',
      'index-escape',
      'generation-null',
      'version-junk',
      'other-arch',
      'wrong-weights',
      'loop',
      'link-out',
    ].map(at),
    join(dir, 'outside'),
    dir,
    weightsRoot,
    `${weightsRoot}/../root/good`,
    'relative/path',
    '',
    '   ',
    'a\u0000b',
    `/${'n'.repeat(5000)}`,
    join(weightsRoot, 'x'.repeat(300_000)),
  );
}

function keepInternalErrors(record: Readonly<Record<string, unknown>>): void {
  if (record.event === 'internal_error' || (typeof record.status === 'number' && record.status >= 500)) internal.push(record);
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  root = await mkdtemp(join(tmpdir(), 'rxrl-fuzz-'));
  await writeFixtures(root);
  model = PolicyModel.create(config, 1);
  server = await serve({ model, tokenizer, port: 0, weightsRoot: join(root, 'root'), log: keepInternalErrors });
});

afterAll(async () => {
  await server?.close();
  model?.dispose();
  if (root !== undefined) await rm(root, { recursive: true, force: true });
});

describe('rxrl serve under seeded fuzzing', () => {
  it(`answers ${REQUESTS} random, malformed and valid requests (seed ${SEED}) with valid responses or OpenAI 4xx errors`, async () => {
    const rng = mulberry32(SEED);
    const origin = server.url;
    const url = new URL(origin);
    // Warm up (kernels, connection pool) before measuring memory.
    const probe: FuzzRequest = {
      kind: 'probe',
      method: 'POST',
      path: '/v1/completions',
      headers: JSON_HEADERS,
      body: JSON.stringify({ model: MODEL, prompt: 'ab', max_tokens: 2 }),
    };
    expect((await send(origin, probe)).status).toBe(200);
    const gc = collector();
    gc?.();
    const before = process.memoryUsage();
    const tensorsBefore = tf.memory().numTensors;

    const failures: string[] = [];
    const counts = new Map<string, number>();
    let issued = 0;
    const worker = async (): Promise<void> => {
      while (issued < REQUESTS) {
        const index = issued++;
        const request = nextRequest(rng); // drawn in index order: the seed fixes the sequence
        counts.set(request.kind, (counts.get(request.kind) ?? 0) + 1);
        let problem: string | undefined;
        try {
          problem = request.raw === undefined ? check(request, await send(origin, request)) : await sendRaw(url, request.raw);
        } catch (error) {
          problem = `request failed: ${error instanceof Error ? `${error.message} (${String((error as { cause?: unknown }).cause)})` : String(error)}`;
        }
        if (problem !== undefined) failures.push(`${problem}\n    ${describeRequest(index, request)}`);
      }
    };
    await Promise.all(Array.from({ length: CONCURRENCY }, () => worker()));

    gc?.();
    const after = process.memoryUsage();
    const rssGrowth = after.rss - before.rss;
    const heapGrowth = after.heapUsed + after.external - (before.heapUsed + before.external);
    const tensorsAfter = tf.memory().numTensors;
    const health = await send(origin, { kind: 'health', method: 'GET', path: '/health', headers: {} });
    const answer = await send(origin, probe);

    if (process.env.RXRL_FUZZ_REPORT) {
      console.info(
        JSON.stringify({ rssGrowthMiB: rssGrowth / 2 ** 20, heapGrowthMiB: heapGrowth / 2 ** 20, counts: Object.fromEntries(counts) }),
      );
    }
    expect(failures.length, `seed ${SEED}: ${failures.length} bad answers; the first:\n${failures.slice(0, 12).join('\n')}`).toBe(0);
    expect(internal, `seed ${SEED}: internal errors logged`).toEqual([]);
    expect(health.status).toBe(200);
    expect(answer.status).toBe(200);
    expect(tensorsAfter, 'tensors leaked by the requests').toBe(tensorsBefore);
    expect(rssGrowth, `rss grew by ${(rssGrowth / 2 ** 20).toFixed(0)} MiB`).toBeLessThan(MAX_RSS_GROWTH_BYTES);
    expect(heapGrowth, `the live heap grew by ${(heapGrowth / 2 ** 20).toFixed(0)} MiB`).toBeLessThan(MAX_HEAP_GROWTH_BYTES);
    expect([...counts.values()].reduce((a, b) => a + b, 0)).toBe(REQUESTS);
    // Each family was exercised (the weights make these near-certain for any seed).
    const families = [
      'completions/valid',
      'chat/valid',
      'weights/valid',
      'weights/mutated',
      'models/retrieve',
      'wrong-method',
      'unknown-route',
      'body/text',
      'raw',
    ];
    for (const kind of families) {
      expect(counts.get(kind) ?? 0, kind).toBeGreaterThan(0);
    }
  }, 180_000);
});
