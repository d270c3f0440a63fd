/**
 * Processes that outlive their agent's sample (issue 31, row 14): `--samples` samples of a command agent through
 * {@link gatewayWorker}, each a shell script that starts `--detach` detached `sleep 300`s (a background job, a
 * `nohup` one, one that left its session with `setsid`, one double-forked into a session of its own; round robin)
 * and then execs the Python calculator agent (PyPI `openai`: run with a `python3` that has it on PATH, e.g.
 * `PATH=/work/pyvenv/bin:$PATH`). After every sample has ended, counts the `sleep`s still running (not zombies),
 * prints one JSON line, and kills those survivors by pid.
 *
 * Usage: `npm run bench -- agentProcesses [--samples 16] [--detach 4] [--concurrency 4] [--backend cpu]`.
 * The defaults are the audit's shape: 64 detached `sleep`s across 16 samples.
 *
 * @packageDocumentation
 */
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { gatewayWorker } from '../lib/agent/gateway.js';
import { isRunning } from '../lib/agent/processTree.js';
import { LocalEngine } from '../lib/engine/local.js';
import { initBackend, type BackendName } from '../lib/model/backend.js';
import { CharTokenizer } from '../lib/model/tokenizer.js';
import { PolicyModel } from '../lib/model/transformer.js';

function flag(args: readonly string[], name: string, fallback: string): string {
  const at = args.indexOf(`--${name}`);
  return at >= 0 && args[at + 1] !== undefined ? args[at + 1] : fallback;
}

/** Ways a descendant detaches; each appends its pid to `$PIDS`. */
const DETACH = [
  'sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  'nohup sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  'setsid sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS"',
  '( setsid sleep 300 >/dev/null 2>&1 & echo $! >> "$PIDS" )',
];

/** Runs the benchmark. */
export async function main(args: readonly string[]): Promise<void> {
  const samples = Number(flag(args, 'samples', '16'));
  const detach = Number(flag(args, 'detach', '4'));
  const concurrency = Number(flag(args, 'concurrency', '4'));
  await initBackend(flag(args, 'backend', 'cpu') as BackendName, { logger: { info: () => undefined } });
  const tokenizer = new CharTokenizer();
  const config = { vocabSize: tokenizer.vocabSize, dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 64 };
  const model = PolicyModel.create(config, 1);
  const engine = new LocalEngine(model, { tokenizer });
  const dir = await mkdtemp(join(tmpdir(), 'rxrl-bench-agent-processes-'));
  const agent = fileURLToPath(new URL('../../examples/python/calculator_agent.py', import.meta.url));
  const script = join(dir, 'agent.sh');
  await writeFile(
    script,
    `${Array.from({ length: detach }, (_, i) => DETACH[i % DETACH.length]).join('\n')}\nexec python3 ${JSON.stringify(agent)}\n`,
  );
  const pids = join(dir, 'pids');
  const worker = gatewayWorker({ command: `sh ${JSON.stringify(script)}`, env: { PIDS: pids } }, { maxModelLen: config.maxSeqLen });
  const started = performance.now();
  let failed = 0;
  try {
    let next = 0;
    const lane = async (): Promise<void> => {
      for (let i = next++; i < samples; i = next++) {
        const task = { id: `calc/${i}`, prompt: `${i % 10}+1`, answer: String((i % 10) + 1) };
        const input = {
          engine,
          task,
          id: `calc/${i}@0/0`,
          groupId: `calc/${i}@0`,
          runId: 0,
          modelTag: 'policy',
          seed: i,
          maxTokens: 8,
          temperature: 1,
          topP: 1,
        };
        await worker(input, new AbortController().signal).catch(() => failed++);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, lane));
    const wallMs = performance.now() - started;
    const all = existsSync(pids)
      ? readFileSync(pids, 'utf8')
          .split('\n')
          .filter((l) => l !== '')
          .map(Number)
      : [];
    const surviving = all.filter(isRunning);
    process.stdout.write(
      `${JSON.stringify({ bench: 'agent-processes', samples, failedSamples: failed, detached: all.length, surviving: surviving.length, wallMs: Math.round(wallMs) })}\n`,
    );
    for (const pid of surviving) process.kill(pid, 'SIGKILL');
  } finally {
    await worker.close();
    model.dispose();
    await rm(dir, { recursive: true, force: true });
  }
}
