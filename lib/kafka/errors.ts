/**
 * Typed errors of the Kafka bridge. Test them with `instanceof` or the predicates in `lib/core/errors.ts`
 * (`isRetriable`), never by message text.
 *
 * @packageDocumentation
 */
import { RxrlError, type RxrlErrorOptions } from '../core/errors.js';

/**
 * A Kafka client operation (send, commit, admin call, consumer crash) failed. Retriable when the kafkajs error
 * under it says so (`cause.retriable`), unless the options say otherwise.
 */
export class KafkaBridgeError extends RxrlError {
  override readonly name = 'KafkaBridgeError';

  constructor(message: string, options: RxrlErrorOptions = {}) {
    super(message, { ...options, retriable: options.retriable ?? causeIsRetriable(options.cause) });
  }
}

/** The local Kafka broker (tests, CI, examples) could not be fetched or started. Never retriable. */
export class BrokerStartError extends RxrlError {
  override readonly name = 'BrokerStartError';
}

/** True for errors of the Kafka bridge. */
export function isKafkaBridgeError(error: unknown): error is KafkaBridgeError {
  return error instanceof KafkaBridgeError;
}

/** True when `cause` (a kafkajs error) says it is retriable. */
export function causeIsRetriable(cause: unknown): boolean {
  return typeof cause === 'object' && cause !== null && (cause as { retriable?: unknown }).retriable === true;
}

/** A value breaks the message schema and cannot be encoded (for example a non-integer token id). Never retriable. */
export class EncodeError extends RxrlError {
  override readonly name = 'EncodeError';
}
