/**
 * Rollouts on an OpenAI-compatible server named by the recipe (`openai.baseUrl`, `openai.model`): vLLM, SGLang or
 * `rxrl serve`, serving the run's model. Each version reaches it as a model directory and the weight-update
 * endpoint, or, for a LoRA policy, as a PEFT adapter loaded with vLLM's `load_lora_adapter` under
 * `<policy>-v<version>` (the older ones unloaded). The run's starting weights are published before the first
 * rollout, so a resumed run's server serves its checkpoint.
 *
 * @packageDocumentation
 */
import { join } from 'node:path';

import type { RxrlConfig } from '../../lib/config/schema.js';
import { OpenAIEngine } from '../../lib/engine/openai.js';
import type { RolloutEngine } from '../../lib/engine/types.js';
import type { EngineContext } from './contracts.js';
import { samplesInFlight } from './settings.js';

/**
 * The `createEngine` of a run whose rollouts go to `openai.baseUrl`; weights are written below `<run-dir>/served`
 * (the server must read that directory).
 */
export function servedEngine(
  config: Pick<RxrlConfig, 'openai' | 'rollout' | 'run' | 'sync'>,
  runDir: string | undefined,
): (context: EngineContext) => Promise<RolloutEngine> {
  return async ({ policy, tokenizer, version, lora, signal }) => {
    const engine = new OpenAIEngine({
      baseURL: config.openai.baseUrl as string,
      model: config.openai.model,
      apiKey: config.openai.apiKey,
      tokenizer,
      version,
      concurrency: samplesInFlight(config),
      weightSync: {
        timeoutMs: config.openai.weightSyncTimeoutMs,
        directory: join(runDir ?? join(process.cwd(), 'runs', 'served'), 'served'),
        config: policy.config,
        ...(lora
          ? { lora: { config: lora.config, name: lora.name } }
          : // The first push may take a server that served other weights back to this run's version.
            {
              body: (path: string, v: number) => ({
                model_path: path,
                weight_version: String(v),
                ...(v === version ? { force: true } : {}),
              }),
            }),
      },
    });
    await engine.loadWeights(version, policy.getWeights(), signal);
    return engine;
  };
}
