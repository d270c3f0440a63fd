/**
 * Trains the calculator agent written on the Vercel AI SDK (examples/agents/calculatorAiSdk.ts: `streamText`, a
 * `calc` tool, up to three steps) without changing it: rxrl hands it the base URL of a recorded session of its
 * gateway and trains on the exact tokens of its calls; the calculator evaluator scores its final text.
 *
 * Run: `npm run build && node dist/examples/agent-ai-sdk.js` (RXRL_STEPS sets the step budget, default 10).
 * The last stdout line is a JSON summary.
 */
import { aiSdkCalculatorAgent } from './agents/calculatorAiSdk.js';
import { trainAgent } from './agents/train.js';

await trainAgent('agent-ai-sdk', {
  run: async (task, context) => {
    await aiSdkCalculatorAgent(task, context);
  },
});
