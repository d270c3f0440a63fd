/**
 * Records for a schema registry: with `kafka.schemaRegistry.url` set, a process registers the record schema
 * (proto/rxrl/v1/records.proto) under each topic's subject `<topic>-value` through the Confluent Schema Registry API
 * (Confluent's own, Apicurio's `/apis/ccompat/v7`, Redpanda's, Karapace's), after checking that it is compatible with
 * the subject's latest version, and writes its records in the Confluent wire format: a 0 byte, the schema id
 * (4 bytes, big-endian), the message's index in the file (zigzag varints), then the Protocol Buffers encoding.
 *
 * rxrl's own decoders read that format without a registry (lib/kafka/codec.ts): the framing says which message
 * follows, and a Protocol Buffers reader skips the fields a newer schema added. Other readers resolve the schema by
 * its id (Confluent's deserializers, `@kafkajs/confluent-schema-registry`, examples/python/read_trajectories.py).
 *
 * @packageDocumentation
 */
import { readBoundedText } from '../core/http.js';
import { RxrlError } from '../core/errors.js';
import { encodeHeartbeatMessage, encodeTaskMessage, encodeTrajectoryMessage, encodeWeightsMessage } from './codec.js';
import { MESSAGE_INDEXES, RECORDS_PROTO } from './schema/records.js';
import type { KafkaTopics, RecordEncoders } from './types.js';

/** Where a registry is and how long to wait for it. */
export interface SchemaRegistryOptions {
  /**
   * Base URL of the Confluent Schema Registry API (for example `http://localhost:8081`, or Apicurio's
   * `http://host:8080/apis/ccompat/v7`). Credentials in it (`https://user:secret@host`) go as HTTP basic auth.
   */
  readonly url: string;
  /** Each request unanswered after this long fails. Default 10 s. */
  readonly timeoutMs?: number;
  /** Ends the registration at once. */
  readonly signal?: AbortSignal;
}

/** The record schema as registered under each topic's subject. */
export interface RegisteredSchemas {
  /** Schema id of each topic's subject. */
  readonly ids: Readonly<Record<'tasks' | 'trajectories' | 'weights' | 'heartbeats', number>>;
  /** Encoders that frame each record with its topic's schema id. */
  readonly encoders: RecordEncoders;
}

/** A schema registry refused the schema, answered what it should not, or did not answer in time. */
export class SchemaRegistryError extends RxrlError {
  override readonly name = 'SchemaRegistryError';
}

/** Writers of plain Protocol Buffers records: what a process uses without a schema registry. */
export const PLAIN_ENCODERS: RecordEncoders = {
  task: encodeTaskMessage,
  trajectory: encodeTrajectoryMessage,
  weights: encodeWeightsMessage,
  heartbeat: encodeHeartbeatMessage,
};

/** Largest registry answer read. */
const MAX_ANSWER_BYTES = 1 << 20;
const CONTENT_TYPE = 'application/vnd.schemaregistry.v1+json';

/**
 * Registers the record schema under the subjects of `topics` (after checking it is compatible with each subject's
 * latest version) and returns encoders that write each topic's records in the Confluent wire format.
 *
 * @throws {@link SchemaRegistryError} naming the subject and the registry's answer when the schema is incompatible,
 *   the registry fails or does not answer within `timeoutMs`.
 */
export async function registerRecordSchemas(options: SchemaRegistryOptions, topics: KafkaTopics): Promise<RegisteredSchemas> {
  const client = new RegistryClient(options);
  const subjects = {
    tasks: `${topics.tasks}-value`,
    trajectories: `${topics.trajectories}-value`,
    weights: `${topics.weights}-value`,
    heartbeats: `${topics.heartbeats}-value`,
  };
  const ids = {
    tasks: await client.register(subjects.tasks),
    trajectories: await client.register(subjects.trajectories),
    weights: await client.register(subjects.weights),
    heartbeats: await client.register(subjects.heartbeats),
  };
  return {
    ids,
    encoders: {
      task: framed(PLAIN_ENCODERS.task, ids.tasks, MESSAGE_INDEXES['rxrl.v1.TaskRecord']),
      trajectory: framed(PLAIN_ENCODERS.trajectory, ids.trajectories, MESSAGE_INDEXES['rxrl.v1.TrajectoryRecord']),
      weights: framed(PLAIN_ENCODERS.weights, ids.weights, MESSAGE_INDEXES['rxrl.v1.WeightsRecord']),
      heartbeat: framed(PLAIN_ENCODERS.heartbeat, ids.heartbeats, MESSAGE_INDEXES['rxrl.v1.Heartbeat']),
    },
  };
}

/**
 * `encode` whose records carry a registry's framing: magic byte 0, `schemaId` (big-endian), then the message indexes
 * `[index]` (a zigzag varint count and index; `[0]` is the single byte 0).
 */
export function framed<T>(encode: (message: T) => Uint8Array, schemaId: number, index: number): (message: T) => Uint8Array {
  if (!(Number.isInteger(schemaId) && schemaId >= 0 && schemaId < 2 ** 31)) {
    throw new SchemaRegistryError(`schema id ${schemaId} is not a non-negative 32-bit integer`);
  }
  const header = [0, (schemaId >>> 24) & 0xff, (schemaId >>> 16) & 0xff, (schemaId >>> 8) & 0xff, schemaId & 0xff, ...indexesOf(index)];
  return (message) => {
    const body = encode(message);
    const out = Buffer.allocUnsafe(header.length + body.length);
    out.set(header, 0);
    out.set(body, header.length);
    return out;
  };
}

/** The zigzag varints of the message-index path `[index]`. */
function indexesOf(index: number): number[] {
  if (index === 0) return [0];
  const out = [2]; // one element, zigzag encoded
  let v = index * 2;
  while (v > 0x7f) {
    out.push((v & 0x7f) | 0x80);
    v >>>= 7;
  }
  out.push(v);
  return out;
}

/** The part of the Confluent Schema Registry API rxrl uses, every request bounded in time and size. */
class RegistryClient {
  private readonly base: string;
  private readonly headers: Record<string, string>;

  constructor(private readonly options: SchemaRegistryOptions) {
    let url: URL;
    try {
      url = new URL(options.url);
    } catch (cause) {
      throw new SchemaRegistryError(
        `kafka.schemaRegistry.url: '${options.url}' is not a URL (give http://host:port of the registry's API)`,
        { cause },
      );
    }
    this.headers = { 'Content-Type': CONTENT_TYPE, Accept: CONTENT_TYPE };
    if (url.username !== '') {
      const credentials = `${decodeURIComponent(url.username)}:${decodeURIComponent(url.password)}`;
      this.headers.Authorization = `Basic ${Buffer.from(credentials).toString('base64')}`;
      url.username = '';
      url.password = '';
    }
    this.base = url.toString().replace(/\/+$/, '');
  }

  /**
   * The schema's id under `subject`: found when it is registered there already, else registered after a check
   * against the subject's latest version. A registration that loses a race with another process's (a 409 while the
   * schema is now there) takes the id the other one registered.
   */
  async register(subject: string): Promise<number> {
    const body = JSON.stringify({ schemaType: 'PROTOBUF', schema: RECORDS_PROTO });
    const path = `/subjects/${encodeURIComponent(subject)}`;
    const found = await this.lookup(path, body, subject);
    if (found !== undefined) return found;
    const check = await this.request('POST', `/compatibility${path}/versions/latest`, body, subject);
    if (check.status === 200) {
      const compatible = (check.json as { is_compatible?: unknown }).is_compatible;
      if (compatible !== true) {
        throw new SchemaRegistryError(
          `schema registry: rxrl's record schema is not compatible with the latest version under '${subject}' (${check.text.slice(0, 500)}); give the topics another kafka.topicPrefix, or let the registry's owner decide on the subject's compatibility`,
          { context: { subject } },
        );
      }
    } else if (check.status !== 404) {
      throw this.refused('check the compatibility of', subject, check);
    }
    const registered = await this.request('POST', `${path}/versions`, body, subject);
    const id = (registered.json as { id?: unknown }).id;
    if (registered.status === 200 && typeof id === 'number') return id;
    const raced = registered.status === 409 ? await this.lookup(path, body, subject) : undefined;
    if (raced !== undefined) return raced;
    throw this.refused('register', subject, registered);
  }

  /** The id of the schema under `subject` when it is registered there (`POST /subjects/{subject}`), else `undefined`. */
  private async lookup(path: string, body: string, subject: string): Promise<number | undefined> {
    const answer = await this.request('POST', path, body, subject);
    const id = (answer.json as { id?: unknown }).id;
    if (answer.status === 200 && typeof id === 'number') return id;
    if (answer.status === 404) return undefined;
    throw this.refused('look up', subject, answer);
  }

  private refused(what: string, subject: string, answer: { status: number; text: string }): SchemaRegistryError {
    const incompatible = answer.status === 409 ? " (incompatible with the subject's compatibility level)" : '';
    return new SchemaRegistryError(
      `schema registry at ${this.base}: could not ${what} the record schema under '${subject}': HTTP ${answer.status}${incompatible} ${answer.text.slice(0, 500)}`,
      { context: { subject, status: answer.status } },
    );
  }

  private async request(
    method: string,
    path: string,
    body: string,
    subject: string,
  ): Promise<{ status: number; text: string; json: unknown }> {
    const timeoutMs = this.options.timeoutMs ?? 10_000;
    const signals = [AbortSignal.timeout(timeoutMs), ...(this.options.signal ? [this.options.signal] : [])];
    try {
      const response = await fetch(`${this.base}${path}`, { method, headers: this.headers, body, signal: AbortSignal.any(signals) });
      const text = await readBoundedText(response, MAX_ANSWER_BYTES, `schema registry ${path}`);
      let json: unknown = {};
      try {
        json = text === '' ? {} : JSON.parse(text);
      } catch {
        // Not JSON: reported with the status.
      }
      return { status: response.status, text, json: json ?? {} };
    } catch (cause) {
      if (cause instanceof SchemaRegistryError) throw cause;
      const stopped = this.options.signal?.aborted === true;
      throw new SchemaRegistryError(
        stopped
          ? `schema registry: stopped while registering '${subject}'`
          : `schema registry at ${this.base} did not answer ${method} ${path} within ${timeoutMs} ms: ${cause instanceof Error ? cause.message : String(cause)} (is kafka.schemaRegistry.url right?)`,
        { cause, retriable: !stopped, context: { subject } },
      );
    }
  }
}
