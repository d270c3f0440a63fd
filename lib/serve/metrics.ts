/**
 * `GET /metrics` of `rxrl serve`: Prometheus text (version 0.0.4) under vLLM's metric names, so a dashboard or an
 * autoscaler made for a vLLM fleet reads rxrl's too — requests running and waiting, prompt and generation tokens,
 * finished requests by reason, time to first token and end-to-end latency histograms — each labelled `model_name`.
 *
 * @packageDocumentation
 */
import { PrometheusText } from '../observe/prometheus.js';

/** vLLM's buckets of `vllm:time_to_first_token_seconds`. */
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560];
/** vLLM's buckets of `vllm:e2e_request_latency_seconds`. */
const E2E_BUCKETS = [0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680];

class Histogram {
  readonly counts: number[];
  sum = 0;
  count = 0;

  constructor(readonly buckets: readonly number[]) {
    this.counts = buckets.map(() => 0);
  }

  observe(value: number): void {
    this.sum += value;
    this.count += 1;
    this.buckets.forEach((bound, i) => {
      if (value <= bound) this.counts[i] += 1;
    });
  }
}

/** One served request as {@link ServeMetrics.begin} tracks it. */
export interface ServedRequest {
  /** A token of it was sampled (the first one sets the time to first token). */
  token(): void;
  /** It ended: its prompt and generated tokens, and why it stopped. */
  end(promptTokens: number, generatedTokens: number, finishReason: string): void;
}

/** The counters behind `GET /metrics`. */
export class ServeMetrics {
  private running = 0;
  private promptTokens = 0;
  private generationTokens = 0;
  private readonly finished = new Map<string, number>();
  private readonly ttft = new Histogram(TTFT_BUCKETS);
  private readonly e2e = new Histogram(E2E_BUCKETS);

  /**
   * @param modelName - the `model_name` label.
   * @param waiting - requests queued and not yet running (the engine's queue).
   * @param now - clock in ms. Default `performance.now`.
   */
  constructor(
    private readonly modelName: string,
    private readonly waiting: () => number = () => 0,
    private readonly now: () => number = () => performance.now(),
  ) {}

  /** A request starts running. */
  begin(): ServedRequest {
    const started = this.now();
    let first = false;
    let ended = false;
    this.running += 1;
    return {
      token: () => {
        if (first) return;
        first = true;
        this.ttft.observe((this.now() - started) / 1000);
      },
      end: (prompt, generated, reason) => {
        if (ended) return;
        ended = true;
        this.running -= 1;
        this.promptTokens += prompt;
        this.generationTokens += generated;
        this.finished.set(reason, (this.finished.get(reason) ?? 0) + 1);
        this.e2e.observe((this.now() - started) / 1000);
      },
    };
  }

  /** The Prometheus text of every metric. */
  text(): string {
    const model = { model_name: this.modelName };
    return new PrometheusText()
      .family('vllm:num_requests_running', 'gauge', 'Requests being sampled.', [[model, this.running]])
      .family('vllm:num_requests_waiting', 'gauge', 'Requests queued.', [[model, this.waiting()]])
      .family('vllm:prompt_tokens_total', 'counter', 'Prompt tokens of finished requests.', [[model, this.promptTokens]])
      .family('vllm:generation_tokens_total', 'counter', 'Generated tokens of finished requests.', [[model, this.generationTokens]])
      .family(
        'vllm:request_success_total',
        'counter',
        'Finished requests by finish reason.',
        [...this.finished].map(([reason, n]) => [{ ...model, finished_reason: reason }, n] as const),
      )
      .histogram('vllm:time_to_first_token_seconds', 'Seconds from a request to its first sampled token.', model, this.ttft)
      .histogram('vllm:e2e_request_latency_seconds', 'Seconds from a request to its last token.', model, this.e2e)
      .toString();
  }
}
