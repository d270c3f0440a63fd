#!/usr/bin/env python3
"""TRL's side of ``npm run bench -- trl``: the same GRPO run as rxrl's, by ``trl.GRPOTrainer`` on PyTorch's CPU.

Reads the task as ``bench/trl.ts`` exported it (``train.jsonl`` and ``validation.jsonl``: each row the prompt
rendered in the model's chat template, its token ids as rxrl encoded them, and the answer) and a JSON of settings
mapped from the rxrl recipe, checks that the tokenizer here encodes every prompt to rxrl's ids, then:

1. scores the model on the held-out prompts (greedy, as rxrl's validation), before training;
2. trains ``--steps`` GRPO steps (LoRA through ``peft`` when the settings have one), timing each step's wall time
   and the part of it spent generating and scoring (the rest is training), within that part the generate calls
   and the reward functions, and within training the optimizer's part (gradient norm and clip, then Adam; the rest
   is forward and backward); every ``--val-every`` steps it scores the held-out prompts again (outside the steps'
   clock: the next step's starts after it);
3. scores the held-out prompts after the last step (unless step 2 just did).

Prints one JSON line per event on stdout: ``{"event": "val", "step": -1 | N, ...}`` (N the 0-based step it
follows), ``{"event": "step", ...}`` per step, and last ``{"event": "done", ...}``. Nothing is downloaded; the
model is a local directory.

Usage::

    python3 bench/trl_grpo.py --model DIR --data DIR --settings JSON --out DIR [--steps 50] [--seed 1] [--threads 2]
        [--val-every 10] [--prepare N] [--sampling-seed S] [--record] [--score-adapter DIR]

With ``--prepare N`` it trains nothing: it builds the same trainer and writes to ``--out`` what the run would start
from, for ``bench trl --paired`` to give rxrl's side the same: ``order.json`` (the ids of the first ``N`` prompts in
the order the trainer's sampler visits them, epoch after epoch) and, with a LoRA adapter, ``initial-adapter/`` (the
adapter as PEFT initialized it, saved before any step). ``--sampling-seed S`` reseeds the RNGs once the trainer is
built, so a run keeps its seed's prompt order and initial adapter and draws other completions.

``--record`` (for ``npm run bench -- trlReplay``) also writes ``OUT/record``: ``initial-adapter/`` and
``final-adapter/`` (LoRA), ``rollouts.jsonl`` (each step's rows as TRL trains them: prompt and completion token ids,
rewards, advantages) and ``steps.jsonl`` (each step's gradient norm before clipping, and loss). ``--score-adapter DIR``
trains nothing: it builds the same trainer, puts the adapter in ``DIR`` in place of its own and scores the held-out
prompts as the run's last validation would.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _offline  # noqa: E402,F401  (offline, sleeping OpenMP workers: before torch loads)
from trl_reward import equation_reward, score  # noqa: E402


# The JSON lines go to the real stdout; whatever the libraries print (transformers prints each log) goes to stderr.
_OUT = sys.stdout
sys.stdout = sys.stderr


def emit(record: dict) -> None:
    print(json.dumps(record), file=_OUT, flush=True)


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--data", required=True, help="directory with train.jsonl and validation.jsonl")
    parser.add_argument("--settings", required=True, help="JSON of the run's settings (see bench/trl.ts)")
    parser.add_argument("--out", required=True, help="output directory of the trainer")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--val-every", type=int, default=10, help="score the held-out prompts every N steps")
    parser.add_argument("--prepare", type=int, default=0, metavar="N", help="write the first N prompts' order and the initial adapter, train nothing")
    parser.add_argument(
        "--sampling-seed",
        type=int,
        default=None,
        help="reseed the RNGs once the trainer is built: other sampling draws, the same prompt order and initial adapter",
    )
    parser.add_argument("--score-adapter", metavar="DIR", help="score the held-out prompts with this adapter (the run's shape) after --steps steps, train nothing")
    parser.add_argument(
        "--record",
        action="store_true",
        help="write OUT/record: the adapter before and after training and every step's rollouts (rollouts.jsonl)",
    )
    return parser.parse_args()


def check_tokens(tokenizer, rows: list[dict]) -> None:
    """Every prompt must encode here to the ids rxrl sampled from, or the two runs would see different inputs."""
    for row in rows:
        ids = tokenizer(row["prompt"])["input_ids"]
        if ids != row["prompt_ids"]:
            raise SystemExit(f"trl_grpo: prompt {row['id']} encodes to {ids[:12]}… here, rxrl sent {row['prompt_ids'][:12]}…")


def evaluate(model, tokenizer, rows: list[dict], max_tokens: int, eos_ids: list[int], step: int) -> dict:
    """Greedy responses to the held-out prompts, scored as rxrl's validation scores them (batched, left padded)."""
    import torch

    was_training = model.training
    model.eval()
    started = time.perf_counter()
    totals = {"reward": 0.0, "format": 0, "correct": 0}
    missed = []
    tokenizer.padding_side = "left"
    with torch.no_grad():
        for start in range(0, len(rows), 64):
            batch = rows[start : start + 64]
            inputs = tokenizer([r["prompt"] for r in batch], return_tensors="pt", padding=True)
            out = model.generate(**inputs, max_new_tokens=max_tokens, do_sample=False, eos_token_id=eos_ids, pad_token_id=tokenizer.pad_token_id)
            for row, ids in zip(batch, out[:, inputs["input_ids"].shape[1] :].tolist(), strict=True):
                stop = next((i for i, t in enumerate(ids) if t in eos_ids), None)
                response = tokenizer.decode(ids if stop is None else ids[:stop], skip_special_tokens=True)
                result = score(response, row["answer"], truncated=stop is None)
                for key in totals:
                    totals[key] += result[key]
                if not result["correct"]:
                    missed.append(row["id"])
    if was_training:
        model.train()
    n = len(rows)
    return {"event": "val", "step": step, "reward_mean": totals["reward"] / n, "format_mean": totals["format"] / n, "correct_mean": totals["correct"] / n, "samples": n, "missed": sorted(missed), "seconds": time.perf_counter() - started}


def prepare(trainer, train_rows: list[dict], count: int, out: str) -> None:
    """The first ``count`` prompt ids in the order the trainer's sampler visits them, and the initial adapter."""
    sampler = trainer._get_train_sampler(trainer.train_dataset)
    # Each chunk of `batch_size` prompts comes `repeat_count` times, each prompt `mini_repeat_count` times in a row;
    # every new pass over the sampler is the next epoch (its generator goes on).
    per_chunk = sampler.batch_size * sampler.mini_repeat_count * sampler.repeat_count
    order: list[str] = []
    while len(order) < count:
        stream = list(iter(sampler))
        for start in range(0, len(stream), per_chunk):
            chunk = stream[start : start + sampler.batch_size * sampler.mini_repeat_count : sampler.mini_repeat_count]
            order.extend(train_rows[i]["id"] for i in chunk)
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "order.json"), "w", encoding="utf-8") as f:
        json.dump(order[:count], f)
    if hasattr(trainer.model, "peft_config"):
        trainer.model.save_pretrained(os.path.join(out, "initial-adapter"))
    emit({"event": "prepared", "prompts": count, "adapter": hasattr(trainer.model, "peft_config")})


def record_rollouts(trainer, path: str) -> None:
    """Appends each generation batch to ``path`` as one JSON line: the rows' prompt and completion token ids (without
    padding; a completion keeps its EOS), rewards and advantages, in the order TRL trains them."""
    import torch

    generate = trainer._generate_and_score_completions
    calculate = trainer._calculate_rewards
    last: dict = {}

    def calculate_and_keep(*a, **k):
        rewards = calculate(*a, **k)
        last["rewards"] = rewards
        return rewards

    def generate_and_record(inputs):
        output = generate(inputs)
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(output["prompt_ids"], output["prompt_mask"], strict=True)]
        completions = [ids[mask.bool()].tolist() for ids, mask in zip(output["completion_ids"], output["completion_mask"], strict=True)]
        weights = torch.as_tensor(trainer.reward_weights, dtype=last["rewards"].dtype, device=last["rewards"].device)
        rewards = (last["rewards"] * weights.unsqueeze(0)).nansum(dim=1)
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"prompt_ids": prompts, "completion_ids": completions, "rewards": rewards.tolist(), "advantages": output["advantages"].tolist()}) + "\n")
        return output

    trainer._calculate_rewards = calculate_and_keep
    trainer._generate_and_score_completions = generate_and_record


def timed(obj, name: str, timing: dict, key: str) -> None:
    """Wraps the method ``name`` of ``obj`` so that its seconds add up in ``timing[key]``."""
    method = getattr(obj, name)

    def wrapper(*a, **k):
        started = time.perf_counter()
        try:
            return method(*a, **k)
        finally:
            timing[key] += time.perf_counter() - started

    setattr(obj, name, wrapper)


def grpo_config(settings: dict, out: str, steps: int, seed: int):
    """The ``GRPOConfig`` of the settings (bench/trl.ts ``trlSettings``); scripts/trl_parity.py runs it on one batch."""
    from trl import GRPOConfig

    rows, micro = settings["rows"], settings["microBatchSize"]
    return GRPOConfig(
        output_dir=out,
        max_steps=steps,
        # One optimizer step per batch of `rows` completions, in micro-batches of `micro`, as rxrl's trainer.
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,
        num_generations=settings["groupSize"],
        max_completion_length=settings["maxTokens"],
        temperature=settings["temperature"],
        top_p=settings["topP"],
        learning_rate=settings["learningRate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=settings["maxGradNorm"],
        beta=settings["klCoef"],
        # rxrl's KL loss is the k3 estimate itself (GRPO, verl); TRL 1.16 multiplies it by the (differentiable)
        # importance ratio by default (DeepSeek-V3.2's unbiased KL gradient), which changes the gradient, not the loss.
        use_bias_correction_kl=False,
        epsilon=settings["clipLow"],
        epsilon_high=settings["clipHigh"],
        num_iterations=settings["ppoEpochs"],
        loss_type=settings["lossType"],
        scale_rewards=settings["scaleRewards"],
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        # rxrl keeps the activations for the backward pass; TRL's default would recompute them (slower, less memory).
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
        # Equal work (`bench trl --equal-work`): no completion ends before max_completion_length. EOS is kept out
        # until then, so every row trains all its tokens too (rxrl's side ignores its stop tokens instead).
        generation_kwargs={"min_new_tokens": settings["maxTokens"]} if settings.get("ignoreEos") else None,
    )


def lora_config(lora: dict | None):
    """PEFT's ``LoraConfig`` of the settings' adapter (rank, alpha, target modules; no dropout), or None."""
    from peft import LoraConfig

    if not lora:
        return None
    return LoraConfig(r=lora["rank"], lora_alpha=lora["alpha"], lora_dropout=0.0, target_modules=list(lora["targetModules"]), task_type="CAUSAL_LM")


def build(args: argparse.Namespace, settings: dict):
    """The trainer as the run builds it; returns it with the tokenizer, the held-out rows and the stop ids."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    train_rows = read_jsonl(os.path.join(args.data, "train.jsonl"))
    val_rows = read_jsonl(os.path.join(args.data, "validation.jsonl"))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    check_tokens(tokenizer, train_rows + val_rows)
    # rxrl trains in float32; transformers would otherwise keep the directory's dtype.
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    config = grpo_config(settings, args.out, args.steps, args.seed)
    eos_ids: list[int] = []

    def reward(completions, answer, completion_ids, **kwargs):
        return equation_reward(completions, answer, completion_ids, eos_ids)

    reward.__name__ = "equation_reward"
    dataset = Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train_rows])
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer, peft_config=lora_config(settings.get("lora")))
    eos_ids.extend(trainer.eos_token_ids if isinstance(trainer.eos_token_ids, list) else [trainer.eos_token_ids])
    return trainer, tokenizer, train_rows, val_rows, eos_ids


def score_adapter(trainer, tokenizer, val_rows: list[dict], max_tokens: int, eos_ids: list[int], adapter: str, step: int) -> None:
    """Scores the held-out prompts as the run's last validation does, with the adapter in ``adapter`` (a PEFT
    directory of the run's shape) in place of the trainer's."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    result = set_peft_model_state_dict(trainer.model, load_file(os.path.join(adapter, "adapter_model.safetensors")))
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        raise SystemExit(f"trl_grpo: {adapter} is not this run's adapter (missing {missing[:3]}, unexpected {result.unexpected_keys[:3]})")
    emit({**evaluate(trainer.model, tokenizer, val_rows, max_tokens, eos_ids, step), "adapter": adapter})


def main() -> None:
    args = parse_args()
    settings = json.loads(args.settings)
    try:  # everything the run imports, so that a missing package is a "skipped" event, not a traceback
        import datasets  # noqa: F401
        import peft  # noqa: F401
        import torch  # noqa: F401
        from transformers import set_seed
        import trl  # noqa: F401
    except ImportError as error:
        emit({"event": "skipped", "reason": f"{error} (pip install -r bench/requirements-trl.txt)"})
        return
    trainer, tokenizer, train_rows, val_rows, eos_ids = build(args, settings)
    if args.prepare > 0:
        prepare(trainer, train_rows, args.prepare, args.out)
        return
    if args.score_adapter is not None:
        score_adapter(trainer, tokenizer, val_rows, settings["maxTokens"], eos_ids, args.score_adapter, args.steps - 1)
        return
    if args.sampling_seed is not None:
        # The sampler's order has its own generator (seeded with --seed) and PEFT drew the adapter already: what the
        # global RNGs draw from here on is the completions.
        set_seed(args.sampling_seed)
    record = os.path.join(args.out, "record") if args.record else None
    if record is not None:
        os.makedirs(record, exist_ok=True)
        if hasattr(trainer.model, "peft_config"):
            trainer.model.save_pretrained(os.path.join(record, "initial-adapter"))
        record_rollouts(trainer, os.path.join(record, "rollouts.jsonl"))
    train(trainer, args, lambda step: evaluate(trainer.model, tokenizer, val_rows, settings["maxTokens"], eos_ids, step), settings["rows"], record)
    if record is not None and hasattr(trainer.model, "peft_config"):
        trainer.model.save_pretrained(os.path.join(record, "final-adapter"))


def train(trainer, args: argparse.Namespace, evaluate_at, rows: int, record: str | None) -> None:
    """Trains ``--steps`` steps, emitting each step's timing and the validations (before, every ``--val-every``
    steps, after the last); with ``record``, each step's grad norm and loss go to ``record/steps.jsonl``."""
    import torch
    from transformers import TrainerCallback
    import trl

    # Generation and scoring are timed inside each step (and, within them, the generate calls and the rewards); the
    # rest of the step's wall time is training.
    timing = {"last": 0.0, "rollout": 0.0, "generate": 0.0, "reward": 0.0, "optimizer": 0.0, "optimizer_start": 0.0}
    timed(trainer, "_generate_and_score_completions", timing, "rollout")
    timed(trainer, "_generate_single_turn", timing, "generate")
    timed(trainer, "_calculate_rewards", timing, "reward")
    # The optimizer's part of training as rxrl's `optimizer_s` counts it: the gradient norm and clip, then Adam.
    timed(trainer, "_clip_grad_norm", timing, "optimizer")
    pending: dict = {}
    scored: dict = {"step": None}

    def validate(step: int) -> dict:
        scored["step"] = step
        return evaluate_at(step)

    class Steps(TrainerCallback):
        def on_train_begin(self, _args, state, control, **kwargs):
            timing["last"] = time.perf_counter()

        # Adam's update, between these two calls.
        def on_pre_optimizer_step(self, _args, state, control, **kwargs):
            timing["optimizer_start"] = time.perf_counter()

        def on_optimizer_step(self, _args, state, control, **kwargs):
            timing["optimizer"] += time.perf_counter() - timing["optimizer_start"]

        def on_step_end(self, _args, state, control, **kwargs):
            now = time.perf_counter()
            total = now - timing["last"]
            train = total - timing["rollout"]
            pending.update({"event": "step", "step": state.global_step - 1, "total_s": total, "rollout_s": timing["rollout"], "train_s": train, "generate_s": timing["generate"], "reward_s": timing["reward"], "optimizer_s": timing["optimizer"], "forward_backward_s": train - timing["optimizer"]})
            timing.update({"rollout": 0.0, "generate": 0.0, "reward": 0.0, "optimizer": 0.0, "last": now})
            if state.global_step % args.val_every == 0:
                emit(validate(state.global_step - 1))
                # The validation's time belongs to no step.
                timing["last"] = time.perf_counter()

        def on_log(self, _args, state, control, logs=None, **kwargs):
            if record is not None and logs is not None and "grad_norm" in logs:
                with open(os.path.join(record, "steps.jsonl"), "a", encoding="utf-8") as f:
                    f.write(json.dumps({"step": state.global_step - 1, "grad_norm": float(logs["grad_norm"]), "loss": float(logs["loss"])}) + "\n")
            if pending and logs is not None and "reward" in logs:
                emit({**pending, "reward_mean": logs["reward"], "mean_length": logs.get("completions/mean_length"), "clipped_ratio": logs.get("completions/clipped_ratio"), "entropy": logs.get("entropy"), "pg_loss": logs.get("loss"), "clipfrac": logs.get("clip_ratio/region_mean"), "samples": rows})
                pending.clear()
            # The log's own time goes to the next step, as rxrl's metrics writing does.

    trainer.add_callback(Steps())
    emit({**validate(-1), "trl": trl.__version__, "torch": torch.__version__, "threads": args.threads})
    started = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - started
    if scored["step"] != args.steps - 1:
        emit(validate(args.steps - 1))
    emit({"event": "done", "steps": args.steps, "seconds": seconds})


if __name__ == "__main__":
    main()
