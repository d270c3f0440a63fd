import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ConfigError } from '../../lib/core/errors.js';
import { collate } from '../../lib/data/collate.js';
import { checkSameTokenizer, modelScorer, openaiScorer } from '../../lib/engine/teacher.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import { loadModelDir } from '../../lib/model/modelDir.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { spawnServe, type SpawnedServer } from '../../lib/serve/spawn.js';
import { runTraining } from '../../pipelines/run.js';
import { traj } from '../helpers/fixtures.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const cli = join(root, 'dist', 'cli', 'main.js');
const qwen = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');
const llama = join(root, 'spec', 'fixtures', 'hf', 'tiny-llama');

let server: SpawnedServer;
let tokenizer: Tokenizer;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  tokenizer = await loadTokenizer(qwen);
  server = await spawnServe(['--port', '0', '--backend', 'cpu', '--model', qwen], { cliPath: cli, stderr: 'ignore' });
}, 60_000);
afterAll(async () => {
  await server?.close();
});

/** Two rows of different prompt and response lengths (left-padded prompts, right-padded responses). */
function batch() {
  const rows = [
    traj('a@0', 0, { promptTokens: [1, 5, 9, 12], responseTokens: [40, 260, 2], logprobs: [-1, -1, -1], lossMask: [1, 1, 1] }),
    traj('b@0', 0, {
      promptTokens: [7, 3],
      responseTokens: [50, 51, 52, 53, 2],
      logprobs: [-1, -1, -1, -1, -1],
      lossMask: [1, 1, 1, 1, 1],
    }),
  ];
  return collate(rows, { padId: tokenizer.padId, modelTag: 'policy' });
}

describe('teachers: scorers of response tokens', () => {
  it("a server's prompt_logprobs (rxrl serve) give the in-process model's scores of the same tokens", async () => {
    const { model } = await loadModelDir(qwen);
    try {
      const b = batch();
      const local = await modelScorer(model).responseLogprobs(b);
      const remote = await openaiScorer({ baseUrl: server.baseURL, model: server.modelName, tokenizer }).responseLogprobs(b);
      const R = b.responseLength;
      for (let row = 0; row < b.size; row++) {
        for (let i = 0; i < R; i++) {
          if (b.responseMask[row * R + i] === 0) expect(remote[row * R + i]).toBe(0);
          else expect(remote[row * R + i]).toBeCloseTo(local[row * R + i], 4);
        }
      }
    } finally {
      model.dispose();
    }
  });

  it('refuses a teacher of another tokenizer, naming the difference', async () => {
    const other = await loadTokenizer(llama);
    expect(() => checkSameTokenizer(tokenizer, other, llama)).toThrow(ConfigError);
    expect(() => checkSameTokenizer(tokenizer, other, llama)).toThrow(
      /distill\.teacher: .*tiny-llama does not share the student's tokenizer/,
    );
    expect(() => checkSameTokenizer(tokenizer, tokenizer, qwen)).not.toThrow();
    // A server whose tokens decode otherwise is refused on its first answer.
    const scorer = openaiScorer({ baseUrl: server.baseURL, model: server.modelName, tokenizer: other });
    await expect(scorer.responseLogprobs(batch())).rejects.toThrow(/does not share the student's tokenizer/);
  });

  it('a distillation run scores its samples on the server (distill.teacher.baseUrl)', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-distill-remote-'));
    const steps: Record<string, number>[] = [];
    const config = loadConfig({
      env: {},
      file: join(root, 'recipes', 'smollm2-distill.yaml'),
      set: [
        `model.path=${qwen}`,
        'distill.teacher.path=null',
        `distill.teacher.baseUrl=${server.baseURL}`,
        `distill.teacher.model=${server.modelName}`,
        'run.steps=2',
        `run.dir=${join(dir, 'run')}`,
        'run.backend=cpu',
        'validation.every=0',
        'validation.beforeTrain=false',
        'data.arithmetic.validationSize=4',
        'sync.batchSize=2',
        'rollout.maxTokens=6',
      ],
    });
    await runTraining(config, { log: () => undefined, onStep: (step) => steps.push(step.metrics) });
    // The served teacher is the student's start: the first step's reverse KL is 0 to float precision.
    expect(steps).toHaveLength(2);
    expect(Math.abs(steps[0]['distill/reverse_kl'])).toBeLessThan(1e-3);
  });
});
