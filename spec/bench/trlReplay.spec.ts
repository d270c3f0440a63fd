/**
 * `bench trlReplay`'s refusals. Its replay itself (TRL's recorded steps through rxrl's trainer) is checked against
 * TRL's own three-step record in spec/train/trlParity.spec.ts; TRL's side needs torch, which tests do not install.
 */
import { describe, expect, it } from 'vitest';

import { main } from '../../bench/trlReplay.js';
import { ConfigError } from '../../lib/core/errors.js';

describe('bench trlReplay', () => {
  it.each([['--paired'], ['--only', 'rxrl'], ['--paired', '--sampling-seed', '2']])(
    'refuses bench trl flag %s with a ConfigError',
    async (...flags) => {
      await expect(main([...flags, '--steps', '2'])).rejects.toThrow(ConfigError);
    },
  );

  it('refuses a recipe without a LoRA policy before anything runs (it replays adapters)', async () => {
    await expect(main(['--recipe', 'recipes/smollm2-arithmetic-full.yaml', '--steps', '2'])).rejects.toThrow(
      /needs a recipe whose policy is lora/,
    );
  });
});
