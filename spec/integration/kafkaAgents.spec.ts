/**
 * A multi-agent run over the real broker, both halves in this process: `runAgents` with a Kafka transport (the
 * trainer of `rxrl trainer`) and `runWorker` of the same recipe (`rxrl worker`), which plays the episodes with one
 * engine per policy, each following its policy's weights on the weights topic.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadConfig } from '../../lib/config/schema.js';
import { ensureTopics } from '../../lib/kafka/client.js';
import type { KafkaEvent } from '../../lib/kafka/types.js';
import { kafkaTopics } from '../../lib/kafka/types.js';
import { runAgents } from '../../pipelines/agents.js';
import { runWorker } from '../../pipelines/run.js';
import { kafkaClient, uniqueName } from '../kafka/helpers.js';

describe('multi-agent runs over Kafka (rxrl trainer + rxrl worker)', () => {
  it('L3: two full policies train from episodes played by a worker; each policy\'s weights go out under its name', async () => {
    const kafka = kafkaClient('rxrl-agents-spec');
    const topics = kafkaTopics(uniqueName('agents'));
    await ensureTopics(kafka, topics, { tasks: 2, trajectories: 2 });
    const config = loadConfig({
      env: {},
      values: {
        run: { dir: null, seed: 1, steps: 2, backend: 'auto' },
        data: { task: { validationSize: 10 } },
        sync: { mode: 'batch-async', batchSize: 2 },
        rollout: { groupSize: 2 },
        kafka: { workerConcurrency: 2 },
        agents: { environment: 'writer-editor', roles: [{ name: 'writer', policy: 'writer' }, { name: 'editor', policy: 'editor' }] },
        policies: [{ name: 'writer', specialization: 'full' }, { name: 'editor', specialization: 'full' }],
        checkpoint: { every: 0, onStop: false },
        resume: { mode: 'disable' },
      },
    });
    const events: KafkaEvent[] = [];
    const controller = new AbortController();
    const worker = runWorker(config, { kafka, topics, workerId: uniqueName('w'), signal: controller.signal });
    const summary = await runAgents(config, {
      kafka: { kafka, topics, weightsDir: mkdtempSync(join(tmpdir(), 'rxrl-agents-weights-')), onEvent: (e) => events.push(e) },
    });
    const done = await worker;
    expect(summary.policies.map((p) => [p.name, p.steps])).toEqual([['writer', 2], ['editor', 2]]);
    // Versions 0, 1, 2 of each policy were announced under its own name.
    const published = events.filter((e) => e.type === 'trainer.published').map((e) => `${String(e.payload.modelTag)}:${String(e.payload.version)}`);
    expect(published.sort()).toEqual(['editor:0', 'editor:1', 'editor:2', 'writer:0', 'writer:1', 'writer:2']);
    // Every step trained its own policy's slots: the writer's turn-0 groups, the editor's turn-1 groups.
    const trained = events.filter((e) => e.type === 'trainer.trained');
    for (const e of trained) {
      const suffix = e.payload.modelTag === 'writer' ? '/writer/0' : '/editor/1';
      expect((e.payload.groupIds as string[]).every((id) => id.endsWith(suffix))).toBe(true);
    }
    // The worker played 2 steps × 2 tasks (plus at most the next admission batch) × 2 episodes, 2 slots each.
    expect(done.tasks).toBeGreaterThanOrEqual(4);
    expect(done.trajectories).toBe(done.tasks * 2 * 2 - done.failures);
    expect(summary.valFinal['val/episodes']).toBe(10);
  }, 180_000);
});
