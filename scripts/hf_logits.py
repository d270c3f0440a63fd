#!/usr/bin/env python3
"""Run a Hugging Face model directory through transformers and print its logits as JSON.

rxrl's specs call this (when python3 can import torch and transformers) to check
that model directories written by rxrl load in transformers unchanged and give
the same logits and token ids that rxrl computes.

Usage:
    echo '{"input_ids": [[1, 2, 3]]}' | python3 scripts/hf_logits.py MODEL_DIR [--adapter PEFT_DIR]

With --adapter, the PEFT adapter directory is loaded on top of the model
(``peft.PeftModel.from_pretrained``) and the logits are those of the adapted model.

stdin is one JSON object:
    input_ids       [[int]]   required, B rows of equal length T
    attention_mask  [[0|1]]   optional (default: all ones)
    position_ids    [[int]]   optional (default: whatever transformers derives)
    texts           [str]     optional, each encoded with add_special_tokens=False

stdout is one JSON line:
    {"logits": [B][T][V], "encoded": [[int]], "model_type": str, "num_parameters": int, "peft": str|null}

The model is loaded in float32 with eager attention.  On failure the script
prints a one-line message to stderr and exits with a non-zero status.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import json
import sys


def fail(message):
    sys.stderr.write("hf_logits: " + " ".join(str(message).split()) + "\n")
    sys.exit(1)


def int_matrix(value, key):
    if not isinstance(value, list) or not value or not all(isinstance(row, list) for row in value):
        fail(f"'{key}' must be a non-empty list of lists")
    width = len(value[0])
    for row in value:
        if len(row) != width:
            fail(f"'{key}' rows must all have the same length")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in row):
            fail(f"'{key}' must contain integers only")
    return value


def main(argv):
    adapter_dir = None
    if len(argv) == 4 and argv[2] == "--adapter":
        adapter_dir = argv[3]
    elif len(argv) != 2:
        fail("usage: python3 scripts/hf_logits.py MODEL_DIR [--adapter PEFT_DIR] < request.json")
    model_dir = argv[1]
    if not os.path.isdir(model_dir):
        fail(f"not a directory: {model_dir}")

    try:
        request = json.loads(sys.stdin.read())
    except json.JSONDecodeError as err:
        fail(f"stdin is not valid JSON: {err}")
    if not isinstance(request, dict) or "input_ids" not in request:
        fail("stdin must be a JSON object with 'input_ids'")

    input_ids = int_matrix(request["input_ids"], "input_ids")
    shape = (len(input_ids), len(input_ids[0]))
    extras = {}
    for key in ("attention_mask", "position_ids"):
        if request.get(key) is not None:
            extras[key] = int_matrix(request[key], key)
            if (len(extras[key]), len(extras[key][0])) != shape:
                fail(f"'{key}' must have the same shape as input_ids {list(shape)}")
    texts = request.get("texts") or []
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        fail("'texts' must be a list of strings")

    try:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as err:
        fail(f"cannot import torch/transformers: {err}")

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
        tokenizer = AutoTokenizer.from_pretrained(model_dir) if texts else None
    except Exception as err:  # noqa: BLE001 - report any loading problem on one line
        fail(f"cannot load {model_dir}: {type(err).__name__}: {err}")
    peft_version = None
    if adapter_dir is not None:
        try:
            import peft
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter_dir)
            peft_version = peft.__version__
        except Exception as err:  # noqa: BLE001
            fail(f"cannot load the adapter {adapter_dir}: {type(err).__name__}: {err}")
    model.eval()

    vocab = model.config.get_text_config().vocab_size
    if any(v < 0 or v >= vocab for row in input_ids for v in row):
        fail(f"input_ids out of range for vocab_size {vocab}")

    try:
        inputs = {"input_ids": torch.tensor(input_ids, dtype=torch.long)}
        for key, value in extras.items():
            inputs[key] = torch.tensor(value, dtype=torch.long)
        with torch.no_grad():
            logits = model(**inputs).logits.float()
        encoded = [tokenizer.encode(text, add_special_tokens=False) for text in texts] if tokenizer else []
    except Exception as err:  # noqa: BLE001
        fail(f"forward pass failed: {type(err).__name__}: {err}")

    result = {
        "logits": logits.tolist(),
        "encoded": encoded,
        "model_type": model.config.model_type,
        "num_parameters": int(model.num_parameters()),
        "peft": peft_version,
    }
    sys.stdout.write(json.dumps(result, separators=(",", ":")) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main(sys.argv)
