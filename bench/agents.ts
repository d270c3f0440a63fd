/**
 * PettingLLMs' specialization levels on the bundled two-agent task (writer–editor): L1 one policy shared by both
 * agents (prompts tell the roles apart), L2 one frozen base with a LoRA adapter per agent, L3 a full model per
 * agent; each trained for the same steps, batch and seed from the same seeded base model. Prints one JSON line per
 * level (held-out reward per agent before and after, wall time, trainable parameters, bytes per weight sync) and an
 * `agents-summary` line with the table.
 *
 * Usage: `npm run bench -- agents [--levels L1,L2,L3] [--steps N] [--batch N] [--group N] [--rank R] [--backend B] [--seed S] [--lr LR]`
 * (defaults: 150 steps, batch 16, group 8, rank 8, auto backend, seed 1, lr 2e-3).
 *
 * @packageDocumentation
 */
import { loadConfig } from '../lib/config/schema.js';
import { runAgents, type AgentsRunSummary } from '../pipelines/agents.js';

type Level = 'L1' | 'L2' | 'L3';

function flag(args: readonly string[], name: string): string | undefined {
  const at = args.indexOf(name);
  return at >= 0 && at + 1 < args.length ? args[at + 1] : undefined;
}

/** The `agents` and `policies` sections of a level. */
function level(name: Level, rank: number): Record<string, unknown> {
  switch (name) {
    case 'L1':
      return {
        agents: {
          roles: [
            { name: 'writer', policy: 'shared' },
            { name: 'editor', policy: 'shared' },
          ],
        },
        policies: [{ name: 'shared', specialization: 'prompt' }],
      };
    case 'L2':
      return {
        agents: {
          roles: [
            { name: 'writer', policy: 'writer' },
            { name: 'editor', policy: 'editor' },
          ],
        },
        policies: ['writer', 'editor'].map((p) => ({
          name: p,
          specialization: 'lora',
          lora: { rank, alpha: 2 * rank, targetModules: ['q_proj', 'k_proj', 'v_proj', 'o_proj', 'gate_proj', 'up_proj', 'down_proj'] },
        })),
      };
    case 'L3':
      return {
        agents: {
          roles: [
            { name: 'writer', policy: 'writer' },
            { name: 'editor', policy: 'editor' },
          ],
        },
        policies: ['writer', 'editor'].map((p) => ({ name: p, specialization: 'full' })),
      };
  }
}

function row(name: Level, summary: AgentsRunSummary): Record<string, unknown> {
  const val = (m: Record<string, number> | null, agent: string, key = 'reward_mean'): number | null =>
    m === null ? null : Math.round((m[`val/${agent}/${key}`] ?? 0) * 1000) / 1000;
  return {
    bench: 'agents',
    level: name,
    backend: summary.backend,
    seconds: Math.round(summary.seconds * 10) / 10,
    writer_reward: [val(summary.valInitial, 'writer'), val(summary.valFinal, 'writer')],
    editor_reward: [val(summary.valInitial, 'editor'), val(summary.valFinal, 'editor')],
    writer_accuracy: val(summary.valFinal, 'writer', 'accuracy_mean'),
    editor_accuracy: val(summary.valFinal, 'editor', 'accuracy_mean'),
    trainable_parameters: summary.policies.reduce((n, p) => n + p.trainableParameters, 0),
    sync_bytes_per_step: summary.policies.reduce((n, p) => n + p.syncBytes, 0),
    policies: summary.policies.map((p) => ({
      name: p.name,
      specialization: p.specialization,
      steps: p.steps,
      trainable: p.trainableParameters,
      sync_bytes: p.syncBytes,
    })),
  };
}

export async function main(args: readonly string[]): Promise<void> {
  const levels = (flag(args, '--levels') ?? 'L1,L2,L3').split(',') as Level[];
  const steps = Number(flag(args, '--steps') ?? 150);
  const batchSize = Number(flag(args, '--batch') ?? 16);
  const groupSize = Number(flag(args, '--group') ?? 8);
  const rank = Number(flag(args, '--rank') ?? 8);
  const backend = flag(args, '--backend') ?? 'auto';
  const seed = Number(flag(args, '--seed') ?? 1);
  const learningRate = Number(flag(args, '--lr') ?? 2e-3);
  const rows: Record<string, unknown>[] = [];
  for (const name of levels) {
    if (!['L1', 'L2', 'L3'].includes(name)) throw new Error(`unknown level '${name}'; valid: L1, L2, L3`);
    const config = loadConfig({
      env: {},
      values: {
        run: { dir: null, seed, steps, backend },
        agents: { environment: 'writer-editor', ...(level(name, rank).agents as object) },
        policies: level(name, rank).policies,
        sync: { batchSize },
        rollout: { groupSize },
        trainer: { learningRate },
        checkpoint: { every: 0, onStop: false },
        resume: { mode: 'disable' },
      },
    });
    const summary = await runAgents(config);
    const line = row(name, summary);
    rows.push(line);
    process.stdout.write(`${JSON.stringify(line)}\n`);
  }
  process.stdout.write(
    `${JSON.stringify({
      bench: 'agents-summary',
      steps,
      batch: batchSize,
      group: groupSize,
      lr: learningRate,
      table: rows.map((r) => ({
        level: r.level,
        seconds: r.seconds,
        writer: r.writer_reward,
        editor: r.editor_reward,
        trainable: r.trainable_parameters,
        sync_bytes: r.sync_bytes_per_step,
      })),
    })}\n`,
  );
}
