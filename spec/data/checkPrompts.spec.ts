import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { checkPrompts } from '../../lib/data/checkPrompts.js';
import { readLocatedTasks } from '../../lib/data/loader.js';
import { ConfigError, DecodeError } from '../../lib/core/errors.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import type { Task } from '../../lib/core/types.js';

const tokenizer = new CharTokenizer('abcdefgh=');
// 12 positions, 4 of them for the response: a prompt may be 8 tokens, BOS included (7 characters).
const budget = { tokenizer, maxSeqLen: 12, maxTokens: 4 };

let dir: string;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), 'rxrl-check-prompts-'));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** Writes a JSONL file of the given lines (strings are written as they are, objects as JSON). */
async function jsonl(name: string, lines: ReadonlyArray<string | Record<string, unknown>>): Promise<string> {
  const file = join(dir, name);
  await writeFile(file, lines.map((line) => (typeof line === 'string' ? line : JSON.stringify(line))).join('\n') + '\n');
  return file;
}

/** The error `promise` rejects with (fails the test when it resolves). */
async function rejection(promise: Promise<unknown>): Promise<Error & { context: Record<string, unknown> }> {
  const outcome = await promise.then(
    () => undefined,
    (error: unknown) => error,
  );
  expect(outcome).toBeInstanceOf(Error);
  return outcome as Error & { context: Record<string, unknown> };
}

describe('checkPrompts', () => {
  it('passes a file whose prompts fit, the longest exactly at maxSeqLen − maxTokens', async () => {
    const file = await jsonl('fits.jsonl', [{ id: 'a', prompt: 'abc=' }, '', { id: 'b', prompt: 'abcdef=' }]);
    await expect(checkPrompts({ jsonl: file }, budget)).resolves.toEqual({ tasks: 2, longestPrompt: 8 });
  });

  it('refuses an over-long prompt with a DecodeError naming file, line, task and lengths', async () => {
    // Line 4 (a blank line is still counted): 8 characters + BOS = 9 tokens > 12 − 4.
    const file = await jsonl('long.jsonl', [{ id: 'a', prompt: 'ab=' }, '', { id: 'b', prompt: 'abc=' }, { id: 't9', prompt: 'abcdefg=' }]);
    const error = await rejection(checkPrompts({ jsonl: file }, budget));
    expect(error).toBeInstanceOf(DecodeError);
    expect(error.message).toBe(`${file}:4: task t9: prompt is 9 tokens, longer than model.maxSeqLen − rollout.maxTokens = 12 − 4 = 8`);
    expect(error.context).toMatchObject({ file, line: 4, taskId: 't9', tokens: 9, limit: 8 });
  });

  it('refuses a prompt with a character outside the tokenizer alphabet, naming file, line and character', async () => {
    const file = await jsonl('alien.jsonl', [
      { id: 'a', prompt: 'ab=' },
      { id: 'x', prompt: 'abé=' },
    ]);
    const error = await rejection(checkPrompts({ jsonl: file }, budget));
    expect(error).toBeInstanceOf(DecodeError);
    expect(error.message).toBe(
      `${file}:2: task x: prompt cannot be tokenized: character "é" (U+00E9) at index 2 is not in the tokenizer's vocabulary`,
    );
    expect(error.context).toMatchObject({ file, line: 2, taskId: 'x', char: 'é', index: 2 });
    expect(error.cause).toBeInstanceOf(DecodeError);
  });

  it('names an invisible character by its code point', async () => {
    const file = await jsonl('invisible.jsonl', [{ id: 'z', prompt: 'a\u200bb=' }]);
    await expect(checkPrompts({ jsonl: file }, budget)).rejects.toThrow(/:1: task z: .*\(U\+200B\) at index 1/);
  });

  it('encodes prompts the way the rollout does: the default worker adds BOS; `encode` replaces it', async () => {
    const tasks: Task[] = [{ id: 'a', prompt: 'abcdef=' }];
    await expect(checkPrompts(tasks, budget)).resolves.toEqual({ tasks: 1, longestPrompt: 8 });
    // A chat-like rendering that wraps the prompt in two more tokens no longer fits.
    const wrapped = (task: Task): number[] => [tokenizer.bosId, ...tokenizer.encode(`a${task.prompt}a`)];
    const error = await rejection(checkPrompts(tasks, { ...budget, encode: wrapped, source: 'data.validation' }));
    expect(error).toBeInstanceOf(DecodeError);
    expect(error.message).toMatch(/^data\.validation\[0\]: task a: prompt is 10 tokens, longer than .* = 8$/);
    expect(error.context).toMatchObject({ source: 'data.validation', index: 0, taskId: 'a' });
  });

  it('refuses a prompt that encodes to no tokens', async () => {
    const error = await rejection(checkPrompts([{ id: 'e', prompt: '' }], { ...budget, encode: () => [] }));
    expect(error).toBeInstanceOf(DecodeError);
    expect(error.message).toBe('tasks[0]: task e: prompt encodes to no tokens');
  });

  it('lets errors other than DecodeError through unchanged', async () => {
    const bug = new TypeError('bug in the template');
    const encode = (): number[] => {
      throw bug;
    };
    await expect(checkPrompts([{ id: 'a', prompt: 'a' }], { ...budget, encode })).rejects.toBe(bug);
  });

  it('refuses a budget that leaves no room for a prompt with a ConfigError', async () => {
    await expect(checkPrompts([], { tokenizer, maxSeqLen: 8, maxTokens: 8 })).rejects.toThrow(ConfigError);
    await expect(checkPrompts([], { tokenizer, maxSeqLen: 8, maxTokens: 8 })).rejects.toThrow(/leaves no room for a prompt/);
  });

  it('counts an empty file as zero tasks', async () => {
    const file = await jsonl('empty.jsonl', ['']);
    await expect(checkPrompts({ jsonl: file }, budget)).resolves.toEqual({ tasks: 0, longestPrompt: 0 });
  });

  it('reports a malformed line or a missing file as a DecodeError naming it', async () => {
    const bad = await jsonl('bad.jsonl', [{ id: 'a', prompt: 'a' }, '{"id": "b", "prompt": ']);
    await expect(checkPrompts({ jsonl: bad }, budget)).rejects.toThrow(
      new RegExp(`^${bad.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:2: not valid JSON$`),
    );
    const missing = join(dir, 'no-such.jsonl');
    const error = await rejection(checkPrompts({ jsonl: missing }, budget));
    expect(error).toBeInstanceOf(DecodeError);
    expect(error.message).toContain(`cannot read ${missing}: ENOENT`);
  });

  it('stops when its signal fires', async () => {
    const file = await jsonl('abort.jsonl', [{ id: 'a', prompt: 'a' }]);
    const controller = new AbortController();
    controller.abort(new Error('stop'));
    await expect(checkPrompts({ jsonl: file }, { ...budget, signal: controller.signal })).rejects.toThrow('stop');
  });
});

describe('readLocatedTasks', () => {
  it('yields each task with its file and 1-based line, counting blank lines', async () => {
    const file = await jsonl('located.jsonl', [{ id: 'a', prompt: 'x' }, '', '  ', { id: 'b', prompt: 'y' }]);
    const seen: string[] = [];
    for await (const { task, file: f, line } of readLocatedTasks(file)) seen.push(`${f === file ? 'file' : f}:${line}:${task.id}`);
    expect(seen).toEqual(['file:1:a', 'file:4:b']);
  });
});
