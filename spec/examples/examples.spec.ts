import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { describe, expect, inject, it } from 'vitest';

import { lacks } from '../helpers/testSetup.js';

const run = promisify(execFile);
const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const built = join(root, 'dist', 'examples');
const sources = readdirSync(join(root, 'examples')).filter((f) => f.endsWith('.ts'));

/**
 * Extra environment of the Kafka examples: the broker of this run (spec/kafka/globalSetup.ts), topics of their
 * own, small batches, and for the trainer one in-process worker so that it can finish alone.
 */
function kafkaEnv(source: string): NodeJS.ProcessEnv {
  if (!source.startsWith('kafka-')) return {};
  const brokers = inject('kafkaBrokers');
  if (!brokers) throw new Error('no Kafka broker for the Kafka examples (spec/kafka/globalSetup.ts)');
  return {
    KAFKA_BROKERS: brokers,
    RXRL_KAFKA_PREFIX: `examples-${randomBytes(4).toString('hex')}`,
    RXRL_WEIGHTS_DIR: mkdtempSync(join(tmpdir(), 'rxrl-weights-')),
    RXRL_BATCH_SIZE: '4',
    RXRL_GROUP_SIZE: '4',
    RXRL_KAFKA_WORKERS: source === 'kafka-trainer.ts' ? '1' : '0',
  };
}

/** Examples that need another process to finish: a rollout worker serves a trainer's run. */
const COMPANIONS: Readonly<Record<string, string>> = { 'kafka-rollout-worker.ts': 'kafka-trainer.ts' };

function lastJson(stdout: string): { steps?: number } {
  return JSON.parse(stdout.trim().split('\n').at(-1) ?? '') as { steps?: number };
}

/**
 * The examples' output convention: stdout is one JSON summary line naming the example; progress goes to stderr as
 * `step N/total · …` lines (a rollout worker, which takes no steps, says what it does there); TF.js prints no banner.
 */
function expectConvention(source: string, { stdout, stderr }: { stdout: string; stderr: string }): void {
  const lines = stdout.split('\n');
  expect(lines, stdout).toHaveLength(2);
  expect(lines[1]).toBe('');
  expect(JSON.parse(lines[0])).toMatchObject({ example: source.replace(/\.ts$/, ''), steps: 2 });
  if (source !== 'kafka-rollout-worker.ts') expect(stderr).toMatch(/^(\S+ )?step 2\/2 · [\d.]+ s\/it · /m);
  expect(stderr).not.toContain('looks like you are running TensorFlow.js');
}

/** Every example runs with node from the build (`npm test` builds first) with a tiny step budget. */
describe('examples (smoke, built by pretest)', () => {
  it('has examples to run', () => {
    expect(sources.length).toBeGreaterThan(0);
  });

  for (const source of sources) {
    // The Python agent example needs the PyPI openai that npm test installs; it skips only where it could not.
    it.skipIf(source === 'agent-python.ts' && lacks('python'))(
      `${source} runs to completion and ends with a JSON summary`,
      async () => {
        const file = join(built, source.replace(/\.ts$/, '.js'));
        // The Hugging Face example runs on the committed tiny Qwen2 fixture here, even where SmolLM2 has been built.
        const model = source === 'hf-chat-grpo.ts' ? { RXRL_MODEL_DIR: join(root, 'spec', 'fixtures', 'hf', 'tiny-qwen2') } : {};
        const env = { ...process.env, RXRL_STEPS: '2', ...model, ...kafkaEnv(source) };
        const companion = COMPANIONS[source];
        const partner = companion
          ? run(process.execPath, [join(built, companion.replace(/\.ts$/, '.js'))], { cwd: root, env, timeout: 120_000 })
          : undefined;
        const output = await run(process.execPath, [file], { cwd: root, env, timeout: 120_000 });
        expectConvention(source, output);
        if (partner) expect(lastJson((await partner).stdout).steps).toBe(2);
      },
      150_000,
    );
  }
});
