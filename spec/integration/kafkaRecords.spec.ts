/**
 * Trajectories any consumer can read: `rxrl trainer` and `rxrl worker` run a short Kafka run on the real broker, then
 * the trajectory topic is read twice — with rxrl's decoder (what the trainer decodes) and with the Python example
 * (examples/python/read_trajectories.py: PyPI confluent-kafka and classes generated from proto/rxrl/v1/records.proto)
 * — and every field of every record must agree, the response text being the tokenizer's decoding of the ids. Then
 * the same through a real schema registry (Apicurio, started here): records in the Confluent wire format under the
 * schema registered for the topic's subject, read back by the Python example (confluent-kafka's ProtobufDeserializer,
 * which resolves the schema by its id); and rxrl refuses to write to a subject whose latest schema its own is not
 * compatible with.
 */
import { execFile, spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

import { SchemaRegistry } from '@kafkajs/confluent-schema-registry';
import type { KafkaMessage } from 'kafkajs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { isSampleFailure } from '../../lib/core/types.js';
import { decodeTrajectoryMessage, recordFormatOf } from '../../lib/kafka/codec.js';
import { SchemaRegistryError, registerRecordSchemas } from '../../lib/kafka/schemaRegistry.js';
import { RECORDS_PROTO } from '../../lib/kafka/schema/records.js';
import { kafkaTopics, type TrajectoryMessage } from '../../lib/kafka/types.js';
import { loadRollout } from '../../pipelines/parts/data.js';
import { startSchemaRegistry, type SchemaRegistryServer } from '../helpers/schemaRegistry.js';
import { lacks, unavailable } from '../helpers/testSetup.js';
import { waitFor } from '../helpers/waitFor.js';
import { brokers, kafkaClient, uniqueName } from '../kafka/helpers.js';

const run = promisify(execFile);
const root = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
const CLI = join(root, 'dist/cli/main.js');
/** The test setup's Python environment (.cache/python), first on the specs' PATH. */
const PYTHON = 'python3';
const READER = join(root, 'examples/python/read_trajectories.py');
const STEPS = 2;
const BATCH = 2;
const GROUP = 2;
const TASK = { transform: 'reverse', alphabet: 'abcd', minLength: 2, maxLength: 3, validationSize: 4 } as const;

/** A record read from the topic: where it lies and its value's bytes. */
interface Raw {
  readonly partition: number;
  readonly offset: string;
  readonly key: string;
  readonly value: Buffer;
}

/** One line of `read_trajectories.py --json`. */
interface PythonLine {
  readonly key: string;
  readonly partition: number;
  readonly offset: number | string;
  readonly record: Record<string, unknown>;
}

/** The recipe of a short Kafka run on topics of its own. */
function writeRecipe(dir: string, prefix: string, registryUrl?: string): string {
  const recipe = join(dir, 'recipe.json');
  writeFileSync(
    recipe,
    JSON.stringify({
      run: { dir: 'run', seed: 5, steps: STEPS, backend: 'cpu' },
      data: { source: 'bundled', task: TASK, epochs: 0 },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
      rollout: { groupSize: GROUP },
      sync: { mode: 'sync', batchSize: BATCH },
      validation: { beforeTrain: false },
      logging: { level: 'warn' },
      kafka: {
        brokers: brokers(),
        topicPrefix: prefix,
        workerConcurrency: 2,
        ...(registryUrl ? { schemaRegistry: { url: registryUrl } } : {}),
      },
    }),
  );
  return recipe;
}

/** Runs `rxrl <command> <recipe>` to its end; rejects with its stderr on a non-zero exit. */
function rxrl(command: 'trainer' | 'worker', recipe: string): Promise<string> {
  return new Promise((done, fail) => {
    const child = spawn(process.execPath, [CLI, command, recipe], { stdio: ['ignore', 'ignore', 'pipe'] });
    let stderr = '';
    child.stderr!.on('data', (d: Buffer) => (stderr = (stderr + d.toString()).slice(-6000)));
    child.on('exit', (code) => (code === 0 ? done(stderr) : fail(new Error(`rxrl ${command} exited with ${code}:\n${stderr}`))));
  });
}

/** Every record of `topic` from its start, once `count` of them are there. */
async function readAll(topic: string, count: number): Promise<Raw[]> {
  const kafka = kafkaClient('rxrl-records');
  const consumer = kafka.consumer({ groupId: uniqueName('records'), maxWaitTimeInMs: 100 });
  const out: Raw[] = [];
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ partition, message }: { partition: number; message: KafkaMessage }) => {
        out.push({ partition, offset: message.offset, key: message.key?.toString() ?? '', value: message.value ?? Buffer.alloc(0) });
      },
    });
    await waitFor(() => out.length >= count, { what: `${count} records on ${topic} (got ${out.length})` });
  } finally {
    await consumer.disconnect();
  }
  return out;
}

/** The Python example's `--json` lines for `count` records of `topic`. */
async function readInPython(topic: string, count: number, registryUrl?: string): Promise<PythonLine[]> {
  const args = [READER, '--brokers', brokers(), '--topic', topic, '--from-beginning', '--json', '--max', String(count), '--timeout', '60'];
  if (registryUrl) args.push('--registry', registryUrl);
  const { stdout } = await run(PYTHON, args, {
    cwd: root,
    maxBuffer: 1 << 26,
    env: { ...process.env, XDG_CACHE_HOME: join(root, '.cache') },
  });
  return stdout
    .split('\n')
    .filter((line) => line.trim() !== '')
    .map((line) => JSON.parse(line) as PythonLine);
}

/** What a record decoded by rxrl says, in the names and JSON forms of the schema (protobuf's JSON mapping). */
function asProtoJson(message: TrajectoryMessage, tokenizer: Tokenizer): Record<string, unknown> {
  const { output } = message;
  const ids = { id: output.id, task_id: output.taskId, group_id: output.groupId, run_id: output.runId, model_tag: output.modelTag };
  const base = { run: message.run, produced_unix_ms: message.producedAt ?? 0 };
  if (isSampleFailure(output)) {
    const retriable = (output.error as { retriable?: boolean }).retriable === true;
    return {
      ...base,
      failure: { ...ids, error_name: output.error.name, error_message: output.error.message, retriable, skipped: output.skipped === true },
    };
  }
  const t = output;
  expect(t.responseText).toBe(tokenizer.decode(t.responseTokens));
  const task = {
    id: t.task.id,
    prompt: t.task.prompt,
    ...(t.task.answer === undefined ? {} : { answer: t.task.answer }),
    ...(t.task.epoch === undefined ? {} : { epoch: t.task.epoch }),
  };
  const times = message.times!;
  return {
    ...base,
    trajectory: {
      ...ids,
      policy_version: t.policyVersion,
      prompt_tokens: t.promptTokens,
      response_tokens: t.responseTokens,
      logprobs: t.logprobs,
      loss_mask: t.lossMask.map((v) => v === 1),
      reward: t.reward,
      finish_reason: `FINISH_REASON_${t.finishReason.toUpperCase()}`,
      metrics: t.metrics,
      task,
      response_text: t.responseText,
      times: { generate_start_unix_ms: times.generateStart, generate_end_unix_ms: times.generateEnd, reward_end_unix_ms: times.rewardEnd },
    },
  };
}

/** protobuf's JSON mapping leaves out fields at their default; the comparison does too. */
function withoutDefaults(value: unknown): unknown {
  if (Array.isArray(value)) return value.length === 0 ? undefined : value;
  if (value === null || typeof value !== 'object') return value === 0 || value === false || value === '' ? undefined : value;
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(value)) {
    const kept = withoutDefaults(v);
    if (kept !== undefined) out[k] = kept;
  }
  return Object.keys(out).length === 0 ? undefined : out;
}

/** The run's tokenizer, as the worker builds it from the recipe. */
async function tokenizerOf(recipe: string): Promise<Tokenizer> {
  const config = loadConfig({ file: recipe });
  return (await loadRollout(config, dirname(recipe))).tokenizer;
}

/** Runs a trainer and a worker to the end of a short run; returns the trajectory topic's records. */
async function shortRun(dir: string, registryUrl?: string): Promise<{ topic: string; records: Raw[]; tokenizer: Tokenizer }> {
  const prefix = uniqueName('records');
  const recipe = writeRecipe(dir, prefix, registryUrl);
  const worker = rxrl('worker', recipe);
  await rxrl('trainer', recipe);
  await worker;
  const topic = kafkaTopics(prefix).trajectories;
  const records = await readAll(topic, STEPS * BATCH * GROUP);
  return { topic, records, tokenizer: await tokenizerOf(recipe) };
}

/** Each Python line equals rxrl's decoding of the record at the same partition and offset. */
function expectSameRecords(python: readonly PythonLine[], records: readonly Raw[], tokenizer: Tokenizer): void {
  expect(python).toHaveLength(records.length);
  const at = new Map(records.map((r) => [`${r.partition}@${r.offset}`, r]));
  for (const line of python) {
    const raw = at.get(`${line.partition}@${line.offset}`);
    expect(raw, `record ${line.partition}@${line.offset}`).toBeDefined();
    expect(line.key).toBe(raw!.key);
    const decoded = decodeTrajectoryMessage(raw!.value);
    expect(line.key).toBe(decoded.output.groupId);
    const record = { ...line.record } as Record<string, Record<string, unknown>>;
    if (record.trajectory) {
      // uint64 and int64 are strings in protobuf's JSON mapping; float log-probs are the same float32 values.
      record.trajectory = { ...record.trajectory, logprobs: (record.trajectory.logprobs as number[] | undefined)?.map(Math.fround) };
    }
    expect(withoutDefaults(record)).toEqual(withoutDefaults(asProtoJson(decoded, tokenizer)));
  }
}

describe.skipIf(lacks('python'))(`Kafka records read outside JavaScript${lacks('python') ? ` (${unavailable('python')})` : ''}`, () => {
  const dirs: string[] = [];
  afterAll(() => {
    for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
  });

  it('the Python example reads every field of a worker’s trajectories as rxrl decodes them; the text is the ids’ decoding', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-records-'));
    dirs.push(dir);
    const { topic, records, tokenizer } = await shortRun(dir);
    expect(records.length).toBe(STEPS * BATCH * GROUP);
    expect(records.every((r) => recordFormatOf(r.value) === 'protobuf')).toBe(true);
    const python = await readInPython(topic, records.length);
    expectSameRecords(python, records, tokenizer);
    const texts = python.map((l) => (l.record.trajectory as { response_text?: string } | undefined)?.response_text);
    expect(texts.every((t) => typeof t === 'string')).toBe(true);
  }, 0); // no total bound: the run's own waits are bounded by its progress

  describe.skipIf(lacks('registry'))(`with a schema registry${lacks('registry') ? ` (${unavailable('registry')})` : ''}`, () => {
    let server: SchemaRegistryServer;
    beforeAll(async () => {
      server = await startSchemaRegistry();
    });
    afterAll(async () => {
      await server?.stop();
    });

    it('records are in the Confluent wire format under the registered schema; the Python example resolves it by id', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'rxrl-records-'));
      dirs.push(dir);
      const { topic, records, tokenizer } = await shortRun(dir, server.url);
      const registry = new SchemaRegistry({ host: server.url, clientId: 'rxrl-spec', retry: { retries: 0 } });
      const id = await registry.getLatestSchemaId(`${topic}-value`);
      // The schema a reader resolves from a record's id is rxrl's.
      const byId = (await (await fetch(`${server.url}/schemas/ids/${id}`)).json()) as { schema: string };
      expect(byId.schema).toContain('message TrajectoryRecord');
      for (const r of records) {
        expect(recordFormatOf(r.value)).toBe('confluent');
        expect(r.value.readUInt32BE(1)).toBe(id);
        // The message indexes name TrajectoryRecord, the file's seventh message: [6], one zigzag varint each.
        expect([...r.value.subarray(5, 7)]).toEqual([2, 12]);
      }
      expectSameRecords(await readInPython(topic, records.length, server.url), records, tokenizer);
    }, 0);

    it('rxrl refuses a subject whose latest schema its own is not compatible with, naming the subject', async () => {
      const topics = kafkaTopics(uniqueName('refused'));
      const subject = `${topics.trajectories}-value`;
      const answer = await fetch(`${server.url}/config/${encodeURIComponent(subject)}`, {
        method: 'PUT',
        headers: { 'Content-Type': 'application/vnd.schemaregistry.v1+json' },
        body: JSON.stringify({ compatibility: 'BACKWARD' }),
      });
      expect(answer.status).toBe(200);
      // Someone else's schema under the subject, whose `reward` is a string: rxrl's double is not a compatible change.
      const foreign = RECORDS_PROTO.replace('double reward = 11;', 'string reward = 11;');
      expect(foreign).not.toBe(RECORDS_PROTO);
      const registered = await fetch(`${server.url}/subjects/${encodeURIComponent(subject)}/versions`, {
        method: 'POST',
        headers: { 'Content-Type': 'application/vnd.schemaregistry.v1+json' },
        body: JSON.stringify({ schemaType: 'PROTOBUF', schema: foreign }),
      });
      expect(registered.status).toBe(200);
      const refusal = await registerRecordSchemas({ url: server.url, timeoutMs: 30_000 }, topics).then(
        () => undefined,
        (error: unknown) => error,
      );
      expect(refusal).toBeInstanceOf(SchemaRegistryError);
      expect((refusal as Error).message).toContain(subject);
      expect((refusal as Error).message).toMatch(/not compatible|409/);
    });
  });
});
