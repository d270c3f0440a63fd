/**
 * The record `fromKafka` emits for a consumed message.
 *
 * @packageDocumentation
 */

import type { IHeaders, KafkaMessage } from 'kafkajs';

import type { KafkaRecord } from './types.js';

/**
 * A consumed record; key and headers are decoded on first access (most consumers never read them). Its first
 * `ack()` calls `done` (the offset's acknowledgement) and then `onAck`; later ones do nothing.
 */
export class DeliveredRecord<T> implements KafkaRecord<T> {
  private acked = false;
  private decodedHeaders: Record<string, string> | undefined;

  constructor(
    readonly value: T,
    readonly topic: string,
    readonly partition: number,
    private readonly message: KafkaMessage,
    private readonly done: () => void,
    private readonly onAck: () => void,
  ) {}

  get offset(): string {
    return this.message.offset;
  }

  get key(): string | undefined {
    return this.message.key === null ? undefined : this.message.key.toString('utf8');
  }

  get headers(): Readonly<Record<string, string>> {
    return (this.decodedHeaders ??= stringHeaders(this.message.headers));
  }

  get timestamp(): string {
    return this.message.timestamp;
  }

  ack(): void {
    if (this.acked) return;
    this.acked = true;
    this.done();
    this.onAck();
  }
}

/** Kafka headers as UTF-8 strings, the first value of a repeated header. */
export function stringHeaders(headers: IHeaders | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers ?? {})) {
    const first = Array.isArray(value) ? value[0] : value;
    if (first !== undefined) out[name] = first.toString();
  }
  return out;
}
