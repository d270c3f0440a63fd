#!/usr/bin/env python3
"""Next-token sampling distributions written by transformers, for ``spec/model/samplingParity.spec.ts``.

For a handful of logit rows and (temperature, top_p, top_k) settings, resolves the generation config the way
``generate(do_sample=True)`` does (``model._prepare_generation_config``: what the caller passed, then the model
directory's ``generation_config.json``, then transformers' global defaults: ``top_k=None`` becomes 50), builds the
logits processors ``generate`` builds from it (``model._get_logits_processor``: ``TemperatureLogitsWarper``,
``TopKLogitsWarper``, ``TopPLogitsWarper``, in that order) on the local tiny model ``spec/fixtures/hf/tiny-qwen2``
(nothing is downloaded), runs the row through them and takes the softmax: the exact vector ``generate`` draws from.

Rows are generated from a seed by a hash both sides compute exactly (``logit_row`` here, ``logitRow`` in the
spec), so the fixture stores only each row's recipe and, per case:

- ``kept``: the ids whose processed score is finite, as runs ``[start, end, start, end, ...]``;
- ``q``: each kept id's probability in units of ``Q_UNIT`` (rounded), as base64 of unsigned LEB128 varints, in
  id order (the rounding is at most ``Q_UNIT / 2``);
- ``top``: the 8 most likely ids with their probabilities (float64);
- ``float32Error``: how far torch's own float32 softmax of the processed scores is from the float64 one (the
  rounding ``torch.multinomial`` then samples with; it is not part of the distribution);
- ``processors``: the processors ``generate`` built.

Usage (pins: scripts/requirements-fixtures.txt)::

    python3 scripts/sampling_reference.py [--out spec/fixtures/sampling/reference.json]
"""
from __future__ import annotations

import argparse
import base64
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..")
MODEL_DIR = os.path.join(ROOT, "spec", "fixtures", "hf", "tiny-qwen2")
DEFAULT_OUT = os.path.join(ROOT, "spec", "fixtures", "sampling", "reference.json")
Q_UNIT = 1e-7
MASK32 = 0xFFFFFFFF
NEG_INF = "-inf"

# A row: vocabulary size, seed and scale of the bulk (scale * (sum of 4 uniforms - 2)), then overrides.
ROWS = [
    {"name": "peaked", "vocab": 64, "seed": 1, "scale": 1.0, "set": [[7, 9.0], [3, 6.5], [50, 6.0]]},
    {"name": "flat", "vocab": 32, "seed": 2, "scale": 0.0, "set": []},
    # Four tokens tied at 2.0 below one at 3.0: top_p 0.5 and 0.9 cut inside the tie.
    {"name": "ties", "vocab": 16, "seed": 3, "scale": 0.0,
     "set": [[0, 3.0], [2, 2.0], [5, 2.0], [9, 2.0], [13, 2.0], [1, 1.0], [4, 1.0]]},
    {"name": "neg-inf", "vocab": 48, "seed": 4, "scale": 2.0,
     "set": [[0, NEG_INF], [5, NEG_INF], [17, NEG_INF], [40, NEG_INF], [11, 4.0]]},
    {"name": "small", "vocab": 8, "seed": 5, "scale": 1.5, "set": []},
    # SmolLM2's vocabulary: a bulk in [-5, 5] under a few much likelier tokens (two of them tied).
    {"name": "large", "vocab": 49152, "seed": 6, "scale": 2.5,
     "set": [[1234, 16.0], [40000, 15.0], [7, 14.5], [30000, 14.5], [49151, 13.0]]},
]
TEMPERATURES = [1.0, 0.7, 1.3]
TOP_PS = [1.0, 0.9, 0.5]
TOP_KS = [0, None, 50]
# Full-support cases of the large row take ~65 KB each: two are enough (the others are truncated).
LARGE_FULL = {(1.0, 1.0, 0), (1.3, 1.0, 0)}


def mix32(x: int) -> int:
    """murmur3's finalizer on 32 bits (as ``mix32`` in lib/core/random.ts)."""
    h = x & MASK32
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & MASK32
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & MASK32
    return (h ^ (h >> 16)) & MASK32


def logit_row(row: dict):
    """The row's float32 logits: only integer hashing, additions and one product, exact in float64 on both sides."""
    import numpy as np

    key = mix32(row["seed"] ^ 0x9E3779B9)
    values = []
    for i in range(row["vocab"]):
        u = [(mix32(key ^ ((4 * i + j) & MASK32)) + 0.5) / 4294967296.0 for j in range(4)]
        values.append(row["scale"] * (((u[0] + u[1]) + (u[2] + u[3])) - 2.0))
    out = np.array(values, dtype=np.float32)
    for index, value in row["set"]:
        out[index] = -np.inf if value == NEG_INF else value
    return out


def runs(ids) -> list[int]:
    out: list[int] = []
    for i in ids:
        if out and out[-1] == i:
            out[-1] = i + 1
        else:
            out.extend([i, i + 1])
    return out


def varints(values) -> str:
    buf = bytearray()
    for v in values:
        v = int(v)
        while True:
            byte = v & 0x7F
            v >>= 7
            buf.append(byte | (0x80 if v else 0))
            if not v:
                break
    return base64.b64encode(bytes(buf)).decode("ascii")


def distribution(model, logits, temperature: float, top_p: float, top_k):
    import torch
    from transformers import GenerationConfig

    asked = GenerationConfig(do_sample=True, temperature=temperature, top_p=top_p, top_k=top_k)
    resolved, _ = model._prepare_generation_config(asked)
    processors = model._get_logits_processor(resolved, input_ids_seq_length=1, device="cpu")
    scores = torch.from_numpy(logits.copy())[None, :]
    input_ids = torch.zeros((1, 1), dtype=torch.long)
    processed = processors(input_ids, scores)
    # The processed float32 scores decide what is kept, as in generate; their softmax is taken in float64 (torch's
    # float32 softmax over 49152 entries rounds by up to a few 1e-6, recorded as float32Error).
    probs = torch.softmax(processed.double(), dim=-1)[0]
    float32_error = (torch.softmax(processed, dim=-1)[0].double() - probs).abs().max().item()
    kept = torch.isfinite(processed[0]).nonzero().flatten().tolist()
    return resolved, [type(p).__name__ for p in processors], kept, probs, float32_error


def tie_order_is_stable(logits) -> bool:
    """Whether torch's ascending sort orders this row's ties by id (what rxrl assumes), as numpy's stable sort."""
    import numpy as np
    import torch

    return torch.sort(torch.from_numpy(logits.copy()), descending=False).indices.tolist() == \
        np.argsort(logits, kind="stable").tolist()


def cases_of(model, row: dict) -> list[dict]:
    import torch

    logits = logit_row(row)
    out = []
    for t in TEMPERATURES:
        for p in TOP_PS:
            for k in TOP_KS:
                resolved, names, kept, probs, float32_error = distribution(model, logits, t, p, k)
                if row["vocab"] > 4096 and len(kept) == row["vocab"] and (t, p, k) not in LARGE_FULL:
                    continue
                q = torch.round(probs[kept] / Q_UNIT).long().tolist()
                top = torch.topk(probs, min(8, len(kept)))
                out.append({
                    "row": row["name"], "temperature": t, "topP": p, "topKAsked": k, "topK": resolved.top_k,
                    "processors": names, "kept": runs(kept), "q": varints(q),
                    "top": [[i, float(v)] for i, v in zip(top.indices.tolist(), top.values.tolist())],
                    "float32Error": float32_error,
                })
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args()
    import numpy as np
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, dtype=torch.float32)
    cases = [c for row in ROWS for c in cases_of(model, row)]
    rows = [{**row, "set": row["set"], "tieOrderStable": tie_order_is_stable(logit_row(row))} for row in ROWS]
    fixture = {
        "versions": {"torch": torch.__version__.split("+")[0], "transformers": transformers.__version__,
                     "numpy": np.__version__},
        "qUnit": Q_UNIT, "rows": rows, "cases": cases,
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    sys.stderr.write(f"sampling_reference: {len(cases)} cases -> {args.out} ({os.path.getsize(args.out)} bytes)\n")


if __name__ == "__main__":
    main()
