/**
 * SkyRL's Tinker server for the specs: the environment `npm test`'s setup installed (its path in
 * `.cache/skyrl-home`), the float32 Qwen3 fixture, and a directory of the spec's own (lib/tinker/skyrlServer.ts
 * starts and stops it).
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { startSkyrl as start, type SkyrlServer } from '../../lib/tinker/skyrlServer.js';

export type { SkyrlServer } from '../../lib/tinker/skyrlServer.js';

/** The float32 Qwen3 fixture SkyRL trains here (JAX on a CPU refuses float16 products). */
export const SKYRL_MODEL = fileURLToPath(new URL('../fixtures/hf/tiny-qwen3-f32', import.meta.url));

/** Where the setup installed SkyRL, or undefined when it did not. */
export function skyrlHome(): string | undefined {
  try {
    const home = readFileSync(fileURLToPath(new URL('../../.cache/skyrl-home', import.meta.url)), 'utf8').trim();
    return existsSync(join(home, 'bin', 'uv')) ? home : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Starts SkyRL's server on the fixture in `dir`, with `processes` JAX processes and `backendConfig` over the
 * defaults; resolves once it answers its health check.
 */
export async function startSkyrl(dir: string, processes: 1 | 2 = 1, backendConfig: Record<string, unknown> = {}): Promise<SkyrlServer> {
  const home = skyrlHome();
  if (home === undefined) throw new Error('SkyRL is not installed: npm test installs it (scripts/test-setup.sh, step 5)');
  return start({ home, model: SKYRL_MODEL, dir, processes, backendConfig });
}
