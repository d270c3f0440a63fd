import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadTasks, validateTask } from '../../lib/data/loader.js';
import { ConfigError, DecodeError } from '../../lib/core/errors.js';
import type { Task } from '../../lib/core/types.js';

const tasks: Task[] = Array.from({ length: 6 }, (_, i) => ({ id: `t${i}`, prompt: `p${i}`, answer: `a${i}` }));

async function collect(iterable: AsyncIterable<Task>, limit = Infinity): Promise<Task[]> {
  const out: Task[] = [];
  for await (const t of iterable) {
    out.push(t);
    if (out.length >= limit) break;
  }
  return out;
}

describe('loadTasks', () => {
  it('yields an array over several epochs, tagging each task with its epoch', async () => {
    const out = await collect(loadTasks(tasks, { epochs: 2 }));
    expect(out.map((t) => `${t.id}:${t.epoch}`)).toEqual([...tasks.map((t) => `${t.id}:0`), ...tasks.map((t) => `${t.id}:1`)]);
  });

  it('shuffles each epoch differently and reproducibly from the seed', async () => {
    const a = (await collect(loadTasks(tasks, { epochs: 2, shuffle: true, seed: 3 }))).map((t) => t.id);
    const b = (await collect(loadTasks(tasks, { epochs: 2, shuffle: true, seed: 3 }))).map((t) => t.id);
    const c = (await collect(loadTasks(tasks, { epochs: 2, shuffle: true, seed: 4 }))).map((t) => t.id);
    expect(a).toEqual(b);
    expect(a).not.toEqual(c);
    expect(a.slice(0, 6)).not.toEqual(a.slice(6));
    expect([...a.slice(0, 6)].sort()).toEqual(tasks.map((t) => t.id).sort());
  });

  it('is pull-based: a generator is read only as far as asked, and its finally runs on break', async () => {
    let read = 0;
    let closed = false;
    const source = (function* () {
      try {
        for (let i = 0; ; i++) {
          read++;
          yield { id: `g${i}`, prompt: 'x' };
        }
      } finally {
        closed = true;
      }
    })();
    const loader = loadTasks(source);
    const iterator = loader[Symbol.asyncIterator]();
    expect(read).toBe(0);
    await iterator.next();
    await iterator.next();
    expect(read).toBe(2);
    await iterator.return?.();
    expect(closed).toBe(true);
  });

  it('ends on an empty source even when told to repeat it forever', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-loader-empty-'));
    const empty = join(dir, 'empty.jsonl');
    await writeFile(empty, '\n');
    // Reading a file yields to the event loop, so the timer can tell a loader that never ends.
    for (const options of [{ epochs: Infinity }, { epochs: Infinity, shuffle: true }]) {
      const iterator = loadTasks({ jsonl: empty }, options)[Symbol.asyncIterator]();
      const first = await Promise.race([
        iterator.next(),
        new Promise<'still running'>((done) => setTimeout(() => done('still running'), 2_000)),
      ]);
      expect(first).toEqual({ done: true, value: undefined });
    }
    expect(await collect(loadTasks([], { epochs: Infinity }))).toEqual([]);
  });

  it('records its position and resumes from it without repeating a task', async () => {
    const loader = loadTasks(tasks, { epochs: 2, shuffle: true, seed: 1 });
    const head = await collect(loader, 8);
    expect(loader.position).toEqual({ epoch: 1, index: 2 });
    const tail = await collect(loadTasks(tasks, { epochs: 2, shuffle: true, seed: 1, start: loader.position }));
    const all = await collect(loadTasks(tasks, { epochs: 2, shuffle: true, seed: 1 }));
    expect([...head, ...tail].map((t) => `${t.id}:${t.epoch}`)).toEqual(all.map((t) => `${t.id}:${t.epoch}`));
  });

  it('reads JSONL files lazily or shuffled, and names file and line of a malformed row', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-loader-'));
    const good = join(dir, 'good.jsonl');
    await writeFile(good, tasks.map((t) => JSON.stringify(t)).join('\n') + '\n\n');
    expect((await collect(loadTasks({ jsonl: good }))).map((t) => t.id)).toEqual(tasks.map((t) => t.id));
    expect(await collect(loadTasks({ jsonl: good }, { shuffle: true, seed: 2 }))).toHaveLength(6);

    const bad = join(dir, 'bad.jsonl');
    await writeFile(bad, `${JSON.stringify(tasks[0])}\n{"id": "x", "prompt": 3}\n`);
    const error = await collect(loadTasks({ jsonl: bad })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(DecodeError);
    expect(error).toMatchObject({ context: { file: bad, line: 2 } });
    const notJson = join(dir, 'notjson.jsonl');
    await writeFile(notJson, '{"id": \n');
    await expect(collect(loadTasks({ jsonl: notJson }))).rejects.toBeInstanceOf(DecodeError);
  });

  it('reads reference outputs: a response, or a conversation whose last turn is the reply', () => {
    expect(validateTask({ id: 1, prompt: 'p', response: 'r' })).toEqual({ id: '1', prompt: 'p', response: 'r' });
    const messages = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'What is 2 + 3?' },
      { role: 'assistant', content: '5' },
    ];
    expect(validateTask({ id: 'c', messages, metadata: { source: 'x' } })).toEqual({
      id: 'c',
      prompt: 'What is 2 + 3?',
      response: '5',
      metadata: { source: 'x', messages: messages.slice(0, 2) },
    });
    const bad: [unknown, RegExp][] = [
      [{ id: 'a', prompt: 'p', response: 3 }, /'response' must be a string/],
      [{ id: 'a', messages: [] }, /'messages' must be a non-empty array/],
      [{ id: 'a', messages: [{ role: 'user', content: 'q' }] }, /last of 'messages' must be the assistant's turn/],
      [{ id: 'a', messages: [{ role: 'robot', content: 'q' }] }, /messages\[0\] must be an object with a role/],
      [{ id: 'a', messages, response: 'r' }, /as 'response' or as 'messages', not both/],
      [{ id: 'a', messages: [{ role: 'assistant', content: 'r' }] }, /'prompt' must be a string/],
    ];
    for (const [row, message] of bad) expect(() => validateTask(row, { file: 'f.jsonl', line: 2 })).toThrow(message);
    expect(() => validateTask(bad[0][0])).toThrow(DecodeError);
  });

  it("reads TRL's and verl's rows: prompt messages, ground truths, other columns as metadata, ids from the row's place", () => {
    const prompt = [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'What is 2 + 3?' },
    ];
    expect(validateTask({ prompt, ground_truth: 5, source: 'gsm' }, { file: 'dir/train.jsonl', line: 7 })).toEqual({
      id: 'train.jsonl#7',
      prompt: 'What is 2 + 3?',
      answer: '5',
      metadata: { ground_truth: 5, source: 'gsm', messages: prompt },
    });
    const verl = { data_source: 'd', prompt, reward_model: { style: 'rule', ground_truth: '5' }, extra_info: { index: 3 } };
    expect(validateTask(verl, { file: 'f.jsonl', line: 1 })).toMatchObject({
      answer: '5',
      metadata: { data_source: 'd', extra_info: { index: 3 } },
    });
    // answer wins over ground_truth, which wins over reward_model.ground_truth; the row's metadata wins over a column.
    expect(validateTask({ id: 1, prompt: 'p', answer: 'a', ground_truth: 'g', x: 1, metadata: { x: 2 } })).toEqual({
      id: '1',
      prompt: 'p',
      answer: 'a',
      metadata: { ground_truth: 'g', x: 2 },
    });
    const bad: [unknown, RegExp][] = [
      [
        {
          prompt: [
            { role: 'user', content: 'q' },
            { role: 'assistant', content: 'a' },
          ],
        },
        /prompt's messages must be the user's turn/,
      ],
      [{ prompt: [], id: 1 }, /'prompt' must be a non-empty array/],
      [{ prompt: 'p', answer: { x: 1 } }, /'answer' must be a string or a number/],
      [{ prompt, messages: [{ role: 'assistant', content: 'a' }] }, /in 'prompt' or in 'messages', not both/],
    ];
    for (const [row, message] of bad) expect(() => validateTask(row, { file: 'f.jsonl', line: 2 })).toThrow(message);
    expect(() => validateTask({ prompt: 'p' })).toThrow(/'id' must be a non-empty string or a number/);
  });

  it('rejects epochs or shuffle over a one-shot source', () => {
    expect(() => loadTasks((function* () {})(), { epochs: 2 })).toThrow(ConfigError);
    expect(() => loadTasks(tasks, { epochs: 0 })).toThrow(ConfigError);
  });
});
