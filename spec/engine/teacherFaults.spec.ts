/**
 * A distillation teacher on a server that answers what no model would (issue 53, rows 5 and 7): log-probs above 0
 * (+50, +1e15), beyond float32 (1e30, ±1e300, 1e400), or never answering. Each is a real node `http` server on
 * loopback, spoken to by the real teacher client (`openaiScorer`) and by real distillation runs.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { mkdtemp, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { afterEach, beforeAll, describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { EngineError, RetriesExhaustedError, StepFailedError } from '../../lib/core/errors.js';
import { collate } from '../../lib/data/collate.js';
import { openaiScorer, TEACHER_LOGPROB_TOLERANCE } from '../../lib/engine/teacher.js';
import { initBackend } from '../../lib/model/backend.js';
import { loadTokenizer } from '../../lib/model/hfTokenizer.js';
import type { Tokenizer } from '../../lib/model/types.js';
import { runTraining } from '../../pipelines/run.js';
import { traj } from '../helpers/fixtures.js';
import { checkpointWritten, expectHandledStop, intactCheckpoint, stopWhenBlocked } from '../helpers/stopRun.js';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const qwen = join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2');

/**
 * A teacher server: every `POST /v1/completions` is answered with `prompt_logprobs` giving each token (after the
 * first) the log-prob `value(requestIndex)` as JSON text (so `1e400` reaches the client as written), or, when that
 * is `undefined`, never answered.
 */
interface TeacherServer {
  readonly baseUrl: string;
  readonly requests: () => number;
  close(): Promise<void>;
}

const servers: Server[] = [];
afterEach(async () => {
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((resolve) => server.close(resolve));
  }
});

async function teacherServer(value: (request: number) => string | undefined): Promise<TeacherServer> {
  let requests = 0;
  const server = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = '';
    req.on('data', (chunk: Buffer) => (body += chunk.toString()));
    req.on('end', () => {
      const logprob = value(requests++);
      if (logprob === undefined) return; // never answers
      const { prompt } = JSON.parse(body) as { prompt: number[][] };
      const choices = prompt.map(
        (ids, index) =>
          `{"index":${index},"text":"","finish_reason":"length","prompt_logprobs":[null${ids
            .slice(1)
            .map((id) => `,{"${id}":{"logprob":${logprob}}}`)
            .join('')}]}`,
      );
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(`{"id":"x","object":"text_completion","created":0,"model":"teacher","choices":[${choices.join(',')}]}`);
    });
  });
  servers.push(server);
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  return { baseUrl: `http://127.0.0.1:${port}/v1`, requests: () => requests, close: async () => undefined };
}

let tokenizer: Tokenizer;
beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  tokenizer = await loadTokenizer(qwen);
});

/** One row: a 4-token prompt and a 3-token response (its tokens at positions 4, 5 and 6). */
function batch() {
  const row = traj('a@0', 0, { promptTokens: [1, 5, 9, 12], responseTokens: [40, 26, 2], logprobs: [-1, -1, -1], lossMask: [1, 1, 1] });
  return collate([row], { padId: tokenizer.padId, modelTag: 'policy' });
}

/** The tiny distillation recipe on the fixture, its teacher at `baseUrl`. */
function distillRun(dir: string, baseUrl: string, set: string[] = []) {
  return loadConfig({
    env: {},
    file: join(root, 'recipes', 'smollm2-distill.yaml'),
    set: [
      `model.path=${qwen}`,
      'distill.teacher.path=null',
      `distill.teacher.baseUrl=${baseUrl}`,
      'distill.teacher.model=teacher',
      'run.steps=2',
      `run.dir=${join(dir, 'run')}`,
      'run.backend=cpu',
      'validation.every=0',
      'validation.beforeTrain=false',
      'data.arithmetic.validationSize=4',
      'sync.batchSize=2',
      'rollout.groupSize=2',
      'rollout.maxTokens=4',
      ...set,
    ],
  });
}

describe('a teacher that answers what no model would', () => {
  it.each(['50', '1e15', '1e30', '1e300', '-1e300', '1e400', '-1e400'])(
    'log-prob %s: an EngineError naming the token position and the value, not retried',
    async (value) => {
      const server = await teacherServer(() => value);
      const scorer = openaiScorer({ baseUrl: server.baseUrl, model: 'teacher', tokenizer });
      const error = await scorer.responseLogprobs(batch()).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(EngineError);
      expect((error as EngineError).retriable).toBe(false);
      // The first response token is the row's fifth (position 4).
      expect((error as EngineError).context).toMatchObject({ position: 4, answer: 0, logprob: Number(value) });
      expect((error as EngineError).message).toMatch(/token 4 of answer 0 is /);
      expect(server.requests()).toBe(1);
    },
  );

  it(`a float32 rounding above 0 (up to ${TEACHER_LOGPROB_TOLERANCE}) is read as 0; a real log-prob as it is`, async () => {
    for (const [value, read] of [
      ['1e-7', 0],
      ['-0.5', -0.5],
    ] as const) {
      const server = await teacherServer(() => value);
      const scores = await openaiScorer({ baseUrl: server.baseUrl, model: 'teacher', tokenizer }).responseLogprobs(batch());
      expect([...scores]).toEqual([read, read, read]);
    }
  });

  it('a distillation run whose teacher answers +50 fails with that EngineError (it trained on it before)', async () => {
    const server = await teacherServer(() => '50');
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-teacher-positive-'));
    const steps: number[] = [];
    const error = await runTraining(distillRun(dir, server.baseUrl), {
      log: () => undefined,
      onStep: (step) => steps.push(step.step),
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(EngineError);
    expect((error as EngineError).context).toMatchObject({ logprob: 50 });
    expect(steps).toEqual([]);
  }, 120_000);

  it('under stop_on_error a run whose every update was skipped (teacher log-probs of −3e38) fails naming its steps; under continue it ends', async () => {
    // −3e38 is a finite float32 log-prob, but its advantages make every gradient non-finite: each update is skipped.
    const server = await teacherServer(() => '-3e38');
    const dir = await mkdtemp(join(tmpdir(), 'rxrl-teacher-skipped-'));
    const skipped: boolean[] = [];
    const onStep = (step: { skipped: boolean }): number => skipped.push(step.skipped);
    const error = await runTraining(distillRun(join(dir, 'stop'), server.baseUrl, ['run.errorPolicy=stop_on_error']), {
      log: () => undefined,
      onStep,
    }).catch((e: unknown) => e);
    expect(skipped).toEqual([true, true]);
    expect(error).toBeInstanceOf(StepFailedError);
    expect((error as StepFailedError).context).toMatchObject({ steps: 2, skipped: 2 });
    const summary = await runTraining(distillRun(join(dir, 'continue'), server.baseUrl, ['run.errorPolicy=continue']), {
      log: () => undefined,
    });
    expect(summary.steps).toBe(2);
    expect(summary.lastStep['actor/skipped_nonfinite']).toBe(1);
  }, 120_000);

  it('a teacher that never answers fails the call at distill.teacher.timeoutMs, retries included', async () => {
    const server = await teacherServer(() => undefined);
    const config = distillRun('/unused', server.baseUrl, ['distill.teacher.timeoutMs=300']);
    const scorer = openaiScorer({ baseUrl: server.baseUrl, model: 'teacher', tokenizer, timeoutMs: config.distill.teacher.timeoutMs });
    const error = await scorer.responseLogprobs(batch()).catch((e: unknown) => e);
    // One attempt used the whole deadline: no retry was started past it (before: 1 + 3 attempts of 120 s each).
    expect(error).toBeInstanceOf(RetriesExhaustedError);
    expect((error as RetriesExhaustedError).cause).toBeInstanceOf(EngineError);
    expect(server.requests()).toBe(1);
  });

  it("SIGTERM while the teacher never answers (the second step): rxrl run exits, keeping the first step's checkpoint", async () => {
    // The first scoring is answered (the first step trains and is checkpointed); the second is held.
    let onHeld: () => void = () => undefined;
    const held = new Promise<void>((resolve) => (onHeld = resolve));
    const server = await teacherServer((request) => {
      if (request === 0) return '-1';
      onHeld();
      return undefined;
    });
    const work = await mkdtemp(join(tmpdir(), 'rxrl-teacher-hold-'));
    const file = join(work, 'recipe.json');
    const config = distillRun(work, server.baseUrl, ['run.steps=5', 'checkpoint.every=1', 'checkpoint.keepLast=0']);
    // The teacher's own deadline is long (300 s): only the signal can end the wait.
    await writeFile(
      file,
      JSON.stringify({ ...config, distill: { ...config.distill, teacher: { ...config.distill.teacher, timeoutMs: 300_000 } } }),
    );
    const stopped = await stopWhenBlocked({
      args: ['run', file],
      what: 'teacher held',
      env: { RXRL_LOG_LEVEL: 'silent' },
      // Blocked on the second scoring, with the first step's checkpoint written (its save may still be running when
      // the second scoring starts).
      blocked: () => Promise.all([held, checkpointWritten(join(work, 'run'))]),
      exitBoundMs: 60_000,
    });
    expectHandledStop(stopped);
    expect(await intactCheckpoint(join(work, 'run'))).toMatch(/global_step_1$/);
  }, 180_000);
});
