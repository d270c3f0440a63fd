import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { describe, expect, it } from 'vitest';

import { runEmbedded } from '../../pipelines/embedded.js';
import { runServed } from '../../pipelines/served.js';

const cli = join(dirname(fileURLToPath(import.meta.url)), '..', '..', 'dist', 'cli', 'main.js');

describe('GRPO through OpenAIEngine and a spawned rxrl serve (built CLI)', () => {
  it('trains like the in-process engine: same seeds, same step rewards, versions published to the server', async () => {
    const settings = {
      steps: 3,
      seed: 4,
      backend: 'cpu' as const,
      batchSize: 4,
      groupSize: 4,
      model: { dModel: 16, nLayers: 1, nHeads: 2, dFF: 32 },
      task: { validationSize: 20 },
    };
    const localRewards: number[] = [];
    const servedRewards: number[] = [];
    const local = await runEmbedded({ ...settings, onStep: (s) => localRewards.push(s.metrics['rollout/reward_mean']) });
    const served = await runServed({ ...settings, cliPath: cli, onStep: (s) => servedRewards.push(s.metrics['rollout/reward_mean']) });
    expect(served).toMatchObject({ steps: 3, engine: 'openai', spawnedServer: true });
    expect(served.engineStats).toMatchObject({ failures: 0, retries: 0, weightLoads: 3 });
    expect(served.engineStats.calls).toBe(2 * 20 + 3 * 16 + 3);
    expect(served.lastStep['rollout/staleness_max']).toBe(0);
    servedRewards.forEach((r, i) => expect(r).toBeCloseTo(localRewards[i], 5));
    expect(served.valRewardInitial).toBeCloseTo(local.valRewardInitial, 5);
    expect(local.valRewardFinal).not.toBeNull();
    expect(served.valRewardFinal).toBeCloseTo(local.valRewardFinal!, 5);
  }, 120_000);
});
