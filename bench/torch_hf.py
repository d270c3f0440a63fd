#!/usr/bin/env python3
"""PyTorch CPU reference for ``npm run bench -- hf``: SmolLM2-135M-shaped Llama throughput.

Measures, in float32 on CPU with ``torch.set_num_threads(N)``, for batch ``B`` x sequence ``T`` (default 1 x 128):

* ``forward_tok_s``: ``B*T`` / seconds of one no-grad forward pass (eager attention, no KV cache);
* ``grad_tok_s``: ``B*T`` / seconds of forward, mean cross-entropy of each position's logits against the next
  token, and backward (every weight's gradient, no optimizer step);
* ``train_tok_s``: the same plus an AdamW step (lr 1e-5);
* with ``--lora R``, ``lora_train_tok_s``: the same step of a PEFT LoRA adapter (rank R, alpha 2R, every attention
  and MLP projection) over the model, AdamW on the adapter only.

``--device cuda`` runs it all on the GPU (float32; each timed run waits for the device).

With ``--sample N`` it measures sampling instead: ``sample_tok_s``, new tokens per second of ``model.generate``
(KV cache, temperature 1, no top-k/top-p, no stop token) drawing ``N`` tokens for each of ``B`` left-padded
prompts whose lengths are drawn from 8..24 (as ``npm run bench -- sample``).

Each is timed after one warm-up run as the median of ``--reps`` runs. The model is a randomly initialised
(seeded) ``LlamaForCausalLM`` with SmolLM2-135M's shape — nothing is downloaded — or, with ``--model-dir``, a
local Hugging Face model directory (e.g. the one ``scripts/smollm2.py`` builds).

Usage::

    python3 bench/torch_hf.py [--threads 2] [--reps 3] [--batch 1] [--seq 128] [--sample N] [--model-dir DIR]
        [--device cpu|cuda] [--lora R]

``OMP_WAIT_POLICY`` defaults to ``PASSIVE`` (set it to override): on a shared, busy 2-core machine the default
spinning OpenMP workers made 2 threads several times slower than 1.

Prints one JSON line on stdout. When torch (or transformers) cannot be imported it prints
``{"bench": "hf-torch", "skipped": "..."}`` and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _offline  # noqa: E402,F401  (offline, sleeping OpenMP workers: before torch loads)

BENCH = "hf-torch"

# SmolLM2-135M's architecture.
SMOLLM2_135M = dict(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    hidden_act="silu",
    max_position_embeddings=2048,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
    bos_token_id=1,
    eos_token_id=2,
)
ROPE_THETA = 100000.0


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    parser.add_argument("--reps", type=int, default=3, help="timed runs per measurement (median; default 3)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--sample", type=int, default=0, help="measure sampling of this many new tokens per row instead")
    parser.add_argument("--model-dir", default=None, help="load this local HF model directory instead")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where the model runs (default cpu)")
    parser.add_argument("--lora", type=int, default=0, help="also time a PEFT LoRA step of this rank (alpha 2r, every projection)")
    parser.add_argument(
        "--shape",
        default=None,
        help="JSON object of LlamaConfig fields (vocab_size, hidden_size, ...) replacing SmolLM2-135M's; rope_theta too",
    )
    args = parser.parse_args(argv)
    for name in ("threads", "reps", "batch", "seq"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def build_model(args, torch):
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if args.model_dir:
        return AutoModelForCausalLM.from_pretrained(
            args.model_dir, dtype=torch.float32, attn_implementation="eager", local_files_only=True
        )
    shape = dict(SMOLLM2_135M)
    rope_theta = ROPE_THETA
    if args.shape:
        fields = json.loads(args.shape)
        rope_theta = float(fields.pop("rope_theta", rope_theta))
        shape.update(fields)
    try:  # transformers >= 5
        config = LlamaConfig(**shape, rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    except TypeError:  # transformers 4.x
        config = LlamaConfig(**shape, rope_theta=rope_theta)
    config._attn_implementation = "eager"
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(config).to(torch.float32)


def timed(fn, reps: int, device: str = "cpu", torch=None) -> list[float]:
    """Seconds of ``reps`` runs of ``fn`` after one warm-up run (on CUDA, each waits for the device to finish)."""

    def run() -> None:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()

    run()  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times


def sample_throughput(args, model, torch) -> dict:
    """New tokens per second of ``model.generate`` over ``args.batch`` left-padded prompts of 8..24 tokens."""
    generator = torch.Generator().manual_seed(args.seed + 2)
    vocab = model.config.vocab_size
    lengths = torch.randint(8, 25, (args.batch,), generator=generator).tolist()
    width = max(lengths)
    input_ids = torch.zeros((args.batch, width), dtype=torch.long)
    attention_mask = torch.zeros((args.batch, width), dtype=torch.long)
    for row, length in enumerate(lengths):
        input_ids[row, width - length :] = torch.randint(3, vocab, (length,), generator=generator)
        attention_mask[row, width - length :] = 1
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    model.eval()
    torch.manual_seed(args.seed)

    def sample() -> None:
        with torch.inference_mode():
            out = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.sample,
                min_new_tokens=args.sample,
                pad_token_id=0,
                eos_token_id=None,
                use_cache=True,
            )
        assert out.shape[1] == width + args.sample

    sample_s = statistics.median(timed(sample, args.reps, model.device.type, torch))
    import transformers

    return {
        "bench": BENCH,
        "threads": args.threads,
        "batch": args.batch,
        "new_tokens": args.sample,
        "sample_tok_s": round(args.batch * args.sample / sample_s, 1),
        "sample_s": round(sample_s, 4),
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
        "reps": args.reps,
    }


def step_rates(args, model, torch, device: str) -> dict:
    """Forward, gradient and AdamW-step seconds of the whole model on ``args.batch`` x ``args.seq`` random tokens."""
    import torch.nn.functional as F

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(args.seed + 1)
    tokens = torch.randint(0, vocab, (args.batch, args.seq + 1), generator=generator).to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def loss():
        logits = model(input_ids=inputs, use_cache=False).logits
        return F.cross_entropy(logits.reshape(-1, vocab).float(), targets.reshape(-1))

    def forward() -> None:
        with torch.inference_mode():
            model(input_ids=inputs, use_cache=False)

    def grad_step() -> None:
        model.zero_grad(set_to_none=True)
        loss().backward()

    losses: list[float] = []

    def adam_step(optimizer):
        def step() -> None:
            optimizer.zero_grad(set_to_none=True)
            value = loss()
            value.backward()
            optimizer.step()
            losses.append(value.item())

        return step

    model.eval()
    times = {"forward": timed(forward, args.reps, device, torch)}
    model.train()  # dropout is 0 in these configs; train mode only matters for models that have it
    times["grad"] = timed(grad_step, args.reps, device, torch)
    times["train"] = timed(adam_step(torch.optim.AdamW(model.parameters(), lr=args.lr)), args.reps, device, torch)
    out = {name: statistics.median(values) for name, values in times.items()}
    out["loss"] = losses[-1]
    if args.lora > 0:
        try:
            from peft import LoraConfig, get_peft_model
        except Exception:  # noqa: BLE001 - any import failure means "no peft here"
            return {**out, "lora": None}
        targets_ = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
        lora = get_peft_model(model, LoraConfig(r=args.lora, lora_alpha=2 * args.lora, lora_dropout=0.0, target_modules=targets_))
        trainable = [p for p in lora.parameters() if p.requires_grad]
        out["lora"] = statistics.median(timed(adam_step(torch.optim.AdamW(trainable, lr=args.lr)), args.reps, device, torch))
    return out


def device_of(args, torch) -> str | None:
    """The device string for ``--device``, or None when torch cannot use it here."""
    if args.device == "cuda":
        return "cuda" if torch.cuda.is_available() else None
    return "cpu"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    # Other processes' load at the start (this is a shared machine); 1-minute average.
    load = round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None
    try:
        import torch
    except Exception:  # noqa: BLE001 - any import failure means "no torch here"
        emit({"bench": BENCH, "skipped": "torch not importable"})
        return 0
    try:
        import transformers
    except Exception:  # noqa: BLE001
        emit({"bench": BENCH, "skipped": "transformers not importable"})
        return 0
    device = device_of(args, torch)
    if device is None:
        emit({"bench": BENCH, "skipped": f"--device {args.device}: torch {torch.__version__} sees no CUDA device"})
        return 0

    torch.set_num_threads(args.threads)
    model = build_model(args, torch).to(device)
    params = sum(p.numel() for p in model.parameters())  # tied embeddings counted once

    if args.sample > 0:
        emit({**sample_throughput(args, model, torch), "params": params, "seconds": round(time.perf_counter() - started, 1)})
        return 0

    n_tokens = args.batch * args.seq
    rates = step_rates(args, model, torch, device)
    lora = {}
    if args.lora > 0:
        lora = {"lora_rank": args.lora, "lora_train_tok_s": None if rates["lora"] is None else round(n_tokens / rates["lora"], 1)}
        if rates["lora"] is None:
            lora["lora_skipped"] = "peft not importable"
        else:
            lora["lora_train_step_s"] = round(rates["lora"], 4)
    emit(
        {
            "bench": BENCH,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "threads": args.threads,
            "batch": args.batch,
            "seq": args.seq,
            "params": params,
            "forward_tok_s": round(n_tokens / rates["forward"], 1),
            "grad_tok_s": round(n_tokens / rates["grad"], 1),
            "train_tok_s": round(n_tokens / rates["train"], 1),
            **lora,
            "torch": torch.__version__.split("+")[0],
            "reps": args.reps,
            "model": args.model_dir or ("random:" + args.shape if args.shape else "random:SmolLM2-135M"),
            "forward_s": round(rates["forward"], 4),
            "grad_s": round(rates["grad"], 4),
            "train_step_s": round(rates["train"], 4),
            "loss": round(rates["loss"], 4),
            "transformers": transformers.__version__,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "loadavg_1m_at_start": load,
            "seconds": round(time.perf_counter() - started, 1),
        }
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
