import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { calculatorAgent } from '../../examples/agents/calculator.js';
import { aiSdkCalculatorAgent } from '../../examples/agents/calculatorAiSdk.js';
import { agentsSdkCalculatorAgent } from '../../examples/agents/calculatorAgentsSdk.js';
import { gatewayWorker, type AgentProgram } from '../../lib/agent/gateway.js';
import { LocalEngine } from '../../lib/engine/local.js';
import { OpenAIEngine } from '../../lib/engine/openai.js';
import { AgentError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import type { Task } from '../../lib/core/types.js';
import { serve } from '../../lib/serve/server.js';
import type { RolloutWorkerInput } from '../../lib/engine/worker.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';
import { lacks } from '../helpers/testSetup.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const pythonAgent = `python3 ${join(root, 'examples', 'python', 'calculator_agent.py')}`;
const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const task: Task = { id: 'calc/2+3', prompt: '2+3', answer: '5' };
let model: PolicyModel;
let engine: LocalEngine;
const workers: { close(): Promise<void> }[] = [];

function input(): RolloutWorkerInput {
  return {
    engine,
    task,
    id: 'calc/2+3@0/0',
    groupId: 'calc/2+3@0',
    runId: 0,
    modelTag: 'policy',
    seed: 5,
    maxTokens: 12,
    temperature: 1,
    topP: 1,
  };
}

function worker(program: AgentProgram) {
  const w = gatewayWorker(program, { maxModelLen: config.maxSeqLen });
  workers.push(w);
  return w;
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  // bos 2 + 3 eos | c a l c ( 2 + 3 ) eos | 5 eos | 5 eos: calls the tool, reads 5, answers 5
  model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5'))));
  engine = new LocalEngine(model, { tokenizer });
});

afterAll(async () => {
  await Promise.all(workers.map((w) => w.close()));
  model.dispose();
});

const calcTurn = [...tokenizer.encode('calc(2+3)'), tokenizer.eosId];
const toolTurn = [...tokenizer.encode('5'), tokenizer.eosId];
const answerTurn = [...tokenizer.encode('5'), tokenizer.eosId];

describe('gatewayWorker: unmodified agents trained through a session gateway', () => {
  it('a JS agent on the openai npm client (streaming, a tool round trip) becomes one sample with its reward', async () => {
    const run = worker({
      run: async (t, context) => {
        const answer = await calculatorAgent(t, context);
        return { reward: answer === t.answer ? 1 : 0 };
      },
    });
    const sample = await run(input(), new AbortController().signal);
    expect(sample.promptTokens).toEqual([tokenizer.bosId, ...tokenizer.encode('2+3'), tokenizer.eosId]);
    expect(sample.responseTokens).toEqual([...calcTurn, ...toolTurn, ...answerTurn]);
    expect(sample.lossMask).toEqual([...calcTurn.map(() => 1), 0, 0, 1, 1]);
    expect(sample.logprobs.slice(calcTurn.length, calcTurn.length + 2)).toEqual([0, 0]);
    expect(sample).toMatchObject({
      reward: 1,
      response: '5',
      finishReason: 'stop',
      policyVersion: 0,
      metrics: { 'agent/calls': 2, 'agent/sequences': 1, 'agent/drift': 0 },
    });
  });

  it('the same agent on the Vercel AI SDK (streamText, a tool step) gives the same token-exact sample', async () => {
    const sample = await worker({ run: (t, context) => aiSdkCalculatorAgent(t, context).then(() => undefined) })(
      input(),
      new AbortController().signal,
    );
    expect(sample.responseTokens).toEqual([...calcTurn, ...toolTurn, ...answerTurn]);
    expect(sample.lossMask).toEqual([...calcTurn.map(() => 1), 0, 0, 1, 1]);
    expect(sample).toMatchObject({ response: '5', metrics: { 'agent/calls': 2, 'agent/sequences': 1 } });
  });

  it('the same agent on the OpenAI Agents SDK (Agent, a function tool, Runner) gives the same token-exact sample', async () => {
    const sample = await worker({ run: (t, context) => agentsSdkCalculatorAgent(t, context).then(() => undefined) })(
      input(),
      new AbortController().signal,
    );
    expect(sample.responseTokens).toEqual([...calcTurn, ...toolTurn, ...answerTurn]);
    expect(sample.lossMask).toEqual([...calcTurn.map(() => 1), 0, 0, 1, 1]);
    expect(sample).toMatchObject({ response: '5', metrics: { 'agent/calls': 2, 'agent/sequences': 1 } });
  });

  it('over an upstream OpenAI-compatible server (another rxrl serve), the gateway records the same token ids', async () => {
    const upstream = await serve({ model, tokenizer });
    workers.push(upstream);
    const remote = new OpenAIEngine({ baseURL: upstream.baseURL, model: upstream.modelName, tokenizer });
    const sample = await worker({ run: (t, context) => calculatorAgent(t, context).then(() => undefined) })(
      { ...input(), engine: remote },
      new AbortController().signal,
    );
    expect(sample.responseTokens).toEqual([...calcTurn, ...toolTurn, ...answerTurn]);
    expect(sample.lossMask).toEqual([...calcTurn.map(() => 1), 0, 0, 1, 1]);
    expect(sample.logprobs.filter((_, j) => sample.lossMask[j] === 1).every((l) => l <= 0)).toBe(true);
  });

  it.skipIf(lacks('python'))(
    'a Python agent on PyPI openai, run as a command, gives the same sample; a printed {"reward": r} is its reward',
    async () => {
      const sample = await worker({ command: pythonAgent })(input(), new AbortController().signal);
      expect(sample.responseTokens).toEqual([...calcTurn, ...toolTurn, ...answerTurn]);
      expect(sample.response).toBe('5');
      expect(sample.reward).toBeUndefined(); // the recipe's evaluator scores the answer
      const scored = await worker({ command: `${pythonAgent} > /dev/null && echo '{"reward": 0.5}'` })(
        input(),
        new AbortController().signal,
      );
      expect(scored.reward).toBe(0.5);
    },
  );

  it.skipIf(lacks('python'))(
    'fails a sample alone, with a typed error: a crash (stderr kept), no call, a bad reward, a cancelled agent (killed)',
    async () => {
      const signal = new AbortController().signal;
      const crash = await worker({ command: 'echo "boom: tool server down" >&2; exit 3' })(input(), signal).catch((e: unknown) => e);
      expect(crash).toBeInstanceOf(AgentError);
      expect((crash as AgentError).message).toMatch(/exited with code 3.*boom: tool server down/);
      await expect(worker({ command: 'true' })(input(), signal)).rejects.toThrow(/made no call/);
      await expect(worker({ command: `${pythonAgent} > /dev/null && echo '{"reward": "lots"}'` })(input(), signal)).rejects.toBeInstanceOf(
        AgentError,
      );
      await expect(worker({ run: () => ({ reward: Number.NaN }) })(input(), signal)).rejects.toBeInstanceOf(AgentError);
      // A hung agent ends when its sample is cancelled (it would outlive the test's timeout otherwise).
      const controller = new AbortController();
      const hung = worker({ command: 'sleep 1000' })(input(), controller.signal);
      setTimeout(() => controller.abort(new Error('sample timed out')), 200);
      await expect(hung).rejects.toThrow(/timed out/);
    },
  );
});
