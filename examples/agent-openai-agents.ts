/**
 * Trains the calculator agent written on the OpenAI Agents SDK (examples/agents/calculatorAgentsSdk.ts: an `Agent`
 * with a `calc` tool, up to three turns) without changing it: rxrl hands it the base URL of a recorded session of its
 * gateway and trains on the exact tokens of its calls; the calculator evaluator scores its final text.
 *
 * Run: `npm run build && node dist/examples/agent-openai-agents.js` (RXRL_STEPS sets the step budget, default 10).
 * The last stdout line is a JSON summary.
 */
import { agentsSdkCalculatorAgent } from './agents/calculatorAgentsSdk.js';
import { trainAgent } from './agents/train.js';

await trainAgent('agent-openai-agents', {
  run: async (task, context) => {
    await agentsSdkCalculatorAgent(task, context);
  },
});
