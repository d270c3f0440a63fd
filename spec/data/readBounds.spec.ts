/**
 * Hostile task files are refused before they cost anything: an 888-byte-class zstd Parquet holding a 10 MB prompt is
 * refused by the tokenizer's lower bound before the prompt is encoded; a page claiming 2^31 − 1 bytes, and one whose
 * zstd frames hold 100 MB, are refused before they are decompressed; a row past its bound, a FIFO, an SFT reference
 * output longer than the context — each a `DecodeError` naming the file and the row. The files are made byte by byte
 * here (spec/helpers/parquetBytes.ts).
 */
import { spawnSync } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { DecodeError } from '../../lib/core/errors.js';
import { checkPrompts } from '../../lib/data/checkPrompts.js';
import { readLocatedTasks } from '../../lib/data/loader.js';
import { DEFAULT_READ_BOUNDS } from '../../lib/data/readBounds.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { parquetBytes, plainLength, snappyLiteral, zstdRle } from '../helpers/parquetBytes.js';

const fixture = join(import.meta.dirname, '..', 'fixtures', 'hf', 'tiny-qwen2');

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-read-bounds-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A one-row Parquet file whose `prompt` is `count` × 'a', stored as zstd RLE blocks. */
async function zstdPrompt(name: string, count: number): Promise<{ file: string; bytes: number }> {
  const file = join(dir, name);
  const bytes = parquetBytes({ column: 'prompt', codec: 'ZSTD', data: zstdRle(plainLength(count), 0x61, count), claimed: count + 4 });
  await writeFile(file, bytes);
  return { file, bytes: bytes.length };
}

/** The error `promise` rejects with (fails the test when it resolves). */
async function rejection(promise: Promise<unknown>): Promise<DecodeError> {
  const outcome = await promise.then(
    () => undefined,
    (error: unknown) => error,
  );
  expect(outcome).toBeInstanceOf(DecodeError);
  return outcome as DecodeError;
}

async function drain(path: string, bounds = DEFAULT_READ_BOUNDS): Promise<number> {
  let rows = 0;
  for await (const located of readLocatedTasks(path, undefined, bounds)) rows += located.task.prompt.length > 0 ? 1 : 0;
  return rows;
}

describe('task files past their bounds', () => {
  it('refuses a 10 MB prompt from a sub-kilobyte zstd Parquet before encoding it, naming file:row and the limit', async () => {
    const { file, bytes } = await zstdPrompt('prompt10mb.parquet', 10_000_000);
    console.log(`prompt10mb.parquet: ${bytes} bytes`);
    expect(bytes).toBeLessThan(1024);
    const tokenizer = await loadTokenizer(fixture);
    const error = await rejection(checkPrompts({ file }, { tokenizer, maxSeqLen: 128, maxTokens: 32 }));
    expect(error.message.startsWith(`${file}:1: task prompt10mb.parquet#1: prompt is at least `)).toBe(true);
    expect(error.context).toMatchObject({ file, line: 1, limit: 96 });
    expect(error.context.atLeast).toBeGreaterThan(96);
    // Refused by the bound: the prompt was never encoded, so no token count was taken.
    expect(error.context.tokens).toBeUndefined();
  });

  it('refuses a page that claims 2^31 − 1 bytes (snappy) before decompressing it, naming file:row and the bound', async () => {
    const value = Buffer.concat([plainLength(2), Buffer.from('hi')]);
    const file = join(dir, 'claims2g.parquet');
    const bytes = parquetBytes({ column: 'prompt', codec: 'SNAPPY', data: snappyLiteral(value), claimed: 2 ** 31 - 1 });
    await writeFile(file, bytes);
    console.log(`claims2g.parquet: ${bytes.length} bytes`);
    const error = await rejection(drain(file));
    expect(error.message).toBe(`${file}:1: a page of rows 1–1 claims ${2 ** 31 - 1} bytes uncompressed, more than the bound of ${2 ** 26}`);
    expect(error.context).toMatchObject({ file, line: 1, bytes: 2 ** 31 - 1, limit: 2 ** 26, bound: 'pageBytes' });
  });

  it('refuses a 100 MB zstd page before decompressing it, and its row group past its own bound', async () => {
    const { file, bytes } = await zstdPrompt('prompt100mb.parquet', 100_000_000);
    console.log(`prompt100mb.parquet: ${bytes} bytes`);
    expect((await rejection(drain(file))).context).toMatchObject({ file, line: 1, bound: 'pageBytes', limit: 2 ** 26 });
    const group = await rejection(drain(file, { ...DEFAULT_READ_BOUNDS, pageBytes: 2 ** 30, rowGroupBytes: 1000 }));
    expect(group.context).toMatchObject({ file, line: 1, bound: 'rowGroupBytes', limit: 1000 });
  });

  it('lets a zstd page that holds more than it claims write no more than the claim', async () => {
    const file = join(dir, 'lies.parquet');
    // The frames hold 50 MB after the value's 10 bytes; the header claims 14: the decoder fills 14 bytes and stops there.
    await writeFile(file, parquetBytes({ column: 'prompt', codec: 'ZSTD', data: zstdRle(plainLength(10), 0x61, 50_000_000), claimed: 14 }));
    const rows: string[] = [];
    for await (const { task } of readLocatedTasks(file)) rows.push(task.prompt);
    expect(rows).toEqual(['a'.repeat(10)]);
  });

  it('refuses a row past rowBytes, in Parquet and in JSONL, naming file:row', async () => {
    const { file } = await zstdPrompt('prompt1k.parquet', 1000);
    const bounds = { ...DEFAULT_READ_BOUNDS, rowBytes: 999 };
    expect((await rejection(drain(file, bounds))).context).toMatchObject({ file, line: 1, bytes: 1006, limit: 999, bound: 'rowBytes' });
    expect(await drain(file, { ...bounds, rowBytes: 1006 })).toBe(1);
    const jsonl = join(dir, 'long.jsonl');
    await writeFile(jsonl, `{"prompt":"a"}\n\n${JSON.stringify({ prompt: 'a'.repeat(1000) })}\n`);
    const error = await rejection(drain(jsonl, bounds));
    expect(error.message.startsWith(`${jsonl}:3: the row is 1013 bytes, more than the bound of 999`)).toBe(true);
  });

  it('refuses a FIFO as a task file at once, naming it, without opening it', async () => {
    const fifo = join(dir, 'tasks.jsonl');
    expect(spawnSync('mkfifo', [fifo]).status).toBe(0);
    const error = await rejection(drain(fifo));
    expect(error.message).toBe(`${fifo}: is a FIFO, not a regular file of tasks`);
    expect(error.context).toMatchObject({ file: fifo, kind: 'a FIFO' });
  });
});

describe('SFT reference outputs past the context', () => {
  const tokenizer = new CharTokenizer('abc');
  const budget = { tokenizer, maxSeqLen: 16, maxTokens: 4, references: true };

  it('refuses a reference output longer than the context leaves, naming file:line and the limit', async () => {
    const file = join(dir, 'sft.jsonl');
    // BOS + 2 prompt tokens + 12 response tokens + stop = 16 fits; one more does not.
    await writeFile(
      file,
      [
        { prompt: 'ab', response: 'c'.repeat(12) },
        { prompt: 'ab', response: 'c'.repeat(13) },
      ]
        .map((r) => JSON.stringify(r))
        .join('\n'),
    );
    const error = await rejection(checkPrompts({ file }, budget));
    expect(error.message).toBe(
      `${file}:2: task sft.jsonl#2: reference output is 13 tokens, longer than the 12 tokens that model.maxSeqLen = 16 leaves after its 3-token prompt and a stop token`,
    );
    expect(error.context).toMatchObject({ file, line: 2, tokens: 13, limit: 12, maxSeqLen: 16 });
    expect(await checkPrompts({ file }, { ...budget, references: false })).toEqual({ tasks: 2, longestPrompt: 3 });
  });

  it('refuses a huge reference output before encoding it, and a task without one', async () => {
    const huge = join(dir, 'huge.jsonl');
    await writeFile(huge, JSON.stringify({ prompt: 'ab', answer: 'c'.repeat(1_000_000) }));
    const error = await rejection(checkPrompts({ file: huge }, budget));
    expect(error.context).toMatchObject({ file: huge, line: 1, limit: 12 });
    expect(error.context.atLeast).toBeGreaterThan(12);
    expect(error.context.tokens).toBeUndefined();
    const none = await rejection(checkPrompts([{ id: 'x', prompt: 'ab' }], budget));
    expect(none.message).toBe("tasks[0]: task x has no reference output to train on (a 'response', or an 'answer')");
  });
});
