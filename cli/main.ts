#!/usr/bin/env node
/**
 * The `rxrl` command line.
 *
 * @packageDocumentation
 */
import { parseCommand, usageError, type ParsedCommand } from './args.js';
import { COMMANDS, commandHelp, generalHelp, isCommandName, type CommandName } from './usage.js';
import { ConfigError, isAbortError, isRxrlError, isUsageError, UsageError } from '../lib/core/errors.js';
import { printable } from '../lib/observe/terminal.js';

/** A string flag's value, else the environment variable `env`'s (when given), else undefined. */
function text(args: ParsedCommand, name: string, env?: string): string | undefined {
  return setting(args, name, env)?.value;
}

/** A flag's value as given: on the command line (`--steps`), else in its environment variable (`RXRL_STEPS`). */
interface Setting {
  readonly value: string;
  /** `--steps` or `RXRL_STEPS`, for messages. */
  readonly source: string;
  readonly fromEnv: boolean;
}

/** The value of flag `name`, else of the environment variable `env` (when given), with where it came from. */
function setting(args: ParsedCommand, name: string, env?: string): Setting | undefined {
  const value = args.values[name];
  if (typeof value === 'string') return { value, source: `--${name}`, fromEnv: false };
  const fromEnv = env === undefined ? undefined : process.env[env];
  return fromEnv === undefined ? undefined : { value: fromEnv, source: env!, fromEnv: true };
}

/**
 * A value that `setting` cannot be: a flag's is a usage error (exit 2; {@link main} names the command), an
 * environment variable's a configuration error (exit 1).
 */
function malformed(setting: Setting, what: string): Error {
  const message = `${setting.source} must be ${what}, got '${setting.value}'`;
  return setting.fromEnv
    ? new ConfigError(message, { context: { key: setting.source } })
    : new UsageError(message, { context: { flag: setting.source } });
}

/** A setting as a non-negative decimal integer (`--steps 20`); not given: undefined; empty, `0x10`, `1e3`, `-1`, `abc`: refused. */
function integer(given: Setting | undefined): number | undefined {
  if (given === undefined) return undefined;
  const n = /^\d+$/.test(given.value) ? Number(given.value) : Number.NaN;
  if (!Number.isSafeInteger(n)) throw malformed(given, 'a non-negative integer');
  return n;
}

/** A setting as a TCP port: 1–65535, or 0 for any free one. */
function port(given: Setting | undefined): number | undefined {
  const n = integer(given);
  if (given !== undefined && n !== undefined && n > 65_535) throw malformed(given, 'a port (1-65535, or 0 for any free one)');
  return n;
}

/** A setting that must be one of `allowed` (`--mode sync`). */
function choice<T extends string>(given: Setting | undefined, allowed: readonly T[]): T | undefined {
  if (given === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(given.value)) throw malformed(given, `one of ${allowed.join(', ')}`);
  return given.value as T;
}

const MODES = ['sync', 'batch-async', 'fully-async'] as const;
const BACKENDS = ['auto', 'wasm', 'cpu', 'tensorflow'] as const;

async function start(args: ParsedCommand): Promise<number> {
  const { runEmbedded, EMBEDDED_STEPS } = await import('../pipelines/embedded.js');
  const steps = integer(setting(args, 'steps', 'RXRL_STEPS'));
  const seed = integer(setting(args, 'seed', 'RXRL_SEED'));
  const mode = choice(setting(args, 'mode', 'RXRL_MODE'), MODES);
  const backend = choice(setting(args, 'backend', 'RXRL_BACKEND'), BACKENDS);
  const controller = new AbortController();
  process.once('SIGINT', () => controller.abort());
  const { Progress } = await import('../lib/observe/progress.js');
  const progress = new Progress({ total: steps ?? EMBEDDED_STEPS });
  const summary = await runEmbedded({
    ...(steps === undefined ? {} : { steps }),
    ...(seed === undefined ? {} : { seed }),
    ...(mode === undefined ? {} : { mode }),
    ...(backend === undefined ? {} : { backend }),
    signal: controller.signal,
    onStep: (step, elapsed) => progress.update(step, elapsed),
  });
  progress.done();
  const { lastStep: _last, ...printed } = summary;
  process.stdout.write(`${JSON.stringify(printed)}\n`);
  return 0;
}

/** `NAME=DIR[,NAME=DIR…]` of `--lora-modules` as a record; a malformed entry is refused, naming it. */
function loraModules(given: Setting | undefined): Record<string, string> | undefined {
  if (given === undefined) return undefined;
  const out: Record<string, string> = {};
  for (const entry of given.value.split(',')) {
    const at = entry.indexOf('=');
    if (at <= 0 || at === entry.length - 1) throw malformed({ ...given, value: entry }, 'NAME=DIR[,NAME=DIR…]');
    out[entry.slice(0, at)] = entry.slice(at + 1);
  }
  return out;
}

async function serveCommand(args: ParsedCommand): Promise<number> {
  const { runServeCommand } = await import('../lib/serve/command.js');
  const { REASONING_PARSERS } = await import('../lib/serve/reasoning.js');
  const { EMBEDDED_MODEL } = await import('../pipelines/embedded.js');
  const { stringTransformTask } = await import('../recipes/stringTransform.js');
  const env = (name: string): string => `RXRL_SERVE_${name.toUpperCase().replaceAll('-', '_')}`;
  const flag = (name: string): string | undefined => text(args, name, env(name));
  const given = (name: string): Setting | undefined => setting(args, name, env(name));
  const controller = stopOnSignals();
  const listenPort = port(given('port'));
  const maxBatchSize = integer(given('max-batch-size'));
  const maxWaitMs = integer(given('max-wait-ms'));
  const maxModelLen = integer(given('max-model-len'));
  const seed = integer(setting(args, 'seed', 'RXRL_SEED'));
  const maxSessions = integer(given('max-sessions'));
  const maxTokens = integer(given('max-session-tokens'));
  const idleMs = integer(given('session-idle-ms'));
  const backend = choice(setting(args, 'backend', 'RXRL_BACKEND'), BACKENDS);
  return runServeCommand({
    model: flag('model') ?? flag('checkpoint'),
    modelFlag: flag('model') === undefined && flag('checkpoint') !== undefined ? 'checkpoint' : 'model',
    alphabet: flag('alphabet'),
    defaultAlphabet: stringTransformTask().characters,
    defaultModel: EMBEDDED_MODEL,
    ...(seed === undefined ? {} : { seed }),
    host: flag('host'),
    ...(listenPort === undefined ? {} : { port: listenPort }),
    modelName: flag('served-model-name') ?? flag('model-name'),
    ...(backend === undefined ? {} : { backend }),
    ...(maxBatchSize === undefined ? {} : { maxBatchSize }),
    ...(maxWaitMs === undefined ? {} : { maxWaitMs }),
    ...(maxModelLen === undefined ? {} : { maxModelLen }),
    weightsRoot: flag('weights-root'),
    apiKey: flag('api-key'),
    loraModules: loraModules(given('lora-modules')),
    reasoningParser: choice(given('reasoning-parser'), REASONING_PARSERS),
    sessions: {
      ...(maxSessions === undefined ? {} : { maxSessions }),
      ...(maxTokens === undefined ? {} : { maxTokens }),
      ...(idleMs === undefined ? {} : { idleMs }),
    },
    verbose: args.values.verbose === true,
    signal: controller.signal,
    out: (line) => process.stdout.write(`${line}\n`),
    err: (line) => process.stderr.write(`${line}\n`),
  });
}

async function tinkerCommand(args: ParsedCommand): Promise<number> {
  const { runTinkerCommand } = await import('../lib/tinker/command.js');
  const env = (name: string): string => `RXRL_TINKER_${name.toUpperCase().replaceAll('-', '_')}`;
  const flag = (name: string): string | undefined => text(args, name, env(name));
  const listenPort = port(setting(args, 'port', env('port')));
  const maxModels = integer(setting(args, 'max-models', env('max-models')));
  const maxRank = integer(setting(args, 'max-rank', env('max-rank')));
  const backend = choice(setting(args, 'backend', 'RXRL_BACKEND'), BACKENDS);
  if (flag('model') === undefined) {
    throw new UsageError('--model DIR is required (a Hugging Face model directory or id, or RXRL_TINKER_MODEL)', {
      context: { flag: '--model' },
    });
  }
  return runTinkerCommand({
    model: flag('model'),
    modelName: flag('served-model-name'),
    host: flag('host'),
    ...(listenPort === undefined ? {} : { port: listenPort }),
    apiKey: flag('api-key'),
    stateDir: flag('state-dir'),
    ...(maxModels === undefined ? {} : { maxModels }),
    ...(maxRank === undefined ? {} : { maxRank }),
    ...(backend === undefined ? {} : { backend }),
    signal: stopOnSignals().signal,
    out: (line) => process.stdout.write(`${line}\n`),
  });
}

/**
 * The recipe of `rxrl run|trainer|worker|config <recipe> [--set k=v]… [--steps N] [--seed N]` (a file, or
 * `rxrl:<name>` for one shipped in the package), resolved and validated: the recipe's paths relative to its directory, `--set` paths relative to the working directory; the step
 * budget and the seed of `--steps`/`--seed`, else of `RXRL_STEPS`/`RXRL_SEED`, win over the recipe and `--set`.
 */
async function resolvedConfig(args: ParsedCommand): Promise<{ config: import('../lib/config/schema.js').RxrlConfig; dir: string }> {
  const { loadConfig } = await import('../lib/config/schema.js');
  const { recipeDir } = await import('../pipelines/parts/data.js');
  const { basename, extname, resolve } = await import('node:path');
  const { recipeFile } = await import('./bundled.js');
  const file = recipeFile(args.positionals[0]);
  const set = (args.values.set as string[] | undefined) ?? [];
  const steps = integer(setting(args, 'steps', 'RXRL_STEPS'));
  const seed = integer(setting(args, 'seed', 'RXRL_SEED'));
  const overrides = [...(steps === undefined ? [] : [`run.steps=${steps}`]), ...(seed === undefined ? [] : [`run.seed=${seed}`])];
  const config = loadConfig({ file, set: [...set, ...overrides] });
  const dir = recipeDir(file);
  if (config.run.dir === null) config.run.dir = resolve('runs', basename(file, extname(file)));
  return { config, dir };
}

async function configCommand(args: ParsedCommand): Promise<number> {
  const { describeConfig } = await import('../lib/config/schema.js');
  const { config } = await resolvedConfig(args);
  process.stdout.write(`${describeConfig(config)}\n`);
  return 0;
}

/** The Kafka client and topics of a recipe's `kafka` section. */
async function kafkaOf(config: import('../lib/config/schema.js').RxrlConfig, clientId: string) {
  const { createKafka } = await import('../lib/kafka/client.js');
  const { kafkaTopics } = await import('../lib/kafka/types.js');
  const topics = kafkaTopics(config.kafka.topicPrefix);
  const { url, timeoutMs } = config.kafka.schemaRegistry;
  let encoders: import('../lib/kafka/types.js').RecordEncoders | undefined;
  if (url !== null) {
    const { registerRecordSchemas } = await import('../lib/kafka/schemaRegistry.js');
    const registered = await registerRecordSchemas({ url, timeoutMs }, topics);
    encoders = registered.encoders;
    process.stderr.write(`rxrl: records in the schema registry's wire format (schema ids ${JSON.stringify(registered.ids)})\n`);
  }
  return {
    kafka: createKafka(config.kafka.brokers, { clientId: `${config.kafka.clientId}-${clientId}` }),
    topics,
    ...(encoders ? { encoders } : {}),
  };
}

/** `rxrl run` (embedded rollouts) and `rxrl trainer` (rollouts by `rxrl worker` processes over Kafka). */
async function runCommand(args: ParsedCommand, overKafka = false): Promise<number> {
  const { resolve } = await import('node:path');
  const { config, dir } = await resolvedConfig(args);
  const kafka = overKafka
    ? {
        ...(await kafkaOf(config, 'trainer')),
        weightsDir: config.kafka.weightsDir === null ? resolve(dir, config.run.dir!, 'weights') : resolve(dir, config.kafka.weightsDir),
      }
    : undefined;
  const { activityTracker } = await import('../pipelines/run.js');
  const activity = activityTracker(config);
  let last: import('../lib/train/types.js').StepResult | undefined;
  const status = await statusServer(args, activity, () => ({
    step: last === undefined ? 0 : last.step + 1,
    steps: config.run.steps,
    mode: config.sync.mode,
    metrics: last?.metrics,
  }));
  if (status) process.stderr.write(`rxrl: status on ${status.url}/status and ${status.url}/metrics\n`);
  try {
    if (config.agents.environment !== 'none') return await agentsCommand(config, dir, kafka, { activity, onStep: (step) => (last = step) });
    return await trainCommand(config, dir, kafka, { activity, onStep: (step) => (last = step) });
  } finally {
    await status?.close();
  }
}

/** The training of `rxrl run|trainer` for a single-policy recipe: a progress line, one summary line. */
async function trainCommand(
  config: import('../lib/config/schema.js').RxrlConfig,
  dir: string,
  kafka: import('../pipelines/run.js').KafkaTransport | undefined,
  watched: WatchedRun,
): Promise<number> {
  const { runTraining } = await import('../pipelines/run.js');
  const { Progress } = await import('../lib/observe/progress.js');
  const { activity } = watched;
  const progress = new Progress({
    ...(config.run.steps > 0 ? { total: config.run.steps } : {}),
    stalls: () => activity.snapshot().stalled,
  });
  const { createLogger } = await import('../lib/observe/logger.js');
  const logger = createLogger({ level: config.logging.level });
  const { moduleLogger } = await import('../lib/observe/logger.js');
  const kafkaLog = moduleLogger(logger, 'kafka');
  const controller = stopOnSignals();
  const summary = await runTraining(config, {
    baseDir: dir,
    signal: controller.signal,
    logger,
    activity,
    log: (line) => progress.message(`rxrl: ${line}`),
    onStep: (step, elapsed) => {
      watched.onStep(step);
      progress.update(step, elapsed);
    },
    ...(kafka ? { kafka: { ...kafka, onEvent: (event) => kafkaLog.debug({ event: event.type, ...event.payload }, event.type) } } : {}),
  });
  progress.done();
  const { lastStep: _last, ...printed } = summary;
  process.stdout.write(`${JSON.stringify(printed)}\n`);
  return 0;
}

/** What a training command shares with its status server: the tracker, and each step as it ends. */
interface WatchedRun {
  readonly activity: import('../lib/observe/activity.js').ActivityTracker;
  readonly onStep: (step: import('../lib/train/types.js').StepResult) => void;
}

/** The status server of `--status-port N [--status-host H]`, when asked for. */
async function statusServer(
  args: ParsedCommand,
  tracker: import('../lib/observe/activity.js').ActivityTracker,
  info: () => import('../lib/observe/status.js').RunInfo,
): Promise<import('../lib/observe/status.js').StatusServer | undefined> {
  const statusPort = port(setting(args, 'status-port'));
  if (statusPort === undefined) return undefined;
  const { serveStatus } = await import('../lib/observe/status.js');
  return serveStatus({ tracker, info, port: statusPort, host: text(args, 'status-host') });
}

/**
 * `rxrl status <url> [--json] [--timeout-ms N]`: a running training's status, as tables (or the JSON document), read
 * within a deadline and a size bound; SIGINT/SIGTERM end the wait. What is printed holds no escape sequence.
 */
async function statusCommand(args: ParsedCommand): Promise<number> {
  const { fetchStatus, formatStatus } = await import('../lib/observe/status.js');
  const { printable } = await import('../lib/observe/terminal.js');
  const timeoutMs = integer(setting(args, 'timeout-ms'));
  const status = await fetchStatus(args.positionals[0], { signal: stopOnSignals().signal, timeoutMs });
  process.stdout.write(printable(args.values.json === true ? `${JSON.stringify(status)}\n` : formatStatus(status)));
  return 0;
}

/** The signal that asked for a graceful stop, once one did. */
let stoppedBy: 'SIGINT' | 'SIGTERM' | undefined;

/** An abort controller that SIGINT or SIGTERM fires: a graceful stop. */
function stopOnSignals(): AbortController {
  const controller = new AbortController();
  const stop = (signal: 'SIGINT' | 'SIGTERM'): void => {
    stoppedBy = signal;
    controller.abort();
  };
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
  return controller;
}

/** `rxrl run` or `rxrl trainer` of a multi-agent recipe (`agents.environment` set): every policy's steps, one summary line. */
async function agentsCommand(
  config: import('../lib/config/schema.js').RxrlConfig,
  dir: string,
  kafka: import('../pipelines/run.js').KafkaTransport | undefined,
  watched: WatchedRun,
): Promise<number> {
  const { runAgents } = await import('../pipelines/agents.js');
  const { Progress } = await import('../lib/observe/progress.js');
  const progress = new Progress({
    ...(config.run.steps > 0 ? { total: config.run.steps } : {}),
    perPolicy: true,
    stalls: () => watched.activity.snapshot().stalled,
  });
  const controller = stopOnSignals();
  const summary = await runAgents(config, {
    baseDir: dir,
    signal: controller.signal,
    activity: watched.activity,
    ...(kafka ? { kafka } : {}),
    log: (line) => progress.message(`rxrl: ${line}`),
    onStep: (step, elapsed) => {
      watched.onStep(step);
      progress.update(step, elapsed);
    },
  });
  progress.done();
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  return 0;
}

/** `rxrl worker <recipe>`: rolls out the tasks of the recipe's Kafka run until it ends. */
async function workerCommand(args: ParsedCommand): Promise<number> {
  const { runWorker } = await import('../pipelines/run.js');
  const { config, dir } = await resolvedConfig(args);
  const { createLogger, moduleLogger } = await import('../lib/observe/logger.js');
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
      if (r.outcome === 'rolled-out')
        process.stderr.write(`rxrl: task ${r.taskId} (${r.trajectories} trajectories, v${r.policyVersion})\n`);
    },
  });
  process.stdout.write(`${JSON.stringify(summary)}\n`);
  return 0;
}

/** `rxrl report <run-dir> [--out FILE]`: writes the HTML report of a run and prints its path. */
async function reportCommand(args: ParsedCommand): Promise<number> {
  const { writeReport } = await import('../lib/observe/report.js');
  const out = text(args, 'out');
  const path = await writeReport(args.positionals[0], out === undefined ? {} : { out });
  process.stdout.write(`${path}\n`);
  return 0;
}

/** `rxrl recipes`: the bundled recipes, one line each. */
async function recipesCommand(): Promise<number> {
  const { describeBundledRecipes } = await import('./bundled.js');
  process.stdout.write(describeBundledRecipes());
  return 0;
}

/** `rxrl init [name] [--out FILE]`: copies a bundled recipe into the working directory and says how to run it. */
async function initCommand(args: ParsedCommand): Promise<number> {
  const { DEFAULT_INIT_FILE, DEFAULT_INIT_RECIPE, initRecipe } = await import('./bundled.js');
  const out = text(args, 'out') ?? DEFAULT_INIT_FILE;
  const path = initRecipe(args.positionals[0] ?? DEFAULT_INIT_RECIPE, out);
  process.stdout.write(`${path}\n`);
  process.stderr.write(`rxrl: wrote ${out}; train it with: npx rxrl run ${out}\n`);
  return 0;
}

/** Each command's body, given its parsed arguments. */
const RUNNERS: Readonly<Record<CommandName, (args: ParsedCommand) => Promise<number>>> = {
  start,
  serve: serveCommand,
  tinker: tinkerCommand,
  run: (args) => runCommand(args),
  trainer: (args) => runCommand(args, true),
  worker: workerCommand,
  config: configCommand,
  report: reportCommand,
  status: statusCommand,
  recipes: recipesCommand,
  init: initCommand,
};

/**
 * Runs `rxrl <command> …`: `-h`/`--help` prints the command's usage (exit 0); a malformed command line (an unknown
 * command or flag, a flag without its value or with a malformed one, a missing or extra argument) throws a
 * {@link UsageError} (exit 2); a configuration or run failure, any other error (exit 1).
 */
async function main(argv: readonly string[]): Promise<number> {
  const [command, ...rest] = argv;
  if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
    const topic = rest[0];
    process.stdout.write(command === 'help' && topic !== undefined && isCommandName(topic) ? commandHelp(COMMANDS[topic]) : generalHelp());
    return 0;
  }
  if (!isCommandName(command)) throw new UsageError(`unknown command '${command}' (see rxrl --help)`, { context: { command } });
  const args = parseCommand(COMMANDS[command], rest);
  if (args.help) {
    process.stdout.write(commandHelp(COMMANDS[command]));
    return 0;
  }
  try {
    return await RUNNERS[command](args);
  } catch (error) {
    // A malformed flag value found while the command reads its flags: named with the command, as the parser does.
    if (isUsageError(error) && error.context.command === undefined) throw usageError(COMMANDS[command], error.message, error);
    throw error;
  }
}

/**
 * What the user reads of an error: its name and message, never a stack trace (an unexpected error says so, and
 * `RXRL_DEBUG=1` prints its stack for a bug report).
 */
function errorLine(error: unknown): string {
  if (isRxrlError(error)) return `${error.name}: ${error.message}`;
  if (!(error instanceof Error)) return `unexpected error: ${String(error)}`;
  if (process.env.RXRL_DEBUG === '1') return `unexpected ${error.stack ?? error.message}`;
  return `unexpected ${error.name}: ${error.message} (a bug: RXRL_DEBUG=1 prints where it happened)`;
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error: unknown) => {
    // Stopped by a signal before the run could end gracefully (still setting up): the shell's code for that signal.
    if (stoppedBy !== undefined && isAbortError(error)) {
      process.stderr.write(`rxrl: stopped by ${stoppedBy}\n`);
      process.exitCode = stoppedBy === 'SIGINT' ? 130 : 143;
      return;
    }
    // A message may carry what a peer sent: no escape sequence reaches the terminal.
    process.stderr.write(`rxrl: ${printable(errorLine(error))}\n`);
    process.exitCode = isUsageError(error) ? 2 : 1;
  },
);
