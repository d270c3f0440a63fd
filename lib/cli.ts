#!/usr/bin/env node
/**
 * The `rxrl` command line.
 *
 * @packageDocumentation
 */
import { ConfigError, isRxrlError } from './errors.js';

const usage = `rxrl — reinforcement-learning post-training as a reactive stream

Usage:
  rxrl start [--steps N] [--seed N] [--mode sync|batch-async|fully-async] [--backend auto|wasm|cpu|tensorflow]
                    train the bundled task end to end on the embedded policy (GRPO, RL only, no server)
  rxrl serve [--model DIR] [--served-model-name NAME] [--port N] [--host H] [--alphabet CHARS] [--seed N]
             [--max-batch-size N] [--max-wait-ms N] [--weights-root DIR] [--api-key KEY] [--backend …] [--verbose]
             [--lora-modules NAME=DIR[,NAME=DIR…]] [--max-model-len N]
             [--max-sessions N] [--max-session-tokens N] [--session-idle-ms N]
                    OpenAI-compatible server (/v1/completions with prompt_logprobs, /v1/chat/completions with the
                    model's chat template, both streaming; /v1/models, /health, /update_weights_from_disk;
                    /sessions/{id}/v1/… records agents' calls token for token for training) for a Hugging Face
                    model directory (Llama 3, Qwen2, Qwen3, SmolLM2; a run checkpoint is one), or a fresh tiny
                    policy over --alphabet; served model id = the directory's name unless --served-model-name;
                    port 8000 by default, 0 picks a free one; --weights-root confines update_weights_from_disk
                    to directories below DIR; --api-key (or RXRL_SERVE_API_KEY) is required as a Bearer token
                    on every route but /health; --lora-modules serves PEFT LoRA adapters on the shared base,
                    each under its own model name (more load through /v1/load_lora_adapter, as in vLLM);
                    --max-model-len caps the context (a model whose weights and one full-length sequence's
                    cache exceed the backend's memory is refused before anything is allocated); sessions are
                    bounded: 1024 at once, 1048576 tokens each, freed after 600000 ms idle by default;
                    prints {"event":"listening","url":…} on stdout,
                    stops on SIGINT/SIGTERM
  rxrl tinker --model DIR [--served-model-name NAME] [--port N] [--host H] [--api-key KEY] [--state-dir DIR]
             [--max-models N] [--max-rank N] [--backend …]
                    a Tinker-API service for the official tinker SDK (TINKER_BASE_URL=<url>): LoRA training
                    clients on the model directory (forward_backward with cross_entropy, importance_sampling
                    or ppo; optim_step with Adam; save_state/load_state under --state-dir), sampling clients;
                    --api-key (or RXRL_TINKER_API_KEY) is checked against the SDK's X-API-Key header;
                    prints {"event":"listening","url":…}, stops on SIGINT/SIGTERM
  rxrl run <recipe.json|yaml> [--set key=value]…
                    train from a recipe: checkpoints, lossless resume (resume.mode auto by default),
                    metrics.jsonl and trained.jsonl in run.dir (default runs/<recipe name>); a multi-agent
                    recipe (agents.environment, agents.roles, policies) trains every policy and saves each one's
                    final weights under run.dir/policies/<name> (a model directory or a PEFT adapter)
  rxrl trainer <recipe.json|yaml> [--set key=value]…
                    the same run with rollouts done by 'rxrl worker' processes over Kafka (kafka.brokers,
                    kafka.topicPrefix); weights are written to kafka.weightsDir (default <run.dir>/weights), which
                    the workers must be able to read; checkpoints and resume as in 'rxrl run' (a multi-agent
                    recipe: each policy's weights under its name, a LoRA policy's as its adapter alone)
  rxrl worker <recipe.json|yaml> [--set key=value]…
                    a rollout worker of the recipe's Kafka run (any number, any machine sharing the weights
                    directory); follows a restarted trainer; exits when the run ends
  rxrl config <recipe.json|yaml> [--set key=value]…
                    print the resolved, validated configuration (secrets redacted)
  rxrl report <run-dir> [--out FILE]
                    write a self-contained HTML page with the run's curves (reward, held-out reward, loss, KL,
                    clip fraction, staleness, throughput) from <run-dir>/metrics.jsonl; prints its path
                    (default <run-dir>/report.html)
  rxrl --help       this text

Environment (flags win): RXRL_STEPS, RXRL_SEED, RXRL_MODE, RXRL_BACKEND.
The last line on stdout is one JSON object with the run's summary.
`;

/** Reads `--name value` or `--name=value` from argv, else the environment variable, else undefined. */
function option(argv: readonly string[], name: string, env: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === `--${name}`) return argv[i + 1];
    if (argv[i].startsWith(`--${name}=`)) return argv[i].slice(name.length + 3);
  }
  return process.env[env];
}

function integer(value: string | undefined, name: string): number | undefined {
  if (value === undefined || value === '') return undefined;
  const n = Number(value);
  if (!Number.isInteger(n) || n < 0) throw new ConfigError(`${name} must be a non-negative integer, got '${value}'`);
  return n;
}

/**
 * Refuses flags a command does not know (a typo would otherwise be ignored silently). `valued` flags take the next
 * argument (or `--flag=value`); `switches` take none.
 */
function checkFlags(command: string, argv: readonly string[], valued: readonly string[], switches: readonly string[] = []): void {
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    const name = arg.startsWith('--') ? arg.slice(2).split('=')[0] : undefined;
    if (name !== undefined && valued.includes(name)) {
      if (!arg.includes('=')) i++;
    } else if (name === undefined || !switches.includes(name)) {
      throw new ConfigError(`rxrl ${command}: unknown ${name === undefined ? 'argument' : 'option'} '${arg}' (see rxrl --help)`);
    }
  }
}

async function start(argv: readonly string[]): Promise<number> {
  checkFlags('start', argv, ['steps', 'seed', 'mode', 'backend']);
  const { runEmbedded, EMBEDDED_STEPS } = await import('../pipelines/embedded.js');
  const steps = integer(option(argv, 'steps', 'RXRL_STEPS'), 'steps');
  const seed = integer(option(argv, 'seed', 'RXRL_SEED'), 'seed');
  const mode = option(argv, 'mode', 'RXRL_MODE');
  const backend = option(argv, 'backend', 'RXRL_BACKEND');
  const controller = new AbortController();
  process.once('SIGINT', () => controller.abort());
  const { Progress } = await import('./observe/progress.js');
  const progress = new Progress({ total: steps ?? EMBEDDED_STEPS });
  const summary = await runEmbedded({
    ...(steps === undefined ? {} : { steps }),
    ...(seed === undefined ? {} : { seed }),
    ...(mode === undefined ? {} : { mode: mode as never }),
    ...(backend === undefined ? {} : { backend: backend as never }),
    signal: controller.signal,
    onStep: (step, elapsed) => progress.update(step, elapsed),
  });
  progress.done();
  const { lastStep: _last, ...printed } = summary;
  process.stdout.write(`${JSON.stringify(printed)}\n`);
  return 0;
}

/** `NAME=DIR[,NAME=DIR…]` of `--lora-modules` as a record; a `ConfigError` names a malformed entry. */
function loraModules(value: string | undefined): Record<string, string> | undefined {
  if (value === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const entry of value.split(',')) {
    const at = entry.indexOf('=');
    if (at <= 0 || at === entry.length - 1) throw new ConfigError(`--lora-modules: '${entry}' is not NAME=DIR`, { context: { key: 'lora-modules' } });
    out[entry.slice(0, at)] = entry.slice(at + 1);
  }
  return out;
}

async function serveCommand(argv: readonly string[]): Promise<number> {
  checkFlags(
    'serve',
    argv,
    ['model', 'checkpoint', 'served-model-name', 'model-name', 'port', 'host', 'alphabet', 'seed', 'max-batch-size', 'max-wait-ms', 'weights-root', 'api-key', 'backend', 'lora-modules', 'max-model-len', 'max-sessions', 'max-session-tokens', 'session-idle-ms'],
    ['verbose'],
  );
  const { runServeCommand } = await import('./serve/command.js');
  const { EMBEDDED_MODEL } = await import('../pipelines/embedded.js');
  const { stringTransformTask } = await import('../recipes/stringTransform.js');
  const text = (name: string): string | undefined => option(argv, name, `RXRL_SERVE_${name.toUpperCase().replaceAll('-', '_')}`);
  const controller = stopOnSignals();
  const port = integer(text('port'), 'port');
  const maxBatchSize = integer(text('max-batch-size'), 'max-batch-size');
  const maxWaitMs = integer(text('max-wait-ms'), 'max-wait-ms');
  const maxModelLen = integer(text('max-model-len'), 'max-model-len');
  const seed = integer(option(argv, 'seed', 'RXRL_SEED'), 'seed');
  const maxSessions = integer(text('max-sessions'), 'max-sessions');
  const maxTokens = integer(text('max-session-tokens'), 'max-session-tokens');
  const idleMs = integer(text('session-idle-ms'), 'session-idle-ms');
  return runServeCommand({
    model: text('model') ?? text('checkpoint'),
    modelFlag: text('model') === undefined && text('checkpoint') !== undefined ? 'checkpoint' : 'model',
    alphabet: text('alphabet'),
    defaultAlphabet: stringTransformTask().characters,
    defaultModel: EMBEDDED_MODEL,
    ...(seed === undefined ? {} : { seed }),
    host: text('host'),
    ...(port === undefined ? {} : { port }),
    modelName: text('served-model-name') ?? text('model-name'),
    backend: option(argv, 'backend', 'RXRL_BACKEND') as never,
    ...(maxBatchSize === undefined ? {} : { maxBatchSize }),
    ...(maxWaitMs === undefined ? {} : { maxWaitMs }),
    ...(maxModelLen === undefined ? {} : { maxModelLen }),
    weightsRoot: text('weights-root'),
    apiKey: text('api-key'),
    loraModules: loraModules(text('lora-modules')),
    sessions: {
      ...(maxSessions === undefined ? {} : { maxSessions }),
      ...(maxTokens === undefined ? {} : { maxTokens }),
      ...(idleMs === undefined ? {} : { idleMs }),
    },
    verbose: argv.includes('--verbose'),
    signal: controller.signal,
    out: (line) => process.stdout.write(`${line}\n`),
    err: (line) => process.stderr.write(`${line}\n`),
  });
}

async function tinkerCommand(argv: readonly string[]): Promise<number> {
  checkFlags('tinker', argv, ['model', 'served-model-name', 'port', 'host', 'api-key', 'state-dir', 'max-models', 'max-rank', 'backend'], []);
  const { runTinkerCommand } = await import('./tinker/command.js');
  const text = (name: string): string | undefined => option(argv, name, `RXRL_TINKER_${name.toUpperCase().replaceAll('-', '_')}`);
  const port = integer(text('port'), 'port');
  const maxModels = integer(text('max-models'), 'max-models');
  const maxRank = integer(text('max-rank'), 'max-rank');
  return runTinkerCommand({
    model: text('model'),
    modelName: text('served-model-name'),
    host: text('host'),
    ...(port === undefined ? {} : { port }),
    apiKey: text('api-key'),
    stateDir: text('state-dir'),
    ...(maxModels === undefined ? {} : { maxModels }),
    ...(maxRank === undefined ? {} : { maxRank }),
    backend: option(argv, 'backend', 'RXRL_BACKEND') as never,
    signal: stopOnSignals().signal,
    out: (line) => process.stdout.write(`${line}\n`),
  });
}

/** Splits `<recipe> [--set k=v]…` (also `--set=k=v`); anything else is an error naming it. */
function recipeArgs(argv: readonly string[]): { file: string; set: string[] } {
  const set: string[] = [];
  let file: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--set') {
      const value = argv[++i];
      if (value === undefined) throw new ConfigError('--set needs key=value');
      set.push(value);
    } else if (arg.startsWith('--set=')) {
      set.push(arg.slice('--set='.length));
    } else if (!arg.startsWith('--') && file === undefined) {
      file = arg;
    } else {
      throw new ConfigError(`unexpected argument '${arg}'`);
    }
  }
  if (file === undefined) throw new ConfigError('a recipe file is required: rxrl run <recipe.json|yaml>');
  return { file, set };
}

async function resolvedConfig(argv: readonly string[]): Promise<{ config: import('./config/schema.js').RxrlConfig; dir: string }> {
  const { loadConfig } = await import('./config/schema.js');
  const { recipeDir } = await import('../pipelines/parts/data.js');
  const { basename, extname, resolve } = await import('node:path');
  const { file, set } = recipeArgs(argv);
  const config = loadConfig({ file, set });
  const dir = recipeDir(file);
  if (config.run.dir === null) config.run.dir = resolve('runs', basename(file, extname(file)));
  return { config, dir };
}

async function configCommand(argv: readonly string[]): Promise<number> {
  const { describeConfig } = await import('./config/schema.js');
  const { config } = await resolvedConfig(argv);
  process.stdout.write(`${describeConfig(config)}\n`);
  return 0;
}

/** The Kafka client and topics of a recipe's `kafka` section. */
async function kafkaOf(config: import('./config/schema.js').RxrlConfig, clientId: string) {
  const { createKafka } = await import('./kafka/client.js');
  const { kafkaTopics } = await import('./kafka/types.js');
  return { kafka: createKafka(config.kafka.brokers, { clientId: `${config.kafka.clientId}-${clientId}` }), topics: kafkaTopics(config.kafka.topicPrefix) };
}

/** `rxrl run` (embedded rollouts) and `rxrl trainer` (rollouts by `rxrl worker` processes over Kafka). */
async function runCommand(argv: readonly string[], overKafka = false): Promise<number> {
  const { runTraining } = await import('../pipelines/run.js');
  const { Progress } = await import('./observe/progress.js');
  const { resolve } = await import('node:path');
  const { config, dir } = await resolvedConfig(argv);
  const kafka = overKafka
    ? { ...(await kafkaOf(config, 'trainer')), weightsDir: config.kafka.weightsDir === null ? resolve(dir, config.run.dir!, 'weights') : resolve(dir, config.kafka.weightsDir) }
    : undefined;
  if (config.agents.environment !== 'none') return agentsCommand(config, dir, kafka);
  const progress = new Progress(config.run.steps > 0 ? { total: config.run.steps } : {});
  const { createLogger } = await import('./observe/logger.js');
  const logger = createLogger({ level: config.logging.level });
  const { moduleLogger } = await import('./observe/logger.js');
  const kafkaLog = moduleLogger(logger, 'kafka');
  const controller = stopOnSignals();
  const summary = await runTraining(config, {
    baseDir: dir,
    signal: controller.signal,
    logger,
    log: (line) => progress.message(`rxrl: ${line}`),
    onStep: (step, elapsed) => progress.update(step, elapsed),
    ...(kafka ? { kafka: { ...kafka, onEvent: (event) => kafkaLog.debug({ event: event.type, ...event.payload }, event.type) } } : {}),
  });
  progress.done();
  const { lastStep: _last, ...printed } = summary;
  process.stdout.write(`${JSON.stringify(printed)}\n`);
  return 0;
}

/** An abort controller that SIGINT or SIGTERM fires: a graceful stop. */
function stopOnSignals(): AbortController {
  const controller = new AbortController();
  const stop = (): void => controller.abort();
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  return controller;
}

/** `rxrl run` or `rxrl trainer` of a multi-agent recipe (`agents.environment` set): every policy's steps, one summary line. */
async function agentsCommand(
  config: import('./config/schema.js').RxrlConfig,
  dir: string,
  kafka: import('../pipelines/run.js').KafkaTransport | undefined,
): Promise<number> {
  const { runAgents } = await import('../pipelines/agents.js');
  const controller = stopOnSignals();
  const summary = await runAgents(config, {
    baseDir: dir,
    signal: controller.signal,
    ...(kafka ? { kafka } : {}),
    log: (line) => process.stderr.write(`rxrl: ${line}\n`),
    onStep: (step, elapsed) => {
      const reward = step.metrics[`${step.modelTag}/rollout/reward_mean`];
      process.stderr.write(`rxrl: ${step.modelTag} step ${step.step + 1} reward ${reward?.toFixed(3) ?? '-'} (${elapsed.toFixed(0)} s)\n`);
    },
  });
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  return 0;
}

/** `rxrl worker <recipe>`: rolls out the tasks of the recipe's Kafka run until it ends. */
async function workerCommand(argv: readonly string[]): Promise<number> {
  const { runWorker } = await import('../pipelines/run.js');
  const { config, dir } = await resolvedConfig(argv);
  const { createLogger, moduleLogger } = await import('./observe/logger.js');
  const kafkaLog = moduleLogger(createLogger({ level: config.logging.level }), 'kafka');
  const controller = stopOnSignals();
  const summary = await runWorker(config, {
    ...(await kafkaOf(config, 'worker')),
    baseDir: dir,
    signal: controller.signal,
    onEvent: (event) => {
      // A refused weights announcement is worth a warning: the worker goes on with the version it has.
      if (event.type === 'worker.weights_refused') kafkaLog.warn({ event: event.type, ...event.payload }, event.type);
      else kafkaLog.debug({ event: event.type, ...event.payload }, event.type);
    },
    onTask: (r) => {
      if (r.outcome === 'rolled-out') process.stderr.write(`rxrl: task ${r.taskId} (${r.trajectories} trajectories, v${r.policyVersion})\n`);
    },
  });
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  return 0;
}

/** `rxrl report <run-dir> [--out FILE]`: writes the HTML report of a run and prints its path. */
async function reportCommand(argv: readonly string[]): Promise<number> {
  const { writeReport } = await import('./observe/report.js');
  const dirs: string[] = [];
  let out: string | undefined;
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i];
    if (arg === '--out') out = argv[++i] ?? '';
    else if (arg.startsWith('--out=')) out = arg.slice('--out='.length);
    else if (arg.startsWith('--')) throw new ConfigError(`rxrl report: unknown option '${arg}'`);
    else dirs.push(arg);
  }
  if (dirs.length !== 1 || out === '') {
    throw new ConfigError('rxrl report needs one run directory: rxrl report <run-dir> [--out FILE]');
  }
  const path = await writeReport(dirs[0], out === undefined ? {} : { out });
  process.stdout.write(`${path}\n`);
  return 0;
}

async function main(argv: readonly string[]): Promise<number> {
  const [command, ...rest] = argv;
  switch (command) {
    case undefined:
    case '--help':
    case '-h':
    case 'help':
      process.stdout.write(usage);
      return 0;
    case 'start':
      if (rest.includes('--help')) {
        process.stdout.write(usage);
        return 0;
      }
      return start(rest);
    case 'run':
    case 'trainer':
    case 'worker':
    case 'config':
      if (rest.includes('--help')) {
        process.stdout.write(usage);
        return 0;
      }
      if (command === 'worker') return workerCommand(rest);
      return command === 'config' ? configCommand(rest) : runCommand(rest, command === 'trainer');
    case 'serve':
      if (rest.includes('--help')) {
        process.stdout.write(usage);
        return 0;
      }
      return serveCommand(rest);
    case 'tinker':
      if (rest.includes('--help')) {
        process.stdout.write(usage);
        return 0;
      }
      return tinkerCommand(rest);
    case 'report':
      if (rest.includes('--help')) {
        process.stdout.write(usage);
        return 0;
      }
      return reportCommand(rest);
    default:
      process.stderr.write(`rxrl: unknown command '${command}'\n\n${usage}`);
      return 2;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    const text = isRxrlError(error) ? `${error.name}: ${error.message}` : error instanceof Error ? (error.stack ?? error.message) : String(error);
    process.stderr.write(`rxrl: ${text}\n`);
    process.exitCode = 1;
  },
);
