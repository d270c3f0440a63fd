#!/usr/bin/env python3
"""Write spec/fixtures/hf/tiny-qwen3-f32: the tiny-qwen3 fixture with every weight in float32.

JAX on a CPU refuses float16 matrix products, so SkyRL's Tinker server (the engine spec/skyrl trains on) loads
only float32 models here; the weights are tiny-qwen3's (made by scripts/make_hf_fixtures.py), widened exactly.
Deterministic: the same input gives byte-identical files. Run it by hand with the packages of
scripts/requirements-fixtures.txt:

    python3 scripts/make_f32_fixture.py [--source spec/fixtures/hf/tiny-qwen3] [--out spec/fixtures/hf/tiny-qwen3-f32]
"""

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

COPIED = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=Path("spec/fixtures/hf/tiny-qwen3"))
    parser.add_argument("--out", type=Path, default=Path("spec/fixtures/hf/tiny-qwen3-f32"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    weights = load_file(args.source / "model.safetensors")
    widened = {name: np.ascontiguousarray(tensor.astype(np.float32)) for name, tensor in sorted(weights.items())}
    save_file(widened, args.out / "model.safetensors", metadata={"format": "pt"})

    config = json.loads((args.source / "config.json").read_text())
    config["dtype"] = "float32"
    (args.out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for name in COPIED:
        if (args.source / name).exists():
            shutil.copyfile(args.source / name, args.out / name)


if __name__ == "__main__":
    main()
