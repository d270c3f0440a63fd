/**
 * The calculator agent once more, on the OpenAI Agents SDK (`@openai/agents`): an `Agent` with a `calc` function tool,
 * run for at most three turns on the chat-completions model of an OpenAI client, as an application would write it.
 * Nothing in it knows about rxrl; its runner keeps its traces to itself (no tracing export).
 */
import { Agent, MaxTurnsExceededError, OpenAIChatCompletionsModel, Runner, tool } from '@openai/agents';
import OpenAI from 'openai';
import { z } from 'zod';

import { calc, type CalculatorAgentOptions } from './calculator.js';

/** Answers `task.prompt` (an expression such as `3+4`); returns the final text ('' when it ran out of turns). */
export async function agentsSdkCalculatorAgent(task: { readonly prompt: string }, options: CalculatorAgentOptions): Promise<string> {
  const client = new OpenAI({ baseURL: options.baseURL, apiKey: options.apiKey, maxRetries: 0 });
  const agent = new Agent({
    name: 'calculator',
    model: new OpenAIChatCompletionsModel(client, options.model),
    tools: [
      tool({
        name: 'calc',
        description: 'Evaluates an integer arithmetic expression with + - and *.',
        parameters: z.object({ expression: z.string() }),
        execute: async ({ expression }) => calc(expression),
      }),
    ],
  });
  const runner = new Runner({ tracingDisabled: true });
  try {
    const result = await runner.run(agent, task.prompt, { maxTurns: 3, ...(options.signal ? { signal: options.signal } : {}) });
    return String(result.finalOutput ?? '');
  } catch (error) {
    if (error instanceof MaxTurnsExceededError) return '';
    throw error;
  }
}
