import { describe, expect, it } from 'vitest';

import { loadChatTemplate } from '../lib/chat/jinjaTemplate.js';
import type { RolloutEngine } from '../lib/engine/types.js';
import type { GenerateRequest, GenerateResponse } from '../lib/model/types.js';
import { loadTokenizer } from '../lib/model/hfTokenizer.js';
import { chatWorker, referenceWorker, singleTurnWorker, type RolloutWorkerInput } from '../lib/engine/worker.js';
import type { ChatMessage } from '../lib/chat/types.js';
import { DecodeError } from '../lib/core/errors.js';

const FIXTURE = new URL('./fixtures/hf/tiny-qwen2/', import.meta.url).pathname;

/** An engine that answers every request with `reply` and records the requests. */
async function recordingEngine(reply: string): Promise<{ engine: RolloutEngine; requests: GenerateRequest[] }> {
  const tokenizer = await loadTokenizer(FIXTURE);
  const requests: GenerateRequest[] = [];
  const engine: RolloutEngine = {
    modelTag: 'policy',
    version: 3,
    tokenizer,
    async generate(batch): Promise<GenerateResponse[]> {
      requests.push(...batch);
      const tokens = [...tokenizer.encode(reply), tokenizer.eosId];
      return batch.map(() => ({ tokens, logprobs: tokens.map(() => -1), finishReason: 'stop', policyVersion: 3 }));
    },
    async loadWeights() {},
  };
  return { engine, requests };
}

function input(engine: RolloutEngine): RolloutWorkerInput {
  return {
    engine,
    task: { id: 't', prompt: 'What is 2 + 3?' },
    id: 't@0/0',
    groupId: 't@0',
    runId: 0,
    modelTag: 'policy',
    seed: 7,
    maxTokens: 8,
    temperature: 1,
    topP: 1,
  };
}

describe('rollout workers', () => {
  it("chatWorker renders the prompt with the model's chat template (and a system message) and stops at the model's stop ids", async () => {
    const { engine, requests } = await recordingEngine('2 + 3 = 5');
    const template = (await loadChatTemplate(FIXTURE, engine.tokenizer))!;
    const sample = await chatWorker(template, { system: 'Be brief.' })(input(engine), new AbortController().signal);
    const expected = template.render(
      [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'What is 2 + 3?' },
      ],
      [],
      { addGenerationPrompt: true },
    );
    expect(requests[0]).toMatchObject({ promptTokens: expected, maxTokens: 8, seed: 7, stopTokens: engine.tokenizer.stopIds });
    expect(engine.tokenizer.decode(expected, { skipSpecialTokens: false })).toMatch(
      /<\|im_start\|>user\nWhat is 2 \+ 3\?<\|im_end\|>\n<\|im_start\|>assistant\n$/,
    );
    expect(sample).toMatchObject({ promptTokens: expected, response: '2 + 3 = 5', finishReason: 'stop', policyVersion: 3 });
    expect(sample.lossMask.every((m) => m === 1)).toBe(true);
  });

  it('singleTurnWorker sends the prompt as text, encoded by the tokenizer', async () => {
    const { engine, requests } = await recordingEngine('5');
    const sample = await singleTurnWorker(input(engine), new AbortController().signal);
    expect(requests[0].promptTokens).toEqual(engine.tokenizer.encode('What is 2 + 3?', { addBos: true }));
    expect(sample.response).toBe('5');
  });
});

describe('referenceWorker', () => {
  const signal = new AbortController().signal;

  it("writes the task's reference output after the chat-rendered prompt, up to the template's end-of-turn, without sampling", async () => {
    const { engine, requests } = await recordingEngine('unused');
    const template = (await loadChatTemplate(FIXTURE, engine.tokenizer))!;
    const task = { id: 't', prompt: 'What is 2 + 3?', answer: '2 + 3 = 5' };
    const sample = await referenceWorker(template)({ ...input(engine), task }, signal);
    expect(requests).toEqual([]);
    expect(sample.promptTokens).toEqual(template.render([{ role: 'user', content: task.prompt }], [], { addGenerationPrompt: true }));
    expect(engine.tokenizer.decode(sample.responseTokens, { skipSpecialTokens: false })).toBe('2 + 3 = 5<|im_end|>');
    expect(sample).toMatchObject({ finishReason: 'stop', policyVersion: 3, response: '2 + 3 = 5' });
    expect(sample.lossMask).toEqual(sample.responseTokens.map(() => 1));
    expect(sample.logprobs).toEqual(sample.responseTokens.map(() => 0));
    // `response` wins over `answer`; a conversation in metadata.messages is the prompt.
    const chat = {
      ...task,
      response: 'Five.',
      metadata: {
        messages: [
          { role: 'system', content: 'Be brief.' },
          { role: 'user', content: 'What is 2 + 3?' },
        ],
      },
    };
    const fromChat = await referenceWorker(template)({ ...input(engine), task: chat }, signal);
    expect(fromChat.promptTokens).toEqual(template.render(chat.metadata.messages as ChatMessage[], [], { addGenerationPrompt: true }));
    expect(fromChat.response).toBe('Five.');
  });

  it('without a template encodes the prompt as singleTurnWorker does and ends the reference with the stop token', async () => {
    const { engine } = await recordingEngine('unused');
    const task = { id: 't', prompt: 'abc', response: 'cba' };
    const sample = await referenceWorker()({ ...input(engine), task }, signal);
    expect(sample.promptTokens).toEqual(engine.tokenizer.encode('abc', { addBos: true }));
    expect(sample.responseTokens).toEqual([...engine.tokenizer.encode('cba', { addBos: false }), engine.tokenizer.stopIds[0]]);
  });

  it('fails the sample with a DecodeError when the task has no reference output', async () => {
    const { engine } = await recordingEngine('unused');
    await expect(referenceWorker()({ ...input(engine), task: { id: 'x', prompt: 'p' } }, signal)).rejects.toThrow(DecodeError);
  });
});
