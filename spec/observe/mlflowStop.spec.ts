/**
 * SIGTERM to a real `rxrl run` (the built CLI) whose MLflow server takes the run's start but never answers a
 * metrics `log-batch`: the run ends within seconds of the signal (not after the tracker's 300 s deadline), keeping
 * its last checkpoint.
 */
import { createServer, type Server } from 'node:http';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { afterEach, describe, expect, it } from 'vitest';

import { checkpointWritten, expectHandledStop, intactCheckpoint, stopWhenBlocked } from '../helpers/stopRun.js';

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

/** A tracking server that opens runs but never answers a metrics log-batch; resolves `hung` on the first one. */
async function hangingServer(): Promise<{ url: string; hung: Promise<void> }> {
  let hang: () => void = () => undefined;
  const hung = new Promise<void>((resolve) => (hang = resolve));
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => chunks.push(chunk));
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const route = (req.url ?? '').replace(/^.*\/api\/2\.0\/mlflow\//, '').split('?')[0];
      res.setHeader('content-type', 'application/json');
      if (route === 'experiments/get-by-name') res.end(JSON.stringify({ experiment: { experiment_id: '1' } }));
      else if (route === 'runs/create') res.end(JSON.stringify({ run: { info: { run_id: 'r1' } } }));
      else if (route === 'runs/log-batch' && body.includes('"metrics"')) hang();
      else if (route === 'runs/update' && body.includes('"end_time"'))
        return; // the end: never answered either
      else res.end('{}');
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}`, hung };
}

describe('rxrl run with an MLflow server that never answers', () => {
  it('exits on SIGTERM within seconds, with its last checkpoint intact', async () => {
    const server = await hangingServer();
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-mlflow-stop-'));
    const runDir = join(dir, 'run');
    const recipe = join(dir, 'recipe.json');
    writeFileSync(
      recipe,
      JSON.stringify({
        run: { dir: runDir, seed: 3, steps: 100_000, backend: 'cpu' },
        data: { source: 'bundled', task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 12 },
        rollout: { groupSize: 2 },
        sync: { mode: 'sync', batchSize: 2 },
        checkpoint: { every: 1, keepLast: 2 },
        validation: { beforeTrain: false },
        logging: { mlflow: { trackingUri: server.url, timeoutSeconds: 300 } },
      }),
    );
    const stopped = await stopWhenBlocked({
      args: ['run', recipe],
      what: 'MLflow log-batch held (deadline 300 s)',
      env: { RXRL_LOG_LEVEL: 'warn' },
      blocked: () => Promise.all([server.hung, checkpointWritten(runDir)]),
    });
    expectHandledStop(stopped);
    expect(stopped.code).toBe(0);
    await intactCheckpoint(runDir);
  }, 240_000);
});
