#!/usr/bin/env node
// Generates lib/kafka/schema/records.ts from proto/rxrl/v1/records.proto: one TypeScript interface per message and
// enum (with the .proto's comments), a straight-line encoder and decoder per message over lib/kafka/wire.ts, each
// message's index in the file (for a schema registry's framing) and the .proto's text (what is registered).
//
//   npm run proto            writes the file
//   npm run proto -- --check exits 1 when the committed file differs from what the .proto gives
//
// The .proto is compiled by buf (`@bufbuild/buf` from npm) into descriptors, read with @bufbuild/protobuf. The
// generator handles the field kinds the schema uses — scalars (string, bool, int32, uint32, uint64, float, double),
// enums, messages, proto3 `optional`, oneofs of messages, packed repeated int32/bool/float, map<string, scalar> —
// and stops with an error naming any other, so the schema cannot outgrow the codec unnoticed.
import { execFileSync } from 'node:child_process';
import { readFileSync, writeFileSync, mkdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { createFileRegistry, fromBinary } from '@bufbuild/protobuf';
import { FileDescriptorSetSchema } from '@bufbuild/protobuf/wkt';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const PROTO = 'rxrl/v1/records.proto';
const OUT = join(root, 'lib/kafka/schema/records.ts');

// Scalar types (google.protobuf.FieldDescriptorProto.Type): TypeScript type, wire type, reader, writer, default.
const SCALARS = {
  1: { ts: 'number', wire: 1, read: 'double', write: 'double', zero: '0' },
  2: { ts: 'number', wire: 5, read: 'float', write: 'float', zero: '0' },
  4: { ts: 'number', wire: 0, read: 'uint64', write: 'uint64', zero: '0' },
  5: { ts: 'number', wire: 0, read: 'int32', write: 'int32', zero: '0' },
  8: { ts: 'boolean', wire: 0, read: 'bool', write: 'bool', zero: 'false' },
  9: { ts: 'string', wire: 2, read: 'string', write: 'string', zero: "''" },
  13: { ts: 'number', wire: 0, read: 'uint32', write: 'uint32', zero: '0' },
};
// Packed repeated scalars: the writer's and the reader's method.
const PACKED = {
  5: { read: 'packedInt32' },
  8: { read: 'packedBool' },
  2: { read: 'packedFloat' },
};

function scalarOf(field, type) {
  const s = SCALARS[type];
  if (s === undefined)
    throw new Error(`${field.parent.typeName}.${field.name}: scalar type ${type} is not supported by scripts/proto-gen.mjs`);
  return s;
}

function compile() {
  const buf = join(root, 'node_modules/.bin/buf');
  const image = execFileSync(buf, ['build', 'proto', '--as-file-descriptor-set', '-o', '-'], { cwd: root, maxBuffer: 1 << 24 });
  return createFileRegistry(fromBinary(FileDescriptorSetSchema, image)).getFile(PROTO);
}

/** The .proto's comment at a source path, as TSDoc. */
function docAt(file, path, indent = '') {
  const location = file.proto.sourceCodeInfo?.location.find((l) => l.path.length === path.length && l.path.every((p, i) => p === path[i]));
  const text = (location?.leadingComments ?? '').trim();
  if (text === '') return '';
  const lines = text.split('\n').map((line) => line.replace(/^ /, '').replaceAll('*/', '*\\/'));
  if (lines.length === 1) return `${indent}/** ${lines[0]} */\n`;
  return `${indent}/**\n${lines.map((l) => `${indent} *${l === '' ? '' : ` ${l}`}`).join('\n')}\n${indent} */\n`;
}

const nameOf = (desc) => desc.name;

function tsType(field) {
  switch (field.fieldKind) {
    case 'scalar':
      return scalarOf(field, field.scalar).ts;
    case 'enum':
      return nameOf(field.enum);
    case 'message':
      return nameOf(field.message);
    case 'list':
      if (field.listKind !== 'scalar' || PACKED[field.scalar] === undefined || !field.packed) {
        throw new Error(`${field.parent.typeName}.${field.name}: only packed repeated int32, bool and float are supported`);
      }
      return `${scalarOf(field, field.scalar).ts}[]`;
    case 'map':
      if (field.mapKey !== 9 || field.mapKind !== 'scalar')
        throw new Error(`${field.parent.typeName}.${field.name}: only map<string, scalar> is supported`);
      return `{ [key: string]: ${scalarOf(field, field.scalar).ts} }`;
    default:
      throw new Error(`${field.parent.typeName}.${field.name}: field kind ${field.fieldKind} is not supported`);
  }
}

function interfaceOf(file, message, index) {
  let out = docAt(file, [4, index]);
  out += `export interface ${message.name} {\n`;
  message.fields.forEach((field, i) => {
    if (field.oneof !== undefined) return;
    const optional = field.proto.proto3Optional || field.fieldKind === 'message';
    out += docAt(file, [4, index, 2, i], '  ');
    out += `  ${field.localName}${optional ? '?' : ''}: ${tsType(field)}${optional ? ' | undefined' : ''};\n`;
  });
  for (const oneof of message.oneofs) {
    const cases = oneof.fields.map((f) => {
      if (f.fieldKind !== 'message') throw new Error(`${message.typeName}.${f.name}: oneof members must be messages`);
      return `{ case: '${f.localName}'; value: ${nameOf(f.message)} }`;
    });
    out += `  ${oneof.localName}?: ${cases.join(' | ')} | undefined;\n`;
  }
  return `${out}}\n`;
}

function enumOf(file, e, index) {
  let out = docAt(file, [5, index]);
  out += `export enum ${e.name} {\n`;
  e.values.forEach((v, i) => {
    out += docAt(file, [5, index, 2, i], '  ');
    out += `  ${v.localName} = ${v.number},\n`;
  });
  return `${out}}\n`;
}

const tagOf = (number, wire) => (number << 3) | wire;

function writeField(field) {
  const m = `m.${field.localName}`;
  const n = field.number;
  switch (field.fieldKind) {
    case 'scalar': {
      const s = scalarOf(field, field.scalar);
      const cond = field.proto.proto3Optional ? `${m} !== undefined` : `${m} !== ${s.zero}`;
      return `  if (${cond}) {\n    w.tag(${n}, ${s.wire});\n    w.${s.write}(${m});\n  }\n`;
    }
    case 'enum':
      return `  if (${m} !== 0) {\n    w.tag(${n}, 0);\n    w.int32(${m});\n  }\n`;
    case 'message':
      return `  if (${m} !== undefined) {\n    w.tag(${n}, 2);\n    const at = w.fork();\n    write${field.message.name}(w, ${m});\n    w.join(at);\n  }\n`;
    case 'list':
      return `  if (${m}.length > 0) {\n    w.tag(${n}, 2);\n    w.${PACKED[field.scalar].read}(${m});\n  }\n`;
    case 'map': {
      const s = scalarOf(field, field.scalar);
      return `  for (const k of Object.keys(${m})) {\n    w.tag(${n}, 2);\n    const at = w.fork();\n    w.tag(1, 2);\n    w.string(k);\n    w.tag(2, ${s.wire});\n    w.${s.write}(${m}[k]);\n    w.join(at);\n  }\n`;
    }
  }
  throw new Error(`${field.name}: unsupported`);
}

function writerOf(message) {
  let out = `function write${message.name}(w: WireWriter, m: ${message.name}): void {\n`;
  const byNumber = [...message.fields].sort((a, b) => a.number - b.number);
  for (const field of byNumber) {
    if (field.oneof !== undefined) {
      const o = `m.${field.oneof.localName}`;
      out += `  if (${o}?.case === '${field.localName}') {\n    w.tag(${field.number}, 2);\n    const at = w.fork();\n    write${field.message.name}(w, ${o}.value);\n    w.join(at);\n  }\n`;
    } else {
      out += writeField(field);
    }
  }
  return `${out}}\n`;
}

function readCases(message, field) {
  const m = `m.${field.localName}`;
  const n = field.number;
  const name = `'${message.typeName}.${field.name}'`;
  switch (field.fieldKind) {
    case 'scalar': {
      const s = scalarOf(field, field.scalar);
      return `      case ${tagOf(n, s.wire)}:\n        ${m} = r.${s.read}(${name});\n        break;\n`;
    }
    case 'enum':
      return `      case ${tagOf(n, 0)}:\n        ${m} = r.int32(${name});\n        break;\n`;
    case 'message': {
      const target =
        field.oneof !== undefined
          ? `m.${field.oneof.localName} = { case: '${field.localName}', value: read${field.message.name}(r, r.delimited(${name})) }`
          : `${m} = read${field.message.name}(r, r.delimited(${name}))`;
      return `      case ${tagOf(n, 2)}:\n        ${target};\n        break;\n`;
    }
    case 'list': {
      const p = PACKED[field.scalar];
      const s = scalarOf(field, field.scalar);
      return `      case ${tagOf(n, 2)}:\n        r.${p.read}(${m}, ${name});\n        break;\n      case ${tagOf(n, s.wire)}:\n        ${m}.push(r.${s.read}(${name}));\n        break;\n`;
    }
    case 'map': {
      const s = scalarOf(field, field.scalar);
      return `      case ${tagOf(n, 2)}: {\n        const end = r.delimited(${name});\n        let key = '';\n        let value: ${s.ts} = ${s.zero};\n        while (r.pos < end) {\n          const t = r.uint32(${name});\n          if (t === ${tagOf(1, 2)}) key = r.string(${name});\n          else if (t === ${tagOf(2, s.wire)}) value = r.${s.read}(${name});\n          else r.skip(t, ${name}, KNOWN_ENTRY);\n        }\n        if (r.pos !== end) throw r.fail(${name}, 'an entry runs past its length');\n        ${m}[key] = value;\n        break;\n      }\n`;
    }
  }
  throw new Error(`${field.name}: unsupported`);
}

function readerOf(message) {
  const init = message.fields
    .filter((f) => f.oneof === undefined && f.fieldKind !== 'message' && !f.proto.proto3Optional)
    .map((f) => {
      if (f.fieldKind === 'list') return `${f.localName}: []`;
      if (f.fieldKind === 'map') return `${f.localName}: {}`;
      if (f.fieldKind === 'enum') return `${f.localName}: 0`;
      return `${f.localName}: ${scalarOf(f, f.scalar).zero}`;
    });
  const known = message.fields.map((f) => f.number).sort((a, b) => a - b);
  let out = `function read${message.name}(r: WireReader, end: number): ${message.name} {\n`;
  out += `  const m: ${message.name} = { ${init.join(', ')} };\n`;
  out += `  while (r.pos < end) {\n    const tag = r.uint32('${message.typeName}');\n    switch (tag) {\n`;
  for (const field of message.fields) out += readCases(message, field);
  out += `      default:\n        r.skip(tag, '${message.typeName}', [${known.join(', ')}]);\n    }\n  }\n`;
  out += `  if (r.pos !== end) throw r.fail('${message.typeName}', 'a field runs past the message');\n  return m;\n}\n`;
  return out;
}

function generate() {
  const file = compile();
  const text = readFileSync(join(root, 'proto', PROTO), 'utf8');
  const parts = [
    `// Generated by scripts/proto-gen.mjs from proto/${PROTO}: do not edit, run \`npm run proto\`.\n`,
    '/* eslint-disable */\n',
    "import { WireReader, encodeWith, type WireWriter } from '../wire.js';\n",
    `\n/** The Protocol Buffers package of the records. */\nexport const PACKAGE = '${file.proto.package}';\n`,
    `\n/** The schema's text (proto/${PROTO}), as a schema registry gets it. */\nexport const RECORDS_PROTO = ${JSON.stringify(text)};\n`,
    `\n/** Each message's index among the file's messages (a schema registry's message indexes). */\nexport const MESSAGE_INDEXES = {\n${file.messages.map((m, i) => `  '${m.typeName}': ${i},\n`).join('')}} as const;\n`,
    '\nconst KNOWN_ENTRY = [1, 2];\n',
  ];
  file.enums.forEach((e, i) => parts.push('\n', enumOf(file, e, i)));
  file.messages.forEach((m, i) => parts.push('\n', interfaceOf(file, m, i)));
  for (const m of file.messages) {
    parts.push(
      `\n/** Encodes a \`${m.typeName}\`. */\nexport function encode${m.name}(m: ${m.name}): Uint8Array {\n  return encodeWith((w) => write${m.name}(w, m));\n}\n`,
      `\n/** Decodes a \`${m.typeName}\`. Throws a \`DecodeError\` naming the field. */\nexport function decode${m.name}(bytes: Uint8Array): ${m.name} {\n  return read${m.name}(new WireReader(bytes), bytes.length);\n}\n`,
    );
  }
  for (const m of file.messages) parts.push('\n', writerOf(m), '\n', readerOf(m));
  return parts.join('');
}

const source = generate();
if (process.argv.includes('--check')) {
  let committed = '';
  try {
    committed = readFileSync(OUT, 'utf8');
  } catch {
    // missing: differs
  }
  if (committed !== source) {
    console.error(`proto-gen: ${OUT} is not what proto/${PROTO} generates; run \`npm run proto\``);
    process.exit(1);
  }
} else {
  mkdirSync(dirname(OUT), { recursive: true });
  writeFileSync(OUT, source);
  console.error(`proto-gen: wrote ${OUT}`);
}
