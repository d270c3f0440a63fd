/**
 * A multi-agent run over the real broker, both halves in this process: `runAgents` with a Kafka transport (the
 * trainer of `rxrl trainer`) and `runWorker` of the same recipe (`rxrl worker`), which plays the episodes with one
 * engine per policy, each following its policy's weights on the weights topic.
 */
import { mkdtempSync, readFileSync, readdirSync, statSync } from 'node:fs';
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

interface Level {
  readonly policies: readonly Record<string, unknown>[];
}

/** Trainer and one worker of the writer–editor recipe over a fresh set of topics. */
async function deploy(level: Level, weightsDir = mkdtempSync(join(tmpdir(), 'rxrl-agents-weights-'))) {
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
      agents: {
        environment: 'writer-editor',
        roles: [
          { name: 'writer', policy: 'writer' },
          { name: 'editor', policy: 'editor' },
        ],
      },
      policies: level.policies,
      checkpoint: { every: 0, onStop: false },
      resume: { mode: 'disable' },
    },
  });
  const events: KafkaEvent[] = [];
  const worker = runWorker(config, { kafka, topics, workerId: uniqueName('w') });
  const summary = await runAgents(config, { kafka: { kafka, topics, weightsDir, onEvent: (e) => events.push(e) } });
  return { summary, events, worker: await worker, weightsDir };
}

describe('multi-agent runs over Kafka (rxrl trainer + rxrl worker)', () => {
  it('L2: each LoRA policy goes out as a PEFT directory of its adapter alone, over one base written once', async () => {
    const lora = { rank: 4, alpha: 8, targetModules: ['q_proj', 'v_proj'] };
    const { summary, events, worker } = await deploy({
      policies: ['writer', 'editor'].map((name) => ({ name, specialization: 'lora', lora })),
    });
    expect(summary.policies.map((p) => [p.name, p.steps])).toEqual([
      ['writer', 2],
      ['editor', 2],
    ]);
    const published = events.filter((e) => e.type === 'trainer.published' && e.payload.path !== undefined);
    expect(published).toHaveLength(4);
    for (const e of published) {
      const dir = String(e.payload.path);
      expect(readdirSync(dir).sort()).toEqual(['adapter_config.json', 'adapter_model.safetensors']);
      // 2 layers × (q: 4·(64+64) + v: 4·(64+64)) float32 values, plus the header.
      expect(statSync(join(dir, 'adapter_model.safetensors')).size).toBeLessThan(2 * 2 * 4 * 128 * 4 + 2000);
      const base = (JSON.parse(readFileSync(join(dir, 'adapter_config.json'), 'utf8')) as { base_model_name_or_path: string })
        .base_model_name_or_path;
      expect(readdirSync(base)).toContain('model.safetensors');
    }
    expect(
      new Set(
        published.map(
          (e) =>
            (JSON.parse(readFileSync(join(String(e.payload.path), 'adapter_config.json'), 'utf8')) as { base_model_name_or_path: string })
              .base_model_name_or_path,
        ),
      ).size,
    ).toBe(1);
    expect(worker.tasks).toBeGreaterThanOrEqual(4);
    expect(worker.trajectories).toBe(worker.tasks * 2 * 2 - worker.failures);
  }, 180_000);

  it("L3: two full policies train from episodes played by a worker; each policy's weights go out under its name", async () => {
    const {
      summary,
      events,
      worker: done,
    } = await deploy({ policies: ['writer', 'editor'].map((name) => ({ name, specialization: 'full' })) });
    expect(summary.policies.map((p) => [p.name, p.steps])).toEqual([
      ['writer', 2],
      ['editor', 2],
    ]);
    // Versions 0, 1, 2 of each policy were announced under its own name.
    const published = events
      .filter((e) => e.type === 'trainer.published')
      .map((e) => `${String(e.payload.modelTag)}:${String(e.payload.version)}`);
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
