/**
 * Sampling in rxrl's Tinker service: samplers (a frozen copy of an adapter, or the base model, that batches the
 * requests waiting on it into generation turns), the bounded pool of open samplers, and the bounded store of
 * named sampler weights (`tinker://<model>/sampler_weights/<name>`).
 *
 * A sampler leaves the pool when a newer one pushes it out, but lives on — and keeps its weights — while requests
 * on it are pending; it is disposed when the last one settles.
 *
 * @packageDocumentation
 */
import { randomUUID } from 'node:crypto';

import type { GenerateRequest, GenerateResponse, NamedWeights } from '../model/types.js';
import { LORA_TARGETS, LoraAdapter } from '../model/lora.js';
import { PolicyModel } from '../model/transformer.js';
import { RequestError, quote } from '../serve/protocol.js';

/** Most sequences one generation turn of a sampler decodes together. */
export const MAX_SAMPLE_BATCH = 256;

/** Adapter weights as a training client snapshots them, with their rank and size. */
export interface AdapterSnapshot {
  readonly weights: NamedWeights;
  readonly rank: number;
}

/** Bytes of a snapshot's tensors. */
export function snapshotBytes(snapshot: AdapterSnapshot): number {
  let bytes = 0;
  for (const w of snapshot.weights.values()) bytes += w.data.byteLength;
  return bytes;
}

/** One `asample` call's sequences, waiting for a sampler's turn. */
interface SampleJob {
  readonly requests: readonly GenerateRequest[];
  resolve(responses: GenerateResponse[]): void;
  reject(error: unknown): void;
}

/** A sampling session: frozen adapter weights (none: the base model) and its own view of the base. */
export class Sampler {
  readonly id = `ss-${randomUUID()}`;
  readonly view: PolicyModel;
  private readonly adapter: LoraAdapter | undefined;
  /** Requests holding the sampler (see {@link Sampler.hold}). */
  private pending = 0;
  private retired = false;
  /** The tail of its generation turns. */
  private turns: Promise<unknown> = Promise.resolve();
  /** Jobs waiting for the next turn: each turn decodes all of them (up to a batch) as one batch. */
  private readonly waiting: SampleJob[] = [];

  /**
   * @param base - The base model (not owned).
   * @param stopIds - Stop tokens of requests that name none.
   * @param snapshot - Adapter weights to sample with (copied); none samples the base model.
   * @param modelPath - The sampler weights' path it was opened from, if any.
   * @param session - The session that opened it, if known (sampling keeps that session alive).
   */
  constructor(
    base: PolicyModel,
    private readonly stopIds: readonly number[],
    snapshot: AdapterSnapshot | undefined,
    readonly modelPath: string | undefined,
    readonly session: string | undefined,
  ) {
    this.adapter =
      snapshot === undefined
        ? undefined
        : LoraAdapter.fromWeights(
            base.config,
            { rank: snapshot.rank, alpha: snapshot.rank, targetModules: LORA_TARGETS },
            snapshot.weights,
          );
    this.view = this.adapter === undefined ? base : PolicyModel.withAdapter(base, this.adapter);
  }

  /**
   * Runs `work` with the sampler held: it is not disposed before `work` settles, even when the pool lets it go
   * meanwhile.
   */
  async hold<T>(work: () => Promise<T>): Promise<T> {
    this.pending++;
    try {
      return await work();
    } finally {
      this.pending--;
      if (this.retired && this.pending === 0) this.dispose();
    }
  }

  /**
   * Samples `requests` (validated by the caller) in the sampler's next generation turn, batched with every other
   * call waiting then (the samples of a GRPO group, or of several clients, decode together; seeded samples do not
   * depend on the batch). Call it inside {@link Sampler.hold}.
   */
  generate(requests: readonly GenerateRequest[]): Promise<GenerateResponse[]> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ requests, resolve, reject });
      if (this.waiting.length === 1) this.scheduleTurn();
    });
  }

  /** Lets the sampler go: it is disposed now, or when the last request holding it settles. */
  retire(): void {
    this.retired = true;
    if (this.pending === 0) this.dispose();
  }

  /** Queues one generation turn over the calls waiting when it starts (up to a batch's worth). */
  private scheduleTurn(): void {
    this.turns = this.turns.then(async () => {
      const jobs: SampleJob[] = [];
      let size = 0;
      while (this.waiting.length > 0 && (jobs.length === 0 || size + this.waiting[0].requests.length <= MAX_SAMPLE_BATCH)) {
        const job = this.waiting.shift() as SampleJob;
        jobs.push(job);
        size += job.requests.length;
      }
      if (this.waiting.length > 0) this.scheduleTurn();
      await this.runTurn(jobs);
    });
  }

  /** Decodes `jobs` as one batch; when that fails, each job alone, so that a failure fails its own job only. */
  private async runTurn(jobs: readonly SampleJob[]): Promise<void> {
    try {
      const out = await this.view.generate(
        jobs.flatMap((job) => job.requests),
        { stopIds: this.stopIds },
      );
      let at = 0;
      for (const job of jobs) {
        job.resolve(out.slice(at, at + job.requests.length));
        at += job.requests.length;
      }
    } catch (error) {
      if (jobs.length === 1) return jobs[0].reject(error);
      for (const job of jobs) {
        try {
          job.resolve(await this.view.generate(job.requests, { stopIds: this.stopIds }));
        } catch (alone) {
          job.reject(alone);
        }
      }
    }
  }

  /** Frees the adapter copy and its view (a base-model sampler holds nothing of its own). */
  private dispose(): void {
    if (this.adapter === undefined) return;
    this.view.dispose();
    this.adapter.dispose();
  }
}

/** The open samplers, at most `maxSamplers`: opening one more lets the oldest go. */
export class SamplerPool {
  private readonly samplers = new Map<string, Sampler>();

  constructor(private readonly maxSamplers: number) {}

  /** Adds a sampler, letting the oldest go past `maxSamplers` (it lives on while requests hold it). */
  add(sampler: Sampler): void {
    this.samplers.set(sampler.id, sampler);
    while (this.samplers.size > this.maxSamplers) {
      const [oldest] = this.samplers.values();
      this.samplers.delete(oldest.id);
      oldest.retire();
    }
  }

  /** The sampler `id`; 404 when there is none (never was, or let go). */
  get(id: unknown): Sampler {
    const sampler = typeof id === 'string' ? this.samplers.get(id) : undefined;
    if (sampler === undefined) throw new RequestError(404, `no sampling session ${quote(id)}`);
    return sampler;
  }

  /** Lets every sampler go (each is disposed when its pending requests settle). */
  close(): void {
    for (const sampler of this.samplers.values()) sampler.retire();
    this.samplers.clear();
  }
}

/** Bounds of {@link SamplerWeights}. */
export interface SamplerWeightLimits {
  /** Names kept. */
  readonly maxCount: number;
  /** Bytes of tensors kept, over every name. */
  readonly maxBytes: number;
}

/**
 * Named sampler weights, bounded by count and bytes: saving past either bound drops the least recently used
 * names, which then answer 404 (the SDK's `NotFoundError`).
 */
export class SamplerWeights {
  private readonly entries = new Map<string, { readonly snapshot: AdapterSnapshot; readonly bytes: number }>();
  private bytes = 0;

  constructor(private readonly limits: SamplerWeightLimits) {}

  /**
   * Keeps `snapshot` under `path` (replacing what was there), dropping the least recently used names past the bounds.
   *
   * @throws {@link RequestError} 400 when the snapshot alone is larger than `maxBytes` (nothing is dropped).
   */
  set(path: string, snapshot: AdapterSnapshot): void {
    const bytes = snapshotBytes(snapshot);
    if (bytes > this.limits.maxBytes) {
      throw new RequestError(400, `sampler weights of ${bytes} bytes are more than the ${this.limits.maxBytes} this service keeps`);
    }
    this.remove(path);
    this.entries.set(path, { snapshot, bytes });
    this.bytes += bytes;
    for (const [oldest] of this.entries) {
      if (this.entries.size <= this.limits.maxCount && this.bytes <= this.limits.maxBytes) break;
      this.remove(oldest);
    }
  }

  /** The snapshot at `path` (now the most recently used); 404 when there is none (never saved, or dropped). */
  get(path: string): AdapterSnapshot {
    const entry = this.entries.get(path);
    if (entry === undefined) throw new RequestError(404, `no sampler weights at ${quote(path, 256)}`);
    this.entries.delete(path);
    this.entries.set(path, entry);
    return entry.snapshot;
  }

  /** Names kept. */
  get size(): number {
    return this.entries.size;
  }

  private remove(path: string): void {
    const entry = this.entries.get(path);
    if (entry === undefined) return;
    this.entries.delete(path);
    this.bytes -= entry.bytes;
  }
}
