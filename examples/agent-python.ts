/**
 * Trains a calculator agent written in Python on PyPI's `openai` client (examples/python/calculator_agent.py), run
 * as a command per sample with OPENAI_BASE_URL pointing at a recorded session of rxrl's gateway and the task in
 * RXRL_TASK. The agent prints its answer; the calculator evaluator scores it. Needs `pip install -r
 * examples/python/requirements.txt` (`npm test` puts it in .cache/python for the specs).
 *
 * Run: `npm run build && node dist/examples/agent-python.js` (RXRL_STEPS sets the step budget, default 10).
 * The last stdout line is a JSON summary.
 */
import { fileURLToPath } from 'node:url';

import { trainAgent } from './agents/train.js';

const agent = fileURLToPath(new URL('../../examples/python/calculator_agent.py', import.meta.url));
await trainAgent('agent-python', { command: `python3 ${JSON.stringify(agent)}` });
