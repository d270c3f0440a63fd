/**
 * Trains the bundled reverse task through the Tinker API: the run keeps rollouts, rewards and advantages; a
 * Tinker-API service does forward, backward and Adam on a LoRA adapter and samples the rollouts.
 *
 *   loader ─admit─▶ rollout(TinkerEngine ══HTTP══▶ asample) ─▶ … ─▶ grpoPrepare ─▶ train(forward_backward ppo
 *   + optim_step ══HTTP══▶ service) ─▶ syncWeights(save_weights_for_sampler)
 *
 * Without `TINKER_BASE_URL` the example starts rxrl's own service in this process, over a seeded tiny base model of
 * the task's character tokenizer. With `TINKER_BASE_URL`, `TINKER_API_KEY` and `TINKER_BASE_MODEL` it trains on
 * that service, whose base model must use the same tokenizer. The run is the one `rxrl run` builds from a recipe
 * with `trainer.backend: tinker` (checkpoints under `runs/tinker-example`, resumed automatically).
 *
 * Run: `npm run build && node dist/examples/tinker-run.js` (RXRL_STEPS sets the step budget, default 30; RXRL_SEED
 * the seed). Progress goes to stderr; the last stdout line is a JSON summary.
 */
import { mkdtemp } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { CharTokenizer, PolicyModel, Progress, initBackend, loadConfig, tinkerService, type TinkerService } from '../lib/index.js';
import { runTraining } from '../pipelines/index.js';
import { stringTransformTask } from '../recipes/index.js';

const steps = Number(process.env.RXRL_STEPS ?? 30);
const seed = Number(process.env.RXRL_SEED ?? 1);
const taskKeys = { transform: 'reverse', alphabet: 'abc', minLength: 3, maxLength: 3, validationSize: 16 } as const;
const model = { dModel: 32, nLayers: 2, nHeads: 2, dFF: 64, maxSeqLen: 16 };

await initBackend('auto');
let service: TinkerService | undefined;
let base: PolicyModel | undefined;
let baseUrl = process.env.TINKER_BASE_URL;
let baseModel = process.env.TINKER_BASE_MODEL ?? 'reverse-base';
if (!baseUrl) {
  // rxrl's service over a base model of the run's tokenizer (the one the bundled task gives every run).
  const tokenizer = new CharTokenizer(stringTransformTask({ ...taskKeys, seed }).characters);
  base = PolicyModel.create({ vocabSize: tokenizer.vocabSize, ...model }, seed);
  service = await tinkerService({ model: base, tokenizer, baseModel, stateDir: await mkdtemp(join(tmpdir(), 'rxrl-tinker-states-')) });
  baseUrl = service.url;
  baseModel = 'reverse-base';
}

try {
  const config = loadConfig({
    values: {
      run: { dir: await mkdtemp(join(tmpdir(), 'rxrl-tinker-example-')), seed, steps, errorPolicy: 'continue' },
      data: { source: 'bundled', task: taskKeys },
      model,
      rollout: { groupSize: 8 },
      sync: { mode: 'batch-async', batchSize: 8 },
      trainer: { backend: 'tinker', learningRate: 0.02 },
      tinker: { baseUrl, baseModel, rank: 8 },
      checkpoint: { every: 10 },
    },
  });
  const progress = new Progress({ total: steps });
  const summary = await runTraining(config, { onStep: (step, elapsed) => progress.update(step, elapsed) });
  progress.done();
  const { lastStep: _last, ...printed } = summary;
  console.log(JSON.stringify({ example: 'tinker-run', service: service ? 'rxrl (in process)' : baseUrl, ...printed }));
} finally {
  await service?.close();
  base?.dispose();
}
