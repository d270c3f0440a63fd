"""Makes spec/fixtures/hf/tiny-qwen2-bf16: the tiny Qwen2 fixture cast to bfloat16 by PyTorch and written by
transformers' save_pretrained in shards (max_shard_size 100KB, with model.safetensors.index.json), plus the logits
transformers computes from those weights in float32 for one row of token ids (logits.json). The spec checks that
rxrl's own bfloat16 shards of the same model hold the same bits, and that rxrl reads these within 1e-4.

Usage (pinned versions: scripts/requirements-fixtures.txt): python3 scripts/bf16_fixture.py
"""

import json
import os

import torch
from transformers import AutoModelForCausalLM

ROOT = os.path.join(os.path.dirname(__file__), "..", "spec", "fixtures", "hf")
SOURCE = os.path.join(ROOT, "tiny-qwen2")
OUT = os.path.join(ROOT, "tiny-qwen2-bf16")
IDS = [1, 17, 42, 99, 7, 300, 5, 64]


def main() -> None:
    model = AutoModelForCausalLM.from_pretrained(SOURCE, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(OUT, max_shard_size="100KB")
    reloaded = AutoModelForCausalLM.from_pretrained(OUT, dtype=torch.float32)
    with torch.no_grad():
        logits = reloaded(torch.tensor([IDS])).logits[0]
    with open(os.path.join(OUT, "logits.json"), "w") as f:
        json.dump({"ids": IDS, "logits": [[round(float(x), 6) for x in row] for row in logits]}, f)
        f.write("\n")
    print("wrote", sorted(os.listdir(OUT)))


if __name__ == "__main__":
    main()
