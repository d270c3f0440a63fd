/**
 * A single-agent recipe whose policy is a LoRA adapter, over the real broker: `runTraining` with a Kafka transport
 * (`rxrl trainer`) and `runWorker` of the same recipe (`rxrl worker`), which samples through the adapter it follows
 * on the weights topic.
 */
import { mkdtempSync, readFileSync, readdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

import { loadConfig } from '../../lib/config/schema.js';
import { ensureTopics } from '../../lib/kafka/client.js';
import type { KafkaEvent } from '../../lib/kafka/types.js';
import { kafkaTopics } from '../../lib/kafka/types.js';
import { runTraining, runWorker } from '../../pipelines/run.js';
import { kafkaClient, uniqueName } from '../kafka/helpers.js';

describe('a single-agent LoRA policy over Kafka (rxrl trainer + rxrl worker)', () => {
  it('ships each version as a PEFT directory of the adapter alone over one base, and trains from the worker', async () => {
    const kafka = kafkaClient('rxrl-single-lora-spec');
    const topics = kafkaTopics(uniqueName('single-lora'));
    await ensureTopics(kafka, topics, { tasks: 2, trajectories: 2 });
    const dir = mkdtempSync(join(tmpdir(), 'rxrl-single-lora-kafka-'));
    const config = loadConfig({
      env: {},
      values: {
        run: { dir: join(dir, 'run'), seed: 1, steps: 3, backend: 'cpu' },
        data: { task: { transform: 'reverse', alphabet: 'abc', minLength: 2, maxLength: 3, validationSize: 6 } },
        model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32, maxSeqLen: 16 },
        sync: { mode: 'batch-async', batchSize: 2 },
        rollout: { groupSize: 2 },
        kafka: { workerConcurrency: 2 },
        checkpoint: { every: 1 },
        policies: [{ name: 'reverser', specialization: 'lora', lora: { rank: 2, alpha: 4, targetModules: ['q_proj', 'v_proj'] } }],
      },
    });
    const events: KafkaEvent[] = [];
    const worker = runWorker(config, { kafka, topics, workerId: uniqueName('w') });
    const summary = await runTraining(config, {
      kafka: { kafka, topics, weightsDir: join(dir, 'run', 'weights'), onEvent: (e) => events.push(e) },
    });
    const done = await worker;
    expect(summary.steps).toBe(3);
    const published = events
      .filter((e) => e.type === 'trainer.published' && e.payload.path !== undefined)
      .map((e) => String(e.payload.path));
    expect(published.length).toBeGreaterThanOrEqual(3);
    const bases = new Set<string>();
    for (const path of published) {
      expect(readdirSync(path).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
      bases.add(
        (JSON.parse(readFileSync(join(path, 'adapter_config.json'), 'utf8')) as { base_model_name_or_path: string })
          .base_model_name_or_path,
      );
    }
    expect(bases.size).toBe(1);
    expect(done.trajectories).toBeGreaterThanOrEqual(3 * 2 * 2);
    // Its checkpoints are PEFT adapters too, and trained.jsonl has each step once.
    expect(readdirSync(join(dir, 'run', 'global_step_3'))).toContain('adapter_model.safetensors');
    const steps = readFileSync(join(dir, 'run', 'trained.jsonl'), 'utf8')
      .trim()
      .split('\n')
      .map((l) => (JSON.parse(l) as { step: number }).step);
    expect(steps).toEqual([0, 1, 2]);
  }, 180_000);
});
