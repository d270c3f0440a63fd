/**
 * A run's activity tracker from its recipe, and the watch that turns a stalled module into a warning, a line of
 * `metrics.jsonl` (the report lists it) and, past `activity.stallFailSeconds` under `stop_on_error`, the end of the
 * run with a {@link StalledError}.
 *
 * @packageDocumentation
 */
import type { RxrlConfig } from '../../lib/config/schema.js';
import { ActivityTracker, watchStalls } from '../../lib/observe/activity.js';
import type { StalledError } from '../../lib/observe/errors.js';
import type { Logger } from '../../lib/observe/logger.js';
import { moduleLogger, silentLogger } from '../../lib/observe/logger.js';

/**
 * The activity tracker of a run of `config`: modules stall after `activity.stallSeconds`; a Kafka worker unheard of
 * for three heartbeat periods (`kafka.heartbeatMs`) is gone.
 *
 * @param config - the run's configuration.
 * @returns a new tracker.
 */
export function activityTracker(config: Pick<RxrlConfig, 'activity' | 'kafka'>): ActivityTracker {
  return new ActivityTracker({
    stallSeconds: config.activity.stallSeconds,
    ...(config.kafka.heartbeatMs > 0 ? { workerGoneMs: 3 * config.kafka.heartbeatMs } : {}),
  });
}

/** A run's watch over its stalls. */
export interface RunWatch {
  /** Aborts when a stall fails the run. */
  readonly signal: AbortSignal;
  /** The stall that failed the run. */
  readonly failure: () => StalledError | undefined;
  /** Stops watching. */
  stop(): void;
}

/**
 * Watches `activity` for the run: each stall is a warning (`logger`, `log`) and is passed to `onStall`; under
 * `stop_on_error` a module stalled `activity.stallFailSeconds` aborts the watch's signal.
 *
 * @param config - the run's configuration.
 * @param activity - the run's tracker.
 * @param out - the run's logger and informational lines, and where each stall is recorded.
 */
export function watchRun(
  config: Pick<RxrlConfig, 'activity' | 'run'>,
  activity: ActivityTracker,
  out: {
    readonly logger?: Logger | undefined;
    readonly log?: ((line: string) => void) | undefined;
    readonly onStall?: ((module: string, idleSeconds: number) => void) | undefined;
  },
): RunWatch {
  const controller = new AbortController();
  const log = moduleLogger(out.logger ?? silentLogger, 'activity');
  let failure: StalledError | undefined;
  const stop = watchStalls(activity, {
    failSeconds: config.run.errorPolicy === 'stop_on_error' ? config.activity.stallFailSeconds : 0,
    intervalMs: Math.min(1000, config.activity.stallSeconds * 250),
    onStall: (module, state) => {
      const idle = Math.round(state.idleSeconds);
      log.warn({ module, inFlight: state.inFlight, idleSeconds: state.idleSeconds }, 'module stalled');
      out.log?.(`warning: ${module} stalled: ${state.inFlight} in flight and nothing ended for ${idle} s`);
      out.onStall?.(module, state.idleSeconds);
    },
    onRecover: (module) => {
      log.info({ module }, 'module moves again');
      out.log?.(`${module} moves again`);
    },
    onFail: (error) => {
      log.error({ err: error }, 'stalled: the run stops');
      failure = error;
      controller.abort(error);
    },
  });
  return { signal: controller.signal, failure: () => failure, stop };
}
