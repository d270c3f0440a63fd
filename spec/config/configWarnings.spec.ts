import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { configWarnings } from '../../lib/config/configWarnings.js';
import { loadConfig } from '../../lib/config/schema.js';
import { checkPrompts } from '../../lib/data/checkPrompts.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';

const env = {};

describe('configWarnings', () => {
  it('says nothing about the defaults or a non-empty train split', () => {
    expect(configWarnings(loadConfig({ env }))).toEqual([]);
    expect(configWarnings(loadConfig({ env }), { trainTasks: 12 })).toEqual([]);
  });

  it('warns that rollout.groupSize 1 makes every GRPO advantage 0', () => {
    const warnings = configWarnings(loadConfig({ env, set: ['rollout.groupSize=1'] }));
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toMatch(
      /^rollout\.groupSize is 1: .*advantage .* is always 0, .*nothing is learned .*; use rollout\.groupSize >= 2$/,
    );
    expect(warnings[0]).not.toContain('filterZeroVariance');
    const filtered = configWarnings(loadConfig({ env, set: ['rollout.groupSize=1', 'algorithm.filterZeroVariance=true'] }));
    expect(filtered[0]).toContain('algorithm.filterZeroVariance drops every group');
    expect(configWarnings(loadConfig({ env, set: ['rollout.groupSize=2'] }))).toEqual([]);
  });

  it('warns that an empty train file leaves nothing to train, naming it, after the groupSize warning', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-config-warnings-'));
    try {
      const trainFile = join(dir, 'train.jsonl');
      await writeFile(trainFile, '\n');
      const config = loadConfig({
        env,
        values: {
          data: { source: 'jsonl', trainFile, alphabet: 'ab=' },
          rollout: { groupSize: 1, maxTokens: 4, evaluator: { module: 'evaluator.js' } },
        },
      });
      // The count run.ts has at hand once the prompts are checked.
      const { tasks } = await checkPrompts({ jsonl: trainFile }, { tokenizer: new CharTokenizer('ab='), maxSeqLen: 24, maxTokens: 4 });
      const warnings = configWarnings(config, { trainTasks: tasks });
      expect(warnings).toHaveLength(2);
      expect(warnings[0]).toMatch(/^rollout\.groupSize is 1/);
      expect(warnings[1]).toBe(`data.trainFile ${trainFile}: the train split has no tasks: nothing to train`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('names data when the train split is not a file', () => {
    expect(configWarnings(loadConfig({ env }), { trainTasks: 0 })).toEqual(['data: the train split has no tasks: nothing to train']);
  });
});
