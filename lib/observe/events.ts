/**
 * Instrumentation events: what happened in a run, as typed messages in one envelope
 * `{ id, type, timestamp, payload }` with namespaced types (`trainer.step`, `rollout.failure`, …).
 *
 * {@link Instrumentation} is a thin typed wrapper around an RxJS `Subject`: modules `emit`, observers
 * subscribe to `events$`, filter with `ofType`, or register a plain callback with `on`. A callback that throws
 * is logged and does not disturb the emitter or the other observers.
 *
 * New event types are added by declaration merging on {@link RxrlEventMap}.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';
import { Subject, filter, type Observable } from 'rxjs';
import type { Metrics, PolicyVersion } from '../core/types.js';
import type { Logger } from './logger.js';
import { silentLogger } from './logger.js';

/** A plain, serializable description of an error (for payloads and logs). */
export interface ErrorInfo {
  /** The error's `name` (`EngineError`, `TypeError`, …), or `NonError` for a thrown non-error value. */
  readonly name: string;
  /** The error's message. */
  readonly message: string;
  /** The `retriable` flag of an rxrl error; `false` otherwise. */
  readonly retriable: boolean;
  /** The `context` of an rxrl error, when it has one. */
  readonly context?: Readonly<Record<string, unknown>>;
}

/** Payload of every event type, by type. Extend it by declaration merging to add types. */
export interface RxrlEventMap {
  /** A run started. */
  'run.started': { readonly runDir?: string; readonly mode?: string };
  /** A run ended: its step budget was reached, it was cancelled, or it failed. */
  'run.finished': { readonly steps: number; readonly reason: 'completed' | 'aborted' | 'failed' };
  /** One train step finished. */
  'trainer.step': {
    readonly step: number;
    readonly version: PolicyVersion;
    readonly skipped: boolean;
    readonly metrics: Metrics;
  };
  /** One rollout sample failed (the group shrinks; the run goes on). */
  'rollout.failure': { readonly taskId: string; readonly groupId?: string; readonly error: ErrorInfo };
  /** Every engine holds a new policy version. */
  'weights.published': { readonly version: PolicyVersion };
  /** A checkpoint was written. */
  'checkpoint.saved': { readonly step: number; readonly version: PolicyVersion; readonly path: string };
  /** A run resumed from a checkpoint. */
  'checkpoint.loaded': { readonly step: number; readonly version: PolicyVersion; readonly path: string };
  /** A validation pass finished (`val/`-prefixed metrics). */
  'validation.finished': { readonly version: PolicyVersion; readonly metrics: Metrics };
  /** An {@link ErrorReporter} received an error and decided what to do. */
  'error.reported': {
    readonly error: ErrorInfo;
    readonly action: 'stop' | 'continue' | 'ignore';
    readonly context: Readonly<Record<string, unknown>>;
  };
}

/** A namespaced event type (`module.what`). */
export type RxrlEventType = keyof RxrlEventMap & string;

/** The envelope of every event. */
export interface InstrumentationEvent<K extends RxrlEventType = RxrlEventType> {
  /** Unique id of this event. */
  readonly id: string;
  /** Namespaced type. */
  readonly type: K;
  /** When it was emitted, in ms since the epoch. */
  readonly timestamp: number;
  /** What happened. */
  readonly payload: RxrlEventMap[K];
}

/** Any event, discriminated by `type`. */
export type AnyInstrumentationEvent = { [K in RxrlEventType]: InstrumentationEvent<K> }[RxrlEventType];

/** Options of {@link Instrumentation}. */
export interface InstrumentationOptions {
  /** Clock for `timestamp`. Default `Date.now`. */
  readonly now?: () => number;
  /** Id generator. Default `crypto.randomUUID`. */
  readonly newId?: () => string;
  /** Where failing listeners are reported. Default {@link silentLogger}. */
  readonly logger?: Logger;
}

/**
 * A typed event bus of {@link InstrumentationEvent}s.
 *
 * @example
 * ```ts
 * import { Instrumentation } from 'rxrl';
 * const events = new Instrumentation();
 * const off = events.on('checkpoint.saved', (e) => console.log(e.payload.path));
 * events.emit('checkpoint.saved', { step: 9, version: 10, path: 'runs/a/global_step_10' });
 * off();
 * ```
 */
export class Instrumentation {
  private readonly subject = new Subject<AnyInstrumentationEvent>();
  private readonly now: () => number;
  private readonly newId: () => string;
  private readonly logger: Logger;

  /** Every event, in emission order. Completes on {@link Instrumentation.complete}. */
  readonly events$: Observable<AnyInstrumentationEvent> = this.subject.asObservable();

  /** @param options - clock, id generator and logger. */
  constructor(options: InstrumentationOptions = {}) {
    this.now = options.now ?? Date.now;
    this.newId = options.newId ?? randomUUID;
    this.logger = options.logger ?? silentLogger;
  }

  /**
   * Wraps `payload` in an envelope and delivers it to every observer, synchronously.
   *
   * @param type - namespaced event type.
   * @param payload - the payload of that type.
   * @returns the delivered envelope.
   */
  emit<K extends RxrlEventType>(type: K, payload: RxrlEventMap[K]): InstrumentationEvent<K> {
    const event: InstrumentationEvent<K> = { id: this.newId(), type, timestamp: this.now(), payload };
    this.subject.next(event as unknown as AnyInstrumentationEvent);
    return event;
  }

  /**
   * The events of the given types.
   *
   * @param types - one or more event types.
   * @returns an Observable of those events only.
   */
  ofType<K extends RxrlEventType>(...types: readonly K[]): Observable<InstrumentationEvent<K>> {
    const wanted = new Set<string>(types);
    return this.events$.pipe(filter((event): event is AnyInstrumentationEvent & InstrumentationEvent<K> => wanted.has(event.type)));
  }

  /**
   * Calls `listener` for each event of `type`. A listener that throws is logged (`warn`) and stays registered.
   *
   * @param type - event type.
   * @param listener - callback.
   * @returns a function that removes the listener.
   */
  on<K extends RxrlEventType>(type: K, listener: (event: InstrumentationEvent<K>) => void): () => void {
    const subscription = this.ofType(type).subscribe((event) => {
      try {
        listener(event);
      } catch (error) {
        this.logger.warn({ err: error, eventType: type, eventId: event.id }, 'instrumentation listener failed');
      }
    });
    return () => subscription.unsubscribe();
  }

  /** Completes `events$`; later `emit` calls deliver nothing. */
  complete(): void {
    this.subject.complete();
  }
}
