/**
 * What the agent examples share: a small GRPO run on the calculator task (expressions such as `3+4`, a character
 * policy, the bundled chat template) whose samples come from an agent through rxrl's session gateway.
 *
 * Each sample runs the agent once with the base URL of a recorded session; the session's exact tokens (every
 * completion trained on, tool results masked) become the trajectory, the agent's reward or the calculator
 * evaluator's score its reward.
 */
import { lastValueFrom } from 'rxjs';

import { CharTokenizer, GrpoTrainer, LocalEngine, PolicyModel, gatewayWorker, initBackend, type AgentProgram } from '../../lib/index.js';
import { printProgress } from '../../operators/index.js';
import { grpoPipeline, validate } from '../../pipelines/index.js';
import { calculatorTask } from '../../recipes/index.js';

/** Trains `agent` for `RXRL_STEPS` steps (default 10) and prints a JSON summary line named `example`. */
export async function trainAgent(example: string, agent: AgentProgram): Promise<void> {
  const steps = Number(process.env.RXRL_STEPS ?? 10);
  const batchSize = 2; // tasks per step
  const groupSize = 4; // agent runs per task
  await initBackend('auto');
  const task = calculatorTask({ operators: ['+'], maxOperand: 9, validationSize: 8, seed: 1 });
  const tokenizer = new CharTokenizer(task.characters);
  const config = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 2, nHeads: 2, dFF: 64, maxSeqLen: 48 };
  const policy = PolicyModel.create(config, 1);
  const engine = new LocalEngine(PolicyModel.fromWeights(config, policy.getWeights()), { tokenizer });
  const trainer = new GrpoTrainer(policy, { learningRate: 2e-3, clipHigh: 0.28 });
  const worker = gatewayWorker(agent, { maxModelLen: config.maxSeqLen });
  const maxTokens = 12;
  try {
    const before = await validate(engine, task.validation, task.evaluator, { maxTokens, worker });
    const started = performance.now();
    await lastValueFrom(
      grpoPipeline({
        tasks: task.train,
        loader: { epochs: Infinity, shuffle: true, seed: 1 },
        engines: [engine],
        trainer,
        evaluator: task.evaluator,
        batchSize,
        groupSize,
        maxTokens,
        steps,
        worker,
      }).pipe(printProgress({ total: steps })),
      { defaultValue: undefined },
    );
    const after = await validate(engine, task.validation, task.evaluator, { maxTokens, worker });
    console.log(
      JSON.stringify({
        example,
        steps: trainer.step,
        seconds: Number(((performance.now() - started) / 1000).toFixed(1)),
        valRewardInitial: before['val/reward_mean'],
        valRewardFinal: after['val/reward_mean'],
      }),
    );
  } finally {
    await worker.close();
    trainer.dispose();
    policy.dispose();
  }
}
