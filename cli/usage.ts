/**
 * What each `rxrl` command accepts and how its usage reads: one {@link CommandSpec} per command, parsed by
 * `args.ts`, and the text `rxrl <command> --help` prints (`rxrl --help` prints them all).
 *
 * @packageDocumentation
 */
import type { CommandSpec, FlagSpec } from './args.js';

/** The commands of `rxrl`. */
export type CommandName = 'start' | 'serve' | 'tinker' | 'run' | 'trainer' | 'worker' | 'config' | 'report' | 'status' | 'recipes' | 'init';

/** A command's flags and positionals, and its usage text. */
export interface CommandUsage extends CommandSpec {
  /** The lines under `Usage:` for this command. */
  readonly usage: string;
  /** Environment variables it reads, for the line after its usage. */
  readonly environment?: string;
}

const value: FlagSpec = { type: 'string' };
const flagSwitch: FlagSpec = { type: 'boolean' };
const recipe = { flags: { set: { type: 'string', multiple: true } }, positionals: ['<recipe.json|yaml>'] } as const;
const RECIPE_USAGE = `
                    <recipe.json|yaml> may also be rxrl:<name>, a recipe shipped in the package
                    (rxrl recipes lists them)`;
/** A training run's flags: the recipe's, its step budget and seed, and its status server. */
const training = {
  ...recipe,
  flags: { ...recipe.flags, steps: value, seed: value, 'status-port': value, 'status-host': value },
  environment: 'RXRL_STEPS, RXRL_SEED (as --steps, --seed)',
} as const;
const STEPS_USAGE = `
                    --steps N and --seed N (or RXRL_STEPS, RXRL_SEED) set run.steps and run.seed over the recipe
                    and --set; --set paths are relative to the working directory, the recipe's own paths to
                    the recipe's directory`;
const STATUS_USAGE = `
                    --status-port N serves GET /status (JSON: each module's work in flight, done, failed, idle
                    time, stalls; each Kafka worker's last heartbeat) and GET /metrics (Prometheus) on
                    127.0.0.1:N (0: a free port, printed), or on --status-host H`;

/** Every command, in the order `rxrl --help` lists them. */
export const COMMANDS: Readonly<Record<CommandName, CommandUsage>> = {
  start: {
    name: 'rxrl start',
    flags: { steps: value, seed: value, mode: value, backend: value },
    usage: `  rxrl start [--steps N] [--seed N] [--mode sync|batch-async|fully-async] [--backend auto|wasm|cpu|tensorflow]
                    train the bundled task end to end on the embedded policy (GRPO, RL only, no server); the last
                    line on stdout is one JSON object with the run's summary`,
    environment: 'RXRL_STEPS, RXRL_SEED, RXRL_MODE, RXRL_BACKEND',
  },
  serve: {
    name: 'rxrl serve',
    flags: {
      ...Object.fromEntries(
        [
          'model',
          'checkpoint',
          'served-model-name',
          'model-name',
          'port',
          'host',
          'alphabet',
          'seed',
          'max-batch-size',
          'max-wait-ms',
          'weights-root',
          'api-key',
          'backend',
          'lora-modules',
          'max-model-len',
          'max-sessions',
          'max-session-tokens',
          'session-idle-ms',
          'reasoning-parser',
        ].map((name) => [name, value]),
      ),
      verbose: flagSwitch,
    },
    usage: `  rxrl serve [--model DIR] [--served-model-name NAME] [--port N] [--host H] [--alphabet CHARS] [--seed N]
             [--max-batch-size N] [--max-wait-ms N] [--weights-root DIR] [--api-key KEY] [--backend …] [--verbose]
             [--lora-modules NAME=DIR[,NAME=DIR…]] [--max-model-len N]
             [--max-sessions N] [--max-session-tokens N] [--session-idle-ms N] [--reasoning-parser qwen3|deepseek_r1]
                    OpenAI-compatible server (/v1/completions with prompt_logprobs, /v1/chat/completions with the
                    model's chat template, both streaming; /v1/models, /health, /update_weights_from_disk;
                    /sessions/{id}/v1/… records agents' calls token for token for training) for a Hugging Face
                    model directory (Llama 3, Qwen2, Qwen3, SmolLM2; a run checkpoint is one), or a fresh tiny
                    policy over --alphabet; served model id = the directory's name unless --served-model-name;
                    port 8000 by default, 0 picks a free one; --weights-root confines update_weights_from_disk
                    to directories below DIR; --api-key (or RXRL_SERVE_API_KEY) is required as a Bearer token
                    on every route but /health (and /metrics, Prometheus text with vLLM's metric names);
                    --reasoning-parser splits <think>…</think> into reasoning_content, as vLLM does; --lora-modules serves PEFT LoRA adapters on the shared base,
                    each under its own model name (more load through /v1/load_lora_adapter, as in vLLM);
                    --max-model-len caps the context (a model whose weights and one full-length sequence's
                    cache exceed the backend's memory is refused before anything is allocated); sessions are
                    bounded: 1024 at once, 1048576 tokens each, freed after 600000 ms idle by default;
                    prints {"event":"listening","url":…} on stdout,
                    stops on SIGINT/SIGTERM`,
    environment: 'RXRL_SERVE_<FLAG> for each flag (RXRL_SERVE_API_KEY, RXRL_SERVE_PORT, …), RXRL_SEED, RXRL_BACKEND',
  },
  tinker: {
    name: 'rxrl tinker',
    flags: Object.fromEntries(
      ['model', 'served-model-name', 'port', 'host', 'api-key', 'state-dir', 'max-models', 'max-rank', 'backend'].map((name) => [
        name,
        value,
      ]),
    ),
    usage: `  rxrl tinker --model DIR [--served-model-name NAME] [--port N] [--host H] [--api-key KEY] [--state-dir DIR]
             [--max-models N] [--max-rank N] [--backend …]
                    a Tinker-API service for the official tinker SDK (TINKER_BASE_URL=<url>): LoRA training
                    clients on the model directory (forward_backward with cross_entropy, importance_sampling
                    or ppo; optim_step with Adam; save_state/load_state under --state-dir), sampling clients;
                    --api-key (or RXRL_TINKER_API_KEY) is checked against the SDK's X-API-Key header;
                    prints {"event":"listening","url":…}, stops on SIGINT/SIGTERM`,
    environment: 'RXRL_TINKER_<FLAG> for each flag (RXRL_TINKER_API_KEY, …), RXRL_BACKEND',
  },
  run: {
    name: 'rxrl run',
    ...training,
    usage: `  rxrl run <recipe.json|yaml> [--set key=value]… [--steps N] [--seed N] [--status-port N] [--status-host H]
                    train from a recipe: checkpoints, lossless resume (resume.mode auto by default),
                    metrics.jsonl and trained.jsonl in run.dir (default runs/<recipe name>); a multi-agent
                    recipe (agents.environment, agents.roles, policies) trains every policy and saves each one's
                    final weights under run.dir/policies/<name> (a model directory or a PEFT adapter)${RECIPE_USAGE}${STEPS_USAGE}${STATUS_USAGE}`,
  },
  recipes: {
    name: 'rxrl recipes',
    flags: {},
    usage: `  rxrl recipes
                    list the recipes shipped in the package (rxrl:<name>, one line each, and what a recipe needs
                    beyond the package)`,
  },
  init: {
    name: 'rxrl init',
    flags: { out: value },
    positionals: ['[name]'],
    usage: `  rxrl init [name] [--out FILE]
                    copy a bundled recipe (default reverse; rxrl recipes lists them) into the working directory
                    as rxrl-recipe.yaml (or FILE; .json writes JSON) to edit and run with rxrl run FILE; an
                    existing file is never overwritten`,
  },
  trainer: {
    name: 'rxrl trainer',
    ...training,
    usage: `  rxrl trainer <recipe.json|yaml> [--set key=value]… [--steps N] [--seed N] [--status-port N] [--status-host H]
                    the same run with rollouts done by 'rxrl worker' processes over Kafka (kafka.brokers,
                    kafka.topicPrefix); weights are written to kafka.weightsDir (default <run.dir>/weights), which
                    the workers must be able to read; checkpoints and resume as in 'rxrl run' (a multi-agent
                    recipe: each policy's weights under its name, a LoRA policy's as its adapter alone); its
                    status shows each worker's heartbeat (kafka.heartbeatMs) and the ones gone${RECIPE_USAGE}${STEPS_USAGE}${STATUS_USAGE}`,
  },
  worker: {
    name: 'rxrl worker',
    ...recipe,
    usage: `  rxrl worker <recipe.json|yaml> [--set key=value]…
                    a rollout worker of the recipe's Kafka run (any number, any machine sharing the weights
                    directory); follows a restarted trainer; exits when the run ends`,
  },
  config: {
    name: 'rxrl config',
    ...recipe,
    usage: `  rxrl config <recipe.json|yaml> [--set key=value]…
                    print the resolved, validated configuration (secrets redacted)`,
  },
  report: {
    name: 'rxrl report',
    flags: { out: value },
    positionals: ['<run-dir>'],
    usage: `  rxrl report <run-dir> [--out FILE]
                    write a self-contained HTML page with the run's curves (reward, held-out reward, loss, KL,
                    clip fraction, staleness, throughput) from <run-dir>/metrics.jsonl; prints its path
                    (default <run-dir>/report.html)`,
  },
  status: {
    name: 'rxrl status',
    flags: { json: { type: 'boolean' }, 'timeout-ms': value },
    positionals: ['<url>'],
    usage: `  rxrl status <url> [--json] [--timeout-ms N]
                    print a running training's status (rxrl run|trainer --status-port): one row per module
                    (in flight, held, done, failed, oldest, idle, stalled, last error) and one per Kafka worker
                    (last heartbeat, up/left/gone); --json prints the document as served; gives up after
                    --timeout-ms (default 10000) or an answer over 8 MiB; control characters are not printed`,
  },
};

/** True for the name of an `rxrl` command. */
export function isCommandName(name: string): name is CommandName {
  return Object.hasOwn(COMMANDS, name);
}

/** What `rxrl <command> --help` prints. */
export function commandHelp(command: CommandUsage): string {
  const environment = command.environment === undefined ? '' : `\nEnvironment (flags win): ${command.environment}.\n`;
  return `Usage:\n${command.usage}\n  ${command.name} -h, --help\n                    this text\n${environment}`;
}

/** What `rxrl --help` prints: every command's usage. */
export function generalHelp(): string {
  const commands = Object.values(COMMANDS)
    .map((c) => c.usage)
    .join('\n');
  return `rxrl — reinforcement-learning post-training as a reactive stream

Usage:
${commands}
  rxrl --help       this text; rxrl <command> --help: that command's usage and environment

Every flag takes its value as --flag VALUE or --flag=VALUE; given twice, the last one counts (--set collects
them all). A path given with --set is relative to the working directory; a path in a recipe, to the recipe's
directory. Environment (flags win): RXRL_STEPS, RXRL_SEED, RXRL_MODE, RXRL_BACKEND; RXRL_SERVE_<FLAG>,
RXRL_TINKER_<FLAG>.

Exit codes: 0 done; 2 a usage error (an unknown command or flag, a flag without its value or with a malformed
one such as --steps abc, a missing or extra argument); 1 a configuration error (an unknown or invalid key, a
missing model or file, a malformed environment variable) or a failed run; 130 or 143 stopped by SIGINT or SIGTERM
while still setting up (a training they stop ends gracefully, checkpoint.onStop, with 0). Every error is one line
on stderr: rxrl: <ErrorName>: <what, and what to do>.
`;
}
