/**
 * An agent command's processes end with its sample, and the agent sees only the environment it is given: a shell
 * script that starts detached descendants (background, `nohup`, `setsid`, double-forked into its own session, one
 * that ignores SIGTERM) and then execs the Python calculator agent (PyPI `openai`, which `npm test` installs into
 * .cache/python, first on the specs' PATH) against the real gateway.
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterAll, beforeAll, describe, expect, it } from 'vitest';

import { gatewayWorker, type AgentCommand, type GatewayWorker } from '../../lib/agent/gateway.js';
import { isRunning } from '../../lib/agent/processTree.js';
import { loadConfig } from '../../lib/config/schema.js';
import { LocalEngine } from '../../lib/engine/local.js';
import { AgentError } from '../../lib/core/errors.js';
import { initBackend } from '../../lib/model/backend.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, type PolicyConfig } from '../../lib/model/transformer.js';
import type { Task } from '../../lib/core/types.js';
import type { RolloutWorkerInput } from '../../lib/engine/worker.js';
import { loadRollout } from '../../pipelines/parts/data.js';
import { mergeScripts, scriptedWeights, writeAt } from '../helpers/scripted.js';
import { lacks } from '../helpers/testSetup.js';

const root = fileURLToPath(new URL('../../', import.meta.url));
const pythonAgent = `python3 ${JSON.stringify(join(root, 'examples', 'python', 'calculator_agent.py'))}`;
const tokenizer = new CharTokenizer();
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 32, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 32 };
const task: Task = { id: 'calc/2+3', prompt: '2+3', answer: '5' };
let model: PolicyModel;
let engine: LocalEngine;
let dir: string;
const workers: GatewayWorker[] = [];

/**
 * Starts five detached descendants, each appending its pid to `$PIDS`: a background job, a `nohup` one, one that
 * leaves the process group and session (`setsid`), one double-forked into its own session (orphaned at once, so
 * no parent link leads to it), and one in its own session that ignores SIGTERM (only SIGKILL ends it).
 */
const DETACH = [
  'sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  'nohup sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  'setsid sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  '( setsid sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS" )',
  `setsid sh -c 'trap "" TERM; echo $$ >> "$PIDS"; exec sleep 300' >/dev/null 2>&1 &`,
  // The agent goes on once all five are started and have written their pids (they do so asynchronously).
  'while [ "$(wc -l < "$PIDS")" -lt 5 ]; do sleep 0.01; done',
].join('\n');
const DETACHED = 5;

function input(id = 'calc/2+3@0/0'): RolloutWorkerInput {
  return { engine, task, id, groupId: 'calc/2+3@0', runId: 0, modelTag: 'policy', seed: 5, maxTokens: 12, temperature: 1, topP: 1 };
}

function worker(program: AgentCommand): GatewayWorker {
  const w = gatewayWorker(program, { maxModelLen: config.maxSeqLen, killGraceMs: 300 });
  workers.push(w);
  return w;
}

/** An agent command: `body` (a shell script in the spec's directory), run with `$PIDS` naming `pids`. */
async function agent(name: string, body: string, env: Record<string, string> = {}): Promise<AgentCommand & { pids: string }> {
  const script = join(dir, `${name}.sh`);
  await writeFile(script, `${body}\n`);
  const pids = join(dir, `${name}.pids`);
  return { command: `sh ${JSON.stringify(script)}`, env: { PIDS: pids, ...env }, pids };
}

function pidsIn(file: string): number[] {
  if (!existsSync(file)) return [];
  return readFileSync(file, 'utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map(Number);
}

/** Resolves once `file` lists `count` pids (the agent has started its descendants); fails after 30 s. */
async function started(file: string, count: number): Promise<number[]> {
  for (let i = 0; i < 600; i++) {
    const pids = pidsIn(file);
    if (pids.length >= count) return pids;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`the agent did not start ${count} processes (${file})`);
}

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  // bos 2 + 3 eos | c a l c ( 2 + 3 ) eos | 5 eos | 5 eos: calls the tool, reads 5, answers 5
  model = PolicyModel.fromWeights(config, scriptedWeights(config, tokenizer, mergeScripts(writeAt(5, 'calc(2+3)'), writeAt(17, '5'))));
  engine = new LocalEngine(model, { tokenizer });
  dir = await mkdtemp(join(tmpdir(), 'rxrl-agent-processes-'));
});

afterAll(async () => {
  await Promise.all(workers.map((w) => w.close()));
  model.dispose();
  await rm(dir, { recursive: true, force: true });
});

describe.skipIf(lacks('python'))('gatewayWorker: every process an agent command starts ends with its sample', () => {
  it('an agent that succeeds: its background, nohup, setsid, double-forked and TERM-ignoring descendants all end', async () => {
    const program = await agent('succeeds', `${DETACH}\nexec ${pythonAgent}`);
    const sample = await worker(program)(input(), new AbortController().signal);
    expect(sample.response).toBe('5');
    expect(sample.metrics?.['agent/leftover_processes']).toBe(DETACHED);
    const pids = pidsIn(program.pids);
    expect(pids).toHaveLength(DETACHED);
    expect(pids.filter(isRunning)).toEqual([]);
  });

  it('an agent that fails (exit 3) and one cancelled while running (a sample timeout) leave no descendant', async () => {
    const failing = await agent('fails', `${DETACH}\necho "tool server down" >&2\nexit 3`);
    await expect(worker(failing)(input(), new AbortController().signal)).rejects.toBeInstanceOf(AgentError);
    expect(pidsIn(failing.pids)).toHaveLength(DETACHED);
    expect(pidsIn(failing.pids).filter(isRunning)).toEqual([]);

    const hung = await agent('hangs', `${DETACH}\nsleep 300`);
    const controller = new AbortController();
    const sample = worker(hung)(input(), controller.signal);
    const pids = await started(hung.pids, DETACHED);
    expect(pids.filter(isRunning)).toEqual(pids);
    controller.abort(new Error('sample timed out'));
    await expect(sample).rejects.toThrow(/timed out/);
    expect(pids.filter(isRunning)).toEqual([]);
  });

  it('the run ending (close) stops a running agent and all its descendants; the sample fails with an AgentError', async () => {
    const hung = await agent('run-ends', `${DETACH}\nsleep 300`);
    const w = gatewayWorker(hung, { maxModelLen: config.maxSeqLen, killGraceMs: 300 });
    const sample = w(input(), new AbortController().signal);
    const pids = await started(hung.pids, DETACHED);
    await w.close();
    await expect(sample).rejects.toBeInstanceOf(AgentError);
    expect(pids.filter(isRunning)).toEqual([]);
  });

  it('a descendant that keeps the agent’s stdout open neither holds the sample nor outlives it', async () => {
    const program = await agent('holds-stdout', `sleep 300 & echo $! >> "$PIDS"\nexec ${pythonAgent}`);
    const sample = await worker(program)(input(), new AbortController().signal);
    expect(sample.response).toBe('5');
    expect(pidsIn(program.pids).filter(isRunning)).toEqual([]);
  });

  it('ending one sample spares a concurrent sample’s processes; they end with their own sample', async () => {
    const go = join(dir, 'go');
    const slow = await agent(
      'slow',
      `sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"\nwhile [ ! -e ${JSON.stringify(go)} ]; do sleep 0.05; done\nexec ${pythonAgent}`,
    );
    const fast = await agent('fast', `${DETACH}\nexec ${pythonAgent}`);
    const w = worker(slow);
    const slowSample = w(input('calc/2+3@0/1'), new AbortController().signal);
    const [slowPid] = await started(slow.pids, 1);
    await worker(fast)(input('calc/2+3@0/2'), new AbortController().signal);
    expect(pidsIn(fast.pids).filter(isRunning)).toEqual([]);
    expect(isRunning(slowPid)).toBe(true);
    await writeFile(go, '');
    expect((await slowSample).response).toBe('5');
    expect(isRunning(slowPid)).toBe(false);
  });
});

describe.skipIf(lacks('python'))('gatewayWorker: the agent’s environment', () => {
  const SHELL_ADDED = ['PWD', 'OLDPWD', 'SHLVL', '_'];

  async function environmentOf(name: string, inheritEnv: boolean | undefined): Promise<Map<string, string>> {
    const out = join(dir, `${name}.env`);
    const program = await agent(name, `env > ${JSON.stringify(out)}\nexec ${pythonAgent}`, { AGENT_SETTING: 'from the recipe' });
    await worker({ ...program, ...(inheritEnv === undefined ? {} : { inheritEnv }) })(input(), new AbortController().signal);
    const lines = readFileSync(out, 'utf8')
      .split('\n')
      .filter((l) => l.includes('='));
    return new Map(lines.map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)]));
  }

  it('is the OPENAI_* and RXRL_TASK variables, the recipe’s env and what a process needs (PATH, HOME…): no trainer secret', async () => {
    process.env.RXRL_TEST_SECRET = 'hunter2';
    try {
      const env = await environmentOf('plain', undefined);
      expect(env.has('RXRL_TEST_SECRET')).toBe(false);
      expect([...env.values()].some((v) => v.includes('hunter2'))).toBe(false);
      expect(env.get('AGENT_SETTING')).toBe('from the recipe');
      expect(JSON.parse(env.get('RXRL_TASK') ?? '')).toEqual(task);
      expect(env.get('OPENAI_BASE_URL')).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/sessions\/[^/]+\/v1$/);
      expect(env.get('OPENAI_API_KEY')).toMatch(/^[0-9a-f]{32}$/);
      expect(env.get('PATH')).toBe(process.env.PATH);
      const allowed = new Set([
        ...['OPENAI_BASE_URL', 'OPENAI_API_KEY', 'OPENAI_MODEL', 'RXRL_TASK', 'RXRL_AGENT_SAMPLE', 'AGENT_SETTING', 'PIDS'],
        ...['PATH', 'HOME', 'USER', 'LOGNAME', 'SHELL', 'LANG', 'LANGUAGE', 'TZ', 'TERM', 'TMPDIR', 'TMP', 'TEMP'],
        ...SHELL_ADDED,
      ]);
      expect([...env.keys()].filter((k) => !allowed.has(k) && !k.startsWith('LC_'))).toEqual([]);
    } finally {
      delete process.env.RXRL_TEST_SECRET;
    }
  });

  it('inheritEnv: true passes the whole parent environment (the recipe’s env and the OPENAI_* variables still win)', async () => {
    process.env.RXRL_TEST_SECRET = 'hunter2';
    process.env.AGENT_SETTING = 'from the parent';
    try {
      const env = await environmentOf('inherits', true);
      expect(env.get('RXRL_TEST_SECRET')).toBe('hunter2');
      expect(env.get('AGENT_SETTING')).toBe('from the recipe');
      expect(env.get('OPENAI_BASE_URL')).toMatch(/\/sessions\/[^/]+\/v1$/);
    } finally {
      delete process.env.RXRL_TEST_SECRET;
      delete process.env.AGENT_SETTING;
    }
  });

  it('a recipe’s rollout.agent.inheritEnv reaches the agent: the secret only with inheritEnv true', async () => {
    const out = join(dir, 'recipe.env');
    const script = join(dir, 'recipe.sh');
    await writeFile(script, `env > ${JSON.stringify(out)}\nexec ${pythonAgent}\n`);
    process.env.RXRL_TEST_SECRET = 'hunter2';
    try {
      const seen: boolean[] = [];
      for (const inheritEnv of [false, true]) {
        const recipe = loadConfig({
          env: {},
          values: {
            data: { source: 'calculator' },
            model: { maxSeqLen: config.maxSeqLen },
            rollout: { agent: { command: `sh ${JSON.stringify(script)}`, inheritEnv } },
          },
        });
        const { worker: w } = await loadRollout(recipe, dir);
        workers.push(w as GatewayWorker);
        await w!(input(), new AbortController().signal);
        seen.push(readFileSync(out, 'utf8').includes('RXRL_TEST_SECRET=hunter2'));
      }
      expect(seen).toEqual([false, true]);
    } finally {
      delete process.env.RXRL_TEST_SECRET;
    }
  });
});
