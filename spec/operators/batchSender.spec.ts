/** The sender behind toKafka, over hand-settled sends and a hand-run defer queue (no broker, no clock). */
import { describe, expect, it } from 'vitest';

import { BatchSender } from '../../operators/internal/batchSender.js';

function setup(options: { maxBatchSize?: number; capacity?: number; encode?: (item: number) => string } = {}) {
  const sends: { batch: readonly string[]; resolve: () => void; reject: (error: unknown) => void }[] = [];
  const deferred: (() => void)[] = [];
  const log: string[] = [];
  const encoded: number[] = [];
  const sender = new BatchSender<number, string>({
    encode:
      options.encode ??
      ((item) => {
        encoded.push(item);
        return `m${item}`;
      }),
    send: (batch) => new Promise<void>((resolve, reject) => sends.push({ batch, resolve, reject })),
    maxBatchSize: options.maxBatchSize ?? 3,
    capacity: options.capacity ?? 100,
    sent: (batch) => log.push(`sent ${batch.join(',')}`),
    error: (error) => log.push(`error ${String(error)}`),
    complete: () => log.push('complete'),
    defer: (callback) => deferred.push(callback),
  });
  const runDeferred = (): void => {
    for (const callback of deferred.splice(0)) callback();
  };
  return { sender, sends, deferred, runDeferred, log, encoded };
}

/** Lets the promise callbacks queued so far run. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await Promise.resolve();
};

describe('BatchSender', () => {
  it('sends the first item alone, gathers what arrives meanwhile into requests of at most maxBatchSize, in order', async () => {
    const { sender, sends, log } = setup({ maxBatchSize: 3 });
    sender.push(0);
    expect(sends.map((s) => s.batch)).toEqual([['m0']]);
    for (let i = 1; i <= 5; i++) sender.push(i);
    expect(sends.length).toBe(1); // one request in flight at a time
    expect(sender.waiting).toBe(5);
    sends[0].resolve();
    await settle();
    expect(sends.map((s) => s.batch)).toEqual([['m0'], ['m1', 'm2', 'm3']]);
    sends[1].resolve();
    await settle();
    expect(sends[2].batch).toEqual(['m4', 'm5']);
    sends[2].resolve();
    await settle();
    expect(log).toEqual(['sent m0', 'sent m1,m2,m3', 'sent m4,m5']);
    expect(sender.waiting).toBe(0);
  });

  it('encodes the next request while the previous one is in flight; later items wait for the one after', async () => {
    const { sender, sends, runDeferred, encoded } = setup({ maxBatchSize: 10 });
    sender.push(0);
    sender.push(1);
    sender.push(2);
    expect(encoded).toEqual([0]);
    runDeferred();
    expect(encoded).toEqual([0, 1, 2]); // prepared ahead
    sender.push(3);
    expect(sender.waiting).toBe(3);
    sends[0].resolve();
    await settle();
    expect(sends[1].batch).toEqual(['m1', 'm2']);
    runDeferred();
    sends[1].resolve();
    await settle();
    expect(sends[2].batch).toEqual(['m3']);
  });

  it('completes after the last request was sent, or at once when nothing waits', async () => {
    const { sender, sends, log } = setup();
    sender.push(0);
    sender.end();
    expect(log).toEqual([]);
    sends[0].resolve();
    await settle();
    expect(log).toEqual(['sent m0', 'complete']);

    const idle = setup();
    idle.sender.end();
    expect(idle.log).toEqual(['complete']);
  });

  it('a failed send fails the sender once: nothing more is sent, sent or completed', async () => {
    const { sender, sends, log } = setup();
    sender.push(0);
    sender.push(1);
    sender.end();
    sends[0].reject('boom');
    await settle();
    expect(log).toEqual(['error boom']);
    expect(sends.length).toBe(1);
    expect(sender.waiting).toBe(0);
    sender.push(2);
    expect(sends.length).toBe(1);
  });

  it('an item that cannot be encoded fails the sender before anything of its request is sent', () => {
    const { sender, sends, log } = setup({
      encode: (item) => {
        if (item === 1) throw new Error('unencodable');
        return `m${item}`;
      },
    });
    sender.push(1);
    expect(log).toEqual(['error Error: unencodable']);
    expect(sends).toEqual([]);
  });

  it('refuses an item at the capacity (queued and prepared items count)', () => {
    const { sender, runDeferred } = setup({ capacity: 3, maxBatchSize: 2 });
    expect(sender.push(0)).toBe(true); // in flight: not waiting
    expect(sender.push(1)).toBe(true);
    expect(sender.push(2)).toBe(true);
    runDeferred(); // 1 and 2 prepared
    expect(sender.push(3)).toBe(true);
    expect(sender.waiting).toBe(3);
    expect(sender.push(4)).toBe(false);
    expect(sender.waiting).toBe(3);
  });

  it('after close(), a request in flight is reported neither as sent nor as failed', async () => {
    const { sender, sends, log } = setup();
    sender.push(0);
    sender.push(1);
    sender.end();
    sender.close();
    sends[0].resolve();
    await settle();
    expect(log).toEqual([]);
    expect(sends.length).toBe(1);
    expect(sender.waiting).toBe(0);

    const failing = setup();
    failing.sender.push(0);
    failing.sender.close();
    failing.sends[0].reject('late failure');
    await settle();
    expect(failing.log).toEqual([]);
  });
});
