/**
 * Parquet task files made here by PyPI `datasets` and `pyarrow` (installed by `npm test`) in verl's and TRL's
 * layouts, read by rxrl: prompts as chat messages, answers from `reward_model.ground_truth` or `ground_truth`, other
 * columns handed to the evaluator, shards in order, row groups streamed, codecs decoded; bad files and rows are
 * `DecodeError`s naming them. The two Parquet recipes train two steps on the tiny fixture.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { DecodeError } from '../../lib/core/errors.js';
import type { Task } from '../../lib/core/types.js';
import { loadTasks, readLocatedTasks, readTaskFile } from '../../lib/data/loader.js';
import { runTraining } from '../../pipelines/run.js';

const root = join(import.meta.dirname, '..', '..');
const fixture = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

let dir: string;

function python(args: readonly string[]): void {
  const result = spawnSync('python3', args, { encoding: 'utf8' });
  if (result.status !== 0) throw new Error(`python3 ${args.join(' ')} failed:\n${result.stderr}`);
}

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'rxrl-parquet-'));
  python([join(root, 'scripts', 'arithmetic_parquet.py'), '--out', dir, '--max-operand', '4', '--validation-size', '4', '--shards', '3']);
  // TRL's standard layout written by pyarrow itself: a string prompt, int64 ids, zstd, a row group per 3 rows; a file
  // without a prompt column; and a row whose prompt ends with the assistant's turn.
  python([
    '-c',
    [
      'import sys, pyarrow as pa, pyarrow.parquet as pq',
      'out = sys.argv[1]',
      "t = pa.table({'id': pa.array(range(100, 108), pa.int64()), 'prompt': [f'q{i}' for i in range(8)], 'answer': pa.array(range(8), pa.int64()), 'solution': [f'{i}' for i in range(8)]})",
      "pq.write_table(t, out + '/standard.parquet', compression='zstd', row_group_size=3)",
      "pq.write_table(pa.table({'question': ['a'], 'answer': ['b']}), out + '/noprompt.parquet')",
      "bad = [[{'role': 'user', 'content': 'hi'}], [{'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'yo'}]]",
      "pq.write_table(pa.table({'prompt': bad}), out + '/badrow.parquet')",
    ].join('\n'),
    dir,
  ]);
  writeFileSync(join(dir, 'text.parquet'), 'not parquet at all\n');
});

async function all(path: string): Promise<{ task: Task; file: string; line: number }[]> {
  const out: { task: Task; file: string; line: number }[] = [];
  for await (const located of readLocatedTasks(path)) out.push(located);
  return out;
}

describe('Parquet task files', () => {
  it("reads verl's layout: prompt messages, reward_model.ground_truth, the other columns as metadata", async () => {
    const rows = await all(join(dir, 'verl', 'train.parquet'));
    expect(rows).toHaveLength(2 * 16 - 4);
    const [first] = rows;
    expect(first.line).toBe(1);
    expect(first.task.id).toBe('train.parquet#1');
    expect(first.task.prompt).toMatch(/^What is \d (plus|times) \d\? Answer with the equation only/);
    expect(first.task.answer).toMatch(/^\d [+*] \d = \d+$/);
    expect(first.task.metadata).toMatchObject({
      data_source: 'rxrl/arithmetic',
      ability: 'math',
      reward_model: { style: 'rule', ground_truth: first.task.answer },
      extra_info: { split: 'train', index: 0, question: first.task.prompt },
      messages: [{ role: 'user', content: first.task.prompt }],
    });
    expect(rows.map((r) => r.task.id)).toEqual(rows.map((_, i) => `train.parquet#${i + 1}`));
  });

  it("reads TRL's layout from a directory of shards, in name order, with ground_truth as the answer", async () => {
    const rows = await all(join(dir, 'trl', 'train'));
    expect(rows).toHaveLength(28);
    expect([...new Set(rows.map((r) => r.file.split('/').pop()))]).toEqual([
      'train-00000-of-00003.parquet',
      'train-00001-of-00003.parquet',
      'train-00002-of-00003.parquet',
    ]);
    const verl = await all(join(dir, 'verl', 'train.parquet'));
    expect(rows.map((r) => [r.task.prompt, r.task.answer])).toEqual(verl.map((r) => [r.task.prompt, r.task.answer]));
    expect(rows[0].task.metadata).toEqual({
      ground_truth: rows[0].task.answer,
      messages: [{ role: 'user', content: rows[0].task.prompt }],
    });
    // A loader shuffles a directory of shards over epochs like a file.
    const loader = loadTasks({ file: join(dir, 'trl', 'train') }, { epochs: 2, shuffle: true, seed: 3 });
    const ids: string[] = [];
    for await (const task of loader) ids.push(`${task.id}@${task.epoch}`);
    expect(new Set(ids).size).toBe(56);
  });

  it("reads pyarrow's own file: string prompts, int64 ids and answers, zstd, several row groups", async () => {
    const tasks = await readTaskFile(join(dir, 'standard.parquet'));
    expect(tasks.map((t) => t.id)).toEqual(['100', '101', '102', '103', '104', '105', '106', '107']);
    expect(tasks[7]).toEqual({ id: '107', prompt: 'q7', answer: '7', metadata: { solution: '7' } });
  });

  it('names the file and what is wrong: no prompt column, a bad row, not Parquet', async () => {
    const noPrompt = all(join(dir, 'noprompt.parquet'));
    await expect(noPrompt).rejects.toThrow(DecodeError);
    await expect(noPrompt).rejects.toThrow(
      `${join(dir, 'noprompt.parquet')}: no 'prompt' column (nor 'messages'): it has 'question', 'answer'`,
    );
    await expect(all(join(dir, 'badrow.parquet'))).rejects.toThrow(
      `${join(dir, 'badrow.parquet')}:2: the last of the prompt's messages must be the user's turn, got 'assistant'`,
    );
    await expect(all(join(dir, 'text.parquet'))).rejects.toThrow(/text\.parquet: not a readable Parquet file/);
    await expect(all(join(dir, 'absent.parquet'))).rejects.toThrow(DecodeError);
  });

  // CI's smoke of the two Parquet recipes: two steps each on the tiny fixture, over files made as the recipes say.
  for (const [name, train, test] of [
    ['smollm2-arithmetic-parquet.yaml', 'verl/train.parquet', 'verl/test.parquet'],
    ['smollm2-arithmetic-trl.yaml', 'trl/train', 'trl/test.parquet'],
  ] as const) {
    it(`recipes/${name} trains two steps from its Parquet files`, async () => {
      const run = join(dir, `run-${name}`);
      const config = loadConfig({
        env: {},
        file: join(root, 'recipes', name),
        set: [
          `model.path=${fixture}`,
          `data.trainFile=${join(dir, train)}`,
          `data.validationFile=${join(dir, test)}`,
          'run.steps=2',
          `run.dir=${run}`,
          'run.backend=cpu',
          'validation.every=0',
          'sync.batchSize=2',
          'sync.generationBatchSize=null',
          'algorithm.filterZeroVariance=false',
          'rollout.maxTokens=6',
        ],
      });
      const summary = await runTraining(config, { log: () => undefined });
      expect(summary.steps).toBe(2);
      expect(summary.failedSamples).toBe(0);
      expect(summary.valRewardInitial).toBeGreaterThanOrEqual(0);
      expect(existsSync(join(run, 'global_step_2', 'adapter_model.safetensors'))).toBe(true);
      // The verl-layout recipe logs to TensorBoard.
      expect(existsSync(join(run, 'tensorboard'))).toBe(name === 'smollm2-arithmetic-parquet.yaml');
    }, 120_000);
  }
});
