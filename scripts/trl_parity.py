#!/usr/bin/env python3
"""One GRPO batch through TRL's own ``GRPOTrainer``, recorded for rxrl's parity spec (spec/train/trlParity.spec.ts).

The bench ``npm run bench -- trl`` maps an rxrl recipe onto TRL 1.16's ``GRPOConfig`` (``trlSettings`` in
bench/trl.ts, the ``GRPOConfig`` built in bench/trl_grpo.py). This script runs ONE optimizer step of that
configuration on a fixed batch and records what TRL computes at each stage, so that the spec can check that rxrl's
``grpoPrepare`` + ``GrpoTrainer`` compute the same:

* the model is spec/fixtures/hf/tiny-qwen2 (float32, tied embeddings, q/k/v biases);
* the batch is 3 prompts × a group of 4 completions (``ROWS`` below): prompts of unequal length (left padding),
  completions of fixed token ids and unequal lengths, some ending in the EOS id, some cut at the token budget,
  two groups with unequal rewards and one zero-variance group; two micro-batches of 6 rows, so one group is split
  between them;
* generation is replaced through TRL's ``rollout_func`` hook (the fixed ids come out for each prompt, in the order
  TRL's sampler asks for them); everything after it is TRL's real code path: rewards → group advantages, the
  per-token log-probs, the DAPO loss over 2 micro-batches with gradient accumulation, backward, global-norm
  clipping and one AdamW step;
* it records the advantages, each micro-batch's loss (what was back-propagated) and their sum, every trained
  tensor's gradient after accumulation and before clipping (through ``Trainer._clip_grad_norm``), the norm TRL
  clips with, and the update of every trained tensor by the step (weights after minus before, float32).

Cases: ``full`` (every weight trains), ``lora`` (PEFT ``LoraConfig`` r=4, alpha=8 on q/k/v/o/gate/up/down,
dropout 0) and ``lora_kl`` (the same adapter with ``beta`` > 0: the KL to the reference, which for an adapter is the
base model with the adapter disabled). PEFT initializes ``B = 0``, which makes every gradient of ``A`` zero and the
KL term zero at the first step; so after PEFT's own initialization both ``A`` and ``B`` are overwritten with seeded
values (uniform in ±0.1 for ``A``, ±0.02 for ``B``, torch generator seeded with ``LORA_SEED``), recorded in the
fixture, and the spec loads those same values into rxrl's ``LoraAdapter``.

The ``GRPOConfig`` and ``LoraConfig`` are the ones bench/trl_grpo.py builds (its ``grpo_config`` and
``lora_config``), from the settings bench/trl.ts would map from the spec's recipe. That includes
``use_bias_correction_kl=False``: TRL 1.16 multiplies the KL term by the importance ratio by default (value 1,
gradient not), rxrl does not; ``lora_kl`` also records the loss and grad norm under TRL's default (``trlDefaultKl``),
so that the spec can state the size of that difference.

Three details of TRL are pinned down rather than left to chance:

* ``_prepare_inputs`` shuffles the rows of the generation batch before splitting it into micro-batches. The loss
  ``dapo`` divides every micro-batch by the token count of the whole batch, so the accumulated gradient does not
  depend on that order; the script checks this (one run with TRL's shuffle, one with the identity, gradients equal to
  float32 rounding) and records the run without shuffle, so that micro-batch ``k`` is rows ``6k … 6k+5`` of the
  recorded order on both sides.
* ``rollout_func`` hands TRL the completions as they are: the ids of a completion that ended are cut after its EOS
  (TRL's own generation does the same), the others are exactly the budget long.
* With ``num_iterations`` 1 TRL takes the "old" log-probs to be the current ones (``per_token_logps.detach()``), so
  the ratio is exactly 1. rxrl takes them from the trajectory (the sampler's log-probs). The fixture records TRL's
  per-token log-probs before the step; the spec uses them as the rollout log-probs (what a sampler with the same
  weights reports), and also checks that rxrl's own log-probs agree with them.

A fourth record, ``steps``, is the ``lora`` case over three optimizer steps, written as ``bench/trl_grpo.py --record``
writes a run (its ``record_rollouts``: each step's rows, rewards and advantages) with each step's gradient norm and
the adapter's update over the three steps; its step 1 has no variance in any group, so that TRL's AdamW steps on
momentum alone there. ``spec/train/trlParity.spec.ts`` replays it with ``bench/trlReplay.ts``, as
``npm run bench -- trlReplay`` replays a whole run.

Storage (``spec/fixtures/trl/tiny-qwen2-grpo.json``): float32 arrays as base64 of little-endian bytes
(``{"shape", "f32": "<base64>"}``). LoRA cases store every gradient and update in full. The full fine-tuning
case (93 k weights) stores, per tensor, the L2 norm of the gradient, its dot product with a fixed ±1 vector
(``sign_i = +1`` when bit 31 of ``(i · 2654435761) mod 2³²`` is 0, else −1; flat row-major index ``i``), and the
values at the flat indices ``0, s, 2s, …`` with ``s = ceil(size / 256)``, for the gradient and for the update.

Usage (pins: scripts/requirements-parity.txt; CPU; nothing is downloaded)::

    python3 scripts/trl_parity.py [--out spec/fixtures/trl/tiny-qwen2-grpo.json]
"""
from __future__ import annotations

import os

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "OMP_NUM_THREADS": "1",
    "CUDA_VISIBLE_DEVICES": "",
}.items():
    os.environ.setdefault(_name, _value)

import argparse
import base64
import json
import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))  # bench/trl_grpo.py builds the GRPOConfig and LoraConfig, as the bench does
MODEL_DIR = ROOT / "spec" / "fixtures" / "hf" / "tiny-qwen2"
DEFAULT_OUT = ROOT / "spec" / "fixtures" / "trl" / "tiny-qwen2-grpo.json"

EOS = 482  # tiny-qwen2's <|im_end|>
MAX_TOKENS = 6  # the token budget: completions without EOS have exactly this many tokens
# Two prompts (3 and 5 tokens) × 4 completions; `reward` is what the reward function returns for that completion.
ROWS = {
    "p0": {
        "prompt_ids": [17, 203, 45],
        "completions": [
            ([311, 12, 88, EOS], 1.0),
            ([5, 402, 77, 19, 230, 64], 0.0),  # cut at the budget
            ([140, EOS], 0.5),
            ([222, 31, 9, 400, 17, EOS], 0.25),
        ],
    },
    "p1": {
        "prompt_ids": [101, 7, 350, 260, 42],
        "completions": [
            ([60, 61, 62, EOS], 0.5),
            ([300, 301, 302, 303, 304, 305], 0.5),  # cut at the budget
            ([99, EOS], 0.5),
            ([13, 250, 470, EOS], 0.5),
        ],
    },
    "p2": {
        "prompt_ids": [88, 120, 33, 5],
        "completions": [
            ([410, 2, 3, 4, 5, 6], -1.0),  # cut at the budget
            ([71, 72, EOS], 2.0),
            ([150, 151, 152, 153, 154, EOS], 0.0),
            ([90, EOS], 2.0),
        ],
    },
}
GROUP = 4
MICRO = 6  # rows per micro-batch: 2 micro-batches per optimizer step, the middle group split between them
LEARNING_RATE = 1e-3
LORA = {"rank": 4, "alpha": 8, "targetModules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
LORA_SEED = 1234
KL_BETA = 0.04
SEED = 7
SAMPLES = 256
STEPS = 3  # the ``steps`` case: optimizer steps recorded
FLAT_REWARD = 0.5  # every row's reward at its step 1


def f32(array) -> dict:
    a = np.asarray(array, dtype="<f4")
    return {"shape": list(a.shape), "f32": base64.b64encode(a.tobytes()).decode("ascii")}


def signs(size: int) -> np.ndarray:
    i = np.arange(size, dtype=np.uint64)
    bit = ((i * np.uint64(2654435761)) & np.uint64(0xFFFFFFFF)) >> np.uint64(31)
    return np.where(bit == 0, 1.0, -1.0)


def sketch(tensor: np.ndarray) -> dict:
    flat = tensor.astype(np.float64).reshape(-1)
    stride = math.ceil(flat.size / SAMPLES)
    return {
        "norm": float(np.linalg.norm(flat)),
        "projection": float(flat @ signs(flat.size)),
        "stride": stride,
        "samples": f32(flat[::stride]),
    }


def settings(beta: float) -> dict:
    """The bench's settings (bench/trl.ts `trlSettings`) for this batch."""
    return {
        "rows": GROUP * len(ROWS),
        "microBatchSize": MICRO,
        "groupSize": GROUP,
        "maxTokens": MAX_TOKENS,
        "temperature": 1.0,
        "topP": 1.0,
        "learningRate": LEARNING_RATE,
        "maxGradNorm": 1.0,
        "klCoef": beta,
        "clipLow": 0.2,
        "clipHigh": 0.28,
        "ppoEpochs": 1,
        "lossType": "dapo",
        "scaleRewards": "group",
    }


def fixed_rollout(order: list):
    """TRL's `rollout_func`: for each prompt it is asked for, the next fixed completion of that prompt."""
    seen: dict[str, int] = {}

    def rollout(prompts, trainer):
        prompt_ids, completion_ids = [], []
        for p in prompts:
            k = seen.get(p, 0) % GROUP
            seen[p] = k + 1
            order.append((p, k))
            prompt_ids.append(list(ROWS[p]["prompt_ids"]))
            completion_ids.append(list(ROWS[p]["completions"][k][0]))
        # `logprobs` are the sampler's; TRL keeps them only for vLLM's importance correction (off here).
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * len(c) for c in completion_ids]}

    return rollout


def reward(completions, completion_ids, **kwargs):
    table = {tuple(c): r for row in ROWS.values() for c, r in row["completions"]}
    return [table[tuple(ids)] for ids in completion_ids]


def set_lora_weights(model) -> dict:
    """Overwrites every lora_A / lora_B with seeded values (see the module doc); returns them under PEFT's saved names."""
    gen = torch.Generator().manual_seed(LORA_SEED)
    saved = {}
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_" not in name:
                continue
            bound = 0.1 if "lora_A" in name else 0.02
            p.copy_((torch.rand(p.shape, generator=gen) * 2 - 1) * bound)
            saved[name.replace(".default", "")] = f32(p.detach().numpy())
    return saved


def trained_parameters(model) -> dict:
    """Trained tensors under the names rxrl uses: Hugging Face's, or PEFT's saved names for an adapter."""
    return {name.replace(".default", ""): p for name, p in model.named_parameters() if p.requires_grad}


def run_case(case: str, shuffle: bool, bias_corrected_kl: bool = False) -> dict:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import trl.trainer.grpo_trainer as grpo_module
    from trl import GRPOTrainer
    from trl_grpo import grpo_config, lora_config

    torch.manual_seed(SEED)
    lora = case.startswith("lora")
    s = settings(KL_BETA if case == "lora_kl" else 0.0)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    order: list = []
    dataset = Dataset.from_list([{"prompt": p} for p in ROWS])
    with tempfile.TemporaryDirectory() as out:
        config = grpo_config(s, out, 1, SEED)
        if bias_corrected_kl:  # TRL's default, which the bench turns off
            config.use_bias_correction_kl = True
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward,
            args=config,
            train_dataset=dataset,
            processing_class=tokenizer,
            peft_config=lora_config(LORA if lora else None),
            rollout_func=fixed_rollout(order),
        )
        lora_init = set_lora_weights(trainer.model) if lora else None
        before = {n: p.detach().numpy().copy() for n, p in trained_parameters(trainer.model).items()}
        record = instrument(trainer)
        original_shuffle = grpo_module.shuffle_sequence_dict
        if not shuffle:
            grpo_module.shuffle_sequence_dict = lambda d: d
        try:
            trainer.train()
        finally:
            grpo_module.shuffle_sequence_dict = original_shuffle
        update = {n: p.detach().numpy() - before[n] for n, p in trained_parameters(trainer.model).items()}
    return {"order": order, "settings": s, "lora_init": lora_init, "update": update, **record}


def run_steps() -> dict:
    """The ``lora`` case for ``STEPS`` optimizer steps, recorded as ``bench/trl_grpo.py --record`` records a run: the
    prompts come back in the order TRL's sampler draws them each epoch, with the fixed completions; the rewards are
    the table's at step 0, ``FLAT_REWARD`` for every row at step 1 (no group has any variance: the loss and every
    gradient are 0, yet AdamW steps, moving the weights by their momentum), and the table's negated at step 2."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer
    from trl_grpo import grpo_config, lora_config, record_rollouts

    torch.manual_seed(SEED)
    s = settings(0.0)
    tokenizer = AutoTokenizer.from_pretrained(MODEL_DIR)
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    order: list = []
    calls = {"n": 0}
    fixed = fixed_rollout(order)

    def rollout(prompts, trainer):
        calls["n"] += 1
        return fixed(prompts, trainer)

    def stepped_reward(completions, completion_ids, **kwargs):
        step = calls["n"] - 1
        table = reward(completions, completion_ids)
        if step == 2:  # each row takes the reward of the next completion of its prompt
            table = [dict(rotated)[tuple(ids)] for ids in completion_ids]
        return [FLAT_REWARD if step == 1 else r for r in table]

    rotated = [(tuple(c), row["completions"][(k + 1) % GROUP][1]) for row in ROWS.values() for k, (c, _) in enumerate(row["completions"])]
    norms: list = []
    with tempfile.TemporaryDirectory() as out:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=stepped_reward,
            args=grpo_config(s, out, STEPS, SEED),
            train_dataset=Dataset.from_list([{"prompt": p} for p in ROWS]),
            processing_class=tokenizer,
            peft_config=lora_config(LORA),
            rollout_func=rollout,
        )
        lora_init = set_lora_weights(trainer.model)
        before = {n: p.detach().numpy().copy() for n, p in trained_parameters(trainer.model).items()}
        record_rollouts(trainer, os.path.join(out, "rollouts.jsonl"))
        clip = trainer._clip_grad_norm

        def clip_and_record(model):
            norm = clip(model)
            norms.append(float(norm))
            return norm

        trainer._clip_grad_norm = clip_and_record
        trainer.train()
        rollouts = [json.loads(line) for line in Path(out, "rollouts.jsonl").read_text().splitlines()]
        update = {n: p.detach().numpy() - before[n] for n, p in trained_parameters(trainer.model).items()}
    if len(rollouts) != STEPS or len(norms) != STEPS or norms[1] != 0.0:
        raise SystemExit(f"trl_parity: steps: {len(rollouts)} batches, grad norms {norms}")
    return {
        "settings": s,
        "rollouts": rollouts,
        "gradNorms": norms,
        "loraInit": lora_init,
        "update": {name: f32(u) for name, u in sorted(update.items())},
    }


def instrument(trainer) -> dict:
    """Wraps the trainer's stages to record what they compute (they still run unchanged)."""
    record: dict = {"micro_losses": [], "micro_rows": []}
    generate = trainer._generate_and_score_completions
    compute_loss = trainer.compute_loss
    clip = trainer._clip_grad_norm

    def generate_and_record(inputs):
        output = generate(inputs)
        with torch.no_grad():
            ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
            mask = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
            logps, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, output["completion_ids"].size(1))
        record["advantages"] = output["advantages"].tolist()
        record["num_items_in_batch"] = int(output["num_items_in_batch"])
        record["completion_ids"] = output["completion_ids"].tolist()
        record["logprobs"] = (logps * output["completion_mask"]).tolist()
        return output

    def compute_and_record(model, inputs, *args, **kwargs):
        loss = compute_loss(model, inputs, *args, **kwargs)
        record["micro_losses"].append(float(loss.detach()))
        record["micro_rows"].append(inputs["completion_ids"].tolist())
        return loss

    def clip_and_record(model):
        record["grads"] = {n: p.grad.detach().numpy().copy() for n, p in trained_parameters(model).items()}
        norm = clip(model)
        record["grad_norm"] = float(norm)
        return norm

    trainer._generate_and_score_completions = generate_and_record
    trainer.compute_loss = compute_and_record
    trainer._clip_grad_norm = clip_and_record
    return record


def check_order_free(a: dict, b: dict, case: str) -> float:
    """Largest relative difference between the gradients of the run with TRL's shuffle and the run without."""
    worst = 0.0
    for name, g in a["grads"].items():
        denom = max(float(np.linalg.norm(g)), 1e-12)
        worst = max(worst, float(np.linalg.norm(g - b["grads"][name])) / denom)
    if worst > 1e-5:
        raise SystemExit(f"trl_parity: {case}: gradients depend on the micro-batch order (relative difference {worst:.2e})")
    return worst


def summarize(case: str, run: dict, shuffled: dict) -> dict:
    lora = case.startswith("lora")
    rows = [{"prompt": p, "run": k} for p, k in run["order"]]
    grads, update = run["grads"], run["update"]
    tensors = {
        name: {"grad": f32(g), "update": f32(update[name])} if lora else {"shape": list(g.shape), "grad": sketch(g), "update": sketch(update[name])}
        for name, g in sorted(grads.items())
    }
    return {
        "settings": run["settings"],
        "rows": rows,
        "advantages": run["advantages"],
        "numItemsInBatch": run["num_items_in_batch"],
        "logprobs": run["logprobs"],
        "microBatches": [{"rows": [rows_of(run, ids) for ids in micro], "loss": loss} for micro, loss in zip(run["micro_rows"], run["micro_losses"], strict=True)],
        "loss": sum(run["micro_losses"]),
        "gradNorm": run["grad_norm"],
        "shuffleCheck": {"maxRelativeGradDifference": check_order_free(run, shuffled, case)},
        **({"loraInit": run["lora_init"]} if lora else {}),
        "tensors": tensors,
    }


def rows_of(run: dict, ids: list) -> int:
    """Index (in the recorded order) of the row whose padded completion ids are `ids`."""
    return run["completion_ids"].index(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    import peft
    import transformers
    import trl

    cases = {}
    for case in ["full", "lora", "lora_kl"]:
        run = run_case(case, shuffle=False)
        shuffled = run_case(case, shuffle=True)
        cases[case] = summarize(case, run, shuffled)
        if case == "lora_kl":
            corrected = run_case(case, shuffle=False, bias_corrected_kl=True)
            cases[case]["trlDefaultKl"] = {"loss": sum(corrected["micro_losses"]), "gradNorm": corrected["grad_norm"]}
    fixture = {
        "about": "One GRPO step of TRL's GRPOTrainer on a fixed batch; made by scripts/trl_parity.py (see its docstring).",
        "model": "spec/fixtures/hf/tiny-qwen2",
        "versions": {"trl": trl.__version__, "torch": torch.__version__.split("+")[0], "transformers": transformers.__version__, "peft": peft.__version__},
        "eos": EOS,
        "prompts": {p: row["prompt_ids"] for p, row in ROWS.items()},
        "completions": {p: [{"ids": c, "reward": r} for c, r in row["completions"]] for p, row in ROWS.items()},
        "lora": LORA,
        "klBeta": KL_BETA,
        "cases": cases,
        "steps": run_steps(),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(fixture, indent=1) + "\n")
    print(json.dumps({"out": args.out, "bytes": Path(args.out).stat().st_size, **{c: {"loss": v["loss"], "gradNorm": v["gradNorm"]} for c, v in cases.items()}}), file=sys.stderr)


if __name__ == "__main__":
    main()
