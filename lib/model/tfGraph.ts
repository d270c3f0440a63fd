/**
 * A TensorFlow graph written by rxrl and run as one session on the native backend: a small `GraphDef` builder
 * (the protocol-buffer encoding of TensorFlow's `graph.proto`, `saved_model.proto` and their parts, written
 * field by field) and the session that runs it.
 *
 * Eager execution dispatches every op from JavaScript (about 20 µs each on a quiet machine, several times that
 * under load); a decoding step is about 1,400 ops. A session runs the whole graph inside TensorFlow, where Grappler
 * also folds and fuses what it can. Weights are fed as inputs (TensorFlow reads the backend's tensors in place),
 * so one graph serves every weight version, batch size and cache length.
 *
 * @packageDocumentation
 */
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { BinaryWriter, WireType } from '@bufbuild/protobuf/wire';
import * as tf from '@tensorflow/tfjs-core';

import { BackendUnavailableError } from '../core/errors.js';

/** The element types a graph here uses. */
export type GraphDType = 'float32' | 'int32';

/** TensorFlow's `DataType` numbers. */
const DT: Record<GraphDType, number> = { float32: 1, int32: 3 };

/** A node attribute: a type, an integer, a boolean, an integer list or a constant tensor. */
export type GraphAttr =
  | { readonly type: GraphDType }
  | { readonly i: number }
  | { readonly b: boolean }
  | { readonly ints: readonly number[] }
  | { readonly shape: readonly (number | null)[] }
  | { readonly tensor: { readonly dtype: GraphDType; readonly shape: readonly number[]; readonly values: Float32Array | Int32Array } };

/** A message written field by field, in order (protobuf-es's writer; int64 fields take negative values too). */
class Proto {
  private readonly writer = new BinaryWriter();

  int(field: number, value: number): this {
    this.writer.tag(field, WireType.Varint).int64(value);
    return this;
  }

  raw(field: number, data: Uint8Array): this {
    this.writer.tag(field, WireType.LengthDelimited).bytes(data);
    return this;
  }

  string(field: number, value: string): this {
    this.writer.tag(field, WireType.LengthDelimited).string(value);
    return this;
  }

  message(field: number, value: Proto): this {
    return this.raw(field, value.encode());
  }

  /** A `map<string, M>` entry. */
  entry(field: number, key: string, value: Proto): this {
    return this.message(field, new Proto().string(1, key).message(2, value));
  }

  encode(): Uint8Array {
    return this.writer.finish();
  }
}

/** `TensorShapeProto`: `null` is an unknown dimension. */
function shapeProto(shape: readonly (number | null)[]): Proto {
  const p = new Proto();
  for (const d of shape) p.message(2, new Proto().int(1, d ?? -1));
  return p;
}

function attrProto(attr: GraphAttr): Proto {
  const p = new Proto();
  if ('type' in attr) return p.int(6, DT[attr.type]);
  if ('i' in attr) return p.int(3, attr.i);
  if ('b' in attr) return p.int(5, attr.b ? 1 : 0);
  if ('shape' in attr) return p.message(7, shapeProto(attr.shape));
  if ('ints' in attr) {
    const list = new Proto();
    for (const v of attr.ints) list.int(3, v);
    return p.message(1, list);
  }
  const { dtype, shape, values } = attr.tensor;
  const tensor = new Proto()
    .int(1, DT[dtype])
    .message(2, shapeProto(shape))
    .raw(4, new Uint8Array(values.buffer, values.byteOffset, values.byteLength));
  return p.message(8, tensor);
}

/**
 * Builds a `GraphDef` node by node. Node names are made unique by the builder; an op's outputs are named
 * `node:index`.
 */
export class GraphBuilder {
  private readonly nodes: Proto[] = [];
  private readonly names = new Set<string>();
  private readonly dtypes = new Map<string, GraphDType>();

  /** Adds a node and returns the name of its first output (`node:0`); `outputs` names the others. */
  op(op: string, inputs: readonly string[], attrs: Record<string, GraphAttr> = {}, name = op): string {
    let unique = name;
    for (let n = 1; this.names.has(unique); n++) unique = `${name}_${n}`;
    this.names.add(unique);
    const node = new Proto().string(1, unique).string(2, op);
    for (const input of inputs) node.string(3, input);
    for (const [key, value] of Object.entries(attrs)) node.entry(5, key, attrProto(value));
    this.nodes.push(node);
    return `${unique}:0`;
  }

  /** A graph input of the given element type, and shape where given (`null`: any size; none: any shape). */
  placeholder(name: string, dtype: GraphDType, shape?: readonly (number | null)[]): string {
    const out = this.op(
      'Placeholder',
      [],
      shape === undefined ? { dtype: { type: dtype } } : { dtype: { type: dtype }, shape: { shape } },
      name,
    );
    this.dtypes.set(out, dtype);
    return out;
  }

  /** A constant. */
  constant(values: Float32Array | Int32Array, shape: readonly number[], name = 'Const'): string {
    const dtype: GraphDType = values instanceof Float32Array ? 'float32' : 'int32';
    return this.op('Const', [], { dtype: { type: dtype }, value: { tensor: { dtype, shape, values } } }, name);
  }

  /** An int32 vector constant (shapes, axes, sizes). */
  ints(values: readonly number[], name = 'Const'): string {
    return this.constant(Int32Array.from(values), [values.length], name);
  }

  /** An int32 scalar constant. */
  int(value: number, name = 'Const'): string {
    return this.constant(Int32Array.of(value), [], name);
  }

  /**
   * The graph as a `SavedModel` (tag `serve`, one signature `serving_default`) whose inputs are the given
   * placeholders and whose outputs are the given tensors, all float32 but where `dtypes` says otherwise.
   */
  savedModel(inputs: readonly string[], outputs: readonly string[]): Uint8Array {
    const graph = new Proto();
    for (const node of this.nodes) graph.message(1, node);
    graph.message(4, new Proto().int(1, GRAPH_PRODUCER));
    const info = (name: string): Proto =>
      new Proto()
        .string(1, name)
        .int(2, DT[this.dtypes.get(name) ?? 'float32'])
        .message(3, new Proto().int(3, 1)); // unknown rank
    const signature = new Proto();
    for (const name of inputs) signature.entry(1, name, info(name));
    for (const name of outputs) signature.entry(2, name, info(name));
    signature.string(3, 'tensorflow/serving/predict');
    const meta = new Proto().message(1, new Proto().string(4, 'serve')).message(2, graph).entry(5, 'serving_default', signature);
    return new Proto().int(1, 1).message(2, meta).encode();
  }
}

/** The graph's `versions.producer`: TensorFlow 2.9's (the libtensorflow that tfjs-node 4 loads). */
const GRAPH_PRODUCER = 1087;

/** The part of tfjs-node's backend that loads and runs a `SavedModel`. */
interface SessionBackend {
  loadSavedModelMetaGraph(path: string, tags: string): number;
  runSavedModel(id: number, inputs: tf.Tensor[], infos: { name: string; tfDtype: string }[], outputs: string[]): tf.Tensor[];
  deleteSavedModel(id: number): void;
}

/** The active backend where it can run sessions (the native `tensorflow` one), else null. */
function sessionBackend(): SessionBackend | null {
  const backend = tf.backend() as unknown as Partial<SessionBackend>;
  return tf.getBackend() === 'tensorflow' && typeof backend.loadSavedModelMetaGraph === 'function' ? (backend as SessionBackend) : null;
}

/** Whether graphs can run here: the active backend is the native `tensorflow` one. */
export function graphSessionsAvailable(): boolean {
  return sessionBackend() !== null;
}

/** A graph loaded into a TensorFlow session, run with inputs fed by placeholder name. */
export class GraphSession {
  private readonly backend: SessionBackend;
  private readonly id: number;
  private readonly infos: { name: string; tfDtype: string }[];
  private readonly outputs: string[];
  private disposed = false;

  /**
   * Loads the graph (written to a temporary directory, removed once loaded).
   *
   * @param inputs - Placeholder outputs, in the order {@link GraphSession.run} takes their tensors.
   * @param outputs - Tensors {@link GraphSession.run} returns, in order.
   */
  constructor(graph: GraphBuilder, inputs: readonly string[], outputs: readonly string[]) {
    const backend = sessionBackend();
    if (backend === null) throw new BackendUnavailableError('a graph session needs the native tensorflow backend (npm run native)');
    this.backend = backend;
    this.outputs = [...outputs];
    let dir: string | undefined;
    try {
      dir = mkdtempSync(join(tmpdir(), 'rxrl-graph-'));
      writeFileSync(join(dir, 'saved_model.pb'), graph.savedModel(inputs, outputs));
      this.id = this.backend.loadSavedModelMetaGraph(dir, 'serve');
    } catch (error) {
      throw new BackendUnavailableError(
        `could not load a TensorFlow graph (${(error as Error).message}); PolicyModel.setGraphDecoding(false) samples op by op instead`,
        { cause: error },
      );
    } finally {
      if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
    }
    // Only the name is read for float32 and int32 inputs (other types would be converted).
    this.infos = inputs.map((name) => ({ name, tfDtype: 'DT_FLOAT' }));
  }

  /** Runs the graph: one tensor per input, in order; returns the outputs (owned by the caller). */
  run(inputs: tf.Tensor[]): tf.Tensor[] {
    if (this.disposed) throw new Error('GraphSession: already disposed');
    return this.backend.runSavedModel(this.id, inputs, this.infos, this.outputs);
  }

  dispose(): void {
    if (this.disposed) return;
    this.disposed = true;
    this.backend.deleteSavedModel(this.id);
  }
}
