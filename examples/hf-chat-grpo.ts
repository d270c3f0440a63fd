/**
 * GRPO on a Hugging Face model directory with its own tokenizer and chat template: short arithmetic questions,
 * answered in a fixed format (the equation, `7 * 8 = 56`), scored by a rule.
 *
 * The model is `RXRL_MODEL_DIR`, else SmolLM2-135M-Instruct when `npm run model:smollm2` has built it
 * (`~/.cache/rxrl-models/SmolLM2-135M-Instruct`), else the tiny random-weight Qwen2 fixture of the specs (which
 * only shows the plumbing: it cannot do arithmetic).
 *
 * Run: `npm run build && node dist/examples/hf-chat-grpo.js` (RXRL_STEPS sets the step budget, default 4;
 * RXRL_TRAINED_BLOCKS how many of the last transformer blocks train, default 2).
 * Progress goes to stderr; the last stdout line is a JSON summary.
 */
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { lastValueFrom, take } from 'rxjs';
import {
  AdmissionGate,
  GrpoTrainer,
  LocalEngine,
  chatWorker,
  createRng,
  initBackend,
  loadChatTemplate,
  loadModelDir,
  loadTasks,
  loadTokenizer,
  type Task,
} from '../lib/index.js';
import { admit, batchGroups, groupTrajectories, grpoPrepare, printProgress, rollout, syncWeights, train } from '../operators/index.js';
import { validate } from '../pipelines/index.js';
import { equationEvaluator } from '../recipes/arithmetic.js';

const steps = Number(process.env.RXRL_STEPS ?? 4);
const tasksPerStep = 2;
const groupSize = 4;
const maxTokens = 12;

const smollm2 = join(homedir(), '.cache', 'rxrl-models', 'SmolLM2-135M-Instruct');
const fixture = fileURLToPath(new URL('../../spec/fixtures/hf/tiny-qwen2', import.meta.url));
const modelDir = process.env.RXRL_MODEL_DIR ?? (existsSync(join(smollm2, 'config.json')) ? smollm2 : fixture);

/** `a op b` with small operands; the answer is an integer. */
function arithmetic(count: number, seed: number): Task[] {
  const rng = createRng(seed, 'arithmetic');
  return Array.from({ length: count }, (_, i) => {
    const a = 1 + Math.floor(rng.next() * 9);
    const b = 1 + Math.floor(rng.next() * 9);
    const [op, value] = rng.next() < 0.5 ? ['+', a + b] : ['*', a * b];
    return {
      id: `arith-${seed}-${i}`,
      prompt: `What is ${a} ${op} ${b}? Answer with the equation only, like "2 + 2 = 4".`,
      answer: `${a} ${op} ${b} = ${value}`,
    };
  });
}

/** 1 for the question's equation with the right result, 0.2 for it with a wrong result, 0 otherwise (the recipe's). */
const evaluator = equationEvaluator;

const backend = await initBackend('auto');
const tokenizer = await loadTokenizer(modelDir);
const template = await loadChatTemplate(modelDir, tokenizer);
if (!template) throw new Error(`${modelDir} has no chat template (chat_template.jinja or tokenizer_config.json)`);
const { model: policy } = await loadModelDir(modelDir);
process.stderr.write(`${basename(modelDir)}: ${(policy.numParameters() / 1e6).toFixed(1)} M parameters on ${backend}\n`);

/** One chat turn: the task's prompt as the user's message, rendered with the model's template. */
const worker = chatWorker(template);

// Sync mode in one process: the engine samples from the trainer's own model (a second copy of 135 M weights does not
// fit beside the first in wasm memory), so a weight sync only moves the engine's version and copies nothing.
const engine = new LocalEngine(policy, { tokenizer, sharesTrainerWeights: true });
// Full fine-tuning of a 135 M model needs ~2.2 GB for weights, gradients and Adam moments, past what the wasm
// backend can address (~2 GB); the last blocks and the final norm train here, the rest stays frozen.
const trainedBlocks = Math.min(policy.config.nLayers, Number(process.env.RXRL_TRAINED_BLOCKS ?? 2));
const firstTrained = policy.config.nLayers - trainedBlocks;
const trainable = (name: string): boolean => {
  const block = /^model\.layers\.(\d+)\./.exec(name);
  return block ? Number(block[1]) >= firstTrained : name === 'model.norm.weight';
};
// One forward/backward pass over the step's rows: a group's rows share their prompt, which then runs once.
const trainer = new GrpoTrainer(policy, { learningRate: 1e-5, clipHigh: 0.28, microBatchSize: tasksPerStep * groupSize, trainable });
const gate = new AdmissionGate({ mode: 'sync', tasksPerBatch: tasksPerStep });
const held = arithmetic(8, 2);
process.stderr.write(`scoring ${held.length} held-out questions (greedy)\n`);
const before = await validate(engine, held, evaluator, { maxTokens, worker });
process.stderr.write(
  `held-out reward ${before['val/reward_mean'].toFixed(3)}; training ${trainedBlocks} of ${policy.config.nLayers} blocks\n`,
);
const started = performance.now();
await lastValueFrom(
  admit(loadTasks(arithmetic(200, 1), { epochs: Infinity, shuffle: true, seed: 1 }), gate).pipe(
    rollout(engine, { samplesPerTask: groupSize, concurrency: tasksPerStep * groupSize, maxTokens, evaluator, worker, seed: 1 }),
    groupTrajectories({ keys: ['groupId'], groupSize }),
    batchGroups({ batchSize: tasksPerStep }),
    grpoPrepare({ padId: tokenizer.padId }),
    train(trainer),
    syncWeights([engine], { onPublished: (version) => gate.publish(version) }),
    take(steps),
    printProgress({ total: steps }),
  ),
  { defaultValue: undefined },
);
const after = await validate(engine, held, evaluator, { maxTokens, worker });
console.log(
  JSON.stringify({
    example: 'hf-chat-grpo',
    model: basename(modelDir),
    backend,
    steps: trainer.step,
    seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
    valRewardInitial: before['val/reward_mean'],
    valRewardFinal: after['val/reward_mean'],
    valFormatFinal: after['val/format_mean'],
  }),
);
trainer.dispose();
policy.dispose();
