import { from, lastValueFrom, toArray } from 'rxjs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { agentWorker } from '../../lib/agent/agentWorker.js';
import type { ChatEngine } from '../../lib/chat/types.js';
import { collate } from '../../lib/data/collate.js';
import { LocalEngine } from '../../lib/engine/local.js';
import { OpenAIEngine } from '../../lib/engine/openai.js';
import { ConfigError, DecodeError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import { serve, type RxrlServer } from '../../lib/serve/server.js';
import { isSampleFailure, type RolloutOutput, type Task, type Trajectory } from '../../lib/core/types.js';
import { GrpoTrainer } from '../../lib/train/grpoTrainer.js';
import { batchGroups } from '../../operators/batchGroups.js';
import { groupTrajectories } from '../../operators/groupTrajectories.js';
import { grpoPrepare } from '../../operators/grpoPrepare.js';
import { rollout } from '../../operators/rollout.js';
import { train } from '../../operators/train.js';
import { calculatorTask } from '../../recipes/calculator.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';

const calc = calculatorTask({ maxOperand: 9, validationSize: 20 });
const tokenizer = new CharTokenizer(calc.characters);
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 40, nLayers: 1, nHeads: 2, dFF: 40, maxSeqLen: 40 };
const twoPlusThree: Task = { id: 'calc/2+3', prompt: '2+3', answer: '5' };
const enc = (text: string): number[] => tokenizer.encode(text);
const EOS = tokenizer.eosId;

const servers: RxrlServer[] = [];
const models: PolicyModel[] = [];

/** rxrl serve over a policy scripted by position, and an OpenAIEngine on it. */
async function scriptedServer(script: Map<number, string>): Promise<{ server: RxrlServer; engine: OpenAIEngine }> {
  const model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, script));
  models.push(model);
  const server = await serve({ model, tokenizer });
  servers.push(server);
  return { server, engine: new OpenAIEngine({ baseURL: server.baseURL, model: server.modelName, tokenizer }) };
}

function runAgent(
  engine: ChatEngine | OpenAIEngine | LocalEngine,
  tasks: Task[],
  options: { maxTurns?: number; samples?: number } = {},
): Promise<RolloutOutput[]> {
  const worker = agentWorker({ environment: calc.environment, maxTurns: options.maxTurns ?? 3, maxTotalTokens: config.maxSeqLen });
  return lastValueFrom(
    from(tasks).pipe(
      rollout(engine as OpenAIEngine, {
        samplesPerTask: options.samples ?? 1,
        concurrency: 4,
        maxTokens: 12,
        evaluator: calc.evaluator,
        worker,
      }),
      toArray(),
    ),
  );
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
});

afterAll(async () => {
  await Promise.all(servers.map((s) => s.close()));
  for (const m of models) m.dispose();
});

describe('agent rollouts: calculator tool calls against rxrl serve', () => {
  it('makes one trajectory per episode whose loss mask covers only the policy tokens', async () => {
    // positions: bos 2 + 3 eos | calc(2+3) eos (5..14) | 5 eos (tool, 15..16) | 5 eos (17..18)
    const { engine } = await scriptedServer(mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5')));
    const out = await runAgent(engine, [twoPlusThree], { samples: 2 });
    expect(out.filter(isSampleFailure)).toEqual([]);
    for (const t of out as Trajectory[]) {
      expect(t.promptTokens).toEqual([1, ...enc('2+3'), EOS]);
      expect(t.responseTokens).toEqual([...enc('calc(2+3)'), EOS, ...enc('5'), EOS, ...enc('5'), EOS]);
      expect(t.lossMask).toEqual([...Array(10).fill(1), 0, 0, 1, 1]);
      t.logprobs.forEach((lp, i) => (t.lossMask[i] === 1 ? expect(lp).toBeLessThan(0) : expect(lp).toBe(0)));
      expect(t).toMatchObject({ reward: 1, finishReason: 'stop', policyVersion: 0 });
      expect(t.metrics).toEqual({
        accuracy: 1,
        'agent/turns': 2,
        'agent/tool_calls': 1,
        'agent/tool_errors': 0,
        'agent/policy_tokens': 12,
        'agent/env_tokens': 2,
      });
    }
    const batch = collate(out as Trajectory[], { padId: tokenizer.padId, modelTag: 'policy' });
    expect(Array.from(batch.lossMask.slice(0, batch.responseLength))).toEqual([...Array(10).fill(1), 0, 0, 1, 1]);
  });

  it('answers a failing tool call with the error text and counts it', async () => {
    // calc(2+) fails: the tool answers '?' (14..15); the policy answers at 16
    const { engine } = await scriptedServer(mergeScripts(writeAt(5, 'calc(2+)'), writeAt(16, '5')));
    const [t] = (await runAgent(engine, [twoPlusThree])) as Trajectory[];
    expect(t.responseTokens).toEqual([...enc('calc(2+)'), EOS, ...enc('?'), EOS, ...enc('5'), EOS]);
    expect(t.metrics).toMatchObject({ 'agent/tool_calls': 1, 'agent/tool_errors': 1, accuracy: 1 });
  });

  it('stops at maxTurns with finish reason length, and answers without tools in one turn', async () => {
    const looping = await scriptedServer(mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, 'calc(5)')));
    const [t] = (await runAgent(looping.engine, [twoPlusThree], { maxTurns: 2 })) as Trajectory[];
    expect(t).toMatchObject({ finishReason: 'length', reward: 0 });
    expect(t.metrics['agent/turns']).toBe(2);
    expect(t.lossMask).toEqual([...Array(10).fill(1), 0, 0, ...Array(8).fill(1)]);

    const direct = await scriptedServer(writeAt(5, '5'));
    const [d] = (await runAgent(direct.engine, [twoPlusThree])) as Trajectory[];
    expect(d).toMatchObject({ responseTokens: [...enc('5'), EOS], lossMask: [1, 1], reward: 1 });
    expect(d.metrics).toMatchObject({ 'agent/turns': 1, 'agent/tool_calls': 0 });
  });

  it('fails the sample (not the stream) without a chat engine or with a template that is not prefix-consistent', async () => {
    const local = new LocalEngine(PolicyModel.create(config, 1), { tokenizer });
    const [noChat] = await runAgent(local, [twoPlusThree]);
    expect(isSampleFailure(noChat) && noChat.error).toBeInstanceOf(ConfigError);

    let turn = 0;
    const drifting: ChatEngine = {
      tokenizer,
      async chat() {
        turn++;
        return {
          message:
            turn === 1
              ? { role: 'assistant', content: '', toolCalls: [{ id: 'c', name: 'calc', arguments: '{"expression":"1"}' }] }
              : { role: 'assistant', content: '1' },
          promptTokens: turn === 1 ? [1, 3, 2] : [1, 4, 2, 3, 2],
          tokens: [3, 2],
          logprobs: [-1, -1],
          finishReason: 'stop',
          policyVersion: 0,
        };
      },
    };
    const [drift] = await runAgent(drifting, [twoPlusThree]);
    expect(isSampleFailure(drift) && drift.error).toBeInstanceOf(DecodeError);
    expect(() => agentWorker({ environment: calc.environment, maxTurns: 0 })).toThrow(ConfigError);
  });

  it('trains a GRPO step on agent trajectories (policy tokens only) after rolling out through the server', async () => {
    const { engine } = await scriptedServer(mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5')));
    const policy = PolicyModel.create(config, 2);
    models.push(policy);
    const trainer = new GrpoTrainer(policy, { learningRate: 1e-3 });
    const tasks: Task[] = [twoPlusThree, { id: 'calc/2+3b', prompt: '2+3', answer: '6' }];
    const worker = agentWorker({ environment: calc.environment, maxTurns: 3, maxTotalTokens: config.maxSeqLen });
    const [step] = await lastValueFrom(
      from(tasks).pipe(
        rollout(engine, { samplesPerTask: 2, concurrency: 4, maxTokens: 12, evaluator: calc.evaluator, worker }),
        groupTrajectories({ keys: ['groupId'], groupSize: 2 }),
        batchGroups({ batchSize: 2 }),
        grpoPrepare({ padId: tokenizer.padId }),
        train(trainer),
        toArray(),
      ),
    );
    expect(step.trajectoryIds).toHaveLength(4);
    expect(Number.isFinite(step.metrics['actor/pg_loss'])).toBe(true);
    trainer.dispose();
  });
});
