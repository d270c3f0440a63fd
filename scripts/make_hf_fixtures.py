#!/usr/bin/env python3
"""Generate tiny Hugging Face model directories plus reference outputs for rxrl's parity specs.

rxrl reads and writes Hugging Face model directories (config.json, safetensors
weights, tokenizer.json, tokenizer_config.json, chat templates) and runs the
models on TensorFlow.js.  To prove that the TypeScript implementation agrees
with the reference implementation, this script builds three very small models
entirely locally (nothing is downloaded) and records what PyTorch +
transformers compute for them:

  spec/fixtures/hf/tiny-qwen2/           Qwen2ForCausalLM, F32, tied embeddings,
                                         q/k/v biases, config.json rewritten into the
                                         older layout (top-level rope_theta, torch_dtype)
  spec/fixtures/hf/tiny-qwen3/           Qwen3ForCausalLM, F16, head_dim 32 != hidden/heads,
                                         q_norm/k_norm, untied, chat template in chat_template.jinja
  spec/fixtures/hf/tiny-llama/           LlamaForCausalLM, BF16 in several shards with an
                                         index, llama3 rope scaling, Llama-3-style tokenizer
  spec/fixtures/hf/<name>.expected.json  logits, greedy continuations, tokenizer cases,
                                         rendered chat templates and gradients

Tokenizers are byte-level BPE models trained with the `tokenizers` library on a
corpus that this script generates (English-like sentences, arithmetic, code,
accented Latin, CJK, emoji, CRLF line endings and tabs).  Special tokens are
added after training so that, as in the real Qwen and Llama 3 vocabularies,
they sit at the end of the id range.  The chat templates are small Jinja
templates written for these fixtures; they imitate the shape of the Qwen and
Llama 3 formats without being copies of them.

tiny-qwen3 and tiny-llama use the plain pipeline ByteLevel(use_regex=True).
tiny-qwen2 cannot: for model_type "qwen2" transformers 5.23 always loads
Qwen2Tokenizer, which ignores the normalizer and pre-tokenizer in tokenizer.json
and rebuilds them (NFC, a Qwen split regex, ByteLevel without regex).  So the
qwen2 tokenizer is trained with, and its tokenizer.json stores, exactly that
pipeline (the regex is taken from the installed transformers).  Every
tokenizer expectation is checked against both AutoTokenizer and the raw
tokenizer.json, so the two cannot drift apart silently.

Notes for the specs that consume the expected files:
  * logits of left-padded positions (attention_mask 0) are whatever eager
    attention does with a fully masked query row (eager and sdpa disagree
    there); only positions with mask 1 are meaningful.
  * greedy output is plain argmax with a full forward pass per step and no
    stopping criterion, so exactly max_new_tokens ids are recorded even if one
    of them is an EOS id; prompts are picked so that the top-1/top-2 logit
    margin stays >= GREEDY_MIN_MARGIN along the whole path.
  * grad.sum_logprobs sums log p(x[t+1] | x[<=t]) over the pairs where both
    x[t] and x[t+1] are real tokens; the tied qwen2 embedding gradient includes
    both its input-embedding and its lm_head use.

Every parameter is re-drawn from a seeded torch generator (no zeros and ones
left from the default initialisation), the model is saved in its target
dtype, and then the saved directory is reloaded in float32: every expected
value is computed from that reloaded model, i.e. from exactly what a reader of
the files sees.

The output is deterministic: running the script twice gives byte-identical
files.  Run it by hand (it is not part of the test suite):

    python3 scripts/make_hf_fixtures.py [--out spec/fixtures/hf]

The versions used are pinned in scripts/requirements-fixtures.txt.
"""

import os

# Before anything imports torch / tokenizers / transformers: stay offline, single-threaded.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen3Config,
)

transformers.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()
torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "spec" / "fixtures" / "hf"

# Standard deviations of the re-randomised parameters.  The embedding / lm_head
# are a little wider than the other matrices so that logits land around O(1-5).
# The other matrices use a per-model std ("std_matrix" in SPECS, 0.08-0.16): with
# tied embeddings a small std lets the residual stream echo the input token, and
# greedy decoding would just repeat the prompt's last token.
STD_EMBED = 0.15
STD_BIAS = 0.05
STD_NORM = 0.1

SIG_DIGITS = 7

# ----------------------------------------------------------------------------
# Corpus
# ----------------------------------------------------------------------------

_WORDS = (
    "the a an model policy reward value token tokens batch step steps gradient loss train training "
    "data simple quick brown fox jumps over lazy dog and or with for into from small large number "
    "answer question think check result is was are we you they it good better best again first then "
    "finally because each every sample samples learn learning rate update weights layer attention "
    "query key head heads output input prompt reply assistant user system tool call weather city "
    "today tomorrow sum product count list sort find write read open close run test pass fail"
).split()

_ACCENTED = [
    "Le café est très bon à Paris.",
    "Über die Straße gehen wir gemütlich.",
    "¿Dónde está la estación? Señor, allí.",
    "Une façade élégante, une crème brûlée.",
    "Grüße aus München, schön und groß.",
    "naïve coöperation, Ångström, Øresund.",
    "Ça va? Très bien, merci beaucoup.",
    "Fußball spielen macht Spaß.",
]

_CJK = [
    "中文字很好看。",
    "你好，世界！",
    "我们学习数学和语言。",
    "日本語のテキストです。",
    "今天天气很好。",
    "中文字 中文 文字",
    "模型 训练 奖励",
]

_EMOJI = ["🙂", "🚀", "👍", "🎉", "🔥", "✅", "🙂🙂", "🚀✨"]

_CODE = [
    "def add(a, b):\n\treturn a + b",
    "for (let i = 0; i < n; i++) {\n\tsum += xs[i];\n}",
    "if x == 3:\n    print(\"ok\")\nelse:\n    print(\"no\")",
    "const total = items.reduce((acc, x) => acc + x, 0);",
    "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}",
    "import numpy as np\nxs = np.zeros((4, 8))",
    "while (step < maxSteps) {\n\tstep += 1;\n}",
    "SELECT id, name FROM users WHERE age > 30;",
    "x = [1, 2, 3]\ny = {\"a\": 1, \"b\": 2}",
    "function greet(name) {\n\treturn `hi ${name}`;\n}",
]


def _sentence(rng):
    n = rng.randint(4, 11)
    words = [rng.choice(_WORDS) for _ in range(n)]
    words[0] = words[0].capitalize()
    return " ".join(words) + rng.choice([".", ".", ".", "?", "!", ","])


def _arithmetic(rng):
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    op = rng.choice("+-*")
    res = a + b if op == "+" else a - b if op == "-" else a * b
    style = rng.randint(0, 3)
    if style == 0:
        return f"{a}{op}{b}={res}"
    if style == 1:
        return f"What is {a}{op}{b}? The answer is {res}."
    if style == 2:
        return f"{a} {op} {b} = {res}"
    return f"Q: {a}{op}{b}\tA: {res}"


def make_corpus(seed, n_docs=240):
    """A deterministic mix of document kinds; lines are joined by LF or CRLF."""
    rng = random.Random(seed)
    kinds = ["sentence"] * 5 + ["arith"] * 3 + ["code"] * 2 + ["accent"] * 2 + ["cjk"] * 2 + ["emoji"] + ["tab"]
    docs = []
    for _ in range(n_docs):
        lines = []
        for _ in range(rng.randint(1, 4)):
            kind = rng.choice(kinds)
            if kind == "sentence":
                lines.append(_sentence(rng))
            elif kind == "arith":
                lines.append(_arithmetic(rng))
            elif kind == "code":
                lines.append(rng.choice(_CODE))
            elif kind == "accent":
                lines.append(rng.choice(_ACCENTED))
            elif kind == "cjk":
                lines.append(rng.choice(_CJK))
            elif kind == "emoji":
                lines.append(_sentence(rng)[:-1] + " " + rng.choice(_EMOJI))
            else:
                lines.append("\t" + "\t".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 4))))
        sep = "\r\n" if rng.random() < 0.25 else "\n"
        docs.append(sep.join(lines) + sep)
    return docs


# ----------------------------------------------------------------------------
# Tokenizers
# ----------------------------------------------------------------------------

QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
]


def qwen_hub_pretokenizer():
    """The pipeline transformers' Qwen2Tokenizer hard-codes (NFC, Qwen split regex, ByteLevel without regex).

    The regex is read from the installed transformers so that the file and the class agree exactly.
    """
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    normalizer = normalizers.NFC()
    pre = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    return normalizer, pre


def train_bpe(docs, vocab_size, specials, hub_qwen=False):
    tok = Tokenizer(models.BPE())
    if hub_qwen:
        tok.normalizer, tok.pre_tokenizer = qwen_hub_pretokenizer()
    else:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(docs, trainer=trainer)
    # Specials are added after training so they get the highest ids, as in Qwen / Llama 3.
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    return tok


# A Qwen-like ChatML template, written for these fixtures.
QWEN_CHAT_TEMPLATE = r"""{#- rxrl fixture template: ChatML turns, optional tools, tool calls and tool responses. -#}
{%- set ns = namespace(system='', skip_first=false) -%}
{%- if messages[0]['role'] == 'system' -%}
    {%- set ns.system = messages[0]['content'] -%}
    {%- set ns.skip_first = true -%}
{%- endif -%}
{%- if tools is defined and tools -%}
    {{- '<|im_start|>system\n' -}}
    {%- if ns.system -%}
        {{- ns.system + '\n\n' -}}
    {%- endif -%}
    {{- '# Tools\n\nThese functions are available:\n<tools>' -}}
    {%- for tool in tools -%}
        {{- '\n' + (tool | tojson) -}}
    {%- endfor -%}
    {{- '\n</tools>\n\nTo call one, reply with <tool_call></tool_call> tags around {"name": <name>, "arguments": <object>}.<|im_end|>\n' -}}
{%- elif ns.skip_first -%}
    {{- '<|im_start|>system\n' + ns.system + '<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
    {%- if loop.first and ns.skip_first -%}
        {#- the system message was rendered above -#}
    {%- elif message.role == 'tool' -%}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}
            {{- '<|im_start|>user' -}}
        {%- endif -%}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' -}}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}
            {{- '<|im_end|>\n' -}}
        {%- endif -%}
    {%- elif message.role == 'assistant' and message.tool_calls is defined and message.tool_calls -%}
        {{- '<|im_start|>assistant' -}}
        {%- if message.content is defined and message.content -%}
            {{- '\n' + message.content -}}
        {%- endif -%}
        {%- for call in message.tool_calls -%}
            {%- if call.function is defined -%}
                {%- set call = call.function -%}
            {%- endif -%}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' -}}
            {%- if call.arguments is string -%}
                {{- call.arguments -}}
            {%- else -%}
                {{- call.arguments | tojson -}}
            {%- endif -%}
            {{- '}\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\n' -}}
    {%- else -%}
        {{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|im_start|>assistant\n' -}}
{%- endif -%}
"""

# A Llama-3-like header/eot template, written for these fixtures.
LLAMA_CHAT_TEMPLATE = r"""{#- rxrl fixture template: Llama 3 style headers, content trimmed. -#}
{{- bos_token -}}
{%- for message in messages -%}
    {%- set header = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' -%}
    {{- header + (message.content | trim) + '<|eot_id|>' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
{%- endif -%}
"""


def make_qwen_tokenizer(docs, hub_qwen):
    tok = train_bpe(docs, vocab_size=480, specials=QWEN_SPECIALS, hub_qwen=hub_qwen)
    # Qwen's tokenizer.json carries a ByteLevel post-processor, which adds no tokens.
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=128,
        chat_template=QWEN_CHAT_TEMPLATE,
    )


def make_llama_tokenizer(docs):
    tok = train_bpe(docs, vocab_size=500, specials=LLAMA_SPECIALS)
    bos = "<|begin_of_text|>"
    bos_id = tok.token_to_id(bos)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A",
        pair=f"{bos} $A {bos} $B:1",
        special_tokens=[(bos, bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=bos,
        eos_token="<|eot_id|>",
        clean_up_tokenization_spaces=False,
        model_max_length=128,
        chat_template=LLAMA_CHAT_TEMPLATE,
    )


# ----------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------

COMMON_CONFIG = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def rerandomize(model, seed, std_matrix):
    """Redraw every parameter from a seeded generator (tied parameters are visited once)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name.endswith("norm.weight"):
                value = 1.0 + STD_NORM * noise
            elif name.endswith(".bias"):
                value = STD_BIAS * noise
            elif "embed_tokens" in name or name.startswith("lm_head"):
                value = STD_EMBED * noise
            else:
                value = std_matrix * noise
            param.copy_(value.to(param.dtype))


def token_id(tokenizer, token):
    tid = tokenizer.convert_tokens_to_ids(token)
    assert isinstance(tid, int) and tid >= 0, token
    return tid


SPECS = [
    {
        "name": "tiny-qwen2",
        "family": "qwen",
        "tokenizer": "qwen-hub",
        "dtype": "F32",
        "seed": 1002,
        "std_matrix": 0.16,
        "template_in_config": True,
        "old_config_layout": True,
        "max_shard_size": None,
    },
    {
        "name": "tiny-qwen3",
        "family": "qwen",
        "tokenizer": "qwen-bytelevel",
        "dtype": "F16",
        "seed": 1003,
        "std_matrix": 0.08,
        "template_in_config": False,
        "old_config_layout": False,
        "max_shard_size": None,
    },
    {
        "name": "tiny-llama",
        "family": "llama",
        "tokenizer": "llama",
        "dtype": "BF16",
        "seed": 1004,
        "std_matrix": 0.12,
        "template_in_config": True,
        "old_config_layout": False,
        "max_shard_size": "100KB",
    },
]


def make_config(spec, tokenizer):
    vocab = len(tokenizer)
    if spec["name"] == "tiny-qwen2":
        endoftext = token_id(tokenizer, "<|endoftext|>")
        im_end = token_id(tokenizer, "<|im_end|>")
        return Qwen2Config(
            vocab_size=vocab,
            tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            bos_token_id=None,
            eos_token_id=im_end,
            pad_token_id=endoftext,
            **COMMON_CONFIG,
        )
    if spec["name"] == "tiny-qwen3":
        endoftext = token_id(tokenizer, "<|endoftext|>")
        im_end = token_id(tokenizer, "<|im_end|>")
        return Qwen3Config(
            vocab_size=vocab,
            head_dim=32,
            attention_bias=False,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
            bos_token_id=None,
            eos_token_id=im_end,
            pad_token_id=endoftext,
            **COMMON_CONFIG,
        )
    if spec["name"] == "tiny-llama":
        return LlamaConfig(
            vocab_size=vocab,
            tie_word_embeddings=False,
            attention_bias=False,
            mlp_bias=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
            bos_token_id=token_id(tokenizer, "<|begin_of_text|>"),
            eos_token_id=[token_id(tokenizer, "<|eot_id|>"), token_id(tokenizer, "<|end_of_text|>")],
            pad_token_id=None,
            **COMMON_CONFIG,
        )
    raise ValueError(spec["name"])


def make_generation_config(spec, tokenizer):
    if spec["family"] == "qwen":
        endoftext = token_id(tokenizer, "<|endoftext|>")
        return GenerationConfig(
            eos_token_id=[token_id(tokenizer, "<|im_end|>"), endoftext],
            pad_token_id=endoftext,
        )
    return GenerationConfig(
        bos_token_id=token_id(tokenizer, "<|begin_of_text|>"),
        eos_token_id=[token_id(tokenizer, "<|eot_id|>"), token_id(tokenizer, "<|end_of_text|>")],
    )


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def rewrite_config_old_layout(model_dir):
    """Turn transformers 5's config.json into the pre-5 layout: top-level rope_theta and torch_dtype."""
    path = model_dir / "config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    rope = cfg.pop("rope_parameters")
    assert rope.get("rope_type", "default") == "default" and set(rope) <= {"rope_type", "rope_theta"}, rope
    cfg["rope_theta"] = rope["rope_theta"]
    cfg["torch_dtype"] = cfg.pop("dtype")
    write_json(path, cfg)


def move_template_into_config(model_dir):
    """Keep the chat template inside tokenizer_config.json (the older convention)."""
    jinja = model_dir / "chat_template.jinja"
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if jinja.exists():
        cfg["chat_template"] = jinja.read_text(encoding="utf-8")
        jinja.unlink()
    assert "chat_template" in cfg
    write_json(path, cfg)


def rewrite_tokenizer_config_old_layout(model_dir, tokenizer):
    """Write tokenizer_config.json the way transformers 4.x / Qwen hub repos do.

    transformers 5.23 maps model_type "qwen2" to Qwen2Tokenizer whatever tokenizer_class says, and that
    class rebuilds the pipeline from vocab + merges with its own NFC + split regex, which is why the
    qwen2 fixture's tokenizer.json uses exactly that pipeline.
    """
    path = model_dir / "tokenizer_config.json"
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg.pop("backend", None)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["bos_token"] = None
    cfg["unk_token"] = None
    cfg["errors"] = "replace"
    cfg["split_special_tokens"] = False
    cfg["add_prefix_space"] = False
    cfg["added_tokens_decoder"] = {
        str(tid): {
            "content": tok.content,
            "lstrip": tok.lstrip,
            "normalized": tok.normalized,
            "rstrip": tok.rstrip,
            "single_word": tok.single_word,
            "special": tok.special,
        }
        for tid, tok in sorted(tokenizer.added_tokens_decoder.items())
    }
    write_json(path, cfg)


def build_and_save(spec, tokenizer, model_dir):
    if model_dir.exists():
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)

    torch.manual_seed(spec["seed"])
    config = make_config(spec, tokenizer)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    rerandomize(model, spec["seed"], spec["std_matrix"])
    model.generation_config = make_generation_config(spec, tokenizer)
    model = model.to(DTYPES[spec["dtype"]])

    kwargs = {}
    if spec["max_shard_size"]:
        kwargs["max_shard_size"] = spec["max_shard_size"]
    model.save_pretrained(model_dir, **kwargs)
    tokenizer.save_pretrained(model_dir)

    if spec["template_in_config"]:
        move_template_into_config(model_dir)
    else:
        assert (model_dir / "chat_template.jinja").exists()
        tk = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
        assert "chat_template" not in tk
    if spec["old_config_layout"]:
        rewrite_config_old_layout(model_dir)
        rewrite_tokenizer_config_old_layout(model_dir, tokenizer)


def load_reference(model_dir):
    model, info = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager", output_loading_info=True
    )
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        assert not info.get(key), f"{model_dir}: {key} = {info.get(key)}"
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model, tokenizer


# ----------------------------------------------------------------------------
# Expected values
# ----------------------------------------------------------------------------


def rounded(x):
    """Nested lists of python floats with SIG_DIGITS significant digits."""
    arr = np.asarray(x, dtype=np.float64)
    assert np.all(np.isfinite(arr)), "non-finite value in expected output"
    flat = [float(f"{v:.{SIG_DIGITS}g}") for v in arr.reshape(-1).tolist()]
    return np.array(flat, dtype=object).reshape(arr.shape).tolist() if arr.ndim > 0 else flat[0]


def position_ids_for(mask):
    mask = torch.as_tensor(mask, dtype=torch.long)
    return (mask.cumsum(-1) - 1).clamp(min=0)


def left_pad(rows, pad_id, length):
    ids, mask = [], []
    for row in rows:
        row = list(row)[:length]
        n = length - len(row)
        ids.append([pad_id] * n + row)
        mask.append([0] * n + [1] * len(row))
    return ids, mask


def encode_plain(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def expected_logits(model, tokenizer, pad_id):
    row0 = encode_plain(tokenizer, "The quick brown fox jumps over 12+7=19 🙂")
    row1 = encode_plain(tokenizer, "中文字 and café\r\n\tdef f(x):")
    assert len(row0) >= 10 and len(row1) >= 7, (len(row0), len(row1))
    ids, mask = left_pad([row0[:10], row1[:7]], pad_id, 10)
    pos = position_ids_for(mask)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=pos
        ).logits.float()
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos.tolist(),
        "logits": rounded(out.numpy()),
    }


GREEDY_MIN_MARGIN = 0.01  # top-1 minus top-2 logit at every step, so float noise cannot flip an argmax
GREEDY_CHAT_PROMPTS = ["What is 12+7?", "Name a color.", "Sort 3, 1, 2.", "Say hi in French."]
GREEDY_TEXT_PROMPTS = ["The quick brown fox", "def add(a, b):", "Über 中文字", "12*12="]


def greedy_no_stop(model, prompt_ids, max_new_tokens):
    """Plain argmax decoding: a full forward pass per step and no stopping criterion at all.

    Returns the new ids and the smallest top-1/top-2 logit margin seen along the way.
    """
    ids = list(prompt_ids)
    new, margin = [], float("inf")
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, float(top[0] - top[1]))
            nxt = int(torch.argmax(logits).item())
            new.append(nxt)
            ids.append(nxt)
    return new, margin


def expected_greedy(model, tokenizer, family):
    def chat_prompt(question):
        chat = [{"role": "user", "content": question}]
        if family == "llama":
            chat.insert(0, {"role": "system", "content": "Answer briefly."})
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        return tokenizer.encode(text, add_special_tokens=False)

    slots = [
        [chat_prompt(q) for q in GREEDY_CHAT_PROMPTS],
        [tokenizer.encode(t, add_special_tokens=True) for t in GREEDY_TEXT_PROMPTS],
    ]
    cases = []
    for candidates in slots:
        for prompt in candidates:
            out, margin = greedy_no_stop(model, prompt, 8)
            if margin >= GREEDY_MIN_MARGIN:
                break
        else:
            raise AssertionError("no greedy prompt with a safe argmax margin")
        # Cross-check against generate() (KV cache path).  eos_token_id=None must be passed as a keyword:
        # transformers 5 refills a None eos_token_id inside a GenerationConfig object from the model's
        # generation_config.json, which would stop at EOS.  min_new_tokens is not used either, because
        # it masks the EOS logits and so changes the argmax path.
        with torch.no_grad():
            ref = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=8,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(prompt):].tolist()
        assert ref == out, (ref, out)
        cases.append({"prompt_ids": list(prompt), "max_new_tokens": 8, "output_ids": out})
    return cases


TOKENIZER_TEXTS_COMMON = [
    "Hello world",
    "  leading and trailing spaces  ",
    "multiple     spaces   between",
    "12+7=19 and 1234567*89=109876463",
    "Café naïve über straße façade",
    "中文字 你好世界",
    "emoji 🙂🚀 coder 👩‍💻 family 👨‍👩‍👧 thumbs 👍🏽",
    "line one\r\nline two\r\n\tindented\ttab",
    "",
    "xylophone quizzically jovial",
    "def f(x):\n\treturn x ** 2  # square\n\n\n",
    "Ünïcödé → ∑ ≠ ∞",
    "decomposed Cafe\u0301 vs composed Café",
]
TOKENIZER_TEXTS = {
    "qwen": TOKENIZER_TEXTS_COMMON
    + ["<|im_start|>user\nhi<|im_end|>", "the end<|endoftext|>more"],
    "llama": TOKENIZER_TEXTS_COMMON
    + [
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
        "<|begin_of_text|>text<|end_of_text|>",
    ],
}


def check_against_file(raw, tokenizer, text, ids, ids_with_special):
    """The tokenizer transformers loads must behave exactly like the tokenizer.json on disk."""
    assert raw.encode(text, add_special_tokens=False).ids == ids, ("tokenizer.json disagrees", text)
    assert raw.encode(text, add_special_tokens=True).ids == ids_with_special, ("tokenizer.json disagrees", text)
    for skip in (False, True):
        assert raw.decode(ids, skip_special_tokens=skip) == tokenizer.decode(ids, skip_special_tokens=skip), text


def expected_tokenizer(tokenizer, raw, family):
    cases = []
    for text in TOKENIZER_TEXTS[family]:
        ids = tokenizer.encode(text, add_special_tokens=False)
        with_special = tokenizer.encode(text, add_special_tokens=True)
        check_against_file(raw, tokenizer, text, ids, with_special)
        cases.append(
            {
                "text": text,
                "ids": ids,
                "ids_with_special": with_special,
                "decoded": tokenizer.decode(ids, skip_special_tokens=False),
                "decoded_skip": tokenizer.decode(ids, skip_special_tokens=True),
            }
        )
    return cases


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
ADD_TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}


def chat_cases(family):
    cases = [
        {
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "What is 12+7?"},
            ],
            "tools": None,
            "add_generation_prompt": True,
        },
        {
            "messages": [
                {"role": "user", "content": "Hi!"},
                {"role": "assistant", "content": "Hello. How can I help?"},
                {"role": "user", "content": "Count to three."},
            ],
            "tools": None,
            "add_generation_prompt": True,
        },
        {
            "messages": [
                {"role": "user", "content": "Say yes."},
                {"role": "assistant", "content": "yes"},
            ],
            "tools": None,
            "add_generation_prompt": False,
        },
        {
            "messages": [
                {"role": "system", "content": "  Réponds en français.\n"},
                {"role": "user", "content": "  Grüß dich 🙂 中文字?  \n"},
            ],
            "tools": None,
            "add_generation_prompt": True,
        },
    ]
    if family == "qwen":
        cases.append(
            {
                "messages": [
                    {"role": "system", "content": "You can use tools."},
                    {"role": "user", "content": "Weather in Paris, and 2+3?"},
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "type": "function",
                                "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
                            },
                            {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                        ],
                    },
                    {"role": "tool", "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
                    {"role": "tool", "content": "5"},
                    {"role": "assistant", "content": "It is 21°C and clear in Paris; 2+3=5."},
                ],
                "tools": [WEATHER_TOOL, ADD_TOOL],
                "add_generation_prompt": False,
            }
        )
        cases.append(
            {
                "messages": [
                    {"role": "user", "content": "Add 40 and 2."},
                    {
                        "role": "assistant",
                        "content": "Let me compute that.",
                        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 40, "b": 2}}}],
                    },
                    {"role": "tool", "content": "42"},
                ],
                "tools": [ADD_TOOL],
                "add_generation_prompt": True,
            }
        )
    return cases


def expected_chat(tokenizer, raw, family):
    out = []
    for case in chat_cases(family):
        text = tokenizer.apply_chat_template(
            case["messages"],
            tools=case["tools"],
            add_generation_prompt=case["add_generation_prompt"],
            tokenize=False,
        )
        ids = tokenizer.encode(text, add_special_tokens=False)
        check_against_file(raw, tokenizer, text, ids, tokenizer.encode(text, add_special_tokens=True))
        out.append({**case, "text": text, "ids": ids})
    return out


def grad_param_names(name):
    names = [
        "model.norm.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
    ]
    if name == "tiny-qwen2":
        names += ["model.layers.0.self_attn.q_proj.bias", "model.embed_tokens.weight"]
    if name == "tiny-qwen3":
        names += ["model.layers.0.self_attn.q_norm.weight"]
    return names


def expected_grad(model, tokenizer, pad_id, name):
    row0 = encode_plain(tokenizer, "Policy gradient: 3*4=12 🙂 done")
    row1 = encode_plain(tokenizer, "Über 中文字 fine")
    assert len(row0) >= 8 and len(row1) >= 6, (len(row0), len(row1))
    ids, mask = left_pad([row0[:8], row1[:6]], pad_id, 8)
    pos = position_ids_for(mask)
    ids_t, mask_t = torch.tensor(ids), torch.tensor(mask)

    model.zero_grad(set_to_none=True)
    logits = model(input_ids=ids_t, attention_mask=mask_t, position_ids=pos).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)
    target = ids_t[:, 1:]
    token_logp = logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    valid = (mask_t[:, 1:] == 1) & (mask_t[:, :-1] == 1)
    total = (token_logp * valid.float()).sum()
    total.backward()

    params = dict(model.named_parameters())
    grads = {}
    for pname in grad_param_names(name):
        p = params[pname]
        assert p.grad is not None, pname
        grads[pname] = {"shape": list(p.shape), "data": rounded(p.grad.reshape(-1).numpy())}
    model.zero_grad(set_to_none=True)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos.tolist(),
        "sum_logprobs": rounded(total.item()),
        "grads": grads,
    }


def dump_expected(path, obj):
    """One top-level key per line, compact values (small diffs, small files)."""
    parts = [
        f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False, separators=(',', ':'))}" for k, v in obj.items()
    ]
    with open(path, "w", encoding="utf-8") as f:
        f.write("{\n" + ",\n".join(parts) + "\n}\n")


def make_fixture(spec, tokenizer, out_dir):
    name = spec["name"]
    model_dir = out_dir / name
    build_and_save(spec, tokenizer, model_dir)

    model, tok = load_reference(model_dir)
    assert len(tok) == model.config.vocab_size, (len(tok), model.config.vocab_size)
    if name == "tiny-qwen2":
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "not tied"
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))

    config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    expected = {
        "model": name,
        "dtype": spec["dtype"],
        "config": config,
        "logits": expected_logits(model, tok, pad_id),
        "greedy": expected_greedy(model, tok, spec["family"]),
        "tokenizer": expected_tokenizer(tok, raw, spec["family"]),
        "chat": expected_chat(tok, raw, spec["family"]),
        "grad": expected_grad(model, tok, pad_id, name),
    }
    dump_expected(out_dir / f"{name}.expected.json", expected)

    lg = np.asarray(expected["logits"]["logits"])
    valid = np.asarray(expected["logits"]["attention_mask"], dtype=bool)
    print(
        f"{name}: {type(tok).__name__} vocab={len(tok)} params={model.num_parameters()} "
        f"logits std={lg[valid].std():.3f} max|.|={np.abs(lg[valid]).max():.3f} "
        f"S={expected['grad']['sum_logprobs']}",
        file=sys.stderr,
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="output directory (default: spec/fixtures/hf)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    docs = make_corpus(seed=20240601)
    tokenizers = {
        "qwen-hub": make_qwen_tokenizer(docs, hub_qwen=True),
        "qwen-bytelevel": make_qwen_tokenizer(docs, hub_qwen=False),
        "llama": make_llama_tokenizer(make_corpus(seed=20240602)),
    }
    for spec in SPECS:
        make_fixture(spec, tokenizers[spec["tokenizer"]], out_dir)


if __name__ == "__main__":
    main()
