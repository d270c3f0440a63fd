/**
 * A calculator agent on the `openai` npm client, streaming, as an application would write it: nothing in it knows
 * about rxrl. It asks the model with a `calc` tool on offer, runs the calls it gets back, sends the results, and
 * stops at the first answer without a call (at most three turns).
 *
 * rxrl trains it through its session gateway: `gatewayWorker({ run: calculatorAgent }, …)` hands it the base URL of
 * a recorded session, the only thing the agent takes from rxrl.
 */
import OpenAI from 'openai';

/** The tool as the agent offers it. */
const CALC_TOOL: OpenAI.Chat.ChatCompletionTool = {
  type: 'function',
  function: {
    name: 'calc',
    description: 'Evaluates an integer arithmetic expression with + - and *.',
    parameters: { type: 'object', properties: { expression: { type: 'string' } }, required: ['expression'] },
  },
};

/** `a op b …` with + - * over integers, left to right with * first; '?' for anything else. */
export function calc(expression: string): string {
  if (!/^-?\d+([+\-*]-?\d+)*$/.test(expression) || expression.length > 64) return '?';
  const terms = expression.match(/-?\d+|[+\-*]/g) ?? [];
  const sums: number[] = [];
  let sign = 1;
  let product: number | undefined;
  for (const piece of terms) {
    if (piece === '+' || piece === '-') {
      sums.push(sign * (product ?? 0));
      sign = piece === '+' ? 1 : -1;
      product = undefined;
    } else if (piece !== '*') {
      product = product === undefined ? Number(piece) : product * Number(piece);
    }
  }
  sums.push(sign * (product ?? 0));
  const value = sums.reduce((a, b) => a + b, 0);
  return Number.isSafeInteger(value) ? String(value === 0 ? 0 : value) : '?';
}

/** What the agent is given: where the model is. */
export interface CalculatorAgentOptions {
  readonly baseURL: string;
  readonly apiKey: string;
  readonly model: string;
  readonly signal?: AbortSignal;
}

/**
 * Answers `task.prompt` (an expression such as `3+4`), streaming each turn; returns the final answer's text.
 */
export async function calculatorAgent(task: { readonly prompt: string }, options: CalculatorAgentOptions): Promise<string> {
  const client = new OpenAI({ baseURL: options.baseURL, apiKey: options.apiKey, maxRetries: 0 });
  const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: 'user', content: task.prompt }];
  let answer = '';
  for (let turn = 0; turn < 3; turn++) {
    const stream = client.chat.completions.stream({ model: options.model, messages, tools: [CALC_TOOL] }, { signal: options.signal });
    const reply = (await stream.finalChatCompletion()).choices[0].message;
    messages.push({ role: 'assistant', content: reply.content, ...(reply.tool_calls?.length ? { tool_calls: reply.tool_calls } : {}) });
    answer = reply.content ?? '';
    const calls = (reply.tool_calls ?? []).filter((call) => call.type === 'function');
    if (calls.length === 0) break;
    for (const call of calls) {
      let expression = '';
      try {
        expression = String((JSON.parse(call.function.arguments) as { expression?: unknown }).expression ?? '');
      } catch {
        // malformed arguments: the tool answers '?'
      }
      messages.push({ role: 'tool', tool_call_id: call.id, content: calc(expression) });
    }
  }
  return answer;
}
