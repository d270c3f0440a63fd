/**
 * The calculator agent again, on the Vercel AI SDK (`ai` with `@ai-sdk/openai-compatible`): `streamText` with a
 * `calc` tool and up to three steps, as an application would write it. Nothing in it knows about rxrl.
 */
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { stepCountIs, streamText, tool } from 'ai';
import { z } from 'zod';

import { calc, type CalculatorAgentOptions } from './calculator.js';

/** Answers `task.prompt` (an expression such as `3+4`); returns the final text. */
export async function aiSdkCalculatorAgent(task: { readonly prompt: string }, options: CalculatorAgentOptions): Promise<string> {
  const provider = createOpenAICompatible({ name: 'calculator', baseURL: options.baseURL, apiKey: options.apiKey });
  const result = streamText({
    model: provider.chatModel(options.model),
    prompt: task.prompt,
    tools: {
      calc: tool({
        description: 'Evaluates an integer arithmetic expression with + - and *.',
        inputSchema: z.object({ expression: z.string() }),
        execute: async ({ expression }) => calc(expression),
      }),
    },
    stopWhen: stepCountIs(3),
    maxRetries: 0,
    ...(options.signal ? { abortSignal: options.signal } : {}),
  });
  return await result.text;
}
