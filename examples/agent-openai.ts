/**
 * Trains a calculator agent written on the `openai` npm client (streaming, multi-turn tool use:
 * examples/agents/calculator.ts) without changing it: rxrl hands it the base URL of a recorded session of its
 * gateway, and trains on the exact tokens of its calls. The agent returns nothing, so the calculator evaluator
 * scores its final answer (partial credit); an agent that knows its reward returns it (`{ reward }`).
 *
 * Run: `npm run build && node dist/examples/agent-openai.js` (RXRL_STEPS sets the step budget, default 10).
 * The last stdout line is a JSON summary.
 */
import { calculatorAgent } from './agents/calculator.js';
import { trainAgent } from './agents/train.js';

await trainAgent('agent-openai', {
  run: async (task, context) => {
    await calculatorAgent(task, context);
  },
});
