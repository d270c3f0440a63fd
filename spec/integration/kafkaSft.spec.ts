/**
 * Supervised fine-tuning over the real broker: `runTraining` with a Kafka transport (`rxrl trainer`) and `runWorker`
 * of the same recipe (`rxrl worker`). From a dataset, the worker writes each task's reference output, which crossed
 * the task topic with it; from rollouts, the trainer keeps only the samples that reached `sft.minReward`. On-policy
 * distillation over the broker asks its teacher about every trajectory the workers wrote, as an embedded run does.
 */
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ensureTopics } from '../../lib/kafka/client.js';
import { kafkaTopics } from '../../lib/kafka/types.js';
import { runTraining, runWorker } from '../../pipelines/run.js';
import { kafkaClient, uniqueName } from '../kafka/helpers.js';

describe('trainer.algorithm sft over Kafka (rxrl trainer + rxrl worker)', () => {
  it.each([
    { source: 'dataset', groupSize: 1 },
    { source: 'rollouts', groupSize: 2 },
  ])(
    'sft.source $source: the worker samples, the trainer imitates',
    async ({ source, groupSize }) => {
      const kafka = kafkaClient('rxrl-sft-spec');
      const topics = kafkaTopics(uniqueName(`sft-${source}`));
      await ensureTopics(kafka, topics, { tasks: 2, trajectories: 2 });
      const dir = mkdtempSync(join(tmpdir(), 'rxrl-sft-kafka-'));
      const config = loadConfig({
        env: {},
        values: {
          run: { dir: join(dir, 'run'), seed: 1, steps: 3, backend: 'cpu' },
          data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
          model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
          sync: { mode: 'batch-async', batchSize: 2 },
          rollout: { groupSize },
          trainer: { algorithm: 'sft', learningRate: 0.01 },
          sft: { source, minReward: 0 },
          kafka: { workerConcurrency: 2 },
          checkpoint: { every: 0 },
        },
      });
      const worker = runWorker(config, { kafka, topics, workerId: uniqueName('w') });
      const summary = await runTraining(config, { kafka: { kafka, topics, weightsDir: join(dir, 'run', 'weights') } });
      await worker;
      expect(summary.steps).toBe(3);
      // A server to roll out on has no place in a run over Kafka.
      const served = loadConfig({
        env: {},
        values: {
          ...config,
          run: { ...config.run, dir: join(dir, 'served') },
          openai: { ...config.openai, baseUrl: 'http://127.0.0.1:9/v1' },
        },
      });
      await expect(runTraining(served, { kafka: { kafka, topics, weightsDir: join(dir, 'w2') } })).rejects.toThrow(
        /openai\.baseUrl: a run over Kafka/,
      );
      const lines = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l) as Record<string, number>)
        .filter((m) => m['actor/sft_loss'] !== undefined);
      expect(lines).toHaveLength(3);
      // Every sample of the bundled task scores at least 0; a reference output scores 1 (it is the answer).
      for (const m of lines) expect(m['batch/rows']).toBe(2 * groupSize);
      // The batches were SFT's (advantage 1 on every kept row, `sft.minReward` applied), not GRPO's: a dataset group
      // of one would get advantage 0 there, and the cross-entropy weighted by it would train nothing.
      for (const m of lines) {
        expect(m['actor/sft_loss']).toBeGreaterThan(0);
        expect(Number.isFinite(m['actor/sft_loss'])).toBe(true);
        expect(m['batch/rows_filtered']).toBe(0);
      }
      if (source === 'dataset') for (const m of lines) expect(m['critic/score_mean']).toBe(1);
    },
    180_000,
  );

  it("trainer.algorithm distill: the trainer scores the workers' samples under its teacher", async () => {
    const kafka = kafkaClient('rxrl-distill-spec');
    const topics = kafkaTopics(uniqueName('distill'));
    await ensureTopics(kafka, topics, { tasks: 2, trajectories: 2 });
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-distill-kafka-'));
    const values = {
      run: { dir: join(dir, 'teacher'), seed: 1, steps: 1, backend: 'cpu' },
      data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 2 } },
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
      sync: { mode: 'batch-async', batchSize: 2 },
      rollout: { groupSize: 1 },
      trainer: { algorithm: 'sft', learningRate: 0.05 },
      validation: { beforeTrain: false, every: 0 },
      checkpoint: { every: 1 },
    };
    // The teacher: one embedded SFT step of the same model on the references (same tokenizer, other weights).
    await runTraining(loadConfig({ env: {}, values }), { log: () => undefined });
    const config = loadConfig({
      env: {},
      values: {
        ...values,
        run: { ...values.run, dir: join(dir, 'run'), steps: 2 },
        rollout: { groupSize: 2 },
        trainer: { algorithm: 'distill', learningRate: 0.01 },
        distill: { teacher: { path: join(dir, 'teacher', 'global_step_1') } },
        kafka: { workerConcurrency: 2 },
        checkpoint: { every: 0 },
      },
    });
    const worker = runWorker(config, { kafka, topics, workerId: uniqueName('w') });
    const summary = await runTraining(config, { kafka: { kafka, topics, weightsDir: join(dir, 'run', 'weights') }, log: () => undefined });
    await worker;
    expect(summary.steps).toBe(2);
    const lines = readFileSync(join(dir, 'run', 'metrics.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, number>)
      .filter((m) => m['actor/pg_loss'] !== undefined);
    expect(lines).toHaveLength(2);
    // Every step's batch was distillPrepare's: each sampled token scored by the teacher (a log-prob < 0).
    for (const m of lines) {
      expect(m['batch/rows']).toBe(4);
      expect(m['distill/teacher_logprob_mean']).toBeLessThan(0);
      expect(Number.isFinite(m['distill/reverse_kl'])).toBe(true);
    }
  }, 180_000);
});
