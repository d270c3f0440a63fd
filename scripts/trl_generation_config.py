#!/usr/bin/env python3
"""Which sampling settings TRL's GRPOTrainer really samples with (transformers' generate path, no vLLM).

Builds a real ``trl.GRPOTrainer`` on a local tiny model directory (nothing is downloaded), then resolves the
generation config the way ``generate`` does (``model._prepare_generation_config``: the trainer's config, then the
model directory's ``generation_config.json`` filling what is still ``None``, then transformers' global defaults)
and lists the logits processors ``generate`` builds from it (``model._get_logits_processor``), in order.

It runs twice: on the model directory as it is, and on a copy whose ``generation_config.json`` carries the
sampling defaults a Hub model may ship (``top_k``, ``top_p``, ``temperature``, ``min_p``, ``repetition_penalty``),
to show which of them leak into GRPO's sampling.

Usage::

    python3 scripts/trl_generation_config.py [MODEL_DIR] [--temperature 1.0] [--top-p 1.0]

Prints one JSON line per case: ``{"case", "trainer_kwargs", "resolved", "processors"}``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

_OUT = sys.stdout
sys.stdout = sys.stderr  # the libraries' chatter goes to stderr

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_MODEL = os.path.join(HERE, "..", "spec", "fixtures", "hf", "tiny-qwen2")
SAMPLING_KEYS = ("do_sample", "temperature", "top_k", "top_p", "min_p", "typical_p", "repetition_penalty",
                 "no_repeat_ngram_size", "epsilon_cutoff", "eta_cutoff", "top_h", "eos_token_id", "pad_token_id",
                 "max_new_tokens", "suppress_tokens", "renormalize_logits")
# Sampling defaults a Hub model's generation_config.json may carry (as many chat models do).
HUB_DEFAULTS = {"do_sample": True, "temperature": 0.6, "top_k": 50, "top_p": 0.95, "min_p": 0.05,
                "repetition_penalty": 1.1}


def resolve(model_dir: str, args: argparse.Namespace) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(output_dir=out, max_steps=1, per_device_train_batch_size=2, num_generations=2,
                            max_completion_length=8, temperature=args.temperature, top_p=args.top_p,
                            use_cpu=True, report_to=[], save_strategy="no", bf16=False, fp16=False)
        dataset = Dataset.from_list([{"prompt": "a b"}, {"prompt": "c d"}])
        trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                              args=config, train_dataset=dataset, processing_class=tokenizer)
    resolved, _ = trainer.model._prepare_generation_config(trainer.generation_config)
    processors = trainer.model._get_logits_processor(resolved, input_ids_seq_length=2, device="cpu")
    pick = lambda cfg: {k: getattr(cfg, k, None) for k in SAMPLING_KEYS}
    return {
        "trainer_kwargs": {k: trainer.generation_kwargs.get(k) for k in SAMPLING_KEYS if k in trainer.generation_kwargs},
        "model_generation_config": pick(trainer.model.generation_config),
        "resolved": pick(resolved),
        "processors": [repr(p) if hasattr(p, "top_k") or hasattr(p, "top_p") else type(p).__name__ for p in processors],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=DEFAULT_MODEL)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    args = parser.parse_args()
    import trl, transformers
    versions = {"trl": trl.__version__, "transformers": transformers.__version__}
    print(json.dumps({"case": "model dir as is", **versions, **resolve(args.model, args)}, default=str), file=_OUT)
    with tempfile.TemporaryDirectory() as tmp:
        leaky = os.path.join(tmp, "model")
        shutil.copytree(args.model, leaky)
        path = os.path.join(leaky, "generation_config.json")
        with open(path, encoding="utf-8") as f:
            generation = json.load(f)
        generation.update(HUB_DEFAULTS)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(generation, f)
        print(json.dumps({"case": f"generation_config.json with {HUB_DEFAULTS}", **versions, **resolve(leaky, args)},
                         default=str), file=_OUT)


if __name__ == "__main__":
    main()
