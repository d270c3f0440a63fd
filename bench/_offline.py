"""Environment the Python benchmarks set before torch, tokenizers or transformers load (import this first).

Nothing is fetched from the Hugging Face hub. OpenMP workers sleep rather than spin at barriers (read when torch
loads; set ``OMP_WAIT_POLICY`` to override): on a shared 2-core machine spinning workers fight other processes for
the cores, and with the default policy 2 threads measured ~6x slower than 1 thread here, with PASSIVE close to 1
thread or better. Each value is a default: one already in the environment wins.
"""
import os

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_WAIT_POLICY": "PASSIVE",
}.items():
    os.environ.setdefault(_name, _value)
