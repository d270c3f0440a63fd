/**
 * Two agents with different roles, each trained as its own LoRA adapter on one frozen base (PettingLLMs' L2):
 * a writer answers the bundled reverse task, an editor sees the writer's draft and writes the corrected answer.
 *
 *   loader ─admit─▶ rolloutEpisodes ─▶ groupTrajectories ─┬─ writer: batch ▶ prepare ▶ train ▶ sync (adapter only)
 *                                                         └─ editor: batch ▶ prepare ▶ train ▶ sync (adapter only)
 *
 * Run: `npm run build && node dist/examples/two-agents-lora.js` (RXRL_STEPS sets each policy's step budget,
 * default 30). Progress goes to stderr, one line per policy step (`writer step 3/30 · …`); the last stdout line is a JSON
 * summary.
 */
import { lastValueFrom, tap } from 'rxjs';
import { CharTokenizer, GrpoTrainer, LocalEngine, LoraAdapter, PolicyModel, initBackend, type AgentSpec } from '../lib/index.js';
import { printProgress } from '../operators/index.js';
import { multiAgentPipeline, validateAgents } from '../pipelines/index.js';
import { writerEditorTask } from '../recipes/index.js';

const steps = Number(process.env.RXRL_STEPS ?? 30);
const batchSize = 16; // tasks (episodes) per step
const groupSize = 8; // episodes per task

await initBackend('auto');
const task = writerEditorTask({ transform: 'reverse', alphabet: 'abcde', minLength: 4, maxLength: 4, seed: 3 });
const tokenizer = new CharTokenizer(task.characters);
const config = { vocabSize: tokenizer.vocabSize, dModel: 64, nLayers: 2, nHeads: 4, dFF: 256, maxSeqLen: 24, modelType: 'qwen2' as const };
const lora = { rank: 8, alpha: 16, targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] as const };

// One frozen base for training and one for sampling; each agent's policy is an adapter view over them.
const trainBase = PolicyModel.create(config, 3);
const sampleBase = PolicyModel.fromWeights(config, trainBase.getWeights());
const agents: AgentSpec[] = [
  { name: 'writer', policy: 'writer' },
  { name: 'editor', policy: 'editor' },
];
const policies = agents.map((agent, i) => {
  const adapter = LoraAdapter.create(config, { ...lora, targetModules: [...lora.targetModules] }, 10 + i);
  const sampling = LoraAdapter.fromWeights(config, { ...lora, targetModules: [...lora.targetModules] }, adapter.getWeights());
  const engine = new LocalEngine(PolicyModel.withAdapter(sampleBase, sampling), { tokenizer, modelTag: agent.policy });
  const trainer = new GrpoTrainer(PolicyModel.withAdapter(trainBase, adapter), {
    modelTag: agent.policy,
    learningRate: 2e-3,
    clipHigh: 0.28,
    seed: i,
  });
  return { trainer, engines: [engine] };
});
const engines = new Map(policies.map((p) => [p.trainer.modelTag, p.engines[0]]));
const maxTokens = task.maxAnswerLength + 1;
const score = (): Promise<Record<string, number>> =>
  validateAgents(engines, task.validation, { environment: task.environment, agents, maxTokens });

const before = await score();
const started = performance.now();
const last = new Map<string, number>();
await lastValueFrom(
  multiAgentPipeline({
    tasks: task.train,
    environment: task.environment,
    agents,
    policies,
    batchSize,
    groupSize,
    maxTokens,
    steps,
    loader: { epochs: Infinity, shuffle: true, seed: 3 },
  }).pipe(
    tap((step) => last.set(step.modelTag, step.step + 1)),
    printProgress({ total: steps, perPolicy: true }),
  ),
);
const after = await score();
console.log(
  JSON.stringify({
    example: 'two-agents-lora',
    steps: Math.min(...last.values()),
    seconds: Math.round((performance.now() - started) / 100) / 10,
    writer: [before['val/writer/reward_mean'], after['val/writer/reward_mean']],
    editor: [before['val/editor/reward_mean'], after['val/editor/reward_mean']],
    adapterParameters: policies[0].trainer.model.trainableVariables().reduce((n, v) => n + v.size, 0),
  }),
);
