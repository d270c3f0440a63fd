/** Weight versions across processes: WeightsPublisher → weights topic (real broker) → WeightsFollower. */
import { execFileSync, spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { hostname, tmpdir } from 'node:os';
import { join } from 'node:path';

import type { Kafka, Producer } from 'kafkajs';
import { firstValueFrom, filter } from 'rxjs';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';

import { AbortError, ConfigError } from '../../lib/core/errors.js';
import { LocalEngine } from '../../lib/engine/local.js';
import { createProducer } from '../../lib/kafka/client.js';
import { decodeWeightsMessage, encodeWeightsMessage } from '../../lib/kafka/codec.js';
import type { WeightsVersionMessage } from '../../lib/kafka/types.js';
import { WeightsFollower, WeightsPublisher, type WeightsFollowerEvent } from '../../lib/kafka/weights.js';
import { WEIGHTS_RUN_MARKER, type WeightsCleanup } from '../../lib/kafka/weightsCleanup.js';
import { initBackend } from '../../lib/model/backend.js';
import { readModelDir } from '../../lib/model/modelDir.js';
import { CharTokenizer } from '../../lib/model/tokenizer.js';
import { PolicyModel, validatePolicyConfig, type PolicyConfig } from '../../lib/model/transformer.js';
import { fromKafka } from '../../operators/fromKafka.js';
import { createTopic, kafkaClient, readMessages, uniqueName } from './helpers.js';

const tokenizer = new CharTokenizer('ab');
const config: PolicyConfig = { vocabSize: tokenizer.vocabSize, dModel: 8, nLayers: 1, nHeads: 2, dFF: 16, maxSeqLen: 8 };

let kafka: Kafka;
let producer: Producer;
let model: PolicyModel;
const cleanups: (() => void)[] = [];

beforeAll(async () => {
  await initBackend('cpu', { logger: { info: () => undefined } });
  kafka = kafkaClient('rxrl-weights-spec');
  producer = createProducer(kafka);
  await producer.connect();
  model = PolicyModel.create(config, 1);
});

afterEach(() => {
  for (const cleanup of cleanups.splice(0)) cleanup();
});

afterAll(async () => {
  model?.dispose();
  await producer?.disconnect();
});

async function setup(run = 'run-a'): Promise<{ topic: string; dir: string; publisher: WeightsPublisher }> {
  const topic = uniqueName('weights');
  await createTopic(kafka, topic, 1);
  const dir = mkdtempSync(join(tmpdir(), 'rxrl-weights-spec-'));
  const publisher = new WeightsPublisher({ producer, topic, dir, run, modelTag: 'policy', policyConfig: config });
  return { topic, dir, publisher };
}

function follow(
  topic: string,
  options: { vocab?: CharTokenizer; loadAttempts?: number; root?: string; signal?: AbortSignal } = {},
): WeightsFollower {
  const closings: Promise<void>[] = [];
  const follower = new WeightsFollower(
    fromKafka(kafka, {
      groupId: uniqueName('follower'),
      topics: [topic],
      decode: decodeWeightsMessage,
      onClosed: (c) => void closings.push(c.catch(() => undefined)),
    }),
    {
      tokenizer: options.vocab ?? tokenizer,
      loadAttempts: options.loadAttempts,
      ...(options.root === undefined ? {} : { root: options.root }),
      signal: options.signal,
    },
  );
  cleanups.push(() => follower.close());
  follower.start();
  return follower;
}

describe('WeightsPublisher', () => {
  it('writes each version as a model directory and announces it; keeps the newest 3', async () => {
    const { topic, dir, publisher } = await setup();
    const announced = [];
    for (let v = 0; v < 5; v++) announced.push(await publisher.publish(v, model.getWeights()));
    await publisher.end(4);
    expect(announced.map((a) => a.version)).toEqual([0, 1, 2, 3, 4]);
    expect(readdirSync(join(dir, 'run-a', 'policy')).sort()).toEqual(['v2', 'v3', 'v4']);
    const { weights, metadata, config: read } = await readModelDir(announced[4].path);
    expect(read).toEqual(validatePolicyConfig(config));
    expect(metadata['rxrl.version']).toBe('4');
    expect([...weights.keys()]).toEqual([...model.getWeights().keys()]);
    const messages = (await readMessages(kafka, topic, 6)).map((m) => decodeWeightsMessage(m.value!));
    expect(messages.map((m) => `${m.kind}:${m.version}`)).toEqual([
      'version:0',
      'version:1',
      'version:2',
      'version:3',
      'version:4',
      'end:4',
    ]);
    expect(messages[4]).toMatchObject({ kind: 'version', run: 'run-a', path: announced[4].path, sha256: announced[4].sha256 });
  });
});

describe('WeightsPublisher cleans old weights', () => {
  it("a restarted trainer removes ended trainers' runs after its first announcement, and nothing that is not rxrl's", async () => {
    const { topic, dir } = await setup();
    const old = new WeightsPublisher({ producer, topic, dir, run: 'run-old', modelTag: 'policy', policyConfig: config, keepVersions: 2 });
    for (let v = 0; v < 5; v++) await old.publish(v, model.getWeights());
    expect(readdirSync(join(dir, 'run-old', 'policy')).sort()).toEqual(['v3', 'v4']);
    // The old trainer process is gone (killed): its marker names a pid that no longer runs.
    const dead = spawnSync(process.execPath, ['-e', '0']).pid;
    const marker = (pid: number, host = hostname()): string => JSON.stringify({ run: 'x', pid, host });
    writeFileSync(join(dir, 'run-old', WEIGHTS_RUN_MARKER), marker(dead));
    // What is not an ended rxrl run stays: another tool's directory and file, a live trainer's run, another host's
    // run, and a link to a directory outside (with a dead marker) that must not be followed.
    mkdirSync(join(dir, 'foreign'));
    writeFileSync(join(dir, 'foreign', 'model.safetensors'), 'x');
    writeFileSync(join(dir, 'notes.txt'), 'x');
    mkdirSync(join(dir, 'run-alive'));
    writeFileSync(join(dir, 'run-alive', WEIGHTS_RUN_MARKER), marker(process.pid));
    mkdirSync(join(dir, 'run-elsewhere'));
    writeFileSync(join(dir, 'run-elsewhere', WEIGHTS_RUN_MARKER), marker(dead, 'another-host'));
    const outside = mkdtempSync(join(tmpdir(), 'rxrl-weights-outside-'));
    cleanups.push(() => rmSync(outside, { recursive: true, force: true }));
    writeFileSync(join(outside, WEIGHTS_RUN_MARKER), marker(dead));
    symlinkSync(outside, join(dir, 'run-linked'));

    const cleaned: WeightsCleanup[] = [];
    const restarted = new WeightsPublisher({
      producer,
      topic,
      dir,
      run: 'run-new',
      modelTag: 'policy',
      policyConfig: config,
      keepVersions: 2,
      onCleanup: (c) => cleaned.push(c),
    });
    await restarted.publish(5, model.getWeights());
    expect(cleaned).toHaveLength(1);
    expect(cleaned[0].removed).toEqual([join(dir, 'run-old')]);
    expect(cleaned[0].kept.map((k) => k.path).sort()).toEqual([join(dir, 'run-alive'), join(dir, 'run-elsewhere')]);
    expect(readdirSync(dir).sort()).toEqual(['foreign', 'notes.txt', 'run-alive', 'run-elsewhere', 'run-linked', 'run-new']);
    expect(existsSync(join(outside, WEIGHTS_RUN_MARKER))).toBe(true);
    for (let v = 6; v < 9; v++) await restarted.publish(v, model.getWeights());
    expect(readdirSync(join(dir, 'run-new', 'policy')).sort()).toEqual(['v7', 'v8']);
    expect(cleaned).toHaveLength(1); // once per run
  });
});

describe('WeightsFollower', () => {
  it('builds its engine from the first file alone and loads each newer version; waitFor gates on the version', async () => {
    const { topic, publisher } = await setup();
    await publisher.publish(0, model.getWeights());
    const follower = follow(topic);
    const engine = await follower.waitFor('run-a', 0);
    expect(engine?.version).toBe(0);
    expect(engine?.tokenizer).toBe(tokenizer);
    let resolved = false;
    const later = follower.waitFor('run-a', 2).then((e) => ((resolved = true), e));
    await publisher.publish(1, model.getWeights());
    await new Promise((r) => setTimeout(r, 300));
    expect(resolved).toBe(false);
    await publisher.publish(2, model.getWeights());
    expect(await later).toBe(engine); // the same engine, now holding version 2
    expect(engine?.version).toBe(2);
  });

  it("several policies of one run: one engine each, waitForAll gates on every policy's version", async () => {
    const { topic, dir, publisher: writer } = await setup();
    const editor = new WeightsPublisher({ producer, topic, dir, run: 'run-a', modelTag: 'editor', policyConfig: config });
    const other = PolicyModel.create(config, 2);
    await writer.publish(0, model.getWeights());
    await editor.publish(0, other.getWeights());
    const follower = follow(topic);
    const engines = await follower.waitForAll('run-a', 0, ['policy', 'editor']);
    expect([...(engines?.keys() ?? [])].sort()).toEqual(['editor', 'policy']);
    expect(engines?.get('editor')?.modelTag).toBe('editor');
    expect(engines?.get('editor')).not.toBe(engines?.get('policy'));
    // Version 1 of only one policy does not satisfy a wait for both.
    let resolved = false;
    const later = follower.waitForAll('run-a', 1, ['policy', 'editor']).then((e) => ((resolved = true), e));
    await writer.publish(1, model.getWeights());
    await new Promise((r) => setTimeout(r, 300));
    expect(resolved).toBe(false);
    await editor.publish(1, other.getWeights());
    const both = await later;
    expect(both?.get('policy')?.version).toBe(1);
    expect(both?.get('editor')?.version).toBe(1);
    expect(readdirSync(join(dir, 'run-a')).sort()).toEqual([WEIGHTS_RUN_MARKER, 'editor', 'policy']);
    const ended = firstValueFrom(follower.events.pipe(filter((e) => e.type === 'end')));
    await writer.end(1);
    await ended;
    expect(await follower.waitForAll('run-a', 0, ['editor'])).toBeUndefined();
    other.dispose();
  });

  it('coalesces announcements that arrive during a load: the newest wins', async () => {
    const { topic, publisher } = await setup();
    for (let v = 0; v < 6; v++) await publisher.publish(v, model.getWeights());
    const follower = follow(topic);
    const loaded: number[] = [];
    follower.events.pipe(filter((e) => e.type === 'loaded')).subscribe((e) => loaded.push(e.type === 'loaded' ? e.version : -1));
    const engine = await follower.waitFor('run-a', 5);
    expect(engine?.version).toBe(5);
    expect(loaded.at(-1)).toBe(5);
    expect(loaded.length).toBeLessThan(6); // versions whose files were already replaced were skipped
  });

  it('the end of the followed run resolves pending waits with undefined and is reported', async () => {
    const { topic, publisher } = await setup();
    await publisher.publish(0, model.getWeights());
    const follower = follow(topic);
    await follower.waitFor('run-a', 0);
    const ended = firstValueFrom(follower.events.pipe(filter((e) => e.type === 'end')));
    const waiting = follower.waitFor('run-a', 7);
    await publisher.end(0);
    expect(await waiting).toBeUndefined();
    expect(await ended).toMatchObject({ type: 'end', message: { run: 'run-a', version: 0 } });
    expect(await follower.waitFor('run-a', 0)).toBeUndefined();
  });

  it('a newer run supersedes the old one: its tasks are over, the new run gets a fresh engine', async () => {
    const { topic, dir, publisher } = await setup('run-old');
    await publisher.publish(0, model.getWeights());
    const follower = follow(topic);
    const old = await follower.waitFor('run-old', 0);
    const next = new WeightsPublisher({ producer, topic, dir, run: 'run-new', modelTag: 'policy', policyConfig: config });
    await next.publish(0, model.getWeights());
    const fresh = await follower.waitFor('run-new', 0);
    expect(fresh).toBeDefined();
    expect(fresh).not.toBe(old);
    expect(await follower.waitFor('run-old', 0)).toBeUndefined();
  });

  it('refuses an announced file that never matches its announcement, and loads the next version', async () => {
    const { topic, publisher } = await setup();
    const v0 = await publisher.publish(0, model.getWeights());
    writeFileSync(join(v0.path, 'model.safetensors'), Buffer.alloc(v0.bytes)); // same size, wrong contents
    const follower = follow(topic, { loadAttempts: 3 });
    const refused = firstValueFrom(follower.events.pipe(filter((e) => e.type === 'refused')));
    expect(await refused).toMatchObject({ version: 0, reason: expect.stringMatching(/does not match the announced size and SHA-256/) });
    expect(existsSync(v0.path)).toBe(true);
    expect(follower.current).toBeUndefined();
    await publisher.publish(1, model.getWeights());
    expect((await follower.waitFor('run-a', 0))?.version).toBe(1);
  });

  it('rejects a model whose vocabulary does not fit the worker tokenizer', async () => {
    const { topic, publisher } = await setup();
    await publisher.publish(0, model.getWeights());
    const follower = follow(topic, { vocab: new CharTokenizer('abc') });
    await expect(follower.waitFor('run-a', 0)).rejects.toBeInstanceOf(ConfigError);
  });

  it("a load waiting for the engine's running generation ends at once when the worker's signal fires, and loads nothing", async () => {
    const { topic, publisher } = await setup();
    await publisher.publish(0, model.getWeights());
    const stop = new AbortController();
    const follower = follow(topic, { signal: stop.signal });
    const engine = (await follower.waitFor('run-a', 0)) as LocalEngine;
    // The engine's generation runs until the spec releases it (a long rollout): only the signal can end the load's wait.
    const generate = PolicyModel.prototype.generate;
    let release: () => void = () => undefined;
    let started: () => void = () => undefined;
    const running = new Promise<void>((resolve) => (started = resolve));
    vi.spyOn(PolicyModel.prototype, 'generate').mockImplementationOnce(async function (this: PolicyModel, requests, options) {
      started();
      await new Promise<void>((resolve) => (release = resolve));
      return generate.call(this, requests, options);
    });
    const loads = vi.spyOn(LocalEngine.prototype, 'loadWeights');
    cleanups.push(() => vi.restoreAllMocks());
    const first = engine.generate([{ promptTokens: [1, 2], maxTokens: 1 }]);
    await running;
    const loaded: WeightsFollowerEvent[] = [];
    follower.events.subscribe((e) => void (e.type === 'end' ? undefined : loaded.push(e)));
    await publisher.publish(1, model.getWeights());
    await vi.waitFor(() => expect(loads).toHaveBeenCalled(), { timeout: 60_000, interval: 20 });
    const load = loads.mock.results[0].value as Promise<void>;
    stop.abort();
    // Ended within the turn of the event loop the signal fired in, while the generation still runs.
    const ended = await Promise.race([
      load.then(
        () => 'loaded',
        (e: unknown) => e,
      ),
      new Promise((r) => setImmediate(() => r('still waiting'))),
    ]);
    expect(ended).toBeInstanceOf(AbortError);
    release();
    expect((await first)[0].policyVersion).toBe(0);
    await Promise.allSettled([load]);
    // Dropped, not refused: the engine keeps version 0, and the follower reports nothing of version 1.
    expect(engine.version).toBe(0);
    expect(loaded).toEqual([]);
  });

  it('waits are cancelled by their signal', async () => {
    const { topic } = await setup();
    const follower = follow(topic);
    const controller = new AbortController();
    const waiting = follower.waitFor('run-a', 0, controller.signal);
    controller.abort(new Error('stop'));
    await expect(waiting).rejects.toThrow('stop');
  });
});

describe('WeightsFollower on a poisoned weights topic', () => {
  /** Announces a forged version of `run-a` whose path and sizes the sender chose. */
  async function forge(topic: string, announced: Omit<WeightsVersionMessage, 'kind' | 'run' | 'modelTag' | 'timestamp'>): Promise<void> {
    const message: WeightsVersionMessage = { kind: 'version', run: 'run-a', modelTag: 'policy', timestamp: Date.now(), ...announced };
    await producer.send({ topic, messages: [{ key: 'run-a', value: Buffer.from(encodeWeightsMessage(message)) }] });
  }

  it('refuses FIFOs, devices, links out of the root, oversized and mis-sized files unread, and keeps serving its version', async () => {
    const { topic, dir, publisher } = await setup();
    const v0 = await publisher.publish(0, model.getWeights());
    const follower = follow(topic, { root: dir, loadAttempts: 2 });
    const engine = await follower.waitFor('run-a', 0);
    const refusals: WeightsFollowerEvent[] = [];
    follower.events.subscribe((e) => e.type === 'refused' && refusals.push(e));
    /** A copy of v0 inside the root whose weights file is replaced by `make`. */
    const poisoned = (name: string, make: (file: string) => void): string => {
      const path = join(dir, name);
      cpSync(v0.path, path, { recursive: true });
      rmSync(join(path, 'model.safetensors'));
      make(join(path, 'model.safetensors'));
      return path;
    };
    const outside = mkdtempSync(join(tmpdir(), 'rxrl-weights-outside-'));
    cleanups.push(() => rmSync(outside, { recursive: true, force: true }));
    cpSync(v0.path, join(outside, 'v9'), { recursive: true });
    const cases: [string, Omit<WeightsVersionMessage, 'kind' | 'run' | 'modelTag' | 'timestamp'>, RegExp][] = [
      [
        'fifo',
        { version: 1, path: poisoned('fifo', (f) => execFileSync('mkfifo', [f])), bytes: v0.bytes, sha256: v0.sha256 },
        /not a regular file/,
      ],
      [
        '/dev/zero',
        { version: 2, path: poisoned('zero', (f) => symlinkSync('/dev/zero', f)), bytes: v0.bytes, sha256: v0.sha256 },
        /is not readable inside/,
      ],
      ['outside', { version: 3, path: join(outside, 'v9'), bytes: v0.bytes, sha256: v0.sha256 }, /is not readable inside/],
      [
        'link out',
        {
          version: 4,
          path: poisoned('link', (f) => symlinkSync(join(outside, 'v9', 'model.safetensors'), f)),
          bytes: v0.bytes,
          sha256: v0.sha256,
        },
        /is not readable inside/,
      ],
      ['huge claim', { version: 5, path: v0.path, bytes: 2 ** 40, sha256: v0.sha256 }, /more than the \d+ its architecture allows/],
      [
        'larger than announced',
        { version: 6, path: poisoned('big', (f) => writeFileSync(f, Buffer.alloc(v0.bytes + 1))), bytes: v0.bytes, sha256: v0.sha256 },
        /more than the \d+ allowed/,
      ],
    ];
    for (const [what, announced, reason] of cases) {
      const refused = firstValueFrom(follower.events.pipe(filter((e) => e.type === 'refused' && e.version === announced.version)));
      await forge(topic, announced);
      expect(await refused, what).toMatchObject({ type: 'refused', reason: expect.stringMatching(reason) });
      expect(follower.current?.version, what).toBe(0);
    }
    expect(refusals).toHaveLength(cases.length);
    // The engine still serves version 0, and the trainer's next version loads as usual (lower than the forged ones).
    expect(engine?.version).toBe(0);
    const v1 = await publisher.publish(1, model.getWeights());
    expect((await follower.waitFor('run-a', 1))?.version).toBe(1);
    expect(v1.path.startsWith(dir)).toBe(true);
  });
});
