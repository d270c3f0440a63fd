/**
 * Trains the bundled reverse task with GRPO, sampling through an OpenAI-compatible server:
 *
 *   loader ─admit─▶ rollout(OpenAIEngine ══HTTP══▶ rxrl serve) ─▶ … ─▶ train ─▶ syncWeights
 *                                                    ▲  safetensors + POST /update_weights_from_disk
 *
 * Without `OPENAI_BASE_URL` the example starts its own `rxrl serve` (a child process on a free loopback port,
 * loaded with the trainer's initial weights). With `OPENAI_BASE_URL` (and optionally `OPENAI_MODEL`) it uses
 * that server, pushing the initial weights to it first; the server must read the weight directory and use the
 * task's character tokenizer.
 *
 * Run: `npm run build && node dist/examples/openai-rollout.js` (RXRL_STEPS sets the step budget, default 30;
 * RXRL_SEED the seed). Progress goes to stderr; the last stdout line is a JSON summary.
 */
import { Progress } from '../lib/index.js';
import { runServed } from '../pipelines/index.js';

const steps = Number(process.env.RXRL_STEPS ?? 30);
const seed = Number(process.env.RXRL_SEED ?? 1);

const progress = new Progress({ total: steps });
const summary = await runServed({
  steps,
  seed,
  baseURL: process.env.OPENAI_BASE_URL || undefined,
  modelName: process.env.OPENAI_MODEL || undefined,
  onStep: (step, elapsed) => progress.update(step, elapsed),
});
progress.done();
const { lastStep: _last, ...printed } = summary;
console.log(JSON.stringify({ example: 'openai-rollout', ...printed }));
